"""Interchange with ``torch.distributed.pipelining``'s compute-only CSV schedules.

torch's ``_PipelineScheduleRuntime._load_csv(filename, format="compute_only")`` reads one CSV row per
pipeline rank, each cell an ``_Action`` string ``{stage}{F|B|I|W}{microbatch}`` (``0F1``, ``1B0``,
``2I3``, ``2W3``); it infers which rank holds which stage from the rows (a stage on one rank only) and
adds the communication itself (``_add_send_recv``). That is our compute-only form with one replica:

* **exportable**: one-replica, synchronous schedules whose forwards each cover one micro-batch --
  gpipe, 1f1b, interleaved (torch's looped placement), hanayo (a "V"/wave placement, which torch infers
  from the rows like ``ScheduleZBVZeroBubble``'s), zb-h1;
* **not exportable** (``ValueError`` saying why): schedules with several model replicas (chimera, gems:
  a torch action names a stage index, not a replica, and torch places each stage on one rank); with
  weight versions / asynchronous updates (pipedream, pipedream-2bw: torch's runtime keeps one weight
  version and steps once per iteration after a flush); with multi-micro-batch forwards (chimera's
  forward doubling: a torch action names one micro-batch).

This module is pure Python (no torch import); the tests check it against torch's own parser.
"""

from __future__ import annotations

import csv
import io

from planner.schedules.ir import COMPUTE_KINDS, Action, Schedule, parse_action


def torch_unsupported_reason(schedule: Schedule) -> str | None:
    """Why torch's compute-only CSV cannot express ``schedule`` (None when it can)."""
    if schedule.replicas != 1:
        return (f"it runs {schedule.replicas} model replicas; a torch action names only a stage index and "
                f"torch places every stage on exactly one rank")
    if not schedule.synchronous or schedule.weight_versions:
        update = schedule.params.get("update", "asynchronous")
        return (f"it is asynchronous (weight versions {schedule.weight_versions}, update {update!r}); "
                f"torch's runtime keeps one weight version and steps once per iteration after a flush")
    for row in schedule.actions:
        for a in row:
            if a.kind in COMPUTE_KINDS and a.span != 1:
                return f"action {a} runs {a.span} micro-batches at once; a torch action names one micro-batch"
    return None


def export_torch_csv(schedule: Schedule) -> str:
    """The compute-only form of ``schedule`` as torch's CSV: row ``d`` holds device (rank) ``d``'s actions."""
    reason = torch_unsupported_reason(schedule)
    if reason:
        raise ValueError(f"torch.distributed.pipelining cannot express schedule {schedule.name!r}: {reason}")
    compute = schedule.compute_only() if schedule.lowered else schedule
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    for row in compute.actions:
        writer.writerow([f"{a.stage}{a.kind}{a.mb}" for a in row if a.kind in COMPUTE_KINDS])
    return buf.getvalue()


def import_torch_csv(text: str, name: str = "torch-csv") -> Schedule:
    """A compute-only :class:`Schedule` from torch's CSV (rows = ranks; empty cells, torch's no-ops, are
    dropped). Stages, micro-batches and the placement are inferred from the cells, as torch does."""
    rows = list(csv.reader(io.StringIO(text)))
    while rows and not any(c.strip() for c in rows[-1]):
        rows.pop()
    if not rows:
        raise ValueError("torch CSV has no rows")
    acts: list[list[Action]] = []
    where: dict[int, int] = {}
    for d, row in enumerate(rows):
        out = []
        for cell in row:
            if not cell.strip():
                continue
            a = parse_action(cell)
            if a.kind not in COMPUTE_KINDS or a.replica or a.span != 1:
                raise ValueError(f"torch CSV row {d}: {cell!r} is not a compute action (F, B, I or W of one "
                                 f"micro-batch)")
            if where.setdefault(a.stage, d) != d:
                raise ValueError(f"torch CSV: stage {a.stage} appears on ranks {where[a.stage]} and {d}")
            out.append(a)
        acts.append(out)
    if not where:
        raise ValueError("torch CSV has no actions")
    stages = max(where) + 1
    missing = [s for s in range(stages) if s not in where]
    if missing:
        raise ValueError(f"torch CSV: stages {missing} appear on no rank")
    microbatches = max(a.mb for row in acts for a in row) + 1
    return Schedule(name, len(acts), stages, microbatches, [[where[s] for s in range(stages)]], acts)
