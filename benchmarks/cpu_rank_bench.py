"""Does the planner's order follow the measured order on this machine? (issue 11: "the order of configurations
by predicted time must follow the measured order").

The local cluster (``local-cpu-4``: 4 gloo processes on this machine's cores) is measured first, as ``make serve``
seeds it (:func:`profiler.local_cluster.measured_cluster`), and the model is profiled in one process
(:func:`profiler.run.profile_model`, one torch thread, float32). The planner then ranks every configuration of that
model on that cluster for a global batch (:func:`planner.search.plan`), and each of the top ``--top`` candidates --
the best of each layout (t, D, W, b), which is what the issue's ranking is about, or with ``--all`` the top ones as
ranked -- is run for real with pipeplan's executor (``launch``: its own D W t processes), in ``--rounds`` rounds,
the candidates in turn within a round (the machine's speed drifts by the minute: a candidate's figure is its median
over the rounds, each round the median of its measured iterations).

Printed: per candidate, predicted and measured time and their ratio, predicted and measured rank; Kendall's
tau between the two orders (1: the same order; pairs whose measured times are within ``--tie`` of each other
count as ties, not as inversions: the machine cannot tell them apart); the regret of acting on the prediction,
the measured time of the planner's first candidate over the best measured one.

Run: ``PYTHONPATH=. python benchmarks/cpu_rank_bench.py [--model gpt-small|gpt-tiny] [--global-batch 16]
[--top 8] [--rounds 3] [--all]`` on a quiet machine (a few minutes); the load average is printed at the start and end.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from cpu_run_bench import MODELS, cluster_for, load  # noqa: E402

ITER, WARM = 5, 2


def kendall_tau(pred: list[float], meas: list[float], tie: float) -> float:
    """Kendall's tau-a between the two orders of the same items: (concordant - discordant) / pairs, a pair
    whose measured times differ by less than the fraction ``tie`` counting as neither (Kendall 1938)."""
    n, score = len(pred), 0
    for i in range(n):
        for j in range(i + 1, n):
            if abs(meas[i] - meas[j]) < tie * min(meas[i], meas[j]):
                continue
            score += 1 if (pred[i] - pred[j]) * (meas[i] - meas[j]) > 0 else -1
    pairs = n * (n - 1) // 2
    return score / pairs if pairs else 1.0


def ranks(values: list[float]) -> list[int]:
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0] * len(values)
    for r, i in enumerate(order):
        out[i] = r + 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="gpt-small", choices=sorted(MODELS))
    ap.add_argument("--global-batch", type=int, default=16)
    ap.add_argument("--top", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--all", dest="layouts", action="store_false",
                    help="the top candidates as ranked (default: the best of each (t, D, W, b) layout)")
    ap.add_argument("--tie", type=float, default=0.03, help="measured times this close are a tie (fraction)")
    args = ap.parse_args()

    import torch

    from executor.launch import launch
    from executor.models import get_config
    from executor.plan import RunPlan
    from planner.request import TrainingRequest
    from planner.search import plan as plan_search
    from profiler.run import profile_model

    torch.set_num_threads(1)
    print(f"load at start {load()}")
    with tempfile.TemporaryDirectory(prefix="pipeplan-rank-bench-") as tmp:
        cluster, _ = cluster_for(4, tmp)
        cfg = get_config("gpt-tiny").with_(**MODELS[args.model])
        sizes = sorted({1 << i for i in range(args.global_batch.bit_length()) if (1 << i) <= args.global_batch})
        prof = profile_model(cfg, micro_batches=sizes, threads=1, repeats=9)
        got = plan_search(prof, cluster, TrainingRequest(global_batch=args.global_batch, top=100))
        cands, seen = [], set()
        for cand in got.candidates:  # the best of each layout, in the planner's order
            c = cand.config
            key = (c.tensor, c.pipeline, c.data, c.micro_batch) if args.layouts else c.label()
            if key not in seen and len(cands) < args.top:
                seen.add(key)
                cands.append(json.loads(json.dumps(cand.to_dict(), default=str)))
        print(f"{args.model} (hidden {cfg.hidden}, {cfg.layers} blocks, seq {cfg.seq}), global batch "
              f"{args.global_batch} on {cluster.name} ({cluster.host.effective_cores:.2f} effective cores of "
              f"{cluster.host.cores}): {len(cands)} candidates of {got.evaluated} configurations")
        plans = [RunPlan.from_candidate(c, model="gpt-tiny", model_overrides=MODELS[args.model], iterations=ITER,
                                        warmup=WARM, dtype="float32") for c in cands]
        measured: list[list[float]] = [[] for _ in cands]
        for rnd in range(args.rounds):
            for i, p in enumerate(plans):
                c = p.spec.config
                res = launch([p], c.pipeline * c.data * c.tensor, timeout=600)
                assert res is not None
                measured[i].append(res["runs"][0]["measured"]["iteration_time"])
            print(f"round {rnd + 1}/{args.rounds} done, load {load()}")
    pred = [c["iteration_time"] for c in cands]
    meas = [statistics.median(m) for m in measured]
    pr, mr = ranks(pred), ranks(meas)
    print(f"\n{'candidate':<56}{'predicted':>10}{'measured':>10}{'ratio':>7}{'rank p/m':>10}  rounds (ms)")
    for c, p, m, a, b, ms in zip(cands, pred, meas, pr, mr, measured, strict=True):
        print(f"{c['label']:<56}{p * 1e3:>10.1f}{m * 1e3:>10.1f}{m / p:>7.2f}{f'{a}/{b}':>10}  "
              + " ".join(f"{x * 1e3:.1f}" for x in ms))
    ratios = sorted(m / p for p, m in zip(pred, meas, strict=True))
    print(f"\nKendall tau (ties within {args.tie:.0%} of measured time): {kendall_tau(pred, meas, args.tie):+.2f}; "
          f"plain: {kendall_tau(pred, meas, 0.0):+.2f}")
    print(f"regret: the planner's first candidate measured {meas[0] * 1e3:.1f} ms, the best measured "
          f"{min(meas) * 1e3:.1f} ms ({cands[meas.index(min(meas))]['label']}): {meas[0] / min(meas):.2f}x")
    print(f"measured/predicted: median {statistics.median(ratios):.2f}, range {ratios[0]:.2f}-{ratios[-1]:.2f}; "
          f"load at end {load()}")


if __name__ == "__main__":
    main()
