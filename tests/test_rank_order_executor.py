"""The rank order in the executor (executor/groups.py's ``Layout``, planner/placement.py): ``tp-pp-dp`` (the default,
rank ``(w D + d) t + k``) and ``tp-dp-pp`` (the pipeline outermost, rank ``(d W + w) t + k``: Megatron-LM's default,
``megatron.core.parallel_state.initialize_model_parallel``). The layout's ranks and coordinates are
planner.placement's; the groups and the point-to-point pairs follow the order; real runs under ``tp-dp-pp`` (1f1b,
Chimera, expert parallelism, t = 2) equal single-process training and place each (device, copy, tensor rank) on
the rank the order says; an emulated run takes the order too; ``pipeplan run --order`` and a plan candidate whose
``run_spec`` says ``order: "tp-dp-pp"``. A relabelling of the ranks trains the same parameters, so the runs'
checks alone cannot see a wrong order: each run's ``measured.ranks`` (the coordinates every rank ran as) is
compared with planner.placement as well. Processes: gloo on the CPU, float64."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from executor.comm import neighbour_pairs
from executor.groups import Layout, make_groups
from executor.plan import RunPlan, load_plan_file
from pipeplan.cli import app
from planner.placement import ORDERS, coords, global_rank
from profiler.hf_config import read_hf_config

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MIXTRAL_CONFIG = FIXTURES / "tiny-mixtral" / "config.json"
# 4 blocks, hidden 64, 4 experts of width 96, top-2 (tests/test_expert_parallel_executor.py)
MIXTRAL = read_hf_config(MIXTRAL_CONFIG).model_dump()
OUTER = "tp-dp-pp"  # the pipeline outermost: the order that is not the executor's old layout


def _placed(run: dict[str, Any]) -> dict[int, tuple[int, int, int]]:
    """rank -> (device, copy, tensor rank) each rank of a run's result ran as."""
    return {r["rank"]: (r["device"], r["data"], r["tensor"]) for r in run["measured"]["ranks"]}


def _expected(order: str, D: int, W: int, t: int) -> dict[int, tuple[int, int, int]]:
    return {r: coords(order, r, D, W, t) for r in range(D * W * t)}


# ---- the layout --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("order", ORDERS)
def test_layout_is_planner_placement_and_round_trips(order: str) -> None:
    """For both orders and several shapes: Layout.rank is planner.placement.global_rank, Layout.coords its
    coords, a bijection of 0..tDW-1 onto the (device, copy, tensor rank) triples, and each inverts the other."""
    for D, W, t in ((1, 1, 1), (2, 2, 1), (2, 3, 2), (4, 2, 2), (3, 4, 1), (2, 2, 4)):
        layout = Layout(D, W, t, order=order)
        seen = set()
        for d in range(D):
            for w in range(W):
                for k in range(t):
                    r = layout.rank(d, w, k)
                    assert r == global_rank(order, d, w, k, D, W, t)
                    assert layout.coords(r) == (d, w, k) == coords(order, r, D, W, t)
                    seen.add(r)
        assert seen == set(range(D * W * t))


def test_layout_takes_the_configs_order_and_refuses_an_unknown_one() -> None:
    """Layout.of reads pipeline, data, tensor, expert and order off a configuration; an order planner.placement
    does not know is refused (global_rank would read it as the default)."""
    c = RunPlan.direct("1f1b", 2, 2, data=4, tensor=2, expert=2, order=OUTER).spec.config
    assert Layout.of(c) == Layout(2, 4, 2, 2, OUTER)
    assert Layout.of(RunPlan.direct("1f1b", 2, 2).spec.config).order == "tp-pp-dp"
    with pytest.raises(ValueError, match="unknown rank order 'pp-tp-dp'"):
        Layout(2, 2, 1, order="pp-tp-dp")


def _groups(monkeypatch: pytest.MonkeyPatch, plan: RunPlan, rank: int) -> Any:
    import executor.groups as groups

    monkeypatch.setattr(groups.dist, "new_group", lambda ranks: tuple(ranks))
    return make_groups(plan.schedule(), Layout.of(plan.spec.config), rank, tied=True)


def test_groups_and_pairs_follow_the_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """1f1b at D = 2, W = 2, t = 1: under tp-dp-pp a stage's copies are contiguous -- stage 0's group [0, 1], stage
    1's [2, 3] -- and the pipeline pairs (0, 2), (1, 3); under tp-pp-dp stage 0's group is [0, 2] and the pairs
    (0, 1), (2, 3). The pairs are what run_plan warms up (Layout.pairs into executor.comm.neighbour_pairs)."""
    outer = RunPlan.direct("1f1b", 2, 2, data=2, order=OUTER)
    inner = RunPlan.direct("1f1b", 2, 2, data=2)
    g = _groups(monkeypatch, outer, 0)
    assert g.stage_ranks == {0: [0, 1], 1: [2, 3]}
    assert g.tied_ranks == [0, 1, 2, 3]
    assert neighbour_pairs(outer.schedule(), Layout.of(outer.spec.config).pairs) == [(0, 2), (1, 3)]
    g = _groups(monkeypatch, inner, 0)
    assert g.stage_ranks == {0: [0, 2], 1: [1, 3]}
    assert neighbour_pairs(inner.schedule(), Layout.of(inner.spec.config).pairs) == [(0, 1), (2, 3)]


def test_tensor_and_expert_groups_follow_the_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """t = 2, D = 2, W = 4, e = 2 under tp-dp-pp (rank (d W + w) t + k): the tensor group of (d, w) is the two
    consecutive ranks 2 (2d + w), +1; rank 0's expert group (copies 0, 1 at device 0, tensor rank 0) is [0, 2] and
    its stage 0 expert-data group (copies 0, 2) is [0, 4]; its stage group every copy of device 0 at tensor rank 0.
    Megatron-LM's docstring example (16 GPUs, t = 2, D = 4): data-parallel group [g0, g2], pipeline [g0, g4, g8,
    g12]."""
    plan = RunPlan.direct("1f1b", 2, 2, data=4, tensor=2, expert=2, order=OUTER, model=MIXTRAL["name"],
                          model_spec=MIXTRAL)
    g = _groups(monkeypatch, plan, 0)
    assert g.tensor_ranks == [0, 1] and g.expert_ranks == [0, 2]
    assert g.expert_data_ranks[0] == [0, 4] and g.stage_ranks[0] == [0, 2, 4, 6]
    g = _groups(monkeypatch, plan, 11)  # (d W + w) t + k = 11: device 1, copy 1, tensor rank 1
    assert Layout.of(plan.spec.config).coords(11) == (1, 1, 1)
    assert g.tensor_ranks == [10, 11] and g.expert_ranks == [9, 11] and g.stage_ranks[1] == [9, 11, 13, 15]
    megatron = Layout(4, 2, 2, order=OUTER)
    assert [megatron.rank(0, w) for w in range(2)] == [0, 2]
    assert [megatron.rank(d) for d in range(4)] == [0, 4, 8, 12]


# ---- real runs against single-process training ------------------------------------------------------------------

def _candidate_file(tmp: Path) -> Path:
    """A plan file whose candidate's run_spec says order tp-dp-pp (as pipeplan plan --json writes it)."""
    cand = {"run_spec": {"config": {"tensor": 1, "pipeline": 2, "data": 2, "micro_batch": 1, "schedule": "1f1b",
                                    "order": OUTER}, "microbatches": 2, "partition": []}}
    path = tmp / "plan.json"
    path.write_text(json.dumps({"candidates": [cand]}))
    return path


def _candidate_plan() -> RunPlan:
    with tempfile.TemporaryDirectory() as tmp:
        return load_plan_file(_candidate_file(Path(tmp)), 0, iterations=2)


RUNS_4 = {
    "1f1b D=2 W=2": RunPlan.direct("1f1b", 2, 2, data=2, order=OUTER, iterations=2),
    "chimera D=2 W=2 (stages on both devices)": RunPlan.direct("chimera", 2, 2, data=2, order=OUTER, iterations=2),
    "mixtral e=2 D=2 W=2": RunPlan.direct("1f1b", 2, 2, data=2, expert=2, order=OUTER, model=MIXTRAL["name"],
                                          model_spec=MIXTRAL, iterations=2),
    "plan candidate with order tp-dp-pp": _candidate_plan(),
}
RUNS_8 = {
    "1f1b t=2 D=2 W=2": RunPlan.direct("1f1b", 2, 2, data=2, tensor=2, order=OUTER, iterations=1),
}


@pytest.fixture(scope="module")
def runs() -> dict[str, dict[str, Any]]:
    from executor.launch import launch

    out: dict[str, dict[str, Any]] = {}
    for plans, world in ((RUNS_4, 4), (RUNS_8, 8)):
        res = launch(list(plans.values()), world, check=True, timeout=120)
        out |= dict(zip(plans, res["runs"], strict=True))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", [*RUNS_4, *RUNS_8])
def test_tp_dp_pp_run_equals_single_process_on_its_ranks(runs: dict[str, dict[str, Any]], name: str) -> None:
    """Each run under tp-dp-pp trains the parameters single-process training does, and every rank ran as the
    (device, copy, tensor rank) planner.placement gives it under tp-dp-pp (which tp-pp-dp would not)."""
    run = runs[name]
    c = run["plan"]["spec"]["config"]
    assert c["order"] == OUTER
    check = run["check"]
    assert check["ok"] is True, check["message"]
    D, W, t = c["pipeline"], c["data"], c["tensor"]
    assert _placed(run) == _expected(OUTER, D, W, t) != _expected("tp-pp-dp", D, W, t)


@pytest.mark.slow
def test_emulated_run_takes_the_order(tmp_path: Path) -> None:
    """An emulated run (uniform profile, this machine's links: real messages) at D = 2, W = 2 under tp-dp-pp runs
    to the end with its ranks laid out as the order says."""
    from executor.emulate import uniform_profile
    from executor.launch import launch
    from planner.profile import save_profile

    save_profile(uniform_profile(4, fwd=1e-3, bwd=2e-3), tmp_path / "p.json")
    plan = RunPlan.direct("1f1b", 2, 2, data=2, order=OUTER, emulate=str(tmp_path / "p.json"), iterations=1,
                          warmup=0)
    run = launch([plan], 4, timeout=120)["runs"][0]
    assert run["emulated"] and run["communication"] == "real" and run["measured"]["iteration_time"] > 0
    assert _placed(run) == _expected(OUTER, 2, 2, 1)


# ---- pipeplan run --order ----------------------------------------------------------------------------------------

def test_cli_run_refuses_an_unknown_order() -> None:
    """``--order`` other than tp-pp-dp or tp-dp-pp: one error line naming --order, exit 2, nothing launched."""
    res = CliRunner().invoke(app, ["run", "-s", "1f1b", "-D", "2", "-N", "2", "-W", "2", "--order", "dp-pp-tp"])
    assert res.exit_code == 2, res.output
    assert res.output.startswith("error: --order: unknown rank order 'dp-pp-tp'") and "tp-dp-pp" in res.output


def test_cli_run_plan_refuses_another_order_than_its_candidates(tmp_path: Path) -> None:
    """A candidate runs in its run_spec's order (its prediction's); ``--order`` naming the other is refused."""
    res = CliRunner().invoke(app, ["run", "--plan", str(_candidate_file(tmp_path)), "--order", "tp-pp-dp"])
    assert res.exit_code == 2, res.output
    assert "--order tp-pp-dp" in res.output and "order tp-dp-pp" in res.output


@pytest.mark.slow
@pytest.mark.parametrize("form", ["direct", "plan"])
def test_cli_run_with_order_tp_dp_pp(tmp_path: Path, form: str) -> None:
    """``pipeplan run -s 1f1b -D 2 -W 2 --order tp-dp-pp --check`` and ``pipeplan run --plan`` of a candidate
    whose run_spec says order tp-dp-pp: both run under tp-dp-pp (the summary says so, the result's ranks are
    placed by it) and equal single-process training."""
    out = tmp_path / "result.json"
    args = (["-s", "1f1b", "-D", "2", "-N", "2", "-W", "2", "--order", OUTER] if form == "direct"
            else ["--plan", str(_candidate_file(tmp_path))])
    res = CliRunner().invoke(app, ["run", *args, "--check", "--iterations", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert f"ranks={OUTER}" in res.output and "check: parameters equal single-process training" in res.output
    run = json.loads(out.read_text())
    assert run["plan"]["spec"]["config"]["order"] == OUTER
    assert _placed(run) == _expected(OUTER, 2, 2, 1)
