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

from planner.gcpause import gc_paused


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
            with gc_paused():  # a garbage-collector pass inside the timed call is not the op's time
                t0 = clock()
                op(state)
                elapsed = clock() - t0
        del state
        if i >= warmup:
            samples.append(elapsed)
    return summarize(samples)


#: cycles of the sleep kernel :func:`time_queued` holds the GPU with while the host issues the timed calls
#: (``torch.cuda._sleep``: ~3 ms at an H100's 1980 MHz, more at lower clocks)
BLOCKER_CYCLES = 6_000_000


@dataclass(frozen=True)
class Queued:
    """:func:`time_queued`'s result: GPU seconds per call (the kernels alone), the host's seconds to issue
    one call, and whether every call was issued before the sleep kernel ended (else the GPU waited for the
    host and ``gpu_s`` includes dispatch)."""

    gpu_s: float
    host_s: float
    valid: bool


def time_queued(op: Callable[[], Any], device: torch.device, calls: int = 10, tries: int = 3,
                blocker_cycles: int = BLOCKER_CYCLES) -> Queued:
    """Seconds of ``op``'s kernels alone: on CUDA, ``calls`` calls issued while a sleep kernel holds the GPU,
    between two events recorded after the sleep, so the events see only the kernels back to back and none of
    the host's dispatch (:func:`time_op` synchronises first, so a call shorter than its own dispatch is timed
    as the dispatch: on a lent H100 every GEMM took >= 31 us that way, a 64^3 one too; benchmarks/
    DEVICE_CHECK.md, 'Runs'). The median of ``tries``; a blocker too short for the host is doubled and the
    try repeated (up to 4 times). On the CPU the op runs where it is issued: the wall time per call, for
    both figures."""
    if calls < 1 or tries < 1:
        raise ValueError("calls and tries must be >= 1")
    op()  # warm-up: first-call set-up (kernel selection, allocator) is not the op's time
    if device.type != "cuda":
        runs = []
        for _ in range(tries):
            t = time.perf_counter()
            for _ in range(calls):
                op()
            runs.append((time.perf_counter() - t) / calls)
        per = float(np.median(runs))
        return Queued(gpu_s=per, host_s=per, valid=True)
    gpu, host, valid = [], [], True
    cycles = blocker_cycles
    for _ in range(tries):
        for _attempt in range(5):
            ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
            torch.cuda.synchronize(device)
            ev[0].record()
            torch.cuda._sleep(cycles)
            ev[1].record()
            t = time.perf_counter()
            ev[2].record()
            for _ in range(calls):
                op()
            ev[3].record()
            issued = time.perf_counter() - t
            ev[3].synchronize()
            if issued < ev[0].elapsed_time(ev[1]) / 1e3:
                break
            cycles *= 2  # the host outran the blocker: hold the GPU longer and try again
        else:
            valid = False
        gpu.append(ev[2].elapsed_time(ev[3]) / 1e3 / calls)
        host.append(issued / calls)
    return Queued(gpu_s=float(np.median(gpu)), host_s=float(np.median(host)), valid=valid)
