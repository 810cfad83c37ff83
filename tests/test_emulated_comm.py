"""Emulated runs' communication (issue 11): real messages when the cluster's links are this machine's, time
tokens that wait for the predicted durations otherwise (:mod:`executor.emulate`); and the real run of a
plan's candidate printing its prediction beside the measured time (``pipeplan run --plan``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from executor.emulate import Emulator, uniform_profile
from executor.groups import Layout
from executor.plan import RunPlan, planned_iteration_time
from planner.cluster import Cluster, HostCpu, Link
from planner.profile import save_profile
from planner.schedules.ir import Action, F

#: a fictional cluster: 5 ms latency and 1 GB/s (this machine's gloo is much faster for small messages)
SLOW = Cluster(name="slow-links", nodes=1, gpus_per_node=4, device="cpu", memory_bytes=2**34, peak_flops=1e12,
               intra=Link(alpha=5e-3, beta=1e-9), inter=Link(alpha=5e-3, beta=1e-9), memory_bandwidth=1e12)


def _plan(profile: str, cluster: str | None, **kw) -> RunPlan:  # type: ignore[no-untyped-def]
    return RunPlan.direct("1f1b", 2, 4, data=2, emulate=profile, cluster=cluster, iterations=1, warmup=1, **kw)


def test_communication_mode_follows_the_cluster(tmp_path: Path) -> None:
    prof = uniform_profile(4, fwd=0.001, bwd=0.002)
    plan = _plan("p.json", None)
    sched = plan.compute_schedule()
    assert Emulator(plan, sched, prof).comm == "real"  # LOCAL_CLUSTER: gloo over loopback, this machine's
    here = SLOW.model_copy(update={"host": HostCpu(cores=2, effective_cores=2.0, processes=4)})
    assert Emulator(plan, sched, prof, here).comm == "real"  # measured on this host
    emu = Emulator(plan, sched, prof, SLOW)
    assert emu.comm == "emulated"  # links of another machine: messages wait for their predicted time
    send = next(a for a in plan.schedule().actions[0] if a.kind == "SEND_F")
    assert emu.p2p_time(send, 0) == pytest.approx(5e-3 + 1e-9 * 4096)  # the simulator's own cost
    assert emu.allreduce_time(0, 0, 0) == emu.costs.allreduce(0, 0, 0) > 0
    emu.use_real_comm("test")
    assert emu.comm == "real"


def test_plan_prediction_beside_the_measured_time(tmp_path: Path) -> None:
    from executor.cli import attach_plan_prediction, prediction_line

    path = tmp_path / "plan.json"
    cand = {"schedule": "1f1b", "pipeline": 2, "data": 1, "tensor": 1, "micro_batch": 1, "microbatches": 4,
            "global_batch": 4}
    path.write_text(json.dumps({"candidates": [{**cand, "iteration_time": 0.02}, cand]}))
    assert planned_iteration_time(path, 0) == 0.02
    assert planned_iteration_time(path, 1) is None  # a hand-written candidate: no prediction
    result = {"measured": {"iteration_time": 0.03}, "emulated": False}
    attach_plan_prediction(result, str(path), 0)
    assert result["predicted"]["iteration_time"] == 0.02 and result["ratio"] == pytest.approx(1.5)
    line = prediction_line(result)
    assert "measured 30.00 ms" in line and "predicted 20.00 ms" in line and "measured/predicted 1.500" in line
    bare = {"measured": {"iteration_time": 0.03}, "emulated": False}
    attach_plan_prediction(bare, str(path), 1)
    assert "predicted" not in bare


@pytest.mark.slow
def test_emulated_messages_wait_for_their_predicted_arrival(tmp_path: Path) -> None:
    """With a cluster of slow fictional links every receive ends no earlier than the producing action's end
    plus the link's predicted time, and the optimizer starts no earlier than the all-reduce's predicted end
    (sleeps last at least their duration; the ranks share the host's monotonic clock): the run costs what
    the cluster's links cost, not what this machine's gloo does."""
    from executor.launch import launch

    ppath, cpath = tmp_path / "p.json", tmp_path / "c.json"
    save_profile(uniform_profile(4, fwd=0.001, bwd=0.002, param_bytes=4 * 2**20), ppath)
    cpath.write_text(SLOW.model_dump_json())
    plan = _plan(str(ppath), str(cpath))
    res = launch([plan], 4, timeout=120, trace=True)
    run = res["runs"][0]
    assert run["communication"] == "emulated"
    emu = Emulator(plan, plan.compute_schedule(), str(ppath), str(cpath))
    p2p = emu.p2p_time(next(a for a in plan.schedule().actions[0] if a.kind == "SEND_F"), 0)
    ar = emu.allreduce_time(0, 0, 0)
    assert p2p > 5e-3 and ar > 8e-3
    ev = [e for e in run["trace"]["traceEvents"] if e["ph"] == "X" and e["args"]["iteration"] == 1]
    end = {(e["tid"], e["name"]): (e["ts"] + e["dur"]) / 1e6 for e in ev}
    start = {(e["tid"], e["name"]): e["ts"] / 1e6 for e in ev}
    layout = Layout(2, 2, 1)
    actions = plan.schedule().actions
    checked = 0
    for rank in range(4):
        device, copy, _ = layout.coords(rank)
        for a in actions[device]:
            if a.kind == "RECV_F":  # from the same copy's device 0, after its forward of the micro-batch
                produced = end[(layout.rank(a.peer, copy), str(Action(F, a.stage - 1, a.mb, a.replica)))]
                assert end[(rank, str(a))] >= produced + p2p - 1e-4, (rank, str(a))
                checked += 1
        last_b = str([a for a in actions[device] if a.kind == "B"][-1])
        posted = max(end[(layout.rank(device, w), last_b)] for w in range(2))  # both copies of the stage
        assert start[(rank, "optimizer (emulated)")] >= posted + ar - 1e-4, rank
    assert checked == 8  # 4 micro-batches into stage 1 on each of its two copies


def test_emulated_step_is_not_charged_the_real_step_overhead() -> None:
    """The cluster's ``executor.step`` (the optimizer's fixed cost and the tied-embedding all-reduce, measured
    on real runs) is charged to a real run's STEP, not to an emulated one's, which runs neither; the other
    per-action overheads are charged to both."""
    from planner.cluster import ExecutorOverhead

    ex = ExecutorOverhead(compute=3e-4, send=1e-4, recv=1e-4, allreduce=2e-5, step=7e-3)
    cl = SLOW.model_copy(update={"executor": ex})
    prof = uniform_profile(4, fwd=0.001, bwd=0.002)
    plan = _plan("p.json", None)
    sched = plan.compute_schedule()
    real = Emulator(plan, sched, prof, cl, emulated=False).costs
    emu = Emulator(plan, sched, prof, cl).costs
    for d in range(2):
        assert real.overheads.of(real, "STEP", -1, d) == pytest.approx(ex.step + ex.allreduce)  # one stage held
        assert emu.overheads.of(emu, "STEP", -1, d) == pytest.approx(ex.allreduce)
    assert emu.overheads.of(emu, "F", 0, 0) == real.overheads.of(real, "F", 0, 0) == pytest.approx(ex.compute + ex.send)


def test_time_by_kind_adds_up_to_the_iteration() -> None:
    """``measured.time_by_kind``: per rank and iteration, the optimizer taken out of STEP, receives counted as
    waiting, and the rest of the iteration (gaps, start skew) as ``other``."""
    from executor.cli import where_time_went
    from executor.trace import summarize

    def payload(rank: int, t0: float) -> dict:  # type: ignore[type-arg]
        rec = [("0F0", "F", t0, t0 + 1.0), ("1RECV_B0", "RECV_B", t0 + 1.0, t0 + 1.5),
               ("0B0", "B", t0 + 1.5, t0 + 3.5), ("optimizer", "OPT", t0 + 3.7, t0 + 3.9),
               ("STEP", "STEP", t0 + 3.6, t0 + 4.0)]  # the walker appends STEP after the OPT inside it
        return {"rank": rank, "device": rank, "data": 0, "tensor": 0, "records": [rec], "peak_alive": 1}

    m = summarize([payload(0, 10.0), payload(1, 10.5)], warmup=0, emulated=False)
    k = m["time_by_kind"]
    assert k["F"] == 1.0 and k["B"] == 2.0 and k["RECV"] == 0.5 and k["OPT"] == pytest.approx(0.2)
    assert k["STEP"] == pytest.approx(0.2)  # 0.4 minus the optimizer inside it
    assert m["iteration_time"] == 4.5  # 10.0 .. 14.5
    assert k["other"] == pytest.approx(4.5 - 3.9)  # the 0.1 gap and the other rank's 0.5 start skew, per rank
    line = where_time_went(k)
    assert line.index("F 1000.00") < line.index("B 2000.00") < line.index("RECV (waiting) 500.00")
