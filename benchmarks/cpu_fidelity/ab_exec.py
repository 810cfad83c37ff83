# ruff: noqa: E402, E501, E741, B007, B023
"""A/B, alternating R rounds, 2 processes on 2 cores: (P) the one-process profile's stage sums; (L) the stages'
F/B in a plain loop (GPipe order, no communication), both processes at once; (X) the executor's real GPipe run
(gloo). Per device and iteration (8 micro-batches): F and B thread CPU and wall, ms."""

import multiprocessing as mp
import os
import statistics
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[2]), str(Path(__file__).resolve().parent)]
import torch
from stage_cpu import B_, SMALL, N, worker


def main():
    torch.set_num_threads(1)
    R = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    sched = sys.argv[2] if len(sys.argv) > 2 else "gpipe"
    from executor.launch import launch
    from executor.models import get_config
    from executor.plan import RunPlan
    from profiler.run import profile_model

    cfg = get_config("gpt-tiny").with_(**SMALL)
    plan = RunPlan.direct(
        sched, 2, N, model="gpt-tiny", model_overrides=SMALL, micro_batch=B_, dtype="float32", iterations=5, warmup=2
    )
    plan.bounds(2)
    ctx = mp.get_context("spawn")
    print("load", os.getloadavg(), sched)
    for r in range(R):
        prof = profile_model(cfg, micro_batches=[1, 2, 4], threads=1, repeats=9)
        pf = sum(l.time("fwd", 2) for l in prof.layers) * N / 2
        pb = sum(l.time("bwd", 2) for l in prof.layers) * N / 2
        q = ctx.Queue()
        bar = ctx.Barrier(2)
        ps = [ctx.Process(target=worker, args=(q, bar, i, "gpipe" if sched == "gpipe" else "1f1b")) for i in range(2)]
        [p.start() for p in ps]
        res = [q.get() for _ in ps]
        [p.join() for p in ps]
        lf = statistics.mean(x["F cpu"] for _, x in res) * N
        lb = statistics.mean(x["B cpu"] for _, x in res) * N
        lfw = statistics.mean(x["F wall"] for _, x in res) * N
        lbw = statistics.mean(x["B wall"] for _, x in res) * N
        ls = statistics.mean(x["STEP cpu"] for _, x in res)
        run = launch([plan], 2, trace=False, timeout=600)["runs"][0]["measured"]
        c, w = run["cpu_by_kind"], run["time_by_kind"]
        print(
            f"round {r} load {os.getloadavg()[0]:.2f}: profile F {pf * 1e3:.1f} B {pb * 1e3:.1f} | loop F cpu {lf * 1e3:.1f} wall {lfw * 1e3:.1f} "
            f"B cpu {lb * 1e3:.1f} wall {lbw * 1e3:.1f} step cpu {ls * 1e3:.1f} | executor F cpu {c['F'] * 1e3:.1f} wall {w['F'] * 1e3:.1f} "
            f"B cpu {c['B'] * 1e3:.1f} wall {w['B'] * 1e3:.1f} STEP cpu {c.get('STEP', 0) * 1e3:.1f} wall {(w.get('STEP', 0) + w.get('OPT', 0)) * 1e3:.1f} "
            f"iter {run['iteration_time'] * 1e3:.1f}"
        )
    print("load", os.getloadavg())


if __name__ == "__main__":
    main()
