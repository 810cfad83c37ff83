# ruff: noqa: E402, E501, E741, B007, B023
"""Which cache effect makes a block slower inside a stack? Per block forward and backward (thread CPU, b=2,
median of 9), alternating over 5 rounds: (1) the profile's way: one block, same input; (2) the same with the
private L2 flushed before each repeat (an 8 MiB buffer written, untimed); (3) a stack of 4 distinct blocks
chained (per block); (4) the same block chained 4 times (per block); (5) 4 distinct blocks, each on the
same input (not chained)."""

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch

torch.set_num_threads(1)
from small import SMALL

from executor.models import build_layers, get_config

cfg = get_config("gpt-tiny").with_(**SMALL)
blocks = [build_layers(cfg, 0, i, i + 1)[0].float().train() for i in range(1, 5)]
x = torch.randn(2, cfg.seq, cfg.hidden)
junk = torch.zeros(2 * 2**20)  # 8 MiB


def flush():
    junk.add_(1.0)


def chain(mods):
    y = x.detach().requires_grad_()
    for m in mods:
        y = m(y)
    return y


def separate(mods):
    return [m(x.detach().requires_grad_()) for m in mods]


def timed(fn, pre=None, back=False):
    out = []
    for _ in range(9):
        if pre:
            pre()
        if back:
            y = fn()
            ys = y if isinstance(y, list) else [y]
            c0 = time.thread_time()
            torch.autograd.backward(ys, [torch.ones_like(v) for v in ys])
            out.append(time.thread_time() - c0)
        else:
            c0 = time.thread_time()
            fn()
            out.append(time.thread_time() - c0)
    return statistics.median(out)


cases = {
    "1 block (profile)": (lambda: blocks[0](x.detach().requires_grad_()), None, 1),
    "1 block, L2 flushed": (lambda: blocks[0](x.detach().requires_grad_()), flush, 1),
    "4 distinct chained": (lambda: chain(blocks), None, 4),
    "4 distinct chained, flushed": (lambda: chain(blocks), flush, 4),
    "same block x4 chained": (lambda: chain([blocks[0]] * 4), None, 4),
    "4 distinct, same input": (lambda: separate(blocks), None, 4),
}
for fn, pre, k in cases.values():
    timed(fn, pre)
    timed(fn, pre, True)
print("load", os.getloadavg())
res = {n: ([], []) for n in cases}
for _r in range(5):
    for n, (fn, pre, k) in cases.items():
        res[n][0].append(timed(fn, pre) / k)
        res[n][1].append(timed(fn, pre, True) / k)
for n, (f, b) in res.items():
    print(
        f"{n:<30} F per block {statistics.median(f) * 1e3:.2f} ms (rounds {' '.join(f'{v * 1e3:.2f}' for v in f)})  "
        f"B {statistics.median(b) * 1e3:.2f} ({' '.join(f'{v * 1e3:.2f}' for v in b)})"
    )
print("load", os.getloadavg())
