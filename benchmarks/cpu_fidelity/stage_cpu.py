# ruff: noqa: E402, E501, E741, B007, B023
"""Compute of pipeline stages in one process, no communication: stage F/B per action (thread CPU and wall)
in GPipe order (N forwards, then N backwards) and in 1F1B order, against the one-layer profile's sums.
Usage: stage_cpu.py [--concurrent K] [--order gpipe|1f1b|both] [--stage S]"""

import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import resource

import torch
from small import SMALL

N, B_ = 8, 2


def setup(stage):
    from executor.interpreter import StageModule
    from executor.models import get_config
    from executor.plan import RunPlan

    plan = RunPlan.direct("gpipe", 2, N, model="gpt-tiny", model_overrides=SMALL, micro_batch=B_, dtype="float32")
    bounds = plan.bounds(2)
    a, b = bounds[stage]
    src = plan.source()
    mod = StageModule(src.build(0, a, b), a, B_, False).float()
    opt = torch.optim.SGD(mod.parameters(), lr=1e-4)
    cfg = get_config("gpt-tiny").with_(**SMALL)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab, (N * B_, cfg.seq), generator=g)
    tg = torch.randint(0, cfg.vocab, (N * B_, cfg.seq), generator=g)
    hid = torch.randn(N * B_, cfg.seq, cfg.hidden, generator=g)
    return mod, opt, ids, tg, hid, bounds


def run_order(stage, order, iters=4, warm=2):
    mod, opt, ids, tg, hid, bounds = setup(stage)
    fc, bc, fw, bw, sc = [], [], [], [], []
    flt = {"F": [], "B": [], "S": []}
    for it in range(iters + warm):
        if order == "gpipe":
            seq = [("F", m) for m in range(N)] + [("B", m) for m in range(N)]
        else:
            w = 2 - stage  # 1F1B warm-up forwards for D=2
            seq = [("F", m) for m in range(w)]
            f, b = w, 0
            while b < N:
                if f < N:
                    seq.append(("F", f))
                    f += 1
                seq.append(("B", b))
                b += 1
        keep = {}
        for kind, m in seq:
            c0, t0 = time.thread_time(), time.perf_counter()
            m0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            if kind == "F":
                if stage == 0:
                    x = ids[m * B_ : (m + 1) * B_]
                else:
                    x = hid[m * B_ : (m + 1) * B_].clone().requires_grad_(True)
                t = [tg[m * B_ : (m + 1) * B_]] if mod.has_head else None
                outs = mod(x, t)
                keep[m] = (x, outs[0])
            else:
                x, out = keep.pop(m)
                if out.dim() == 0:
                    torch.autograd.backward(out, None, inputs=list(mod.parameters()) + ([x] if x.requires_grad else []))
                else:
                    torch.autograd.backward(
                        out, torch.ones_like(out), inputs=list(mod.parameters()) + ([x] if x.requires_grad else [])
                    )
            c, w_ = time.thread_time() - c0, time.perf_counter() - t0
            if it >= warm:
                flt[kind].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - m0)
                (fc if kind == "F" else bc).append(c)
                (fw if kind == "F" else bw).append(w_)
        c0 = time.thread_time()
        m0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        opt.step()
        opt.zero_grad(set_to_none=True)
        if it >= warm:
            sc.append(time.thread_time() - c0)
            flt["S"].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - m0)
    med = statistics.median
    return {
        "F cpu": med(fc),
        "B cpu": med(bc),
        "F wall": med(fw),
        "B wall": med(bw),
        "STEP cpu": med(sc),
        "faults F/B/STEP": [statistics.median(flt[k]) for k in "FBS"],
        "F per-pos": [round(x * 1e3, 1) for x in fc[:N]] if order == "gpipe" else None,
    }


def worker(q, barrier, stage, order):
    torch.set_num_threads(1)
    if barrier is not None:
        barrier.wait()
    q.put((stage, run_order(stage, order)))


def main():
    torch.set_num_threads(1)
    conc = int(sys.argv[sys.argv.index("--concurrent") + 1]) if "--concurrent" in sys.argv else 1
    order = sys.argv[sys.argv.index("--order") + 1] if "--order" in sys.argv else "gpipe"
    from executor.models import get_config
    from profiler.run import profile_model

    cfg = get_config("gpt-tiny").with_(**SMALL)
    prof = profile_model(cfg, micro_batches=[2], threads=1, repeats=9)
    _, _, _, _, _, bounds = setup(0)
    print("load", os.getloadavg(), "order", order, "concurrent", conc)
    for s, (a, b) in enumerate(bounds):
        pf = sum(l.time("fwd", 2) for l in prof.layers[a:b])
        pb = sum(l.time("bwd", 2) for l in prof.layers[a:b])
        print(f"stage {s} layers {a}-{b}: profile F {pf * 1e3:.2f} B {pb * 1e3:.2f} ms")
    ctx = mp.get_context("spawn")
    if conc == 1:
        for s in range(2):
            r = run_order(s, order)
            print(f"alone stage {s}:", {k: (round(v * 1e3, 2) if isinstance(v, float) else v) for k, v in r.items()})
    else:
        q = ctx.Queue()
        bar = ctx.Barrier(conc)
        ps = [ctx.Process(target=worker, args=(q, bar, i % 2, order)) for i in range(conc)]
        [p.start() for p in ps]
        res = [q.get() for _ in ps]
        [p.join() for p in ps]
        for s, r in sorted(res, key=lambda x: x[0]):
            print(
                f"together({conc}) stage {s}:",
                {k: (round(v * 1e3, 2) if isinstance(v, float) else v) for k, v in r.items()},
            )
    print("load", os.getloadavg())


if __name__ == "__main__":
    main()
