"""Candidate timelines: predicted (re-simulated in a planner process, stored apart from the candidate) and
measured (parsed from the executor's Chrome trace).

A timeline is computed on first request by :func:`simulate_candidate` in one of the API's planner processes
(:meth:`api.planrun.PlanRunner.timeline`: its own process, memory limit and timeout, so the API process
stays responsive) and kept in the ``candidate_timelines`` table, never in the candidate record: a plan
document and a job claim stay the size they were. Timelines longer than ``MAX_TIMELINE_ACTIONS`` actions
are refused (422) rather than sent.
"""

from __future__ import annotations

import json
import math
from concurrent.futures import TimeoutError as FutureTimeout
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.orm import Session

from api import crud
from api.errors import InputError
from planner.jsondoc import integer, number, text

#: actions of one timeline document (about 40 bytes each in JSON): a few MB at most
MAX_TIMELINE_ACTIONS = 200_000


def simulate_candidate(profile: dict[str, Any], cluster: dict[str, Any], request: dict[str, Any],
                       cand: dict[str, Any]) -> dict[str, Any]:
    """Re-simulate one stored candidate; its timeline document (rows of [action, start, end(, peer)]).
    Runs in a planner process; raises ``ValueError`` for a candidate that cannot be shown."""
    from planner.cluster import Cluster
    from planner.profile import ModelProfile
    from planner.replicated import replica_rows
    from planner.request import TrainingRequest
    from planner.runspec import config_of
    from planner.search import predict

    # its run_spec's configuration (the flat fields beside it lack some, the expert-parallel size e among them)
    config = config_of(cand)
    got = predict(ModelProfile.model_validate(profile), Cluster.model_validate(cluster),
                  TrainingRequest.model_validate(request), config)
    if got.simulation is None:
        raise ValueError(f"candidate {config.label()} cannot be simulated: {got.reason or 'rejected'}")
    n = sum(len(row) for row in got.simulation.timeline)
    if n > MAX_TIMELINE_ACTIONS:
        raise ValueError(f"candidate {config.label()} has {n} timed actions, more than the {MAX_TIMELINE_ACTIONS} "
                         "a timeline shows; use `pipeplan simulate` or `pipeplan predict` for it")
    rows = []
    for row in got.simulation.timeline:
        out = []
        for a, s, e in row:
            if a.kind in ("RECV_F", "RECV_B"):  # instants (the arrival a compute waits for): the sends show it
                continue
            out.append([str(a), s, e, a.peer] if a.kind in ("SEND_F", "SEND_B") else [str(a), s, e])
        rows.append(out)
    stored = cand.get("iteration_time")
    same = stored is not None and abs(got.iteration_time - stored) <= 1e-9 * max(1.0, abs(stored))
    extra: dict[str, Any] = {}
    grouped = replica_rows(got.costs.schedule) if got.costs is not None and got.costs.schedule else None
    if grouped is not None:  # replicated stages: one row per replica, grouped by stage (timeline.js)
        extra = {"row_labels": grouped[0], "row_stages": grouped[1]}
    return {**extra, "label": config.label(), "devices": len(rows), "makespan": got.simulation.makespan,
            "iteration_time": got.iteration_time, "stored_iteration_time": stored, "matches_stored": same,
            "rows": rows, "computed_at": datetime.now(UTC).isoformat(), "source": "planner.search.predict"}


def candidate_timeline(db: Session, runner: Any, timeout: float, plan_id: int, rank: int) -> dict[str, Any]:
    """The stored timeline of candidate ``rank``, or one computed now in a planner process and stored."""
    row = crud.get_candidate(db, plan_id, rank)
    doc = crud.get_timeline(db, plan_id, rank)
    cached = doc is not None
    if doc is None:
        profile, cluster, request = crud.plan_inputs(db, plan_id)
        cand = row.body
        db.commit()  # hold no transaction while the planner process works
        try:
            status, payload = runner.timeline((profile, cluster, request, cand)).result(timeout=timeout + 10)
        except FutureTimeout:
            status, payload = "error", f"the timeline took longer than {timeout:g} s"
        if status != "ok":
            raise InputError(f"timeline of plan {plan_id} candidate {rank}: {payload}")
        doc = payload
        crud.store_timeline(db, plan_id, rank, doc)
    return {"plan_id": plan_id, "rank": rank, "cached": cached, **doc}


def trace_timeline(trace: str | None) -> tuple[dict[str, Any] | None, str]:
    """The measured timeline from a Chrome trace (``pipeplan run --trace``): complete ("X") events, one row
    per track (rank), of the last traced iteration, times in seconds from that iteration's first start.
    (None, why) when there is nothing to show. A worker stores the trace as it wrote it, so what is not of the
    format's shape is not read: an event whose time is not a finite number, or whose ``pid`` or ``tid`` is not a
    number or a string, is left out; ``args`` that are not an object are taken as none; a name that is not text (a
    lone surrogate escape, which JSON allows) is shown with U+FFFD in its place (:func:`planner.jsondoc.text`)."""
    if not trace:
        return None, "the result has no trace"
    try:
        data = json.loads(trace)
    except (ValueError, RecursionError) as e:
        return None, f"the trace is not JSON: {type(e).__name__}: {str(e)[:200]}"
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        return None, "the trace has no traceEvents list"
    names: dict[Any, str] = {}
    spans: list[tuple[Any, int, str, float, float]] = []
    for ev in events:
        if not isinstance(ev, dict):
            continue
        pid, tid_ = _track_id(ev.get("pid", 0)), _track_id(ev.get("tid", 0))
        if pid is None or tid_ is None:
            continue
        tid = (pid, tid_)
        args = ev.get("args")
        args = args if isinstance(args, dict) else {}
        if ev.get("ph") == "M" and ev.get("name") == "thread_name":
            names[tid] = text(str(args.get("name", "")))
        elif ev.get("ph") == "X":
            ts, dur = number(ev.get("ts")), number(ev.get("dur") or 0.0)
            if ts is None or dur is None or not math.isfinite(ts + dur):
                continue
            it = args.get("iteration", 0)
            spans.append((tid, integer(it) or 0,
                          text(str(ev.get("name", ""))), ts / 1e6, (ts + dur) / 1e6))
    if not spans:
        return None, "the trace has no timed events"
    last = max(s[1] for s in spans)
    spans = [s for s in spans if s[1] == last]
    t0 = min(s[3] for s in spans)
    tracks = sorted({s[0] for s in spans}, key=lambda t: (_order(t[0]), _order(t[1])))
    rows: list[list[list[Any]]] = [[] for _ in tracks]
    index = {t: i for i, t in enumerate(tracks)}
    for tid, _, name, s, e in spans:
        rows[index[tid]].append([name, s - t0, e - t0])
    for r in rows:
        r.sort(key=lambda x: x[1])
    labels = [names.get(t) or text(f"track {t[1]}") for t in tracks]
    return {"iteration": last, "devices": len(rows), "labels": labels, "rows": rows,
            "makespan": max(s[4] for s in spans) - t0}, ""


def _track_id(value: Any) -> int | str | None:
    """A trace event's ``pid`` or ``tid``: an integer or a string (None: neither, the event is left out)."""
    if isinstance(value, bool):
        return None
    return value if isinstance(value, int | str) else None


def _order(value: int | str) -> tuple[int, int, str]:
    """Numbers first, in order, then strings: a sort key for ids of both kinds."""
    return (0, value, "") if isinstance(value, int) else (1, 0, value)
