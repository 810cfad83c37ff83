"""PipeDream's unevenly replicated stages (issue 17): the IR (1F1B-RR), the vectorised A(j, m) program, the
search's replicated candidates and the setting where they win (tests/pipedream_front.py)."""

from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pipedream_front import front_heavy_profile, request, small_memory_cluster

from planner.analytic import analytic_profile
from planner.cluster import load_cluster
from planner.device import device_for_cluster
from planner.model import PRESETS
from planner.partition import _program, pipedream_partition, pipedream_partition_arrays, pipedream_slowest
from planner.replicated import ReplicatedPlans
from planner.request import TrainingRequest
from planner.schedules import build, inflight
from planner.schedules.ir import ALLREDUCE, B, F, lower
from planner.schedules.one_f_one_b_rr import parse_replication
from planner.schedules.replay import replay_lowered
from planner.schedules.validate import validate
from planner.search import Planner, plan
from planner.simulate import UnitCosts, simulate

EX = Path(__file__).resolve().parent.parent / "examples" / "clusters"
reps_st = st.lists(st.integers(1, 4), min_size=1, max_size=5)


@settings(max_examples=150, deadline=None)
@given(reps=reps_st, N=st.integers(1, 14), name=st.sampled_from(["1f1b-rr", "pipedream-rr"]))
def test_replicated_stages_are_valid_ir(reps: list[int], N: int, name: str) -> None:
    """Synchronous (1F1B-RR, a flush) and asynchronous (PipeDream-RR, weight stashing) replicated stages."""
    D = sum(reps)
    sched = build(name, D, N, replication=",".join(map(str, reps)))
    validate(sched)
    low = lower(sched)
    validate(low)
    first = [sum(reps[:s]) for s in range(len(reps))]
    for d, row in enumerate(sched.actions):
        for a in row:  # round robin: micro-batch m runs on replica m mod r_s of every stage
            assert d == first[a.stage] + a.mb % reps[a.stage]
    for m in range(N):  # forward and backward of a micro-batch on the same replica
        for s in range(len(reps)):
            where = {a.kind: d for d, row in enumerate(sched.actions) for a in row if a.mb == m and a.stage == s}
            assert where[F] == where[B]
    # one all-reduce per stage copy: every device all-reduces its one stage once
    for row in low.actions:
        assert Counter(a.kind for a in row)[ALLREDUCE] == 1
    # the in-flight counts the planner bounds memory with are the lists' peaks, per stage copy
    counts = inflight(name, D, N, replication=",".join(map(str, reps)))
    stage_peak = [0] * len(reps)
    for d, row in enumerate(sched.actions):
        alive = peak = 0
        for a in row:
            alive += 1 if a.kind == F else -1
            peak = max(peak, alive)
        (r, s), = sched.stages_on(d)
        assert counts[(r, s)] == peak
        stage_peak[s] = max(stage_peak[s], peak)
    if name == "pipedream-rr":  # one stashed weight version per micro-batch in flight on a replica
        assert not sched.synchronous and sched.params["update"] == "per-microbatch"
        assert sched.weight_versions == stage_peak
        assert sched.actions == build("1f1b-rr", D, N, replication=",".join(map(str, reps))).actions
    else:
        assert sched.synchronous and not sched.weight_versions
    # the fast replay times exactly the lowered lists
    costs = UnitCosts(comm=0.3, allreduce_time=0.5)
    assert simulate(sched, costs).makespan == pytest.approx(replay_lowered(low, costs).makespan)


def test_one_replica_per_stage_is_1f1b() -> None:
    for D, N in ((3, 8), (4, 2), (5, 5)):
        rr = build("1f1b-rr", D, N, replication=",".join(["1"] * D))
        assert rr.actions == build("1f1b", D, N).actions


def test_replicated_stage_halves_the_bottleneck() -> None:
    """2-1-1 with a first stage twice as heavy runs like a balanced 3-stage pipeline."""
    class Heavy(UnitCosts):
        def compute(self, kind, stage, span, device):  # type: ignore[no-untyped-def]
            return super().compute(kind, stage, span, device) * (2 if stage == 0 else 1)
    N = 16
    rr = simulate(build("1f1b-rr", 4, N, replication="2,1,1"), Heavy()).makespan
    uniform = simulate(build("1f1b", 3, N), Heavy()).makespan
    assert rr < 0.6 * uniform


def test_bad_replication_names_the_rule() -> None:
    with pytest.raises(ValueError, match="uses 3 devices, not 4"):
        parse_replication("2,1", 4)
    with pytest.raises(ValueError, match="at least one replica"):
        parse_replication("2,0,2")


def test_vectorised_program_matches_the_loops() -> None:
    rng = random.Random(7)
    for _ in range(200):
        L, M = rng.randint(1, 8), rng.randint(1, 6)
        lt = [rng.choice([rng.random(), 1.0]) for _ in range(L)]
        ct = [rng.random() * 0.3 for _ in range(L)]
        pw = np.concatenate([[0.0], np.cumsum([rng.random() for _ in range(L)])])

        def sync(i: int, j: int, m: int, pw: np.ndarray = pw) -> float:
            return 4 * (m - 1) * (pw[j] - pw[i]) / m
        arr = np.array([[[sync(i, j, m) if m else 0.0 for j in range(L + 1)] for i in range(L + 1)]
                        for m in range(M + 1)])
        a, b = pipedream_partition(lt, ct, M, sync), pipedream_partition_arrays(lt, ct, M, arr)
        assert b.slowest == pytest.approx(a.slowest)
        assert sum(b.replicas) == M and b.bounds[0][0] == 0 and b.bounds[-1][1] == L
        # with a memory limit (stages of at most 2 layers fit), every stage of the answer fits
        narrow = np.arange(L + 1)[None, :] - np.arange(L + 1)[:, None] <= 2
        if M * 2 >= L:
            c = pipedream_partition_arrays(lt, ct, M, arr, fits=narrow)
            assert all(j - i <= 2 for i, j in c.bounds) and sum(c.replicas) == M
            assert c.slowest >= b.slowest - 1e-12
        got = max(max(sum(lt[i:j]), sync(i, j, m) if m > 1 else 0.0) / m
                  for (i, j), m in zip(b.bounds, b.replicas, strict=True))
        assert got <= b.slowest + 1e-9


def test_slowest_alone_equals_the_program_with_its_choices() -> None:
    """:func:`pipedream_slowest` (the search's gate: the values of A(L, m) without the choice tables) gives
    exactly the full program's A(L, m) for every m, with and without a memory limit."""
    rng = random.Random(11)
    for _ in range(100):
        L, M = rng.randint(1, 12), rng.randint(1, 9)
        lt = [rng.choice([rng.random(), 1.0, 0.5]) for _ in range(L)]
        ct = [rng.random() * 0.3 for _ in range(L)]
        fits = None if rng.random() < 0.3 else (
            np.arange(L + 1)[None, :] - np.arange(L + 1)[:, None] <= rng.randint(1, L))
        full, _, _ = _program(lt, ct, M, None, fits, False)
        assert pipedream_slowest(lt, ct, M, fits).tolist() == full[L].tolist()


def _bert48():  # type: ignore[no-untyped-def]
    cl = load_cluster(EX / "piz-daint-p100-16gb.json")
    return analytic_profile(PRESETS["bert-48"], device_for_cluster(cl), dtype="fp32"), cl


def test_uniform_transformer_stack_keeps_uniform_plans() -> None:
    """GPT-2 1.3B on 16 A100s and BERT-48 on 32 P100s: blocks of equal cost balance for some pipeline depth,
    so no replicated plan is even enumerated and the best plan is uniform."""
    cl = load_cluster(EX / "dgx-a100-80gb.json")
    gpt = analytic_profile(PRESETS["gpt2-1.3b"], device_for_cluster(cl))
    for prof, clu, gpus, batch in ((gpt, cl, 16, 64), (*_bert48(), 32, 256)):
        planner = Planner(prof, clu, TrainingRequest(global_batch=batch, gpus=gpus))
        assert not planner.replicated.keys(planner.configs(Counter()), planner.memory.total_state)
        res = planner.search()
        assert res.candidates and res.candidates[0].config.replication is None
        # nor under allow_async (PipeDream's asynchronous variant takes the same gate)
        asyn = Planner(prof, clu, TrainingRequest(global_batch=batch, gpus=gpus, allow_async=True))
        assert asyn.replicated.variants() == ["1f1b-rr", "pipedream-rr"]
        assert not asyn.replicated.keys(asyn.configs(Counter()), asyn.memory.total_state)


@pytest.mark.slow
def test_uniform_stack_beats_replicated_plans_when_they_compete(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same with the gate open (PipeDream's program run for every D): the replicated candidates are
    simulated and lose to the uniform plans on BERT-48."""
    monkeypatch.setattr(ReplicatedPlans, "can_differ", lambda self, t, D, b, rc: D >= 2)
    prof, cl = _bert48()
    planner = Planner(prof, cl, TrainingRequest(global_batch=256, gpus=32, top=200))
    assert len(planner.replicated.keys(planner.configs(Counter()), planner.memory.total_state)) > 10
    res = planner.search()
    assert any(c.config.replication for c in res.candidates)
    assert res.candidates[0].config.replication is None


def test_uneven_replication_wins_where_the_front_dominates() -> None:
    """tests/pipedream_front.py: the best plan is PipeDream's 2-1-1, ahead of every uniform plan by over 5%."""
    res = plan(front_heavy_profile(), small_memory_cluster(), request())
    best = res.candidates[0]
    assert best.config.schedule == "1f1b-rr" and best.config.replication == "2,1,1"
    assert best.partition == [[0, 1], [1, 3], [3, 5]]
    assert "stages 0-0 x2, 1-2 x1, 3-4 x1" in best.to_dict()["label"]
    uniform = min(c.iteration_time for c in res.candidates if c.config.replication is None)
    assert best.iteration_time < 0.95 * uniform
    assert math.isfinite(best.iteration_time)


def test_asynchronous_replicated_plans_only_under_allow_async() -> None:
    """PipeDream's asynchronous variant (weight stashing, pipedream-rr) is enumerated only when allow_async is
    set; it takes the same A(j, m) partition as 1F1B-RR, times the same lists, and costs one stashed weight
    version per micro-batch in flight (beyond the live weights) in memory, which its row explains."""
    prof, cl = front_heavy_profile(), small_memory_cluster()
    sync_only = plan(prof, cl, request())
    assert not any(c.config.schedule == "pipedream-rr" for c in sync_only.candidates + sync_only.infeasible)
    res = plan(prof, cl, request().model_copy(update={"allow_async": True}))
    by = {c.config.schedule: c for c in res.candidates if c.config.replication == "2,1,1"}
    rr, pd = by["1f1b-rr"], by["pipedream-rr"]
    assert pd.partition == rr.partition == [[0, 1], [1, 3], [3, 5]]
    assert pd.iteration_time == pytest.approx(rr.iteration_time)
    sched = build("pipedream-rr", 4, pd.microbatches, replication="2,1,1")
    assert sched.weight_versions == [2, 2, 1]  # c_s of 2-1-1 with 4 micro-batches per replica of stage 0
    for d, ((_r, s),) in enumerate(sched.stages_by_device()):
        a, b = pd.partition[s]
        extra = (sched.weight_versions[s] - 1) * sum(lay.param_bytes for lay in prof.layers[a:b])
        assert pd.memory[d] == pytest.approx(rr.memory[d] + extra)
    assert pd.memory[2] > rr.memory[2]  # stage 1 (layers 1-2, 40 M parameters) stashes a second version
    assert "weight stashing (2,2,1 versions per stage)" in pd.to_dict()["label"]
    assert "weight stashing" not in rr.to_dict()["label"]


# ---- the executor: replicated stages run and train as one process does -------------------------------
TINY = {"layers": 4, "hidden": 16, "heads": 2, "seq": 8, "vocab": 32}
RR_PLANS = {
    "2-1-1 gpt-tiny": {"replication": "2,1,1", "N": 8, "model": None},
    "1-2-1 gpt-tiny": {"replication": "1,2,1", "N": 6, "model": None},
    "1-3 small +rc": {"replication": "1,3", "N": 5, "model": TINY, "recompute": True},
    "2-1-1 grouped small": {"replication": "2,1,1", "N": 4, "model": TINY, "p2p": "grouped"},
}


def _rr_plan(name: str):  # type: ignore[no-untyped-def]
    from executor.plan import RunPlan
    p = RR_PLANS[name]
    return RunPlan.direct("1f1b-rr", 4, p["N"], replication=p["replication"], recompute=bool(p.get("recompute")),
                          **({"model_overrides": p["model"]} if p["model"] else {}))


def _stash_plan():  # type: ignore[no-untyped-def]
    from executor.plan import RunPlan
    return RunPlan.direct("pipedream-rr", 4, 8, replication="2,1,1", iterations=2)


@pytest.fixture(scope="module")
def prefetch_launch() -> dict:  # type: ignore[type-arg]
    """One launch of 4 gloo processes (the default prefetch policy) for the synchronous RR plans and the
    PipeDream-RR stash plan, in sequence on one process group (as tests/test_executor_run.py does): a launch
    costs seconds of process start-up, the plans' runs a fraction of it."""
    from executor.launch import launch
    names = [n for n, p in RR_PLANS.items() if p.get("p2p", "prefetch") == "prefetch"]
    stash = _stash_plan()
    runs = launch([*(_rr_plan(n) for n in names), stash], 4, check=True, timeout=180, p2p="prefetch")["runs"]
    return {"rr": dict(zip(names, runs[:-1], strict=True)), "stash": {"plan": stash, "run": runs[-1]}}


@pytest.fixture(scope="module")
def rr_runs(prefetch_launch: dict) -> dict:  # type: ignore[type-arg]
    from executor.launch import launch
    out = dict(prefetch_launch["rr"])
    names = [n for n, p in RR_PLANS.items() if p.get("p2p", "prefetch") == "grouped"]
    res = launch([_rr_plan(n) for n in names], 4, check=True, timeout=120, p2p="grouped")
    out.update(dict(zip(names, res["runs"], strict=True)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RR_PLANS))
def test_replicated_stages_equal_single_process(rr_runs, name) -> None:  # type: ignore[no-untyped-def]
    """Synchronous 1F1B-RR (a flush): the parameters after the run equal single-process training's."""
    check = rr_runs[name]["check"]
    assert check["ok"], check["message"]


def test_predict_a_named_replication() -> None:
    """A replication the user names (not the program's) gets the partition balancing work per replica."""
    from planner.partition import weighted_partition
    from planner.request import Config
    from planner.search import predict
    assert weighted_partition([4.0, 1.0, 1.0, 1.0, 1.0], (2, 1, 1)) == [(0, 1), (1, 3), (3, 5)]
    cand = predict(front_heavy_profile(), small_memory_cluster(), request(),
                   Config(tensor=1, pipeline=4, data=1, micro_batch=1, schedule="1f1b-rr", replication="1,2,1"))
    assert cand.simulation is not None and len(cand.partition) == 3
    assert "x2" in cand.label()


@pytest.fixture(scope="module")
def stash_run(prefetch_launch: dict) -> dict:  # type: ignore[type-arg]
    return prefetch_launch["stash"]


@pytest.mark.slow
def test_asynchronous_replicated_stages_stash_weights(stash_run) -> None:  # type: ignore[no-untyped-def]
    """PipeDream-RR 2-1-1 on gpt-tiny (4 gloo processes, two windows): every backward uses exactly the weights
    its forward used (version and checksum), the parameters after the run equal PipeDream's weight stashing
    computed in one process with explicit stashed versions (executor.stash_reference) and differ from the same
    without stashing, and no replica keeps more weight versions than the planner costs."""
    run, sched = stash_run["run"], stash_run["plan"].schedule()
    check = run["check"]
    assert check["ok"], check["message"]
    assert check["differs_without_stash"]
    stale = 0
    for log in run["version_log"].values():
        fwd: dict[tuple[int, int], dict] = {}  # type: ignore[type-arg]
        for e in log:  # in order: a backward meets its own window's forward
            if e["event"] == "F":
                fwd[(e["stage"], e["mb"])] = e
                continue
            f = fwd.pop((e["stage"], e["mb"]))
            assert e["version"] == f["version"] and e["checksum"] == f["checksum"]
            stale += e["live_version"] != e["version"]
    assert stale > 0  # the live weights moved on while micro-batches were in flight: the stash mattered
    for per in run["weight_versions"].values():
        for key, n in per.items():
            stage = int(key.strip("()").split(",")[1])
            assert n <= sched.weight_versions[stage]


def test_replica_rows_name_each_replica_grouped_by_stage() -> None:
    """The timeline's rows of a replicated plan (planner.replicated.replica_rows, read by api/static/timeline.js)."""
    from planner.replicated import replica_rows
    for name in ("1f1b-rr", "pipedream-rr"):
        got = replica_rows(build(name, 5, 6, replication="1,3,1"))
        assert got == (["S0 · P0", "S1 r0 · P1", "S1 r1 · P2", "S1 r2 · P3", "S2 · P4"], [0, 1, 1, 1, 2])
    assert replica_rows(build("1f1b", 3, 3)) is None
