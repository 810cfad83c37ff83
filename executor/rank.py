"""Per-rank entry point: :func:`main`, run in each rank that :mod:`executor.supervise` forks (one supervisor
per node, started by :func:`executor.launch.launch`).

The spec names one or more plans, run in sequence on the same process group (the tests run several
schedules per launch). For each plan every rank: validates it against the world size, creates the
process groups (:mod:`executor.groups`), warms the point-to-point channels up (:func:`executor.comm.warm_up`
over the world, then :func:`executor.comm.warm_up_pairs` between neighbouring ranks), builds its stage
replicas and walks its lowered list for the iterations under the spec's posting policy
(:mod:`executor.interpreter`, :mod:`executor.p2p_order`), each iteration starting after a barrier; then the
per-action times (and, with ``check``, the parameters) are gathered on rank 0, which summarises them
(:mod:`executor.trace`), compares with single-process training (:mod:`executor.reference`) and writes the
result (with the backend and the posting policy) atomically into the work directory (on a multi-node run:
the work directory of global rank 0's node).

Devices: gloo runs on the CPU. NCCL runs rank ``r`` on ``cuda:LOCAL_RANK`` (``torch.cuda.set_device`` before
the process group exists) and reports each rank's peak of ``torch.cuda.max_memory_allocated`` over the
measured iterations (reset before each) as ``peak_memory``; ``None`` on the CPU. The NCCL path has not been
run on a GPU yet.

Rendezvous (:func:`rendezvous_store`): the ranks of one node meet in a ``FileStore`` in the work directory
(no port to pick, so no port another process can take first); the ranks of several nodes in a ``TCPStore``
that global rank 0 serves at the launch's endpoint (so the endpoint is on node rank 0's host), every rank
checking that the store is its own job's (the rendezvous id). Both wait at most the spec's timeout, as does
``init_process_group``.

Failure: a rank that raises writes ``error-rank{r}.json`` (rank, time, error, traceback) into the work
directory and exits non-zero; the supervisor then stops the other ranks of the node and the launcher names
the first failing rank and its error (:mod:`executor.launch`).
"""

from __future__ import annotations

import gc
import json
import os
import socket
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from executor.comm import neighbour_pairs, warm_up, warm_up_pairs
from executor.groups import Layout, make_groups
from executor.interpreter import RankRuntime
from executor.p2p_order import default_policy
from executor.plan import RunPlan
from executor.trace import chrome_trace, summarize, write_json_atomic


class InjectedFault(RuntimeError):
    """Raised on purpose (tests of the failure path)."""


def run_plan(plan: RunPlan, rank: int, world: int, check: bool = False, fault: bool = False,
             with_trace: bool = False, backend: str = "gloo", policy: str | None = None,
             device: torch.device | None = None) -> dict[str, Any] | None:
    """Run one plan on this rank with the point-to-point ``policy`` (default: the backend's) and tensors on
    ``device`` (CPU by default); rank 0 returns the result (None elsewhere)."""
    policy = policy or default_policy(backend)
    device = device or torch.device("cpu")
    cuda = device.type == "cuda"
    sched = plan.validate(world)
    c = plan.spec.config
    layout = Layout.of(c)
    emulator = None
    if plan.emulate:
        from executor.emulate import Emulator

        emulator = Emulator(plan, plan.compute_schedule(), plan.emulate, plan.cluster)
        if emulator.comm == "emulated" and world > 1:  # time tokens need one clock: the ranks on one host
            hosts: list[Any] = [None] * world
            dist.all_gather_object(hosts, socket.gethostname())
            if len(set(hosts)) > 1:
                emulator.use_real_comm(f"ranks on {len(set(hosts))} hosts share no clock")
    tied = emulator is None and bool(plan.source().tied())
    groups = make_groups(sched, layout, rank, tied)
    warm_up(rank, world, device)
    warm_up_pairs(rank, neighbour_pairs(sched, layout.pairs), device)
    torch.manual_seed(plan.seed)
    rt = RankRuntime(plan, sched, rank, groups, emulator, policy, device)
    records = []
    cpu: list[float] = []  # process CPU time per iteration (this rank's threads, gloo's included)
    cpu_kinds: list[dict[str, float]] = []  # the walker thread's CPU time per action kind, per iteration
    peak: int | None = None
    with _quiet_collector() as pauses:
        for it in range(plan.warmup + plan.iterations):
            dist.barrier()
            if fault and it == 0:
                raise InjectedFault(f"injected fault on rank {rank}")
            measured = it >= plan.warmup
            if cuda and measured:
                torch.cuda.reset_peak_memory_stats(device)
            cpu0 = time.process_time()
            records.append(rt.iteration(it))
            cpu_kinds.append(rt.cpu_by_kind)
            cpu.append(time.process_time() - cpu0)
            if cuda and measured:
                peak = max(peak or 0, torch.cuda.max_memory_allocated(device))
    payload: dict[str, Any] = {
        "rank": rank, "host": socket.gethostname(), "device": rt.device, "data": rt.data_copy, "tensor": rt.tp,
        "records": records, "cpu_times": cpu, "cpu_by_kind": cpu_kinds,
        "peak_alive": rt.peak_alive, "peak_memory": peak, "version_log": rt.version_log,
        "weight_versions": {str(k): v.max_alive for k, v in rt.stash.items()},
        "gc": pauses.summary(),
    }
    if check and emulator is None:
        payload["params"] = rt.full_parameters()
    gathered: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(payload, gathered, dst=0)
    result = None
    if rank == 0:
        assert gathered is not None
        result = {"plan": plan.to_dict(), "schedule": sched.name, "world_size": world, "backend": backend,
                  "p2p": policy,
                  "measured": summarize(gathered, plan.warmup, emulator is not None),
                  "emulated": emulator is not None}
        if emulator is not None:
            result["predicted"] = emulator.predict()
            result["communication"] = emulator.comm
            #: whether the prediction costs the executor's own per-action overhead (the cluster's `executor`)
            result["overhead_costed"] = emulator.cluster.executor is not None
            result["ratio"] = result["measured"]["iteration_time"] / result["predicted"]["iteration_time"]
        #: per rank, the garbage collector's passes during the iterations (:func:`_quiet_collector`)
        result["gc"] = {p["rank"]: p["gc"] for p in gathered}
        result["version_log"] = {p["rank"]: p["version_log"] for p in gathered if p["version_log"]}
        result["weight_versions"] = {p["rank"]: p["weight_versions"] for p in gathered if p["weight_versions"]}
        if with_trace:
            result["trace"] = chrome_trace(gathered, emulator is not None)
        if check and emulator is None:
            result["check"] = check_against_reference(plan, gathered)
    dist.barrier()
    for g in groups.all():
        dist.destroy_process_group(g)
    return result


class _GCPauses:
    """The collector's passes per generation and their seconds (a ``gc.callbacks`` entry)."""

    def __init__(self) -> None:
        self.passes = [0, 0, 0]
        self.seconds = 0.0
        self._start = 0.0

    def callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.passes[info["generation"]] += 1
            self.seconds += time.perf_counter() - self._start

    def summary(self) -> dict[str, Any]:
        return {"passes": list(self.passes), "seconds": self.seconds}


@contextmanager
def _quiet_collector() -> Iterator[_GCPauses]:
    """Collect once and freeze what is alive (torch, the model, the process groups: hundreds of thousands of
    objects) out of the cyclic collector's reach for the iterations, and count its passes during them.
    Without it a full (generation 2) pass, due after enough allocations, traversed all of them inside an
    action: 190-300 ms in ranks 1 and 2 of ``pipeplan run -s zb-h1 -D 4 -N 8`` (an I of about 2 ms measured
    145-175 ms; the iteration 240-300 ms against 79 ms predicted). Passes during the iterations traverse only
    what they allocate; after them the frozen objects are unfrozen (the next plan of a launch freezes again; this
    one's model may be collected then). The planner pauses the collector likewise (``planner.gcpause.gc_paused``)."""
    gc.collect()
    gc.freeze()
    pauses = _GCPauses()
    gc.callbacks.append(pauses.callback)
    try:
        yield pauses
    finally:
        gc.callbacks.remove(pauses.callback)
        gc.unfreeze()


def check_against_reference(plan: RunPlan, gathered: list[dict[str, Any]]) -> dict[str, Any]:
    from executor.reference import compare, train_reference

    merged: dict[str, list[torch.Tensor]] = {}
    for p in sorted(gathered, key=lambda p: p["rank"]):
        for k, v in p["params"].items():
            merged.setdefault(k, []).extend(v)
    if plan.spec.config.schedule in ("pipedream", "pipedream-rr"):
        # per-micro-batch updates on stashed weights: compared with PipeDream's weight stashing computed in one
        # process with explicit weight versions, and with the same without stashing (which it must not equal)
        from executor.stash_reference import train_stashed_reference

        steps = plan.warmup + plan.iterations
        msg = compare(merged, train_stashed_reference(plan, steps))
        unstashed = compare(merged, train_stashed_reference(plan, steps, stash=False))
        return {"ok": msg is None, "differs_without_stash": unstashed is not None,
                "message": msg or "parameters equal weight stashing with explicit versions (one process)"}
    # 2BW: one window per iteration, drained before its update, is gradient accumulation over N
    ref = train_reference(plan, plan.warmup + plan.iterations)
    msg = compare(merged, ref)
    return {"ok": msg is None, "message": msg or "parameters equal single-process training"}


def rendezvous_store(rendezvous: dict[str, Any], rank: int, world: int, timeout: timedelta) -> dist.Store:
    """The store the ranks meet in: ``{"file": PATH}`` (one node) or ``{"endpoint": "host:port", "id": ID}``
    (several; global rank 0 serves it). Raises when the store at the endpoint belongs to another rendezvous
    id (a node of another job given the same endpoint)."""
    if "file" in rendezvous:
        return dist.FileStore(str(rendezvous["file"]), world)
    host, port = str(rendezvous["endpoint"]).rsplit(":", 1)
    store = dist.TCPStore(host, int(port), world, is_master=rank == 0, timeout=timeout)
    if rank == 0:
        store.set("pipeplan/rendezvous-id", str(rendezvous["id"]))
    theirs = store.get("pipeplan/rendezvous-id").decode()
    if theirs != str(rendezvous["id"]):
        raise RuntimeError(f"the rendezvous at {rendezvous['endpoint']} is {theirs!r}'s, this node was launched "
                           f"for {rendezvous['id']!r}")
    return store


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    workdir = Path(spec["workdir"])
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    backend = str(spec.get("backend", "gloo"))
    try:
        torch.set_num_threads(int(spec.get("threads", 1)))
        device = torch.device("cpu")
        if backend == "nccl":  # one GPU per local rank, chosen before the communicators exist
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        timeout = timedelta(seconds=float(spec["timeout"]))
        store = rendezvous_store(spec["rendezvous"], rank, world, timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        results = []
        for i, pd in enumerate(spec["plans"]):
            fault = spec.get("fault_rank") == rank and spec.get("fault_plan", 0) == i
            results.append(run_plan(RunPlan.from_dict(pd), rank, world, check=bool(spec.get("check")),
                                    fault=fault, with_trace=bool(spec.get("trace")), backend=backend,
                                    policy=spec.get("p2p"), device=device))
        if rank == 0:
            write_json_atomic(str(workdir / "result.json"), {"runs": results})
        dist.barrier()
        dist.destroy_process_group()
    except BaseException as e:
        write_json_atomic(str(workdir / f"error-rank{rank}.json"),
                          {"rank": rank, "time": time.time(), "error": f"{type(e).__name__}: {e}",
                           "traceback": traceback.format_exc()})
        raise
    return 0

