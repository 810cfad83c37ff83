"""Timing of one callable: warm-up, repeats, median and spread.

On CUDA each repeat is bracketed by ``torch.cuda.Event``s recorded on the current stream and the end event
is synchronised; on CPU ``time.perf_counter`` is used (CPU ops are synchronous). PipeDream (section 3.1)
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
            t0 = time.perf_counter()
            op(state)
            elapsed = time.perf_counter() - t0
        del state
        if i >= warmup:
            samples.append(elapsed)
    return summarize(samples)
