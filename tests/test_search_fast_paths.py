"""The search's fast paths give what the plain computations give: the vectorised encoding of a schedule (its
all-reduce points, its action signatures) equals the per-device rules of :mod:`planner.schedules.ir`, and
the ranked output of a search is the one an exhaustive evaluation of every configuration gives."""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.analytic import analytic_profile
from planner.candidate import gib
from planner.cluster import load_cluster
from planner.device import device_for_cluster
from planner.model import PRESETS
from planner.request import Config, TrainingRequest
from planner.runspec import schedule_microbatches
from planner.schedules import build, inflight_exact
from planner.schedules.encoded import EncodedSchedule, _signatures
from planner.schedules.ir import Action, F, Schedule, allreduce_points, eager_stages
from planner.schedules.merge import one_f_one_b_groups
from planner.search import Planner
from planner.simulate import simulate


def _schedules() -> list[tuple[Schedule, object]]:
    """Built schedules of every synchronous kind, each with the eager settings it may be lowered with."""
    out: list[tuple[Schedule, object]] = []
    for D, N in ((2, 3), (4, 8), (6, 12)):
        for name, kw in (("gpipe", {}), ("1f1b", {}), ("zb-h1", {}), ("interleaved", {"chunks": 2}),
                         ("hanayo", {"waves": 2}), ("gems", {}), ("chimera", {}),
                         ("chimera", {"concat": "forward-doubling"})):
            try:
                s = build(name, D, N, **kw)
            except ValueError:
                continue
            for eager in ("none", "all", {0, D - 1}, {1}):
                out.append((s, eager))
    for reps in ("2,1", "1,2,1", "2,2"):
        s = build("1f1b-rr", sum(int(x) for x in reps.split(",")), 6, replication=reps)
        out.extend((s, eager) for eager in ("none", "all"))
    return out


@pytest.mark.parametrize("sched,eager", _schedules(), ids=lambda x: getattr(x, "name", str(x)))
def test_vectorised_allreduce_points_equal_the_per_device_rule(sched, eager):
    plan = EncodedSchedule.encode(sched, eager)
    assert plan is not None
    eager_set = eager_stages(eager, sched.stages)
    held = sched.stages_by_device()
    for d in range(sched.devices):
        here, end = allreduce_points(sched, d, eager_set, held[d])
        assert plan.eager_at[d] == here, d
        assert plan.at_end[d] == end, d


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50), min_size=0, max_size=60), st.integers(0, 10_000))
def test_signatures_number_distinct_values_as_unique_does(values, shift):
    key = np.array(values, dtype=np.int64) + shift
    sig, holder = _signatures(key)
    if not len(key):
        assert len(sig) == len(holder) == 0
        return
    uniq, inverse = np.unique(key, return_inverse=True)
    assert sig.tolist() == inverse.reshape(-1).tolist()
    assert len(holder) == len(uniq) and key[holder].tolist() == uniq.tolist()


# ---- the search -------------------------------------------------------------------------------------------
EX = Path(__file__).resolve().parent.parent / "examples" / "clusters"


def _planner(preset: str, cluster: str, gpus: int, batch: int, top: int = 8, **kw: object) -> Planner:
    cl = load_cluster(EX / cluster)
    prof = analytic_profile(PRESETS[preset], device_for_cluster(cl))
    return Planner(prof, cl, TrainingRequest(global_batch=batch, gpus=gpus, top=top, **kw))


@pytest.mark.parametrize("preset,cluster,gpus,batch", [
    ("bert-48", "piz-daint-p100-16gb.json", 4, 64),
    pytest.param("gpt2-1.3b", "dgx-a100-80gb.json", 8, 128, marks=pytest.mark.slow),
])
def test_memory_known_before_simulating_is_the_simulated_memory(preset, cluster, gpus, batch):
    """The activation peaks counted from the lists' order are the simulator's, to the last bit; and a
    configuration the search rejects before simulating is one the simulation finds out of memory, with the
    same memory and reason."""
    planner = _planner(preset, cluster, gpus, batch)
    multi = rejected_early = 0
    for cfg in planner.configs(Counter()):
        cand, costs = planner.prepare(cfg)
        if costs is None:
            continue
        sched = costs.schedule = planner.shapes.schedule(cfg, schedule_microbatches(cfg, cand.microbatches))
        res = simulate(sched, costs, compiled=planner.shapes.compiled(cfg, sched))
        assert planner.memory.list_peaks(sched, costs) == [d.peak_activations for d in res.devices], cfg.label()
        multi += len(planner.shapes.layout(cfg, sched).stage[0]) > 1
        early = copy.copy(cand)
        if planner.out_of_memory(early, costs, sched, inflight_exact(cfg.schedule)):
            rejected_early += 1
            mem = planner.memory.simulated_memory(cand, costs, res)
            assert early.memory == mem and max(mem) > planner.cluster.memory_bytes
            assert early.reason == f"out of memory: device {mem.index(max(mem))} needs {gib(max(mem))}, " \
                                   f"{gib(max(mem) - planner.cluster.memory_bytes)} over " \
                                   f"{gib(planner.cluster.memory_bytes)}"
        else:
            assert early.reason == cand.reason
    assert multi > 10 and rejected_early > 0


def test_zero_bubble_held_gradients_are_counted_before_the_lists_exist():
    """ZB-H1 holds one stage per device, and its I also holds the weight GEMMs' output gradients until W; where a
    stage's activations peak it holds ``s + 1`` of those (:func:`planner.schedules.zb_h1.held_at_peak`). GPT-3
    175B at t=8, D=16 fits on the activations alone and not with them: the search rejects it before any list is
    built (no partition balancing memory fits either), with the activation peaks the lists give, and simulating
    those lists finds it out of memory too."""
    from planner.cost import ConfigCosts

    planner = _planner("gpt3-175b", "dgx-a100-80gb.json", 1024, 1536)
    cfg = Config(tensor=8, pipeline=16, data=8, micro_batch=1, schedule="zb-h1")
    cand, costs = planner.prepare(cfg)
    assert costs is None and cand.reason.startswith("out of memory: device 15 needs at least")
    assert not planner.shapes._schedules  # no lists built
    assert planner.memory_partition(cfg, planner.shapes.schedule(cfg, cand.microbatches, full=False), 1) is None
    sched = planner.shapes.schedule(cfg, schedule_microbatches(cfg, cand.microbatches))
    costs = ConfigCosts(planner.profile, planner.cluster, planner.request, cfg, sched, planner.partition(16, 1, False))
    reserve = planner.request.memory_reserve_bytes
    floor = [m - s - reserve for m, s in zip(cand.memory, cand.state, strict=True)]
    assert planner.memory.list_peaks(sched, costs) == pytest.approx(floor, rel=1e-12)
    mem = planner.memory.simulated_memory(cand, costs, simulate(sched, costs))
    assert mem.index(max(mem)) == 15 and max(mem) > planner.cluster.memory_bytes


def test_zero_bubble_memory_partition_counts_the_held_gradients():
    """Where ZB-H1's time-balanced partition does not fit, the partition balancing memory counts the output
    gradients its I's hold as the simulation does: every ZB-H1 configuration of GPT-2 1.3B on 16 A100s 40GB it
    partitions fits when simulated (before it counted them, none of those did, and the ones that fit were
    rejected)."""
    from planner.runspec import schedule_samples

    planner = _planner("gpt2-1.3b", "dgx-a100-40gb.json", 16, 128)
    moved = 0
    for cfg in planner.configs(Counter()):
        if cfg.schedule != "zb-h1":
            continue
        cand, costs = planner.prepare(cfg)
        if costs is None or cand.partition == [list(b) for b in planner.partition(cfg.pipeline, schedule_samples(cfg),
                                                                                   cfg.recompute)]:
            continue
        planner.evaluate(cand, costs)
        assert cand.fits, (cfg.label(), cand.reason)
        moved += 1
    assert moved >= 3


def test_a_configuration_fitting_with_the_memory_partition_keeps_no_rejection_reason():
    """GPT-3 175B 1F1B at t=8, D=8: the time-balanced partition does not fit, the memory-balanced one does; the
    candidate is ranked, and the first partition's "out of memory" is not its reason."""
    planner = _planner("gpt3-175b", "dgx-a100-80gb.json", 1024, 1536)
    cfg = Config(tensor=8, pipeline=8, data=16, micro_batch=1, schedule="1f1b")
    cand, costs = planner.prepare(cfg)
    assert costs is not None
    assert cand.partition != [list(b) for b in planner.partition(8, 1, False)]
    planner.evaluate(cand, costs)
    assert cand.fits and cand.reason == ""


@pytest.mark.parametrize("preset,cluster,gpus,batch,kw", [
    pytest.param("gpt2-1.3b", "dgx-a100-80gb.json", 8, 64, {}, marks=pytest.mark.slow),
    ("bert-48", "piz-daint-p100-16gb.json", 4, 64, {}),
    ("bert-48", "piz-daint-p100-16gb.json", 8, 64, {"allow_async": True}),
    # GPipe and 1F1B at D = 1 are twins with the 5th time; the bound of the one named first (1F1B) exceeds that
    # time by rounding: pruned, the row was named GPipe
    ("gpt2-medium", "dgx1-v100-32gb.json", 4, 16, {"shard_optimizer": True, "top": 5}),
    pytest.param("bert-48", "piz-daint-p100-16gb.json", 16, 128, {}, marks=pytest.mark.slow),  # Chimera wins
    # Chimera and interleaved among the best, merged and interleaved configurations rejected on the memory
    # floor before their lists exist (34 and 3), 1F1B/ZB drains and all-reduces in the bounds
    pytest.param("gpt2-1.3b", "dgx1-v100-32gb.json", 8, 64, {}, marks=pytest.mark.slow),
    pytest.param("gpt2-1.3b", "dgx1-v100-32gb.json", 8, 32, {}, marks=pytest.mark.slow),
])
def test_pruned_search_ranks_as_simulating_everything(preset, cluster, gpus, batch, kw):
    """Bounds, pruning, the memory known before simulating and the caches never change the ranking: the top
    candidates (configuration, order, time, memory, the rows they stand for) are those of simulating every
    configuration."""
    pruned = _planner(preset, cluster, gpus, batch, **kw).search()
    full = _planner(preset, cluster, gpus, batch, **kw).search(prune=False)
    assert pruned.candidates, "the case must have feasible plans"
    assert [c.config for c in pruned.candidates] == [c.config for c in full.candidates]
    assert [c.iteration_time for c in pruned.candidates] == [c.iteration_time for c in full.candidates]
    assert [c.memory for c in pruned.candidates] == [c.memory for c in full.candidates]
    assert [c.alternatives for c in pruned.candidates] == [c.alternatives for c in full.candidates]
    assert pruned.simulated < full.simulated


@pytest.mark.slow
@pytest.mark.parametrize("model,cluster,seq,attention,gpus,batch,kw", [
    # latent attention and shared experts, expert parallelism up to e = 8, sequence parallel
    ("deepseek-v2-lite", "dgx-h100-80gb.json", 1024, "flash", 8, 16, {}),
    # attention sinks, a window on every other layer, biased experts, weights sharded over the replicas
    ("gpt-oss-20b", "dgx-a100-80gb.json", 512, "unfused", 8, 16, {"shard_parameters": True}),
    # windows and grouped-query attention, one rank order
    ("gemma-2-9b", "dgx-h100-80gb.json", 1024, "flash", 16, 32, {"rank_order": "tp-dp-pp"}),
])
def test_pruned_search_ranks_as_simulating_everything_hf(model, cluster, seq, attention, gpus, batch, kw):
    """The same for Hugging Face configs of ``examples/models`` (``benchmarks/search_exactness.py --hf`` draws
    many more): rows, times, memory, names and alternatives of the pruned search are the exhaustive search's."""
    from planner.operators import OperatorOptions
    from profiler.hf_config import read_hf_config

    cl = load_cluster(EX / cluster)
    spec = read_hf_config(Path(__file__).resolve().parent.parent / "examples" / "models" / model, seq=seq)
    prof = analytic_profile(spec, device_for_cluster(cl),
                            options=OperatorOptions(attention=attention, sequence_parallel=model.startswith("deep")))
    req = TrainingRequest(global_batch=batch, gpus=gpus, top=5, **kw)
    pruned, full = Planner(prof, cl, req).search(), Planner(prof, cl, req).search(prune=False)
    assert len(pruned.candidates) == 5

    def rows(res):  # type: ignore[no-untyped-def]
        return [(c.config, c.iteration_time, c.memory, c.name, c.alternatives) for c in res.candidates]

    assert rows(pruned) == rows(full)
    assert pruned.simulated < full.simulated


@pytest.mark.parametrize("argv,collects", [(["plan", "--help"], False), (["predict"], False), (["serve"], True),
                                           ([], True)])
def test_short_lived_commands_run_without_the_cyclic_collector(monkeypatch, argv, collects):
    """``plan`` and ``predict`` (compute, print, exit) run with the cyclic GC off; every other command, the
    long-running ones above all, with it on."""
    import gc

    import pipeplan.cli as cli

    seen: list[bool] = []
    exits: list[object] = []
    monkeypatch.setattr(cli, "app", lambda: seen.append(gc.isenabled()))
    monkeypatch.setattr(cli, "exit_now", exits.append)
    monkeypatch.setattr("sys.argv", ["pipeplan", *argv])
    was = gc.isenabled()
    try:
        gc.enable()
        cli.main()
    finally:
        gc.enable() if was else gc.disable()
    assert seen == [collects]
    assert exits == ([] if collects else [0])  # and they end without the interpreter's finalization


@pytest.mark.parametrize("code,status", [(None, 0), (0, 0), (2, 2), ("a message", 1)])
def test_a_short_lived_command_exits_with_its_status_and_its_output_flushed(tmp_path, code, status):
    """:func:`pipeplan.cli.exit_now` ends the process with the status ``SystemExit`` gives, and what was
    printed (buffered, to a pipe) is all there."""
    import subprocess
    import sys

    script = ("import sys; from pipeplan.cli import exit_now; print('x' * 100000); "
              f"print('err', file=sys.stderr); exit_now({code!r})")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert r.returncode == status
    assert r.stdout == "x" * 100000 + "\n"
    assert r.stderr.startswith("err\n") and (code != "a message" or "a message" in r.stderr)


# ---- structural caches of the merged schedules (Chimera, Hanayo) ------------------------------------------
def _pipeline_slots(depth: int, groups: Sequence[Sequence[int]]) -> list[list[tuple[int, Action]]]:
    """Per stage, (slot, action) of one pipeline of ``depth`` stages run alone with 1F1B, every action one
    slot long. Computed by a direct replay (each stage its own device, no communication)."""
    lists = [one_f_one_b_groups(s, depth, groups) for s in range(depth)]
    fdone: dict[tuple[int, int], int] = {}  # (stage, first mb of group) -> end slot
    bdone: dict[tuple[int, int], int] = {}  # (stage, mb) -> end slot
    group_of: dict[int, int] = {m: g[0] for g in groups for m in g}
    pos = [0] * depth
    free = [0] * depth
    out: list[list[tuple[int, Action]]] = [[] for _ in range(depth)]
    remaining = sum(len(x) for x in lists)
    while remaining:
        progressed = False
        for s in range(depth):
            row = lists[s]
            while pos[s] < len(row):
                a = row[pos[s]]
                if a.kind == F:
                    dep = fdone.get((s - 1, a.mb)) if s > 0 else 0
                else:
                    f_end = fdone.get((s, group_of[a.mb]))
                    nxt = bdone.get((s + 1, a.mb)) if s < depth - 1 else 0
                    dep = None if f_end is None or nxt is None else max(f_end, nxt)
                if dep is None:
                    break
                start = max(free[s], dep)
                free[s] = start + 1
                if a.kind == F:
                    fdone[(s, a.mb)] = start + 1
                else:
                    bdone[(s, a.mb)] = start + 1
                out[s].append((start, a))
                pos[s] += 1
                remaining -= 1
                progressed = True
        if not progressed:  # pragma: no cover - 1F1B lists of one pipeline cannot deadlock
            raise RuntimeError("1F1B pipeline replay made no progress")
    return out


@settings(max_examples=120, deadline=None)
@given(st.integers(1, 12), st.lists(st.integers(1, 3), min_size=1, max_size=24))
def test_merge_template_is_the_1f1b_replay_of_one_pipeline(depth, sizes):
    """The template rows (flat tables) are :func:`_pipeline_slots`' replay of the 1F1B lists, slot for slot."""
    from planner.schedules import merge

    groups, i = [], 0
    for n in sizes:
        groups.append(list(range(i, i + n)))
        i += n
    want = [[(slot, a.kind != "F", a.mb, a.span) for slot, a in row] for row in _pipeline_slots(depth, groups)]
    assert merge.template.__wrapped__(depth, tuple(sizes)) == want


def _list_order_peaks(lists, act):
    """The peak of alive activations per device, action by action (the count the warm-up arrays replace)."""
    out = []
    for row in lists:
        alive = peak = 0.0
        for a in row:
            if a.kind == "F":
                alive += a.span * act[a.stage]
                peak = max(peak, alive)
            elif a.kind in ("B", "I"):
                alive -= act[a.stage]
        out.append(peak)
    return out


_MERGED = [("chimera", 4, 4, {"pipelines": 1, "concat": "direct"}),
           ("chimera", 8, 24, {"pipelines": 2, "concat": "direct"}),
           ("chimera", 8, 32, {"pipelines": 4, "concat": "forward-doubling"}),
           ("chimera", 6, 18, {"pipelines": 1, "concat": "backward-halving"}),
           ("hanayo", 4, 12, {"waves": 2}),
           ("hanayo", 8, 16, {"waves": 1})]


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(_MERGED), st.integers(1, 4), st.data())
def test_warmup_peaks_are_the_list_order_count(case, rounds, data):
    """:class:`planner.shapes.Warmup` counts the alive activations of a merged prefix as the lists' order
    does, to the last bit, whatever the per-stage activation figures; its backwards are the lists' B and I."""
    from planner.request import Config
    from planner.shapes import ScheduleCache

    name, D, N, params = case
    cfg = Config(tensor=1, pipeline=D, data=1, micro_batch=1, schedule=name, **params)
    shapes = ScheduleCache()
    S = shapes.schedule(cfg, N, full=False).stages
    warmup = shapes.warmup(cfg, N, rounds * S)
    act = data.draw(st.lists(st.floats(0.0, 1e9, allow_nan=False), min_size=S, max_size=S))
    assert warmup.peaks(np.array(act)) == _list_order_peaks(warmup.lists, act)
    assert warmup.backwards == sum(a.kind in ("B", "I") for row in warmup.lists for a in row)


def test_warmups_are_built_once_per_structure_and_are_the_builders_prefixes():
    """Configurations that differ in t, W, b or recomputation but not in (schedule, D, N, parameters) share
    one warm-up, and it is the builder's own prefix of the full lists."""
    from planner.request import Config
    from planner.schedules import chimera
    from planner.shapes import ScheduleCache

    shapes = ScheduleCache()
    a = Config(tensor=1, pipeline=8, data=2, micro_batch=2, schedule="chimera", pipelines=2, concat="direct")
    b = Config(tensor=4, pipeline=8, data=1, micro_batch=1, schedule="chimera", pipelines=2, concat="direct",
               recompute=True)
    first = shapes.warmup(a, 16, 16)
    assert shapes.warmup(b, 16, 16) is first
    assert shapes.warmup(b, 16, 24) is not first
    assert first.lists == chimera.prefix(8, 16, 16, pipelines=2, concat="direct")
    full = chimera.build(8, 16, pipelines=2, concat="direct").actions
    assert all(full[d][:len(row)] == row for d, row in enumerate(first.lists))
    assert shapes.warmup(Config(tensor=1, pipeline=8, data=1, micro_batch=1, schedule="1f1b"), 16, 16) is None


_BOUND_PLANNER: list[Planner] = []


def _merged_candidates() -> tuple[Planner, list]:
    """A small search's Chimera and Hanayo configurations that pass the checks before merging."""
    if not _BOUND_PLANNER:
        _BOUND_PLANNER.append(_planner("bert-48", "piz-daint-p100-16gb.json", 8, 64))
    planner = _BOUND_PLANNER[0]
    return planner, [cfg for cfg in planner.configs(Counter()) if not inflight_exact(cfg.schedule)]


@settings(max_examples=25, deadline=None)
@given(st.data())
def test_every_warmup_round_bounds_the_simulated_time(data):
    """The prefix bound of each round of the merged warm-up (S, 2S, 3S unit slots) is at most the simulated
    iteration time of the full schedule: what lets the search stop merging once a round's bound exceeds the
    k-th best time."""
    planner, cfgs = _merged_candidates()
    cfg = data.draw(st.sampled_from(cfgs))
    cand, costs = planner.prepare(cfg)
    if costs is None:
        return
    n = schedule_microbatches(cfg, cand.microbatches)
    S = costs.schedule.stages
    bounds = [planner.bounds.prefix_bound(costs, planner.shapes.warmup(cfg, n, r * S)) for r in (1, 2, 3, 5)]
    planner.evaluate(cand, costs)
    if cand.simulation is None:
        return
    for b in bounds:
        assert b is None or b <= cand.iteration_time * (1 + 1e-12), (cfg.label(), bounds, cand.iteration_time)


def test_refine_stops_merging_only_past_the_kth_time():
    """With a k-th best time to beat, the warm-up's rounds stop early only for a candidate whose bound exceeds
    it; without one (the exhaustive search), every round is merged and the bound is that of the last."""
    planner, cfgs = _merged_candidates()
    stopped = 0
    for cfg in cfgs:
        cand, costs = planner.prepare(cfg)
        if costs is None:
            continue
        full, early = copy.copy(cand), copy.copy(cand)
        if planner.refine(full, costs):
            continue
        kth = (cand.lower_bound + full.lower_bound) / 2
        assert not planner.refine(early, costs, kth)
        assert cand.lower_bound <= early.lower_bound
        if early.lower_bound != full.lower_bound:
            stopped += 1
            assert early.lower_bound > kth
    assert stopped > 0


def test_memory_floor_before_the_lists_rejects_only_what_does_not_fit(monkeypatch):
    """Every Chimera, Hanayo or interleaved configuration rejected by the activation floor counted before its
    lists exist (the forwards each device runs before its first backward) overflows its device's memory in
    the built lists too: with the floor switched off, the lists' own peaks (the simulator's count) give the
    same verdict."""
    planner = _planner("gpt2-1.3b", "dgx1-v100-32gb.json", 8, 64)
    floored = [cfg for cfg in planner.configs(Counter()) if cfg.schedule in ("chimera", "hanayo", "interleaved")
               and (got := planner.prepare(cfg))[1] is None and got[0].reason.startswith("out of memory")]
    assert len(floored) > 10
    plain = _planner("gpt2-1.3b", "dgx1-v100-32gb.json", 8, 64)
    monkeypatch.setattr(plain.shapes, "forwards_first", lambda config, sched: None)
    cap = plain.cluster.memory_bytes
    checked = 0
    for cfg in floored:
        cand, costs = plain.prepare(cfg)
        if costs is None:  # the floor of the in-flight counts alone rejects it too
            assert cand.reason.startswith("out of memory")
            continue
        sched = plain.shapes.schedule(cfg, schedule_microbatches(cfg, cand.microbatches))
        costs.schedule = sched
        mem = plain.memory.peak_memory(cand, costs, plain.memory.list_peaks(sched, costs))
        assert max(mem) > cap, cfg.label()
        checked += 1
    assert checked > 10


# ---- the search on two cores (planner.split_search) -------------------------------------------------------
def _rows(res):  # type: ignore[no-untyped-def]
    return [(c.config, c.iteration_time, c.memory, c.name, c.alternatives, c.breakdown, c.closed_forms,
             c.to_dict()) for c in res.candidates]


def _split_search(monkeypatch, planner: Planner):  # type: ignore[no-untyped-def]
    """``planner.search(processes=2)`` with the size threshold off; the child's part as received (None: the
    parent searched it itself)."""
    from planner import split_search

    monkeypatch.setattr(split_search, "MIN_ACTIONS", 0)
    monkeypatch.setattr(split_search, "spare_core", lambda: True)  # (whatever else the machine runs)
    got: list[object] = []
    receive = split_search._receive
    monkeypatch.setattr(split_search, "_receive", lambda fd, pid: (got.append(receive(fd, pid)), got[-1])[1])
    res = planner.search(processes=2)
    return res, got


@pytest.mark.parametrize("preset,cluster,gpus,batch", [
    ("bert-48", "piz-daint-p100-16gb.json", 16, 128),
    ("gpt3-175b", "dgx-a100-80gb.json", 1024, 1536),
])
def test_split_parts_balance_the_work_by_groups(preset, cluster, gpus, batch):
    """:func:`planner.split_search.split_parts`: every (D, N) of the configurations in one part (twins, which
    share D and N, never cross parts), the same split every time, and the parts' work (the sum of D x N)
    apart by at most the largest group's (Graham's LPT rule)."""
    from planner.split_search import split_parts

    configs = _planner(preset, cluster, gpus, batch).configs(Counter())
    parts = split_parts(configs, batch)
    size: Counter[tuple[int, int]] = Counter()
    for c in configs:
        N = batch // (c.data * c.micro_batch)
        size[(c.pipeline, N)] += c.pipeline * N
    assert set(parts) == set(size) and set(parts.values()) == {0, 1}
    assert split_parts(list(reversed(configs)), batch) == parts
    load = [sum(v for g, v in size.items() if parts[g] == p) for p in (0, 1)]
    assert abs(load[0] - load[1]) <= max(size.values())


@pytest.mark.parametrize("preset,cluster,gpus,batch,kw", [
    ("bert-48", "piz-daint-p100-16gb.json", 4, 64, {}),
    ("bert-48", "piz-daint-p100-16gb.json", 8, 64, {"allow_async": True}),  # PipeDream's replicated plans too
    pytest.param("bert-48", "piz-daint-p100-16gb.json", 16, 128, {}, marks=pytest.mark.slow),  # Chimera wins
])
def test_split_search_ranks_as_one_process_and_as_simulating_everything(monkeypatch, preset, cluster, gpus, batch,
                                                                        kw):
    """Two processes, each searching its part of the configurations with the other's best times as they come,
    return the rows of one process (configuration, order, time, memory, name, the rows they stand for, breakdown,
    document) and of the exhaustive search; a row found by the child has the timeline one process gives. The
    counts differ at most between the bound and what simulating found (module docstring of split_search)."""
    one = _planner(preset, cluster, gpus, batch, **kw).search()
    full = _planner(preset, cluster, gpus, batch, **kw).search(prune=False)
    two, got = _split_search(monkeypatch, _planner(preset, cluster, gpus, batch, **kw))
    assert got and got[0] is not None, "the child's part must have come through the pipe"
    assert len(one.candidates) == len(two.candidates) == len(full.candidates) > 1
    assert _rows(two) == _rows(one)
    assert [c.config for c in two.candidates] == [c.config for c in full.candidates]
    assert [c.iteration_time for c in two.candidates] == [c.iteration_time for c in full.candidates]
    assert [c.memory for c in two.candidates] == [c.memory for c in full.candidates]
    from_child = {id(c) for c in got[0].rows}  # type: ignore[attr-defined]
    assert any(id(c) in from_child for c in two.candidates), "the case must take rows from both parts"
    assert [c.simulation for c in two.candidates] == [c.simulation for c in one.candidates]  # timelines too
    _same_counts(two, one)


def test_rows_list_the_same_twins_pruned_full_and_split(monkeypatch):
    """A row lists the twins within the k-th best time (planner.search._merge), whichever way the search ran:
    gpt2-medium on 4 V100s, B = 16, a 4 GiB reserve, k = 5 -- the fifth row (ZB-H1, t = 2, D = 1) has slower
    Hanayo twins (an all-reduce per stage more) past the fifth time, which the exhaustive search simulated and
    listed while the pruned one skipped them by their bound, so the same request's rows differed; and a
    mixture of experts (Qwen1.5-MoE on 8 A100 40GB, B = 32, a sharded optimizer) whose fifth row's slower twins
    two processes simulated and one did not."""
    from planner.operators import OperatorOptions
    from profiler.hf_config import read_hf_config

    def rows(res):  # type: ignore[no-untyped-def]
        return [(c.config, c.iteration_time, c.memory, c.name, c.alternatives) for c in res.candidates]

    dense = dict(preset="gpt2-medium", cluster="dgx1-v100-32gb.json", gpus=4, batch=16, top=5,
                 memory_reserve_bytes=4 * 2**30)
    pruned = _planner(**dense).search()  # type: ignore[arg-type]
    full = _planner(**dense).search(prune=False)  # type: ignore[arg-type]
    assert rows(pruned) == rows(full) and len(pruned.candidates) == 5
    kth = pruned.candidates[-1].iteration_time
    every = _planner(**{**dense, "top": 10_000}).search(prune=False).candidates  # type: ignore[arg-type]
    slower = {c.config: c.alternatives for c in every[:5]}
    assert any(set(slower[c.config]) > set(c.alternatives) for c in pruned.candidates), \
        "the case must have a twin past the k-th time"
    for c in pruned.candidates:
        assert all(t <= kth * (1 + 1e-9) for t in c.alternative_times)
        assert len(c.alternatives) == len(c.alternative_times)

    cl = load_cluster(EX / "dgx-a100-40gb.json")
    spec = read_hf_config(Path(__file__).resolve().parent.parent / "examples" / "models" / "qwen1.5-moe-a2.7b",
                          seq=512)
    moe = analytic_profile(spec, device_for_cluster(cl), options=OperatorOptions(attention="flash"))
    req = TrainingRequest(global_batch=32, gpus=8, top=5, shard_optimizer=True)
    one = Planner(moe, cl, req).search()
    two, got = _split_search(monkeypatch, Planner(moe, cl, req))
    assert got and got[0] is not None
    assert rows(two) == rows(one) == rows(Planner(moe, cl, req).search(prune=False))
    every = Planner(moe, cl, req.model_copy(update={"top": 10_000})).search(prune=False).candidates
    assert any(len(e.alternatives) > len(c.alternatives) for e, c in zip(every, one.candidates, strict=False)), \
        "the case must have a twin past the k-th time"


def _same_counts(two, one) -> None:  # type: ignore[no-untyped-def]
    """The counts of a split search: the same configurations; what is rejected before the search's loop (the
    enumeration, the model state, the activations known from the shape) the same; what the loop decides -- the
    bound, what simulating finds out of memory, PipeDream's replicated plans prepared when they come up -- may
    move between those (each part's threshold falls at its own pace)."""
    assert two.evaluated == one.evaluated
    loop = {"bound: cannot reach the top k", "out of memory"}
    if not any(c.config.replication for c in one.candidates + one.infeasible + two.candidates + two.infeasible):
        assert two.considered == one.considered
        assert {k: v for k, v in two.rejected.items() if k not in loop} == \
            {k: v for k, v in one.rejected.items() if k not in loop}
    assert sum(two.rejected.values()) > 0


@pytest.mark.parametrize("how", ["exit", "raise", "kill", "garbage"])
def test_a_failed_child_is_searched_again_by_the_parent(monkeypatch, how):
    """A child that exits, raises, is killed or sends something unreadable neither hangs the search nor drops
    its candidates: the parent searches the child's part itself, and the rows are those of one process."""
    import os
    import signal

    from planner import split_search

    parent = os.getpid()
    rank = Planner._rank

    def failing(self, *a, **kw):  # type: ignore[no-untyped-def]
        if os.getpid() != parent:
            if how == "exit":
                os._exit(3)
            if how == "raise":
                raise RuntimeError("a bug in the child")
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
        return rank(self, *a, **kw)

    monkeypatch.setattr(Planner, "_rank", failing)
    if how == "garbage":
        monkeypatch.setattr(split_search.pickle, "dumps", lambda obj, protocol=None: b"not a pickle")
    one = _planner("bert-48", "piz-daint-p100-16gb.json", 8, 64).search()
    two, got = _split_search(monkeypatch, _planner("bert-48", "piz-daint-p100-16gb.json", 8, 64))
    assert got == [None]
    assert _rows(two) == _rows(one)
    _same_counts(two, one)


def test_an_error_in_the_parent_leaves_no_child_behind(monkeypatch):
    """The parent's own part failing (a bug, Ctrl-C) raises as in one process, and the child is gone."""
    import os

    parent = os.getpid()
    rank = Planner._rank
    children: list[int] = []
    fork = os.fork

    def spy_fork() -> int:
        pid = fork()
        if pid:
            children.append(pid)
        return pid

    def failing(self, *a, **kw):  # type: ignore[no-untyped-def]
        if os.getpid() == parent:
            raise KeyboardInterrupt
        return rank(self, *a, **kw)

    monkeypatch.setattr(Planner, "_rank", failing)
    monkeypatch.setattr(os, "fork", spy_fork)
    with pytest.raises(KeyboardInterrupt):
        _split_search(monkeypatch, _planner("bert-48", "piz-daint-p100-16gb.json", 8, 64))
    assert len(children) == 1
    with pytest.raises(ChildProcessError):  # reaped already
        os.waitpid(children[0], os.WNOHANG)


def test_split_search_runs_in_one_process_where_it_cannot_fork_or_should_not(monkeypatch):
    """No ``os.fork`` (Windows), another thread alive (the API server), a busy machine or a small search: one
    process."""
    import os
    import threading

    from planner import cpuidle, split_search

    planner = _planner("bert-48", "piz-daint-p100-16gb.json", 4, 64)
    configs = planner.configs(Counter())
    monkeypatch.setattr(cpuidle, "_MARK", None)  # no sample of the cores: the load average decides
    monkeypatch.setattr(split_search, "MIN_ACTIONS", split_search.work(configs, 64) + 1)
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert split_search.spare_core()
    assert split_search.search_split(planner, configs, []) is None  # below MIN_ACTIONS
    monkeypatch.setattr(split_search, "MIN_ACTIONS", 0)
    monkeypatch.setattr(os, "getloadavg", lambda: (1.6, 0.0, 0.0))
    assert not split_search.spare_core()
    assert split_search.search_split(planner, configs, [], auto=True) is None  # busy: 1.6 on 2 cores
    monkeypatch.setattr(os, "getloadavg", lambda: (1.4, 0.0, 0.0))
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0}, raising=False)
    assert not split_search.spare_core()  # one core to run on
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert split_search.spare_core()
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert split_search.search_split(planner, configs, []) is None
    finally:
        stop.set()
        other.join()
    monkeypatch.delattr(os, "fork")
    assert not split_search.can_fork()
    one = _planner("bert-48", "piz-daint-p100-16gb.json", 4, 64).search()
    assert _rows(planner.search(processes=2)) == _rows(one)


def test_board_thresholds_are_never_below_the_whole_search_kth():
    """The threshold a part reads is the k-th smallest of its own and the other part's published best times:
    infinite until k classes are known, then falling."""
    import math

    from planner.split_search import Board, SharedTop

    board = Board(3)
    a, b = SharedTop(3, board, 0), SharedTop(3, board, 1)
    assert a.kth == b.kth == math.inf
    board.publish(1, [1.0, 5.0])
    assert a.kth == math.inf  # two classes known
    a._mine = [2.0]
    assert a.kth == 5.0 and b.kth == math.inf  # b has not seen a's (unpublished) time
    board.publish(0, [2.0])
    b._mine = [1.0, 5.0]
    assert b.kth == 5.0
    board.close()


def test_spare_core_follows_the_cores_idle_since_the_command_started_not_the_lagging_load(monkeypatch):
    """Issue 13 (the plan command's time): the 1-minute load average lags by tens of seconds (right after the
    test suite on an idle machine it read 1.5-3.3, and ``pipeplan plan`` searched in one process: 1.74 s
    against 1.03 s with two). With a sample of /proc/stat taken at the command's start
    (:func:`planner.cpuidle.mark`), the idle jiffies since then decide (a quarter of a core idle is a spare one)."""
    import os

    from planner import cpuidle, split_search

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    now = [100.0]
    monkeypatch.setattr(cpuidle.time, "monotonic", lambda: now[0])
    counters = [(1000, 4000)]  # (idle + iowait, all) jiffies
    monkeypatch.setattr(cpuidle, "_read", lambda: counters[0])
    cpuidle.mark()
    try:
        monkeypatch.setattr(os, "getloadavg", lambda: (3.3, 2.0, 1.0))  # a busy minute behind us
        now[0] += 0.25
        counters[0] = (1000 + 24, 4000 + 50)  # 0.25 s on 2 cores: 50 jiffies, 24 of them idle (0.96 cores)
        assert cpuidle.idle_cores(2) == 2 * 24 / 50
        assert split_search.spare_core()
        counters[0] = (1000 + 12, 4000 + 50)  # 0.48 cores idle: numpy's spinning OpenBLAS threads, no other work
        assert split_search.spare_core()
        counters[0] = (1000 + 1, 4000 + 50)  # 0.04 cores idle: the other core is busy now
        monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # though the last minute was quiet
        assert not split_search.spare_core()
        now[0] = 100.05  # a window too short to read: the load average decides again
        assert cpuidle.idle_cores(2) is None
        assert split_search.spare_core()
        counters[0] = None  # /proc/stat unreadable
        now[0] += 1.0
        assert cpuidle.idle_cores(2) is None
    finally:
        cpuidle.reset()


def test_cpuidle_reads_this_machines_proc_stat():
    """On Linux the sample is real: idle cores between 0 and the machine's cores after a busy 0.15 s."""
    import os
    import time

    from planner import cpuidle

    if cpuidle._read() is None:
        pytest.skip("no /proc/stat")
    cpuidle.mark()
    try:
        end = time.monotonic() + 0.15
        while time.monotonic() < end:  # keep this core busy
            pass
        got = cpuidle.idle_cores(os.cpu_count() or 1)
        assert got is not None and 0.0 <= got <= (os.cpu_count() or 1) - 0.5
    finally:
        cpuidle.reset()


@pytest.mark.parametrize("cluster,preset,gpus,batch,dtype", [
    ("dgx-a100-80gb.json", "gpt2-1.3b", 64, 512, "bf16"), ("local-cpu-4.json", "gpt-tiny", 4, 16, "fp32")])
def test_the_search_makes_no_reference_cycles(cluster, preset, gpus, batch, dtype):
    """The search pauses the cyclic garbage collector (:func:`planner.gcpause.gc_paused`), so whatever it drops
    must be freed by reference counting: a cycle through a candidate's costs (as the executor overheads'
    back-reference to their ConfigCosts was) kept every dropped candidate's costs and schedule alive until the
    collector ran after the search, in plan()'s time (0.2 s on GPT-3 / 1024 GPUs)."""
    import gc

    from planner.search import plan

    cl = load_cluster(Path(__file__).resolve().parent.parent / "examples" / "clusters" / cluster)
    prof = analytic_profile(PRESETS[preset], device_for_cluster(cl), dtype=dtype)
    req = TrainingRequest(global_batch=batch, gpus=gpus, top=5, allow_async=True)
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        res = plan(prof, cl, req)
        found = gc.collect()
    finally:
        if was:
            gc.enable()
    assert res.candidates
    assert found == 0


@pytest.mark.parametrize("recompute", [False, True])
def test_zero_bubble_memory_partition_is_the_brute_force_one(recompute):
    """For ZB-H1 on 3 devices (gpt-tiny's 6 layers: every one of the 10 partitions) and memory capacities between
    the least and the most any partition needs, the partition balancing memory fits when its lists are simulated,
    and it is None only where no partition fits -- with full recomputation too, where a stage of the LM head alone
    splits its backward and holds the logits' gradients while a stage with a transformer block does not."""
    from itertools import combinations

    from planner.candidate import Candidate
    from planner.cost import ConfigCosts
    from planner.runspec import schedule_samples

    cl = load_cluster(EX / "local-cpu-4.json")
    prof = analytic_profile(PRESETS["gpt-tiny"], device_for_cluster(cl), dtype="fp32")
    cfg = Config(tensor=1, pipeline=3, data=1, micro_batch=2, schedule="zb-h1", recompute=recompute)
    req = TrainingRequest(global_batch=16, gpus=3, memory_reserve_bytes=0.0)
    base = Planner(prof, cl, req)
    sched = base.shapes.schedule(cfg, 8)
    L = len(prof.layers)
    need = {}
    for cut in combinations(range(1, L), 2):
        bounds = list(zip((0, *cut), (*cut, L), strict=True))
        costs = ConfigCosts(prof, cl, base.request, cfg, sched, bounds)
        cand = Candidate(cfg, 8)
        cand.state = base.memory.device_state(cfg, sched, costs, ("brute", tuple(bounds)))
        need[tuple(bounds)] = max(base.memory.simulated_memory(cand, costs, simulate(sched, costs)))
    assert any(costs.held_grads(s) > 0 for s in range(3))
    caps = sorted(need.values())
    for cap in [caps[0] * 0.99, *caps, *((a + b) / 2 for a, b in zip(caps, caps[1:], strict=False))]:
        planner = Planner(prof, cl.model_copy(update={"memory_bytes": cap}), req)
        shape = planner.shapes.schedule(cfg, 8, full=False)
        got = planner.memory_partition(cfg, shape, schedule_samples(cfg))
        if got is None:
            assert min(need.values()) > cap, cap
        else:
            assert need[tuple(tuple(b) for b in got)] <= cap * (1 + 1e-9), (cap, got)


def test_the_search_keeps_action_lists_only_of_what_it_may_return(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every simulated candidate kept the action lists it was simulated on (D x N actions) until the search ended:
    gpt-tiny with B^ = 32768 on the local 4-process cluster ran past the API's 1.5 GiB planner memory. Only those
    that may still be among the k rows, or listed as their twins, keep them now; the rows are the same."""
    from planner.cost import ConfigCosts
    from planner.search import Planner, plan

    given: list[ConfigCosts] = []
    use = ConfigCosts.use_schedule

    def recording(self: ConfigCosts, schedule: Schedule) -> None:
        given.append(self)
        use(self, schedule)

    monkeypatch.setattr(ConfigCosts, "use_schedule", recording)
    cl = load_cluster(EX / "local-cpu-4.json")
    prof = analytic_profile(PRESETS["gpt-tiny"], device_for_cluster(cl), dtype="fp32")
    req = TrainingRequest(global_batch=512, top=3)
    res = plan(prof, cl, req)
    held = {id(c) for c in given if c.schedule is not None and all(c.schedule.actions)}
    assert len({id(c) for c in given}) > 10 * len(held) > 0, (len({id(c) for c in given}), len(held))
    assert all(c.costs is not None and id(c.costs) in held for c in res.candidates)  # (the rows keep theirs)
    full = Planner(prof, cl, req).search(prune=False)
    assert [(c.config.label(), c.iteration_time, c.alternatives) for c in res.candidates] == [
        (c.config.label(), c.iteration_time, c.alternatives) for c in full.candidates]
