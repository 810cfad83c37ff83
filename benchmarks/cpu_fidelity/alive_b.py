# ruff: noqa: E402, E501, E741, B007, B023
"""Backward of one block (b=2, thread CPU, median of 9), alternating R rounds: (fresh) the backward right after
its forward, as the profile times it; (fifo-K) K forwards kept alive and the oldest one's backward timed
(a pipeline's order: micro-batches backpropagated first in, first out)."""

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import torch

torch.set_num_threads(1)

from small import alternate, small_block

cfg, blk, x = small_block()
g = torch.ones(2, cfg.seq, cfg.hidden)


def run(keep):
    alive, out = [], []
    for _i in range(11 + keep):
        alive.append(blk(x.detach().requires_grad_()))
        if len(alive) > keep:
            y = alive.pop(0)
            c0 = time.thread_time()
            y.backward(g)
            out.append(time.thread_time() - c0)
    return statistics.median(out[-9:])


alternate(run, ("fresh", "fifo-8", "fifo-2"), int(sys.argv[1]) if len(sys.argv) > 1 else 8)
