"""Predicted vs measured: a job's candidate (what the planner predicted) beside its result (what the agent
measured), field by field with relative errors."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from api.crud import get_job, job_candidate
from db.models import Result
from planner.jsondoc import number
from planner.mismatch import unsharded_run_note


def _rel(pred: float | None, meas: float | None) -> float | None:
    if pred is None or meas is None or pred == 0:
        return None
    return (meas - pred) / pred


def comparison(db: Session, job_id: int) -> dict[str, Any]:
    """Predicted vs measured, field by field, with relative errors (measured ones None until a result)."""
    job = get_job(db, job_id)
    cand = job_candidate(db, job)
    res = db.scalar(select(Result).where(Result.job_id == job_id))
    it_m = res.iteration_time if res else None
    gb = cand.get("global_batch") or None
    thr_m = gb / it_m if (gb and it_m) else None
    rows = [("iteration_time", cand.get("iteration_time"), it_m),
            ("throughput", cand.get("throughput"), thr_m),
            ("bubble_ratio", cand.get("bubble_ratio"), res.bubble_ratio if res else None)]
    devices = []
    # the measured peak is the allocator's (torch.cuda.max_memory_allocated: executor/rank.py), without the
    # framework/workspace reserve the plan counts per device: compare it with the model's own memory. A CPU run
    # measures none (None): the predicted peak is still given, without an error
    mem = cand.get("model_memory") or [m - float(cand.get("memory_reserve") or 0.0) for m in cand.get("memory") or []]
    for d, dev in enumerate(res.devices if res else []):
        entry = dict(dev)
        peak = dev.get("peak_memory")
        if d < len(mem):
            entry["predicted_peak_memory"] = mem[d]
            measured = number(peak)
            if measured is not None:
                entry["peak_memory_relative_error"] = _rel(mem[d], measured)
        devices.append(entry)
    return {"job_id": job.id, "plan_id": job.plan_id, "candidate_index": job.candidate_index,
            "label": cand.get("label", ""), "state": job.state, "emulated": res.emulated if res else None,
            "fields": [{"field": f, "predicted": p, "measured": m, "relative_error": _rel(p, m)}
                       for f, p, m in rows],
            "devices": devices,
            # where what ran is not what the plan predicted: a sharded plan run unsharded, an emulated run
            "note": "; ".join(n for n in (unsharded_run_note(cand), _emulated_note(res, cand)) if n) or None}


def emulation_prediction(res: Result | None) -> float | None:
    """What an emulated run is compared with: the simulator on its own terms (``pipeplan run``'s ``predicted``,
    :meth:`executor.emulate.Emulator.predict`, in the result it reported), seconds; None for a real run or a
    result without one. One rule for a job's comparison and for calibration (:mod:`api.calibration`)."""
    if res is None or not res.emulated:
        return None
    predicted = (res.body or {}).get("predicted")
    own = number(predicted.get("iteration_time")) if isinstance(predicted, dict) else None
    return own if own is not None and own > 0 else None


def _emulated_note(res: Result | None, cand: dict[str, Any]) -> str | None:
    """An emulated run's compute waits instead of running (it takes no core): the run compared itself with the
    simulator on its own terms (``pipeplan run``'s ``predicted``, in the result it reported), which differs
    from the plan's figure where the plan counted processes sharing a CPU host's cores or other links; say both
    when they differ by more than 1%."""
    own = emulation_prediction(res)
    planned = number(cand.get("iteration_time"))
    if own is None or planned is None or own <= 0 or planned <= 0:
        return None
    if abs(own - planned) <= 0.01 * planned:
        return None
    return (f"this run was emulated: its compute waited instead of running, and it compared itself with "
            f"{own * 1e3:.2f} ms, the simulator on its own terms (emulated compute shares no cores), against the "
            f"plan's {planned * 1e3:.2f} ms (measured/that: {res.iteration_time / own:.3f})")
