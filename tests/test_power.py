"""The clock a power-limited GPU holds by busy share (planner.power), its fixed point in the search, and the
search's bounds under it."""

from __future__ import annotations

import json

import pytest

from planner.analytic import analytic_profile
from planner.cluster import load_cluster
from planner.cost import power_of
from planner.device import get_device
from planner.model import PRESETS
from planner.operators import OperatorOptions
from planner.power import PowerLimit, busy_share, held_rate
from planner.request import Config, TrainingRequest
from planner.search import Planner, plan, predict
from planner.simulate import simulate
from tests.test_fidelity_h100 import ROOT

H100 = get_device("H100-SXM5-80GB")
CLUSTER = load_cluster(ROOT / "examples" / "clusters" / "dgx-h100-80gb.json")


def test_rate_rises_from_busy_throughout_to_burst_with_idle_share():
    """Busy throughout: ``sustained_rate``; the H100's duty-cycle rows (82% / 80% / 67% busy measured
    0.93-0.94 / 0.94-0.96 / 0.94-1.0 of the burst rate) against the rule's 0.94 / 0.95 / 1.0; monotone."""
    p = H100.power
    assert p is not None
    assert held_rate(p, 0.86, 1.0) == 0.86 and held_rate(p, 0.86, 0.0) == 1.0
    assert held_rate(p, 0.86, 0.82) == pytest.approx(0.941, abs=2e-3)
    assert held_rate(p, 0.86, 0.80) == pytest.approx(0.952, abs=2e-3)
    assert held_rate(p, 0.86, 0.67) == 1.0
    rates = [held_rate(p, 0.86, u / 100) for u in range(50, 101)]
    assert rates == sorted(rates, reverse=True)


def test_power_figures_are_checked():
    with pytest.raises(ValueError, match="idle_w < limit_w < burst_w"):
        PowerLimit(limit_w=700, idle_w=120, burst_w=650)


def test_collectives_count_half_idle():
    """A device computing 8 of 10 s, 2 of them tensor-parallel collectives, and 1 s of exposed reduction:
    (8 - 1 + 0.5) / 10."""
    assert busy_share(10.0, [(8.0, 2.0, 1.0)]) == pytest.approx(0.75)
    assert busy_share(10.0, [(10.0, 0.0, 0.0), (5.0, 0.0, 0.0)]) == pytest.approx(0.75)


def _profile(device=H100, preset="gpt3-175b", **opts):
    return analytic_profile(PRESETS[preset], device, tensor_sizes=(1, 2, 4, 8), micro_batches=(1, 2, 4),
                            options=OperatorOptions(attention="flash", **opts))


def test_profile_carries_the_matrix_share_only_on_a_power_limited_device():
    """The H100's operator-model shards say what share of their time the matrix engines take (175B's layer at
    t 4, b 1: 0.8-0.95); the A100 (no power figures) and the H100 with ``power`` off carry none."""
    prof = _profile()
    st = prof.layers[1].tensor_times[4]
    assert 0.8 < st.matrix_share[1] < 0.95
    assert power_of(prof) == (H100.power, H100.sustained_rate)
    for dev in (get_device("A100-SXM4-80GB"), H100.model_copy(update={"power": None})):
        other = _profile(dev)
        assert all(st.matrix_share is None for lay in other.layers for st in lay.tensor_times.values())
        assert power_of(other) is None
    assert "matrix_share" not in _profile(get_device("A100-SXM4-80GB")).layers[1].tensor_times[4].model_dump()


def _request(**kw):
    return TrainingRequest(global_batch=64, **{"memory_reserve_bytes": 0, **kw})


def test_a_step_with_idle_share_holds_a_higher_clock_and_is_timed_at_it():
    """GPT-3 175B at t 8, p 8 on 64 H100s: the candidate holds a rate between the busy-throughout 0.86 and 1,
    the rate the rule gives for its simulated busy share (the fixed point), and its time lies between the
    busy-throughout and the burst predictions; its timeline is that of the held clock."""
    prof = _profile()
    cluster = CLUSTER.model_copy(update={"nodes": 8})
    cfg = Config(tensor=8, pipeline=8, data=1, micro_batch=1, schedule="1f1b", recompute=False)
    cand = predict(prof, cluster, _request(), cfg)
    assert cand.held_rate is not None and 0.86 < cand.held_rate < 1.0
    u = cand.costs.busy_share(cand.simulation)
    assert held_rate(H100.power, 0.86, u) == pytest.approx(cand.held_rate, abs=3e-3)
    assert cand.simulation.makespan == pytest.approx(cand.iteration_time)
    busy = predict(_profile(H100.model_copy(update={"power": None})), cluster, _request(), cfg)
    burst = predict(_profile(H100.model_copy(update={"sustained_rate": 1.0})), cluster, _request(), cfg)
    assert busy.held_rate is None and burst.held_rate is None
    assert burst.iteration_time < cand.iteration_time < busy.iteration_time
    assert cand.to_dict()["held_rate"] == cand.held_rate


def test_search_with_held_clock_is_exact():
    """Pruning with bounds of the durations at the fastest clock (ConfigCosts.fastest_clock) returns what
    simulating every configuration does."""
    prof = _profile(preset="gpt2-1.3b")
    cluster = CLUSTER.model_copy(update={"nodes": 1})
    req = TrainingRequest(global_batch=128, top=5, memory_reserve_bytes=0,
                          schedules=["1f1b", "interleaved", "zb-h1", "gpipe", "chimera"])
    pruned, full = plan(prof, cluster, req), Planner(prof, cluster, req).search(prune=False)
    assert len(pruned.candidates) == 5 and pruned.simulated < full.simulated
    assert [c.label() for c in pruned.candidates] == [c.label() for c in full.candidates]
    assert [c.iteration_time for c in pruned.candidates] == pytest.approx([c.iteration_time for c in full.candidates])
    assert all(0.86 < c.held_rate < 0.95 for c in pruned.candidates)


def test_cli_says_the_clock_each_row_holds(tmp_path):
    """``pipeplan predict`` on an H100 operator-model profile prints the held rate; on the A100 (no power
    figures) it prints no clock line."""
    from typer.testing import CliRunner

    from pipeplan.cli import app

    runner = CliRunner()
    args = ["--cluster", str(ROOT / "examples" / "clusters" / "dgx-h100-80gb.json"), "--global-batch", "64",
            "--tensor", "8", "--pipeline", "8", "--data", "1", "--micro-batch", "1", "--schedule", "1f1b"]
    for dev, clock in ((H100, True), (get_device("A100-SXM4-80GB"), False)):
        path = tmp_path / f"{dev.name}.json"
        path.write_text(json.dumps(_profile(dev).model_dump(mode="json")))
        r = runner.invoke(app, ["predict", "--profile", str(path), *args])
        assert r.exit_code == 0, r.output
        assert ("clock: each row at the matrix rate" in r.output) == clock, r.output


def test_emulated_run_sleeps_the_held_clock_s_durations():
    """The executor's emulated mode times a power-limited GPU's compute at the clock the step holds (the planner's
    fixed point), so what it sleeps and predicts is the plan's prediction, faster than at the busy-throughout
    rate."""
    from executor.emulate import Emulator
    from executor.plan import RunPlan

    cluster = CLUSTER.model_copy(update={"nodes": 1})
    plan = RunPlan.direct("1f1b", 4, 8, data=1, emulate="p.json", iterations=1, warmup=1)
    sched = plan.compute_schedule()
    held = Emulator(plan, sched, _profile(preset="gpt2-1.3b"), cluster)
    busy = Emulator(plan, sched, _profile(H100.model_copy(update={"power": None}), preset="gpt2-1.3b"), cluster)
    assert held.costs.held_rate is not None and 0.86 < held.costs.held_rate <= 1.0 and busy.costs.held_rate is None
    u = held.costs.busy_share(simulate(sched, held.costs))
    assert held_rate(H100.power, 0.86, u) == pytest.approx(held.costs.held_rate, abs=3e-3)
    assert held.predict()["iteration_time"] < busy.predict()["iteration_time"]
    assert held.costs.work("F", 0, 1) < busy.costs.work("F", 0, 1)


def test_api_stores_the_matrix_share_and_plans_at_the_held_clock(client):  # type: ignore[no-untyped-def]
    """Through the API on a real database: an H100 operator-model profile keeps its shards' matrix share when
    stored (uploading it again is the same profile), and its plan's candidates carry the clock they hold; a
    matrix share outside [0, 1] is a 422 naming the field."""
    from api_support import AUTH, post_plan

    prof = _profile(preset="gpt2-1.3b").model_dump(mode="json")
    r = client.post("/profiles", json=prof, headers=AUTH)
    assert r.status_code == 201, r.text
    pid = r.json()["id"]
    stored = client.get(f"/profiles/{pid}", headers=AUTH).json()
    assert stored["profile"]["layers"][1]["tensor_times"]["4"]["matrix_share"] == \
        prof["layers"][1]["tensor_times"]["4"]["matrix_share"]
    assert client.post("/profiles", json=prof, headers=AUTH).status_code == 200
    cluster = json.loads((ROOT / "examples" / "clusters" / "dgx-h100-80gb.json").read_text())
    r = client.post("/clusters", json={**cluster, "nodes": 1}, headers=AUTH)
    assert r.status_code == 201, r.text
    plan = post_plan(client, {"profile_id": pid, "cluster_id": r.json()["id"], "global_batch": 64, "top": 3})
    assert plan["status"] == "done" and plan["candidates"]
    assert all(0.86 < c["held_rate"] <= 1.0 for c in plan["candidates"])
    bad = json.loads(json.dumps(prof))
    bad["layers"][1]["tensor_times"]["4"]["matrix_share"]["1"] = 1.5
    r = client.post("/profiles", json=bad, headers=AUTH)
    assert r.status_code == 422 and "matrix_share" in r.text, r.text
