# ruff: noqa: E402, E501, E741, B007, B023
"""Paired, alternating within a round (drift cancels in the ratios): per block, forward and backward thread CPU
ms at b=2 of (P) the profile's way: one block, the same input, 9 repeats, median; (Pf) the same with the
private L2 evicted before each repeat (a buffer of 2x the L2 written, untimed); (S) a stage as the executor
runs it: 4 distinct blocks chained, 8 micro-batches' forwards kept alive then 8 backwards (GPipe), per block.
Prints per round and the medians of the ratios S/P, S/Pf. --concurrent: a second process runs the same at
the same time (the pipeline's other stage on the other core)."""

import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch
from small import SMALL


def l2_bytes():
    try:
        for idx in range(8):
            d = f"/sys/devices/system/cpu/cpu0/cache/index{idx}"
            if open(f"{d}/level").read().strip() == "2":
                s = open(f"{d}/size").read().strip()
                return int(s[:-1]) * (1024 if s.endswith("K") else 1024 * 1024)
    except OSError:
        pass
    return 2 * 2**20


def run(R, out=None, barrier=None):
    torch.set_num_threads(1)
    from executor.models import build_layers, get_config

    cfg = get_config("gpt-tiny").with_(**SMALL)
    blocks = [build_layers(cfg, 0, i, i + 1)[0].float().train() for i in range(1, 5)]
    x = torch.randn(2, cfg.seq, cfg.hidden)
    xs = [torch.randn(2, cfg.seq, cfg.hidden) for _ in range(8)]
    junk = torch.zeros(2 * l2_bytes() // 4)

    def one(flush):
        f, b = [], []
        for _ in range(11):
            if flush:
                junk.add_(1.0)
            inp = x.detach().requires_grad_()
            c0 = time.thread_time()
            y = blocks[0](inp)
            f.append(time.thread_time() - c0)
            if flush:
                junk.add_(1.0)
            c0 = time.thread_time()
            y.backward(torch.ones_like(y))
            b.append(time.thread_time() - c0)
        return statistics.median(f[2:]), statistics.median(b[2:])

    def stage():
        ff, bb = [], []
        for _it in range(3):
            keep = []
            for m in range(8):
                inp = xs[m].detach().requires_grad_()
                c0 = time.thread_time()
                y = inp
                for blk in blocks:
                    y = blk(y)
                ff.append((time.thread_time() - c0) / 4)
                keep.append(y)
            for y in keep:
                c0 = time.thread_time()
                y.backward(torch.ones_like(y))
                bb.append((time.thread_time() - c0) / 4)
            for blk in blocks:
                blk.zero_grad(set_to_none=True)
        return statistics.median(ff[8:]), statistics.median(bb[8:])

    one(False)
    stage()
    if barrier is not None:
        barrier.wait()
    rows = []
    for _r in range(R):
        p, pf, s = one(False), one(True), stage()
        rows.append((p, pf, s))
    if out is not None:
        out.put(rows)
    return rows


def report(rows, tag):
    for r, (p, pf, s) in enumerate(rows):
        print(
            f"{tag} round {r}: F P {p[0] * 1e3:.2f} Pf {pf[0] * 1e3:.2f} S {s[0] * 1e3:.2f} | B P {p[1] * 1e3:.2f} Pf {pf[1] * 1e3:.2f} S {s[1] * 1e3:.2f}"
        )
    med = statistics.median
    print(
        f"{tag} medians of ratios: F S/P {med(s[0] / p[0] for p, pf, s in rows):.3f} S/Pf {med(s[0] / pf[0] for p, pf, s in rows):.3f} Pf/P {med(pf[0] / p[0] for p, pf, s in rows):.3f}"
        f" | B S/P {med(s[1] / p[1] for p, pf, s in rows):.3f} S/Pf {med(s[1] / pf[1] for p, pf, s in rows):.3f} Pf/P {med(pf[1] / p[1] for p, pf, s in rows):.3f}"
    )


if __name__ == "__main__":
    R = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    print("load", os.getloadavg(), "L2", l2_bytes())
    if "--concurrent" in sys.argv:
        ctx = mp.get_context("spawn")
        q = ctx.Queue()
        bar = ctx.Barrier(2)
        ps = [ctx.Process(target=run, args=(R, q, bar)) for _ in range(2)]
        [p.start() for p in ps]
        res = [q.get() for _ in ps]
        [p.join() for p in ps]
        for i, rows in enumerate(res):
            report(rows, f"proc{i}")
    else:
        report(run(R), "alone")
    print("load", os.getloadavg())
