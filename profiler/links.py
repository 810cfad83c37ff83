"""Link micro-benchmark: point-to-point and all-reduce times over message sizes, fitted to alpha + beta n.

The alpha-beta (Hockney) model ``T(n) = alpha + beta n`` (latency ``alpha`` seconds, ``beta`` seconds per
byte) is the one Chimera's performance model uses for communication (Chimera section 3.4, eq. 1 and the
Rabenseifner all-reduce cost in the notes). We fit it by least squares (numpy) to the median times and
report the root-mean-square residual (:func:`fit_alpha_beta`).

* point-to-point: ping-pong between ranks 0 and 1 (rank 0 sends, rank 1 receives and sends back), one
  way = round trip / 2. Labelled ``intra_node`` when both ranks run on the same host, else ``inter_node``.
* all-reduce: ``all_reduce`` (sum) of an ``n``-byte fp32 tensor over all ranks, timed on rank 0 after a
  barrier. Its alpha/beta describe the whole collective at this world size (not per link).

Each size is timed ``warmup + repeats`` times and the minimum of the repeats is kept (noise from other
processes only adds time; on a shared 2-core machine the median is dominated by scheduling delays).

Output (JSON-able, what ``pipeplan profile-links`` writes)::

    {"backend": "gloo", "world_size": 2, "device": "cpu",
     "intra_node": {"alpha": s, "beta": s_per_byte, "residual": s, "relative_residual": x, "points": k},
     "allreduce": {...same keys...},
     "sizes": [bytes...], "p2p_times": [s...], "allreduce_times": [s...]}

Run it under ``torchrun --nproc-per-node 2 ...`` (``init_from_env``) or with ``torch.multiprocessing``
(:func:`spawn_worker`); ``init_process_group`` gets a short ``timeout`` so a missing peer fails fast.
"""

from __future__ import annotations

import json
import os
import socket
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

DEFAULT_SIZES = [2**k for k in range(10, 23, 2)]  # 1 KiB .. 4 MiB


def fit_alpha_beta(sizes: list[int], times: list[float], relative: bool = True) -> dict[str, float]:
    """Least-squares ``times ~ alpha + beta * sizes``.

    ``relative=True`` minimises the relative errors ``sum(((t_i - alpha - beta n_i) / t_i)^2)`` (each row of
    the system divided by ``t_i``): message sizes span decades, and an unweighted fit would let the largest
    messages decide alpha. ``residual`` is the RMS error in seconds, ``relative_residual`` the RMS relative
    error.
    """
    x = np.asarray(sizes, dtype=float)
    y = np.asarray(times, dtype=float)
    if len(x) < 2 or np.ptp(x) == 0:
        raise ValueError("need at least two distinct message sizes to fit alpha and beta")
    if np.any(y <= 0):
        raise ValueError("times must be > 0")
    w = 1.0 / y if relative else np.ones_like(y)
    a = np.stack([np.ones_like(x), x], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
    err = y - (alpha + beta * x)
    return {
        "alpha": float(alpha),
        "beta": float(beta),
        "residual": float(np.sqrt(np.mean(err**2))),
        "relative_residual": float(np.sqrt(np.mean((err / y) ** 2))),
        "points": len(x),
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _estimate(samples: list[float]) -> float:
    """The minimum of the repeats: delays from other processes (shared cores, scheduler) only add time,
    so the fastest repeat is the best estimate of what the link itself costs."""
    return float(np.min(samples))


def _p2p_time(buf: torch.Tensor, rank: int, repeats: int, warmup: int) -> float:
    """One-way time of ``buf`` between ranks 0 and 1 (ping-pong / 2); other ranks return 0."""
    samples = []
    for i in range(warmup + repeats):
        if rank == 0:
            _sync(buf.device)
            t0 = time.perf_counter()
            dist.send(buf, 1)
            dist.recv(buf, 1)
            _sync(buf.device)
            if i >= warmup:
                samples.append((time.perf_counter() - t0) / 2)
        elif rank == 1:
            dist.recv(buf, 0)
            dist.send(buf, 0)
    return _estimate(samples) if samples else 0.0


def _allreduce_time(buf: torch.Tensor, repeats: int, warmup: int) -> float:
    samples = []
    for i in range(warmup + repeats):
        dist.barrier()
        _sync(buf.device)
        t0 = time.perf_counter()
        dist.all_reduce(buf)
        _sync(buf.device)
        if i >= warmup:
            samples.append(time.perf_counter() - t0)
    return _estimate(samples)


def benchmark_links(sizes: list[int] | None = None, repeats: int = 5, warmup: int = 2) -> dict[str, Any]:
    """Run on every rank of an initialised process group (>= 2 ranks); all ranks get rank 0's result."""
    sizes = sorted(sizes or DEFAULT_SIZES)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world < 2:
        raise ValueError("the link benchmark needs at least 2 processes")
    backend = str(dist.get_backend())
    device = torch.device(f"cuda:{torch.cuda.current_device()}") if backend == "nccl" else torch.device("cpu")
    p2p, allreduce = [], []
    for n in sizes:
        buf = torch.ones(max(1, n // 4), dtype=torch.float32, device=device)
        p2p.append(_p2p_time(buf, rank, repeats, warmup))
        allreduce.append(_allreduce_time(buf, repeats, warmup))
    hosts: list[Any] = [None] * world
    dist.all_gather_object(hosts, socket.gethostname())
    link = "intra_node" if hosts[0] == hosts[1] else "inter_node"
    actual = [max(1, n // 4) * 4 for n in sizes]
    result: dict[str, Any] = {
        "backend": backend,
        "world_size": world,
        "device": device.type,
        link: fit_alpha_beta(actual, p2p) if rank == 0 else {},
        "allreduce": fit_alpha_beta(actual, allreduce),
        "sizes": actual,
        "p2p_times": p2p,
        "allreduce_times": allreduce,
    }
    shared = [result]
    dist.broadcast_object_list(shared, src=0)
    return shared[0]


def init_from_env(backend: str | None = None, timeout_s: float = 60.0) -> None:
    """``init_process_group`` from torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
    backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))


def spawn_worker(
    rank: int,
    world_size: int,
    init_method: str,
    out: str,
    sizes: list[int] | None = None,
    repeats: int = 5,
    warmup: int = 2,
    timeout_s: float = 30.0,
) -> None:
    """Entry point for ``torch.multiprocessing.spawn`` (gloo): benchmark and let rank 0 write ``out``."""
    dist.init_process_group(
        "gloo",
        init_method=init_method,
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )
    try:
        result = benchmark_links(sizes, repeats, warmup)
        if rank == 0:
            Path(out).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        dist.destroy_process_group()


def free_port() -> int:
    """A free TCP port on localhost (for a ``tcp://127.0.0.1:port`` init method)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
