"""Multi-process executor tests (CPU, gloo, tiny GPT in float64): every synchronous schedule gives, after one
step, the parameters of plain single-process training on the same global batch -- with the default (prefetch)
and the NCCL (grouped) posting policies, on one node and on two. Few launches: each runs many plans in
sequence on the same process group (torchrun --standalone, or a c10d rendezvous; see executor.launch)."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import pytest
from typer.testing import CliRunner

from executor.launch import RunFailed, launch
from executor.plan import RunPlan
from pipeplan.cli import app

SMALL = {"layers": 4, "hidden": 16, "heads": 2, "seq": 8, "vocab": 32}
SIX = {**SMALL, "layers": 6}


def P(schedule: str, D: int, N: int, model: dict | None = None, **kw) -> RunPlan:  # type: ignore[type-arg]
    return RunPlan.direct(schedule, D, N, model_overrides=model or SMALL, **kw)


PLANS_2 = {
    "gpipe": P("gpipe", 2, 3),
    "gpipe+rc": P("gpipe", 2, 3, recompute=True),
    "1f1b": P("1f1b", 2, 4),
    "1f1b+rc b=2": P("1f1b", 2, 4, recompute=True, micro_batch=2),
    "interleaved v=2": P("interleaved", 2, 4, chunks=2),
    "interleaved v=2+rc": P("interleaved", 2, 4, chunks=2, recompute=True),
    "chimera N=1<D": P("chimera", 2, 1),
    "chimera N=D": P("chimera", 2, 2),
    "chimera N>D direct": P("chimera", 2, 6, concat="direct"),
    "chimera N>D forward-doubling+rc": P("chimera", 2, 4, concat="forward-doubling", recompute=True),
    "chimera N>D backward-halving": P("chimera", 2, 4, concat="backward-halving", micro_batch=2),
    "hanayo W=1": P("hanayo", 2, 4, waves=1),
    "hanayo W=2+rc": P("hanayo", 2, 4, waves=2, model=SIX, recompute=True),
    "zb-h1": P("zb-h1", 2, 4),
    "zb-h1+rc": P("zb-h1", 2, 3, recompute=True),
    "gems": P("gems", 2, 4),
    "gems+rc": P("gems", 2, 3, recompute=True),
    "pipedream-2bw": P("pipedream-2bw", 2, 4),
    "data-parallel W=2 (D=1)": P("gpipe", 1, 2, data=2),
    "tensor-parallel t=2 (D=1)": P("1f1b", 1, 2, tensor=2),
    "pipedream": P("pipedream", 2, 4),
}

PLANS_4 = {
    "chimera D=4 N=2<D": P("chimera", 4, 2),
    "chimera D=4 N=D": P("chimera", 4, 4),
    "chimera D=4 N=8 direct": P("chimera", 4, 8, concat="direct"),
    "chimera D=4 N=8 forward-doubling+rc": P("chimera", 4, 8, concat="forward-doubling", recompute=True),
    "chimera D=4 N=8 backward-halving": P("chimera", 4, 8, concat="backward-halving", micro_batch=2),
    "chimera D=4 f=2": P("chimera", 4, 4, pipelines=2),
    "interleaved D=4 v=2": P("interleaved", 4, 4, chunks=2, model=SIX),
    "gems D=4+rc": P("gems", 4, 4, recompute=True),
    "zb-h1 D=4": P("zb-h1", 4, 6),
    "hanayo D=4 W=1": P("hanayo", 4, 4, waves=1, model=SIX),
    "1f1b D=2 W=2": P("1f1b", 2, 4, data=2),
    "chimera D=2 W=2": P("chimera", 2, 4, data=2),
    "hanayo D=2 waves=2 W=2": P("hanayo", 2, 4, waves=2, data=2, model=SIX),
    "zb-h1 D=2 W=2+rc": P("zb-h1", 2, 4, data=2, recompute=True),
    "1f1b D=2 t=2": P("1f1b", 2, 4, tensor=2),
    "chimera D=2 t=2 forward-doubling+rc": P("chimera", 2, 4, tensor=2, concat="forward-doubling", recompute=True),
    "gpipe D=1 W=2 t=2": P("gpipe", 1, 2, data=2, tensor=2),
}


#: the grouped policy (NCCL's) on gloo: a representative subset, one launch
PLANS_GROUPED = {
    "1f1b D=4": P("1f1b", 4, 6),
    "interleaved D=4 v=2": P("interleaved", 4, 4, chunks=2, model=SIX),
    "chimera D=4 N=8 forward-doubling": P("chimera", 4, 8, concat="forward-doubling"),
    "hanayo D=4 W=1": P("hanayo", 4, 4, waves=1, model=SIX),
    "zb-h1 D=4": P("zb-h1", 4, 6),
}


@pytest.fixture(scope="module")
def runs_2() -> dict:  # type: ignore[type-arg]
    res = launch(list(PLANS_2.values()), 2, check=True, timeout=60, trace=True)
    return dict(zip(PLANS_2, res["runs"], strict=True))


@pytest.fixture(scope="module")
def runs_4() -> dict:  # type: ignore[type-arg]
    res = launch(list(PLANS_4.values()), 4, check=True, timeout=60)
    return dict(zip(PLANS_4, res["runs"], strict=True))


@pytest.fixture(scope="module")
def runs_grouped() -> dict:  # type: ignore[type-arg]
    res = launch(list(PLANS_GROUPED.values()), 4, check=True, timeout=60, p2p="grouped")
    assert res is not None
    return dict(zip(PLANS_GROUPED, res["runs"], strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in PLANS_2 if n != "pipedream"])
def test_equals_single_process_2(runs_2, name) -> None:  # type: ignore[no-untyped-def]
    check = runs_2[name]["check"]
    assert check["ok"], check["message"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PLANS_4))
def test_equals_single_process_4(runs_4, name) -> None:  # type: ignore[no-untyped-def]
    check = runs_4[name]["check"]
    assert check["ok"], check["message"]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PLANS_GROUPED))
def test_grouped_policy_equals_single_process(runs_grouped, name) -> None:  # type: ignore[no-untyped-def]
    run = runs_grouped[name]
    assert run["p2p"] == "grouped" and run["backend"] == "gloo"
    assert run["check"]["ok"], run["check"]["message"]
    assert run["measured"]["peak_memory"] == [None] * 4  # CPU: no device memory figure


@pytest.mark.slow
def test_default_policy_is_recorded(runs_2) -> None:  # type: ignore[no-untyped-def]
    assert runs_2["1f1b"]["p2p"] == "prefetch"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _two_nodes(plans: list[RunPlan], **kw: Any) -> list[Any]:
    """Two launches of 2 processes each on this machine, as node 0 and node 1 of one c10d rendezvous."""
    endpoint, out = f"127.0.0.1:{_free_port()}", [None, None]

    def node(i: int) -> None:
        try:
            out[i] = launch(plans, 2, nnodes=2, node_rank=i, rdzv_endpoint=endpoint, rdzv_id="test", **kw)
        except Exception as e:  # noqa: BLE001 - reported by the test
            out[i] = e

    threads = [threading.Thread(target=node, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    return out


@pytest.mark.slow
def test_two_nodes_equal_single_process() -> None:
    """D=2 x W=2 over two 'nodes': p2p and the data-parallel all-reduce cross them; one node gets the result."""
    out = _two_nodes([P("1f1b", 2, 4, data=2)], check=True, timeout=60)
    assert not [o for o in out if isinstance(o, Exception)], out
    results = [o for o in out if o is not None]
    assert len(results) == 1  # written on global rank 0's node only
    run = results[0]["runs"][0]
    assert run["world_size"] == 4 and run["check"]["ok"], run["check"]["message"]
    assert sorted(r["rank"] for r in run["measured"]["ranks"]) == [0, 1, 2, 3]


@pytest.mark.slow
def test_two_nodes_dead_rank_fails_fast() -> None:
    """Both nodes end with the dead rank's error, before their run timeout: neither waits it out. (The timeout
    is far above the run's own time, so a loaded CI machine starting the processes slowly is not a failure: a
    63 s run under load failed the former 60 s timeout and bound.)"""
    t, timeout = time.monotonic(), 300
    out = _two_nodes([P("1f1b", 2, 4, data=2)], timeout=timeout, fault_rank=3)
    assert all(isinstance(o, RunFailed) for o in out), out
    assert any("rank 3 failed: InjectedFault: injected fault on rank 3" in str(o) for o in out), out
    assert time.monotonic() - t < timeout


def test_forward_doubling_runs_double_forwards() -> None:
    for plan in (PLANS_2["chimera N>D forward-doubling+rc"], PLANS_4["chimera D=4 N=8 forward-doubling+rc"]):
        assert any(a.span == 2 for row in plan.schedule().actions for a in row)


@pytest.mark.slow
def test_pipedream_weight_stashing(runs_2) -> None:  # type: ignore[no-untyped-def]
    run = runs_2["pipedream"]
    stale = 0
    for log in run["version_log"].values():
        fwd = {(e["stage"], e["mb"]): e for e in log if e["event"] == "F"}
        for e in (e for e in log if e["event"] == "B"):
            f = fwd[(e["stage"], e["mb"])]
            assert e["version"] == f["version"] and e["checksum"] == f["checksum"]
            stale += e["live_version"] != e["version"]
    assert stale > 0  # the live weights moved on: the stash mattered
    sched = PLANS_2["pipedream"].schedule()
    for per in run["weight_versions"].values():
        for key, n in per.items():
            stage = int(key.strip("()").split(",")[1])
            assert n <= sched.weight_versions[stage]


@pytest.mark.slow
def test_measurement_and_trace(runs_2) -> None:  # type: ignore[no-untyped-def]
    run = runs_2["1f1b"]
    m = run["measured"]
    assert m["iteration_time"] > 0 and 0 <= m["bubble_ratio"] < 1 and not m["emulated"]
    assert [d["device"] for d in m["devices"]] == [0, 1]
    for d in m["devices"]:
        assert d["busy"] > 0 and d["idle"] >= 0 and d["peak_activations"] >= 1
    tracks = {e["tid"] for e in run["trace"]["traceEvents"] if e["ph"] == "X"}
    assert tracks == {0, 1}
    json.dumps(run["trace"])


@pytest.mark.slow
def test_emulated_run_matches_simulator(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """What is deterministic about an emulated run: each rank walks its schedule's list in order, every compute
    action waits at least its predicted duration (so each device is busy at least as long as the simulator
    says, and the iteration lasts at least as long as the busiest device), and the figures line up device by
    device. The ratio of measured to predicted time depends on the machine's load: it is a benchmark figure
    (``benchmarks/emulate_bench.py``), not a test."""
    from executor.emulate import uniform_profile
    from planner.profile import save_profile

    path = tmp_path / "profile.json"
    save_profile(uniform_profile(4, fwd=0.004, bwd=0.008), path)
    plans = [RunPlan.direct(s, 4, 4, emulate=str(path), iterations=2, warmup=1, **kw)
             for s, kw in (("1f1b", {}), ("chimera", {}))]
    res = launch(plans, 4, timeout=60, trace=True)
    for plan, run in zip(plans, res["runs"], strict=True):
        assert run["emulated"] and run["measured"]["emulated"]
        pred, meas = run["predicted"], run["measured"]
        assert len(pred["devices"]) == len(meas["devices"]) == 4
        for p, m in zip(pred["devices"], meas["devices"], strict=True):
            assert m["busy"] >= p["busy"] - 1e-6, (m, p)  # a sleep lasts at least its duration
        assert meas["iteration_time"] >= max(p["busy"] for p in pred["devices"]) - 1e-6
        assert run["ratio"] == meas["iteration_time"] / pred["iteration_time"]
        sched = plan.schedule()
        done: dict[int, list[str]] = {}
        for e in run["trace"]["traceEvents"]:
            if e["ph"] == "X" and e["cat"] in ("F", "B", "I", "W") and e["args"]["iteration"] == 0:
                done.setdefault(e["tid"], []).append(e["name"])
        for d in range(4):  # W = t = 1: rank d is device d
            assert done[d] == [str(a) for a in sched.actions[d] if a.kind in ("F", "B", "I", "W")], d


@pytest.mark.slow
def test_dead_rank_fails_fast_with_rank_named() -> None:
    t = time.monotonic()
    with pytest.raises(RunFailed, match="rank 1 failed: InjectedFault: injected fault on rank 1"):
        launch([P("1f1b", 2, 4)], 2, timeout=60, fault_rank=1)
    assert time.monotonic() - t < 45


@pytest.mark.slow
def test_cli_check_out_trace(tmp_path) -> None:  # type: ignore[no-untyped-def]
    out, trace = tmp_path / "result.json", tmp_path / "trace.json"
    res = CliRunner().invoke(app, ["run", "--schedule", "chimera", "-D", "2", "-N", "4", "--check", "--iterations",
                                   "1", "--warmup", "0", "--out", str(out), "--trace", str(trace)])
    assert res.exit_code == 0, res.output
    assert "parameters equal single-process training" in res.output
    data = json.loads(out.read_text())
    assert data["check"]["ok"] and data["measured"]["iteration_time"] > 0
    assert json.loads(trace.read_text())["traceEvents"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp")] == []
