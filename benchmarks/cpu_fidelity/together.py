# ruff: noqa: E402, E501, E741, B007, B023
"""Does a process's compute cost more core time while the other core computes too? R rounds: rank 0 runs the
work alone (rank 1 waits at a barrier), then both run it at once; thread CPU per repetition. Works: the host
probe's loop (profiler.local_cluster._compute: 128x512 MLP, fits the private L2) and a gpt-small block's
forward+backward at b=2 (3 MB of weights)."""

import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from small import SMALL


def make(kind):
    import torch

    torch.set_num_threads(1)
    if kind == "mlp":
        from profiler.local_cluster import _compute

        return _compute()
    from executor.models import build_layers, get_config

    cfg = get_config("gpt-tiny").with_(**SMALL)
    blocks = [build_layers(cfg, 0, i, i + 1)[0].float().train() for i in range(1, 5)]
    x = torch.randn(2, cfg.seq, cfg.hidden)

    def once():
        y = x.detach().requires_grad_()
        for b in blocks:
            y = b(y)
        y.backward(torch.ones_like(y))

    if kind == "fwd8":  # forwards only, 8 earlier ones alive (as a stage runs them)
        alive = []

        def fwd():
            y = x.detach().requires_grad_()
            for b in blocks:
                y = b(y)
            alive.append(y)
            del alive[:-8]

        return fwd
    return once


def worker(rank, kind, bar, q, R, reps):
    once = make(kind)
    for _ in range(3):
        once()
    out = []
    for _ in range(R):
        bar.wait()
        alone = 0.0
        if rank == 0:
            c0 = time.thread_time()
            for _ in range(reps):
                once()
            alone = (time.thread_time() - c0) / reps
        bar.wait()
        c0, w0 = time.thread_time(), time.perf_counter()
        for _ in range(reps):
            once()
        out.append((alone, (time.thread_time() - c0) / reps, (time.perf_counter() - w0) / reps))
    q.put((rank, out))


if __name__ == "__main__":
    R = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    print("load", os.getloadavg())
    ctx = mp.get_context("spawn")
    for kind, reps in [(k, {"mlp": 150, "block": 8, "fwd8": 24}[k]) for k in (sys.argv[2].split(",") if len(sys.argv) > 2 else ["mlp", "block"])]:
        q, bar = ctx.Queue(), ctx.Barrier(2)
        ps = [ctx.Process(target=worker, args=(r, kind, bar, q, R, reps)) for r in range(2)]
        [p.start() for p in ps]
        got = dict(q.get() for _ in ps)
        [p.join() for p in ps]
        ratios = [got[0][i][1] / got[0][i][0] for i in range(R)]
        wall = [statistics.mean(got[r][i][2] / got[r][i][1] for r in (0, 1)) for i in range(R)]
        print(
            f"{kind}: rank 0 CPU time together / alone per round: {' '.join(f'{x:.3f}' for x in ratios)} "
            f"(median {statistics.median(ratios):.3f}); wall/CPU together {statistics.median(wall):.3f}; "
            f"alone {statistics.median(got[0][i][0] for i in range(R)) * 1e3:.2f} ms"
        )
    print("load", os.getloadavg())
