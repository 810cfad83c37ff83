"""Measurement: per-action ``time.perf_counter`` start/end on every rank, gathered to rank 0, turned into
the figures the simulator predicts (same keys: ``makespan`` -> ``iteration_time``, ``bubble_ratio``,
``devices`` [{busy, idle, peak_activations, peak_memory}]) and a Chrome-trace JSON (one track per rank,
opens in Perfetto / chrome://tracing).

Clocks: ``perf_counter`` is ``CLOCK_MONOTONIC``, shared by the processes of one machine; every iteration
starts after a barrier, and its time is from the earliest start to the latest end over the ranks. On GPUs the
stamps are CUDA events placed on that clock (:class:`executor.interpreter.CudaClock`). Clocks of different
machines are unrelated, so the records of a rank on another host than rank 0 are shifted, per iteration, to
start when rank 0's do (:func:`align_hosts`; both start right after the same barrier, so the error is the
barrier's exit skew).
Busy time is compute: F/B/I/W and the optimizer's own update (not the waits inside STEP), as the
simulator counts it; the bubble ratio is ``1 - sum(busy) / (D * iteration_time)`` over the D pipeline
devices of data-parallel copy 0, tensor rank 0 (the devices the simulator times).

CPU: ``cpu_time`` is the median over the measured iterations of the process CPU time of all ranks together
(``time.process_time``, every thread of the process, gloo's included): the work an iteration costs the host's
cores, which a shared machine's load does not lengthen as it does wall time.

Memory: ``peak_memory`` per rank (``measured.peak_memory[rank]`` and in ``ranks``/``devices``) is the
peak of ``torch.cuda.max_memory_allocated`` over the measured iterations on GPUs, ``None`` on the CPU.
"""

from __future__ import annotations

import json
import statistics
from typing import Any

COMPUTE = {"F", "B", "I", "W", "OPT"}


def align_hosts(payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``payloads`` with the records of ranks on another host than rank 0 (``host`` field) moved onto rank
    0's clock: each iteration's first record starts when rank 0's does. Same host: unchanged."""
    ref = min(payloads, key=lambda p: p["rank"])
    out = []
    for p in payloads:
        if p.get("host") == ref.get("host"):
            out.append(p)
            continue
        records = []
        for it, rec in enumerate(p["records"]):
            shift = ref["records"][it][0][2] - rec[0][2]
            records.append([(n, k, s + shift, e + shift) for n, k, s, e in rec])
        out.append({**p, "records": records})
    return out


def summarize(payloads: list[dict[str, Any]], warmup: int, emulated: bool) -> dict[str, Any]:
    """Figures over the measured iterations (after ``warmup``); medians over iterations."""
    payloads = align_hosts(payloads)
    n_iter = len(payloads[0]["records"])
    measured = list(range(warmup, n_iter)) or list(range(n_iter))
    times, per_rank_busy = [], {p["rank"]: [] for p in payloads}
    for it in measured:
        start = min(p["records"][it][0][2] for p in payloads)
        end = max(p["records"][it][-1][3] for p in payloads)
        times.append(end - start)
        for p in payloads:
            per_rank_busy[p["rank"]].append(sum(e - s for _, k, s, e in p["records"][it] if k in COMPUTE))
    it_time = statistics.median(times)
    ranks = []
    for p in sorted(payloads, key=lambda p: p["rank"]):
        busy = statistics.median(per_rank_busy[p["rank"]])
        ranks.append({"rank": p["rank"], "device": p["device"], "data": p["data"], "tensor": p["tensor"],
                      "busy": busy, "idle": max(it_time - busy, 0.0), "peak_activations": p["peak_alive"],
                      "peak_memory": p.get("peak_memory")})
    devices = sorted((r for r in ranks if r["data"] == 0 and r["tensor"] == 0), key=lambda r: r["device"])
    # CPU time of all ranks per iteration (process time: unlike wall time, not lengthened by waiting for a core)
    cpu = [sum(p["cpu_times"][it] for p in payloads) for it in measured] if all(
        len(p.get("cpu_times") or []) == n_iter for p in payloads) else []
    D = len(devices)
    bubble = 1.0 - sum(d["busy"] for d in devices) / (D * it_time) if it_time > 0 and D else 0.0
    return {"iteration_time": it_time, "iteration_times": times, "bubble_ratio": bubble,
            "devices": devices, "ranks": ranks, "peak_memory": [r["peak_memory"] for r in ranks],
            "cpu_time": statistics.median(cpu) if cpu else None,
            "time_by_kind": time_by_kind(payloads, measured),
            "cpu_by_kind": cpu_by_kind(payloads, measured),
            "emulated": emulated}


def _kind_group(kind: str) -> str:
    """The kind a record counts under in :func:`time_by_kind` and :func:`cpu_by_kind`: RECV_F and RECV_B
    as ``RECV``, SEND_F and SEND_B as ``SEND``, any other as itself."""
    return "RECV" if kind.startswith("RECV") else "SEND" if kind.startswith("SEND") else kind


def cpu_by_kind(payloads: list[dict[str, Any]], measured: list[int]) -> dict[str, float] | None:
    """The walker thread's CPU seconds per rank and iteration in each action kind (median over the measured
    iterations of the mean over ranks; STEP includes its optimizer): against :func:`time_by_kind`, the
    wall time an action took beyond the core time it used is waiting -- for a core (a shared host), a
    message or a collective. None when the ranks did not record it."""
    if not all(len(p.get("cpu_by_kind") or []) == len(p["records"]) for p in payloads):
        return None
    per_iter: dict[str, list[float]] = {}
    for it in measured:
        sums: dict[str, float] = {}
        for p in payloads:
            for k, v in p["cpu_by_kind"][it].items():
                k = _kind_group(k)
                sums[k] = sums.get(k, 0.0) + v / len(payloads)
        for k, v in sums.items():
            per_iter.setdefault(k, []).append(v)
    return {k: statistics.median(v) for k, v in sorted(per_iter.items())}


def time_by_kind(payloads: list[dict[str, Any]], measured: list[int]) -> dict[str, float]:
    """Where the time went: seconds per rank and iteration in each record kind (the median over the measured
    iterations of the mean over ranks). ``RECV`` is waiting for messages (RECV_F and RECV_B), ``POST`` the
    posting of p2p groups, ``SEND`` what is left of a send at its action; ``OPT`` (the optimizer) runs
    inside ``STEP``, so ``STEP`` is given without it (waiting for sends and all-reduces, the tied
    all-reduce); ``other``: the rest of the iteration (between records, and from the iteration's start --
    the earliest rank's -- to this rank's first record and from its last record to the iteration's end)."""
    per_iter: dict[str, list[float]] = {}
    for it in measured:
        start = min(p["records"][it][0][2] for p in payloads)
        end = max(p["records"][it][-1][3] for p in payloads)
        sums: dict[str, float] = {}
        for p in payloads:
            for _, kind, s, e in p["records"][it]:
                k = _kind_group(kind)
                sums[k] = sums.get(k, 0.0) + (e - s)
        if "OPT" in sums and "STEP" in sums:
            sums["STEP"] -= sums["OPT"]
        n = len(payloads)
        sums = {k: v / n for k, v in sums.items()}
        sums["other"] = max(end - start - sum(sums.values()), 0.0)
        for k, v in sums.items():
            per_iter.setdefault(k, []).append(v)
    return {k: statistics.median(v) for k, v in sorted(per_iter.items())}


def chrome_trace(payloads: list[dict[str, Any]], emulated: bool) -> dict[str, Any]:
    """Chrome trace-event JSON: complete events ("X") in microseconds, one thread (track) per rank."""
    payloads = align_hosts(payloads)
    t0 = min(p["records"][0][0][2] for p in payloads)
    events: list[dict[str, Any]] = []
    for p in sorted(payloads, key=lambda p: p["rank"]):
        tid = p["rank"]
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid,
                       "args": {"name": f"rank {tid} (device {p['device']}, copy {p['data']}, tp {p['tensor']})"}})
        for it, rec in enumerate(p["records"]):
            for name, kind, s, e in rec:
                events.append({"name": name, "cat": kind, "ph": "X", "pid": 0, "tid": tid,
                               "ts": (s - t0) * 1e6, "dur": max(e - s, 0.0) * 1e6, "args": {"iteration": it}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"producer": "pipeplan run", "emulated": emulated}}


def write_json_atomic(path: str, data: Any) -> None:
    """Temp file in the same directory + rename: a reader never sees half a file."""
    import os
    import tempfile

    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=d)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
