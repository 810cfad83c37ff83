"""The search's fast paths give what the plain computations give: the vectorised encoding of a schedule (its
all-reduce points, its action signatures) equals the per-device rules of :mod:`planner.schedules.ir`, and
the ranked output of a search is the one an exhaustive evaluation of every configuration gives."""

from __future__ import annotations

import copy
from collections import Counter
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
from planner.request import TrainingRequest
from planner.runspec import schedule_microbatches
from planner.schedules import build, inflight_exact
from planner.schedules.encoded import EncodedSchedule, _signatures
from planner.schedules.ir import Schedule, allreduce_points, eager_stages
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


@pytest.mark.parametrize("preset,cluster,gpus,batch,kw", [
    pytest.param("gpt2-1.3b", "dgx-a100-80gb.json", 8, 64, {}, marks=pytest.mark.slow),
    ("bert-48", "piz-daint-p100-16gb.json", 4, 64, {}),
    ("bert-48", "piz-daint-p100-16gb.json", 8, 64, {"allow_async": True}),
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


@pytest.mark.parametrize("argv,collects", [(["plan", "--help"], False), (["predict"], False), (["serve"], True),
                                           ([], True)])
def test_short_lived_commands_run_without_the_cyclic_collector(monkeypatch, argv, collects):
    """``plan`` and ``predict`` (compute, print, exit) run with the cyclic GC off; every other command, the
    long-running ones above all, with it on."""
    import gc

    import pipeplan.cli as cli

    seen: list[bool] = []
    monkeypatch.setattr(cli, "app", lambda: seen.append(gc.isenabled()))
    monkeypatch.setattr("sys.argv", ["pipeplan", *argv])
    was = gc.isenabled()
    try:
        gc.enable()
        cli.main()
    finally:
        gc.enable() if was else gc.disable()
    assert seen == [collects]
