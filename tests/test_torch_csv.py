"""Export/import of torch.distributed.pipelining's compute-only CSV, checked with torch's own parser,
validator, lowering (send/recv insertion) and dry-run simulator."""

from __future__ import annotations

import csv

import pytest

torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")

from planner.schedules import build  # noqa: E402
from planner.schedules.ir import lower  # noqa: E402
from planner.schedules.torch_csv import export_torch_csv, import_torch_csv  # noqa: E402

EXPORTABLE = [
    ("gpipe", 4, 8, {}),
    ("1f1b", 4, 8, {}),
    ("1f1b", 3, 2, {}),
    ("interleaved", 4, 8, {"chunks": 2}),
    ("interleaved", 2, 6, {"chunks": 3}),
    ("hanayo", 4, 4, {"waves": 1}),
    ("hanayo", 4, 8, {"waves": 2}),
    ("zb-h1", 4, 8, {}),
    ("zb-h1", 8, 8, {}),
]


def load_with_torch(path, devices):
    """What ``_PipelineScheduleMulti._load_csv(path, "compute_only")`` does: one row per rank."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    return {rank: [torch_schedules._Action.from_str(c) for c in row] for rank, row in enumerate(rows)}


@pytest.mark.parametrize("name,D,N,kw", EXPORTABLE)
def test_export_parsed_by_torch(tmp_path, name, D, N, kw):
    s = build(name, D, N, **kw)
    path = tmp_path / "schedule.csv"
    path.write_text(export_torch_csv(s))
    actions = load_with_torch(path, D)
    assert len(actions) == D
    for d in range(D):
        ours = [(a.stage, a.kind, a.mb) for a in s.actions[d]]
        theirs = [(a.stage_index, a.computation_type.value, a.microbatch_index) for a in actions[d]]
        assert theirs == ours
    # torch's checks: every stage's F/B/I/W in order, one rank per stage -- and the placement it infers
    stage_to_rank = torch_schedules._validate_schedule(actions, D, s.stages, N)
    assert stage_to_rank == {st: s.placement[0][st] for st in range(s.stages)}
    # torch lowers it (adds sends/receives) and dry-runs it without deadlock
    comms = torch_schedules._add_send_recv(actions, stage_to_rank=lambda x: stage_to_rank[x],
                                           num_stages=s.stages)
    torch_schedules._simulate_comms_compute(comms, stage_to_rank=lambda x: stage_to_rank[x],
                                            num_stages=s.stages)


@pytest.mark.parametrize("name,D,N,kw", EXPORTABLE)
def test_round_trip(name, D, N, kw):
    s = build(name, D, N, **kw)
    back = import_torch_csv(export_torch_csv(s), name)
    assert back.actions == s.actions
    assert back.placement == s.placement
    assert (back.devices, back.stages, back.microbatches) == (s.devices, s.stages, s.microbatches)
    # a lowered schedule exports its compute-only form
    assert export_torch_csv(lower(s)) == export_torch_csv(s)


@pytest.mark.parametrize("name,D,N,kw,why", [
    ("chimera", 4, 4, {}, "replicas"),
    ("chimera", 4, 8, {"concat": "forward-doubling"}, "replicas"),
    ("gems", 4, 4, {}, "replicas"),
    ("pipedream", 4, 4, {}, "asynchronous"),
    ("pipedream-2bw", 4, 4, {}, "asynchronous"),
])
def test_not_expressible(name, D, N, kw, why):
    with pytest.raises(ValueError, match=f"cannot express schedule '{name}'.*{why}"):
        export_torch_csv(build(name, D, N, **kw))


@pytest.mark.parametrize("D,v,N", [(2, 2, 4), (4, 2, 8), (4, 3, 8), (4, 2, 12)])
def test_interleaved_matches_torch_interleaved_1f1b(D, v, N):
    """Our interleaved order is torch's ScheduleInterleaved1F1B's (its no-op padding dropped)."""
    cls = torch_schedules.ScheduleInterleaved1F1B
    sched = cls.__new__(cls)  # only the order computation: no stages, no process group
    sched.pp_group_size, sched.n_local_stages, sched._n_microbatches = D, v, N
    sched.number_of_rounds = max(1, N // D)
    sched.microbatches_per_round = N // sched.number_of_rounds
    ours = build("interleaved", D, N, chunks=v)
    for rank in range(D):
        theirs = [str(a) for a in sched._calculate_single_rank_operations(rank) if a is not None]
        assert theirs == [str(a) for a in ours.actions[rank]]


def test_import_errors():
    with pytest.raises(ValueError, match="stage 0 appears on ranks 0 and 1"):
        import_torch_csv("0F0,0B0\n0F1,0B1\n")
    with pytest.raises(ValueError, match="not a compute action"):
        import_torch_csv("0F0,0SEND_F0,0B0\n")
    with pytest.raises(ValueError, match=r"stages \[1\] appear on no rank"):
        import_torch_csv("0F0,0B0\n2F0,2B0\n")


def test_import_skips_torch_noops():
    s = import_torch_csv("0F0,,0B0\n,1F0,1B0\n")
    assert [[str(a) for a in row] for row in s.actions] == [["0F0", "0B0"], ["1F0", "1B0"]]
