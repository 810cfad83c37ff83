"""Timing of one callable: warm-up, repeats, median and spread.

On CUDA each repeat is bracketed by ``torch.cuda.Event``s recorded on the current stream and the end event
is synchronised. On CPU (ops are synchronous) with one torch thread, the calling thread's CPU time
(``time.thread_time``): the core time the op costs, which a shared machine's load does not lengthen --
on this 2-core development machine under a load of 10 a gpt-small block's forward took 18 ms of wall time and
4.7 ms of CPU time (issue 11); turning core time into wall time for processes that share the cores is the
host model's part (:class:`planner.cluster.HostCpu`, :func:`planner.cost.host_share`), which would otherwise
count the load twice. With several intra-op threads their work is not in the caller's CPU time, so the wall
clock (``time.perf_counter``) is used then (:func:`cpu_clock` says which). PipeDream (section 3.1)
profiles each layer over many mini-batches and keeps the average; we keep the median, which is robust
to outliers on shared machines, and report the spread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class Timing:
    """Median seconds of the repeats and their spread: interquartile range / median."""

    median: float
    spread: float
    samples: tuple[float, ...]


def summarize(samples: list[float]) -> Timing:
    arr = np.asarray(samples, dtype=float)
    median = float(np.median(arr))
    q75, q25 = np.percentile(arr, [75, 25])
    spread = float((q75 - q25) / median) if median > 0 else 0.0
    return Timing(median=median, spread=spread, samples=tuple(samples))


def cpu_clock() -> tuple[str, Callable[[], float]]:
    """The CPU clock :func:`time_op` uses now (module docstring): ``("thread CPU time", time.thread_time)``
    with one torch thread, else ``("wall", time.perf_counter)``."""
    if torch.get_num_threads() == 1:
        return "thread CPU time", time.thread_time
    return "wall", time.perf_counter


def time_op(
    setup: Callable[[], Any],
    op: Callable[[Any], Any],
    device: torch.device,
    warmup: int = 2,
    repeats: int = 5,
) -> Timing:
    """Time ``op(setup())``: ``setup`` runs untimed before every call (e.g. the forward before a backward)."""
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    cuda = device.type == "cuda"
    clock = cpu_clock()[1]
    samples: list[float] = []
    for i in range(warmup + repeats):
        state = setup()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            start.record()
            op(state)
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1000.0
        else:
            t0 = clock()
            op(state)
            elapsed = clock() - t0
        del state
        if i >= warmup:
            samples.append(elapsed)
    return summarize(samples)
