"""A local cluster description measured the way its jobs run (issue 13 item 2): links among as many gloo
processes at once as the cluster has devices, and the executor's per-action overhead on that many.

The example ``local-cpu-4`` file carries a link measured on a quiet machine with 2 processes (70 us, 5.7
GB/s); a job runs 4 processes sharing this machine's cores, where one message costs milliseconds
(``pipeplan profile-links --local-procs 4``: all-reduce ~3.4 ms, 0.29 GB/s, issue 13). Here the same
benchmark (:mod:`profiler.links`, Chimera 3.4's alpha-beta fit) and the same overhead measurement
(:mod:`profiler.overhead`) run with the cluster's process count, and the result replaces the file's
``intra``/``inter`` links (point-to-point fit), sets ``allreduce_fit`` (the collective's own fit at that
world size: on a CPU its latency is not ``2 log2(r)`` p2p latencies) and ``executor``.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from planner.cluster import AllReduceFit, Cluster, Link

#: message sizes of the quick measurement: 1 KiB .. 4 MiB (gpt-tiny's activations are 128 KiB per sample,
#: its gradients ~14 MB)
QUICK_SIZES = [2**10, 2**14, 2**18, 2**20, 2**22]


def measure_links(procs: int, sizes: list[int] | None = None, repeats: int = 5, warmup: int = 2,
                  timeout: float = 60.0) -> dict[str, Any]:
    """:func:`profiler.links.benchmark_links` on ``procs`` spawned local gloo processes (rank 0's result)."""
    import torch.multiprocessing as mp

    from profiler.links import free_port, spawn_worker

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "links.json")
        args = (procs, f"tcp://127.0.0.1:{free_port()}", out, sizes or QUICK_SIZES, repeats, warmup, timeout)
        mp.spawn(spawn_worker, args=args, nprocs=procs, join=True)
        return json.loads(Path(out).read_text())


def measured_cluster(base: Cluster, overhead_iterations: int = 10) -> tuple[Cluster, dict[str, Any]]:
    """``base`` with links, all-reduce fit and executor overhead measured on ``base.gpus`` local gloo
    processes (one node: ``intra`` and ``inter`` both get the point-to-point fit); and the raw figures."""
    import platform

    from profiler.overhead import measure_overhead

    procs = base.gpus
    links = measure_links(procs)
    p2p = Link(alpha=max(links["intra_node"]["alpha"], 0.0), beta=max(links["intra_node"]["beta"], 0.0))
    ar = Link(alpha=max(links["allreduce"]["alpha"], 0.0), beta=max(links["allreduce"]["beta"], 0.0))
    ex, raw = measure_overhead(procs=procs, iterations=overhead_iterations, warmup=3)
    note = (f"measured by pipeplan seed on {platform.node()} with {procs} gloo processes at once (as the jobs "
            f"run): p2p alpha {p2p.alpha * 1e6:.0f} us, {1 / p2p.beta / 1e9 if p2p.beta else float('inf'):.2f} "
            f"GB/s; all-reduce of {procs} alpha {ar.alpha * 1e6:.0f} us, "
            f"{1 / ar.beta / 1e9 if ar.beta else float('inf'):.2f} GB/s; executor overhead per action; a shared "
            f"machine's load is in these figures. Peak FLOP/s and memory from the example file.")
    cluster = base.model_copy(update={"intra": p2p, "inter": p2p, "executor": ex, "notes": note,
                                      "allreduce_fit": AllReduceFit(ranks=procs, link=ar)})
    return Cluster.model_validate(cluster.model_dump()), {"links": links, "executor_raw": raw}
