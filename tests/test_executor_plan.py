"""Executor input checks (no processes launched): bad plans fail before launching with a clear message."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from executor.plan import PlanError, RunPlan, even_layer_split, load_plan_file
from pipeplan.cli import app

SMALL = {"layers": 4, "hidden": 16, "heads": 2, "seq": 8, "vocab": 32}


def test_world_size_mismatch() -> None:
    plan = RunPlan.direct("1f1b", 2, 4, data=2)
    with pytest.raises(PlanError, match="D\\*W\\*t = 2\\*2\\*1 = 4 processes.*world size is 3"):
        plan.validate(3)


def test_partition_must_cover_model() -> None:
    plan = RunPlan.direct("1f1b", 2, 4, model="gpt-tiny", partition=[[0, 2], [2, 5]])
    with pytest.raises(PlanError, match="partition does not cover the model: it ends at layer 5"):
        plan.validate()
    plan = RunPlan.direct("1f1b", 2, 4, partition=[[0, 3], [4, 6]])
    with pytest.raises(PlanError, match="stage 1 is \\[4, 6\\)"):
        plan.validate()
    plan = RunPlan.direct("1f1b", 2, 4, partition=[[0, 6]])
    with pytest.raises(PlanError, match="1 ranges but the schedule has 2 stages"):
        plan.validate()


def test_microbatches_must_divide_batch() -> None:
    with pytest.raises(PlanError, match="micro-batches do not divide the batch"):
        RunPlan.direct("gpipe", 2, 4, micro_batch=2, global_batch=10)
    plan = RunPlan.direct("chimera", 2, 4, concat="backward-halving", micro_batch=3)
    with pytest.raises(PlanError, match="even micro-batch"):
        plan.validate()


def test_other_bad_plans() -> None:
    with pytest.raises(PlanError, match="chimera needs an even number"):
        RunPlan.direct("chimera", 3, 4).validate()
    with pytest.raises(PlanError, match="tensor parallelism t=3"):
        RunPlan.direct("1f1b", 1, 2, tensor=3).validate()
    with pytest.raises(PlanError, match="8 stages but the model has only 6 layers"):
        RunPlan.direct("hanayo", 2, 4, waves=2).validate()


def test_even_layer_split() -> None:
    assert even_layer_split(6, 4) == [(0, 2), (2, 4), (4, 5), (5, 6)]


def test_candidate_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cand = {"tensor": 1, "pipeline": 2, "data": 1, "micro_batch": 2, "schedule": "chimera", "recompute": False,
            "pipelines": 1, "concat": "backward-halving", "microbatches": 4, "global_batch": 8,
            "partition": [[0, 3], [3, 6]]}
    (tmp_path / "bare.json").write_text(json.dumps(cand))
    (tmp_path / "plan.json").write_text(json.dumps({"candidates": [cand, {**cand, "schedule": "1f1b"}]}))
    p = load_plan_file(tmp_path / "bare.json")
    assert p.spec.schedule_microbatches == 8 and p.rows == 1 and p.world_size == 2
    sched = p.validate(2)
    assert sched.microbatches == 8 and sched.lowered
    assert load_plan_file(tmp_path / "plan.json", 1).spec.config.schedule == "1f1b"
    with pytest.raises(PlanError, match="out of range"):
        load_plan_file(tmp_path / "plan.json", 5)


def test_cli_refuses_bad_plan_before_launch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cand = {"tensor": 1, "pipeline": 2, "data": 1, "micro_batch": 1, "schedule": "1f1b", "microbatches": 4,
            "global_batch": 4, "partition": [[0, 2], [2, 5]]}
    (tmp_path / "plan.json").write_text(json.dumps(cand))
    res = CliRunner().invoke(app, ["run", "--plan", str(tmp_path / "plan.json"), "--out", str(tmp_path / "r.json")])
    assert res.exit_code == 2
    assert "partition does not cover the model" in res.output
    assert not (tmp_path / "r.json").exists()
    res = CliRunner().invoke(app, ["run", "--schedule", "interleaved", "-D", "2", "-N", "3", "--chunks", "2"])
    assert res.exit_code == 2 and "error: schedule" in res.output


def test_cli_multi_node_options_are_checked_before_launch() -> None:
    run = ["run", "-s", "1f1b", "-D", "2", "-N", "4", "-W", "2"]  # 4 processes
    res = CliRunner().invoke(app, [*run, "--nnodes", "3", "--rdzv-endpoint", "localhost:29500"])
    assert res.exit_code == 2 and "needs D*W*t = 4 processes, which 3 node(s) x 1 process(es)" in res.output
    res = CliRunner().invoke(app, [*run, "--nnodes", "2", "--nproc-per-node", "3", "--rdzv-endpoint", "h:1"])
    assert res.exit_code == 2 and "--nproc-per-node be 4/--nnodes" in res.output
    res = CliRunner().invoke(app, [*run, "--nnodes", "2"])
    assert res.exit_code == 2 and "needs --rdzv-endpoint host:port" in res.output
    res = CliRunner().invoke(app, [*run, "--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"])
    assert res.exit_code == 2 and "--node-rank must be in 0..1" in res.output


def test_placement_is_checked_before_launch() -> None:
    from executor.launch import check_placement

    check_placement(4)
    check_placement(2, 2, 1, "node0:29500")
    with pytest.raises(ValueError, match="rendezvous endpoint"):
        check_placement(2, 2, 0, None)
    with pytest.raises(ValueError, match="outside 0..1"):
        check_placement(2, 2, 2, "node0:29500")
    with pytest.raises(ValueError, match=">= 1"):
        check_placement(0)


def test_records_of_other_hosts_move_onto_rank_0_clock() -> None:
    """Clocks of different machines are unrelated: each iteration of a remote rank starts with rank 0's."""
    from executor.trace import summarize

    def payload(rank: int, host: str, t0: float) -> dict:  # type: ignore[type-arg]
        recs = [[("0F0", "F", t0 + it, t0 + it + 0.1), ("STEP", "STEP", t0 + it + 0.1, t0 + it + 0.2)]
                for it in range(2)]
        return {"rank": rank, "host": host, "device": rank, "data": 0, "tensor": 0, "records": recs,
                "peak_alive": 1, "peak_memory": None}

    m = summarize([payload(0, "a", 100.0), payload(1, "a", 100.05), payload(2, "b", 5000.0)], 0, False)
    assert m["iteration_times"] == pytest.approx([0.25, 0.25])  # host b shifted, host a's offset kept


def test_cuda_clock_places_events_on_the_host_clock(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The arithmetic of the GPU timing (events faked: no GPU here): start + elapsed time from the base event."""
    import torch

    from executor import interpreter

    ticks = iter([0.0, 1.5, 4.0])  # milliseconds at which the base event and two stamps are reached

    class FakeEvent:
        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing
            self.t = 0.0

        def record(self) -> None:
            self.t = next(ticks)

        def elapsed_time(self, other: FakeEvent) -> float:
            return other.t - self.t

    monkeypatch.setattr(interpreter.torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(interpreter.torch.cuda, "synchronize", lambda device=None: None)
    clock = interpreter.CudaClock(torch.device("cuda", 0))
    clock.begin()
    start, end = clock.stamp(), clock.stamp()
    [(name, kind, s, e)] = clock.resolve([("0F0", "F", start, end)])
    assert (name, kind) == ("0F0", "F")
    assert s - clock.t0 == pytest.approx(0.0015) and e - clock.t0 == pytest.approx(0.004)
