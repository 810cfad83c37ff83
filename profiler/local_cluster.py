"""A local cluster description measured the way its jobs run (issue 13 item 2): links among as many gloo
processes at once as the cluster has devices, and the executor's per-action overhead on that many.

The example ``local-cpu-4`` file once carried a link measured on a quiet machine with 2 processes (70 us, 5.7
GB/s); a job runs 4 processes sharing this machine's cores, where one message costs milliseconds
(``pipeplan profile-links --local-procs 4``: all-reduce ~3.4 ms, 0.29 GB/s, issue 13). The file now holds a
snapshot of :func:`measured_cluster` (its ``notes`` give the command and the load). Here the same
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

from planner.cluster import AllReduceFit, Cluster, ExecutorOverhead, HostCpu, Link

#: message sizes of the quick measurement: 1 KiB .. 4 MiB (gpt-tiny's activations are 128 KiB per sample,
#: its gradients ~14 MB)
QUICK_SIZES = [2**10, 2**14, 2**18, 2**20, 2**22]


def _fork_ranks(target: Any, arglist: list[tuple[Any, ...]], preload: tuple[str, ...]) -> None:
    """The one spawned process of :func:`_spawn_ranks`: import ``preload`` once, then fork a process per
    entry of ``arglist`` running ``target`` on it (each dies with this one), and wait for them all."""
    import importlib
    import multiprocessing as mp
    import os

    for module in preload:
        importlib.import_module(module)
    ctx = mp.get_context("fork")
    ps = [ctx.Process(target=_forked, args=(os.getpid(), target, args)) for args in arglist]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    raise SystemExit(max(p.exitcode != 0 for p in ps))


def _forked(parent: int, target: Any, args: tuple[Any, ...]) -> None:
    from executor.runguard import die_with_parent

    if die_with_parent(parent):
        target(*args)


def _spawn_ranks(target: Any, procs: int, args: Any, timeout: float,
                 preload: tuple[str, ...] = ("torch",)) -> list[Any]:
    """Run ``target(*args(rank, queue))`` in ``procs`` processes and return what each put on the queue (one
    item per process, in arrival order). The processes are forked from one spawned process that imported
    ``preload`` first, so torch is imported once rather than ``procs`` times (~3 s of CPU each on the 2-core
    CI machine: it halved the CPU time of seeding's link and host measurements, issue 11's closing note of
    session 31); they start together as before and measure nothing until every one is ready (the targets
    meet at a barrier or a process group). Raises when a process failed without putting its item."""
    import multiprocessing as mp
    import queue as queues
    import time

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    parent = ctx.Process(target=_fork_ranks, args=(target, [args(r, queue) for r in range(procs)], preload))
    parent.start()
    got: list[Any] = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < procs:
            try:
                got.append(queue.get(timeout=0.5))
                continue
            except queues.Empty:
                pass
            if not parent.is_alive():  # ended: what it left in the queue is readable now or never
                try:
                    got.append(queue.get(timeout=1.0))
                    continue
                except queues.Empty:
                    raise RuntimeError(f"{target.__name__}: {procs - len(got)} of {procs} processes ended "
                                       f"without a result (exit code {parent.exitcode}; their error is above)"
                                       ) from None
            if time.monotonic() > deadline:
                raise RuntimeError(f"{target.__name__}: no result from {procs - len(got)} of {procs} processes "
                                   f"within {timeout:.0f} s")
        return got
    finally:
        parent.join(30)
        if parent.is_alive():
            parent.kill()  # its processes die with it
            parent.join()


def measure_links(procs: int, sizes: list[int] | None = None, repeats: int = 5, warmup: int = 2,
                  timeout: float = 60.0) -> dict[str, Any]:
    """:func:`profiler.links.benchmark_links` on ``procs`` local gloo processes (rank 0's result)."""
    from profiler.links import free_port

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "links.json")
        init = f"tcp://127.0.0.1:{free_port()}"
        _spawn_ranks(_links_worker, procs,
                     lambda r, queue: (r, queue, procs, init, out, sizes or QUICK_SIZES, repeats, warmup, timeout),
                     timeout * 3 + 60, preload=("profiler.links",))
        return json.loads(Path(out).read_text())


def _links_worker(rank: int, queue: Any, *args: Any) -> None:
    from profiler.links import spawn_worker

    spawn_worker(rank, *args)
    queue.put((rank, None))


def _compute() -> Any:
    """A small fixed compute (a 128-wide two-layer MLP's forward and backward on 64 rows, one torch thread:
    the kind of work a CPU pipeline stage does), as a function to call."""
    import torch

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    a, w1, w2 = (torch.randn(64, 128, generator=g), torch.randn(128, 512, generator=g, requires_grad=True),
                 torch.randn(512, 128, generator=g, requires_grad=True))

    def once() -> None:
        (torch.nn.functional.gelu(a @ w1) @ w2).square().mean().backward()

    return once


def _host_worker(rank: int, barrier: Any, queue: Any, rounds: int, reps: int) -> None:
    """Round ``r``: rank 0 runs the loop alone (the others wait at the barrier), then every rank runs it;
    puts ``(rank, [(alone, together, together_cpu, alone_cpu), ...])`` seconds per repetition (rank 0's
    alone figures, wall and CPU; ``together_cpu``: the thread's CPU time, the core time the loop used)."""
    import time

    once = _compute()
    for _ in range(max(reps // 5, 2)):
        once()
    out = []
    for _ in range(rounds):
        barrier.wait(timeout=300)
        alone = alone_cpu = 0.0
        if rank == 0:
            t0, c0 = time.perf_counter(), time.thread_time()
            for _ in range(reps):
                once()
            alone, alone_cpu = (time.perf_counter() - t0) / reps, (time.thread_time() - c0) / reps
        barrier.wait(timeout=300)
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(reps):
            once()
        out.append((alone, (time.perf_counter() - t0) / reps, (time.thread_time() - c0) / reps, alone_cpu))
    queue.put((rank, out))


def round_slowdowns(got: dict[int, list[tuple[float, float, float]]], procs: int, rounds: int) -> list[float]:
    """Per round, the mean over the processes of wall / CPU time of the loop run together
    (:func:`_host_worker`'s figures by rank)."""
    return [sum(got[r][i][1] / max(got[r][i][2], 1e-9) for r in range(procs)) / procs for i in range(rounds)]


def round_inflations(got: dict[int, list[tuple[float, ...]]], procs: int, rounds: int) -> list[float]:
    """Per round, the mean over the processes of the loop's CPU time run together over rank 0's CPU time
    of it alone (:func:`_host_worker`'s figures by rank): the core time the same work costs more while the
    processes take turns on the cores (:attr:`planner.cluster.HostCpu.cpu_inflation`)."""
    return [sum(got[r][i][2] for r in range(procs)) / procs / max(got[0][i][3], 1e-9) for i in range(rounds)]


def measure_host(procs: int, rounds: int = 5, reps: int = 150) -> HostCpu:
    """The cores ``procs`` processes of this machine get at once (:class:`planner.cluster.HostCpu`): ``procs``
    processes are started once; in each of ``rounds`` rounds one of them runs a compute loop alone, then all
    of them run it together (behind barriers). ``slowdown`` = the median over rounds of the mean over the
    processes of (wall time of the loop together) / (its CPU time, ``time.thread_time``): the wall seconds
    a process needs per second of core time while ``procs`` of them and whatever else the machine runs
    share the cores (processor sharing); ``effective_cores = procs / slowdown``, at most the cores and at
    least ``1/procs`` of one. Known bias (issue 11, ``benchmarks/cpu_run_bench.py --interleave``, load
    8-12): this busy loop saw 4.4-8.3 wall seconds per CPU second with 2 processes where the pipeline runs
    minutes later saw 2.2-3.1 (their processes block on messages between actions; the scheduler favours
    such sleepers); the floor bounds it, and removing it made predictions 2-4x too slow. CPU time is the
    reference because profiles on the CPU are core time (:mod:`profiler.timing`; issue 11: the earlier
    reference, the loop's wall time alone, already carried the machine's load, which the profile's wall
    times carried a second time). The alone figure is reported in ``source``."""
    import multiprocessing as mp
    import os
    import platform
    import statistics

    cores = os.cpu_count() or 1
    barrier = mp.get_context("spawn").Barrier(procs)
    got = dict(_spawn_ranks(_host_worker, procs, lambda r, queue: (r, barrier, queue, rounds, reps), 600))
    ratios = round_slowdowns(got, procs, rounds)
    alones = [got[0][i][0] for i in range(rounds)]
    slowdown = max(statistics.median(ratios), 1e-9)
    eff = min(float(cores), max(procs / slowdown, 1.0 / procs))
    infl = round_inflations(got, procs, rounds)
    inflation = max(1.0, statistics.median(infl))
    return HostCpu(cores=cores, effective_cores=eff, processes=procs, slowdown=slowdown, cpu_inflation=inflation,
                   source=(f"profiler.local_cluster.measure_host on {platform.node()}: {procs} processes of one "
                           f"torch thread at once took {slowdown:.2f}x their CPU time in wall time (median of "
                           f"{rounds} rounds: {', '.join(f'{r:.2f}' for r in ratios)}; alone "
                           f"{statistics.median(alones) * 1e3:.2f} ms) and {statistics.median(infl):.2f}x its CPU "
                           f"time alone (rounds: {', '.join(f'{r:.2f}' for r in infl)}); a shared machine's load "
                           f"at that time is in the figures"))


def measure_step_bandwidth(params: int = 4_000_000, width: int = 512, rows: int = 64, repeats: int = 7) -> float:
    """Bytes per second of our executor's optimizer step as :meth:`planner.cost.ConfigCosts.step` counts them
    (reading and writing the model state, ``2 bytes_per_param`` per parameter: 16 for float32 SGD, a weight
    and a gradient, :func:`executor.emulate.executor_request`), measured the way the executor steps
    (:meth:`executor.interpreter.RankRuntime._step`): a chain of ``params / width^2`` ``Linear(width, width)``
    layers runs a forward and a backward on ``rows`` rows (untimed), so the gradients are freshly allocated
    and written by the backward and the caches hold what a backward leaves; then the executor's own
    optimizer's (:class:`executor.sgd.SGD`) ``step`` and ``zero_grad`` are timed, one torch thread, thread
    CPU time (core time, as profiles are: sharing the cores is the host model's part), median of
    ``repeats``. Issue 11 (cpufid3): the earlier probe stepped the same 16 tensors with the same gradients
    again and again (caches hot): 33-36 GB/s on the 2-core development machine, where this measures
    14-16 GB/s and a gpt-small stage's own step after its backwards took 2.3-3.1 ms for 3.3 M parameters
    (12-15 GB/s), 3.4 ms against the 1.4 ms predicted before. The cluster file's ``memory_bandwidth`` is
    nominal; this is what the step gets on this machine."""
    import statistics
    import time

    import torch

    from executor.sgd import SGD

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        layers = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(max(1, params // (width * width)))])
        x = torch.randn(rows, width, generator=torch.Generator().manual_seed(0))
        opt = SGD(layers.parameters(), lr=1e-6)
        total = sum(p.numel() for p in layers.parameters())
        times = []
        for i in range(repeats + 2):
            layers(x).square().mean().backward()
            c0 = time.thread_time()
            opt.step()
            opt.zero_grad()
            if i >= 2:
                times.append(time.thread_time() - c0)
    finally:
        torch.set_num_threads(before)
    return 2 * 8.0 * total / max(statistics.median(times), 1e-9)


def measured_cluster(base: Cluster, overhead_iterations: int = 10) -> tuple[Cluster, dict[str, Any]]:
    """``base`` with links, all-reduce fit, the host's cores and executor overhead measured on ``base.gpus``
    local gloo processes (one node: ``intra`` and ``inter`` both get the point-to-point fit); and the raw
    figures. The executor overhead is measured on as many processes as there are cores (at least 2); with
    layers that do nearly nothing those processes run the executor's Python nearly all the time, so each had
    ``min(1, effective_cores / n)`` of a core, and the figures are scaled by that to the overhead of a process
    with a core of its own: sharing the cores is the host model's part (:func:`planner.cost.host_share`),
    which would otherwise count it twice. The overhead with compute emulated (``executor.emulated``) is
    measured on all ``base.gpus`` processes at once, as emulated runs go (they sleep rather than compute:
    :func:`profiler.overhead.measure_emulated_overhead`)."""
    import os
    import platform

    from profiler.overhead import measure_emulated_overhead, measure_overhead, nearly_nothing

    procs = base.gpus
    links = measure_links(procs)
    p2p = Link(alpha=max(links["intra_node"]["alpha"], 0.0), beta=max(links["intra_node"]["beta"], 0.0))
    ar = Link(alpha=max(links["allreduce"]["alpha"], 0.0), beta=max(links["allreduce"]["beta"], 0.0))
    host = measure_host(procs)
    bandwidth = measure_step_bandwidth()
    n_ovh = max(2, min(procs, os.cpu_count() or 1))
    nearly = nearly_nothing(n_ovh, iterations=overhead_iterations, warmup=3)  # profiled once for both
    ex, raw = measure_overhead(procs=n_ovh, iterations=overhead_iterations, warmup=3, nearly=nearly)
    shared = max(1.0, n_ovh / host.effective_cores)

    def scaled(e: ExecutorOverhead) -> ExecutorOverhead:
        return e.model_copy(update={**{k: getattr(e, k) / shared for k in ("compute", "send", "recv", "allreduce",
                                                                             "step", "split_input", "split_weight")},
                                    "source": f"{e.source}; divided by {shared:.2f}, the core share of its {n_ovh} "
                                              f"processes at {host.effective_cores:.2f} effective cores"})

    # with compute emulated the processes sleep: measured on all of them at once, as the emulated runs go
    here = base.model_copy(update={"intra": p2p, "inter": p2p, "host": host})
    emu, raw["emulated"] = measure_emulated_overhead(procs, here, iterations=overhead_iterations, warmup=3,
                                                     nearly=nearly if procs == n_ovh else None)
    ex = scaled(ex).model_copy(update={"emulated": emu})
    raw["overhead_core_share"] = shared
    note = (f"measured by pipeplan seed on {platform.node()} with {procs} gloo processes at once (as the jobs "
            f"run): p2p alpha {p2p.alpha * 1e6:.0f} us, {1 / p2p.beta / 1e9 if p2p.beta else float('inf'):.2f} "
            f"GB/s; all-reduce of {procs} alpha {ar.alpha * 1e6:.0f} us, "
            f"{1 / ar.beta / 1e9 if ar.beta else float('inf'):.2f} GB/s; executor overhead per action; memory "
            f"bandwidth {bandwidth / 1e9:.1f} GB/s as the executor's optimizer step gets it (measure_step_bandwidth); "
            f"a shared machine's load is in these figures. Peak FLOP/s and memory size from the example file.")
    cluster = base.model_copy(update={"intra": p2p, "inter": p2p, "executor": ex, "notes": note,
                                      "memory_bandwidth": bandwidth,
                                      "allreduce_fit": AllReduceFit(ranks=procs, link=ar), "host": host})
    return Cluster.model_validate(cluster.model_dump()), {"links": links, "executor_raw": raw}


def _reserve_worker(rank: int, procs: int, init: str, queue: Any) -> None:
    """One executor process up to its first model: the executor's modules imported (torch, torch.distributed,
    :mod:`executor.rank` and what it imports), one torch thread, the gloo process group built and used once;
    then its resident and peak resident memory (``VmRSS``, ``VmHWM`` of ``/proc/self/status``, Linux)."""
    import torch
    import torch.distributed as dist

    import executor.rank  # noqa: F401  (what a rank imports before it builds a model)

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=procs)
    dist.all_reduce(torch.zeros(1))
    dist.barrier()
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    queue.put((rank, int(status["VmRSS"].split()[0]) * 1024, int(status["VmHWM"].split()[0]) * 1024))
    dist.barrier()
    dist.destroy_process_group()


def measure_reserve(procs: int = 4) -> dict[str, Any]:
    """The memory a CPU executor process holds before any model (the CPU default of
    :data:`planner.reserve.CPU_RESERVE_BYTES`): ``procs`` processes (:func:`_spawn_ranks`) each import what a
    rank of the executor imports, build the gloo process group and use it once (:func:`_reserve_worker`); per
    rank the resident set (``VmRSS``) and its peak (``VmHWM``), bytes. Linux only (``/proc``). Command::

        .venv/bin/python -c "from profiler.local_cluster import measure_reserve; print(measure_reserve(4))"
    """
    from profiler.links import free_port

    init = f"tcp://127.0.0.1:{free_port()}"
    got = sorted(_spawn_ranks(_reserve_worker, procs, lambda r, queue: (r, procs, init, queue), 300))
    return {"procs": procs, "rss": [g[1] for g in got], "peak_rss": [g[2] for g in got],
            "max_peak_rss": max(g[2] for g in got)}
