# ruff: noqa: E402, E501, E741, B007, B023
"""One block's forward (b=2, thread CPU, median of 9 after 2), alternating R rounds: (free) each repeat's output
and graph freed before the next, as the profile does; (alive) the outputs and graphs of the last 8 repeats kept
alive, as GPipe keeps a stage's 8 micro-batches (the allocator cannot hand the same warm buffers back)."""

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch

torch.set_num_threads(1)

from small import alternate, small_block

cfg, blk, x = small_block()


def run(keep):
    alive, out = [], []
    for _i in range(11 + keep):
        inp = x.detach().requires_grad_()
        c0 = time.thread_time()
        y = blk(inp)
        d = time.thread_time() - c0
        alive.append(y)
        alive = alive[-keep:] if keep else []
        del y
        out.append(d)
    return statistics.median(out[-9:])


alternate(run, ("free", "alive-8", "alive-2"), int(sys.argv[1]) if len(sys.argv) > 1 else 8)
