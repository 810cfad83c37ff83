"""Candidates that run the same thing are one row (planner.equivalence, issue 13 item 4)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from planner.analytic import transformer_profile
from planner.cluster import load_cluster
from planner.equivalence import _signature, canonical, collapse, held, schedule_label
from planner.request import TrainingRequest
from planner.schedules import build
from planner.search import Planner, plan, predict

EX = Path(__file__).resolve().parent.parent / "examples" / "clusters"


@pytest.fixture(scope="module")
def local():
    cl = load_cluster(EX / "local-cpu-4.json")
    return cl, transformer_profile("gpt-tiny", 4, 256, 4, 128, 1024, cl.peak_flops, cl.device)


def _sig(name: str, D: int, N: int, layers: int = 8, **kw):  # type: ignore[no-untyped-def]
    s = build(name, D, N, **kw)
    per = layers // s.stages
    part = [[i * per, (i + 1) * per] for i in range(s.stages)]
    return tuple((tuple(held(s, d, part)), tuple(canonical(a, part, s.placement))) for d, a in enumerate(s.actions))


def test_single_device_schedules_with_one_microbatch_are_one() -> None:
    one = _sig("1f1b", 1, 1)
    for name, kw in (("gpipe", {}), ("zb-h1", {}), ("hanayo", {"waves": 1}), ("hanayo", {"waves": 2})):
        assert _sig(name, 1, 1, **kw) == one, name


def test_order_and_held_layers_tell_schedules_apart() -> None:
    assert _sig("gpipe", 1, 2) != _sig("1f1b", 1, 2)  # every forward first: N micro-batches in flight
    assert _sig("zb-h1", 1, 3) == _sig("1f1b", 1, 3)  # I then W of a lone stage is B
    assert _sig("chimera", 2, 1, pipelines=1, concat="direct") != _sig("1f1b", 2, 1)  # a second copy held
    # on two devices I's gradient is sent before W: zero-bubble H1 differs from 1F1B even with N = 1
    assert _sig("zb-h1", 2, 1) != _sig("1f1b", 2, 1)
    assert _sig("gpipe", 2, 2) != _sig("1f1b", 2, 2)
    assert _sig("gpipe", 2, 1) == _sig("1f1b", 2, 1)


def test_local_plan_rows_are_distinct_and_named(local) -> None:  # type: ignore[no-untyped-def]
    cl, prof = local
    res = plan(prof, cl, TrainingRequest(global_batch=8, top=10))
    sigs = [(_key_of(c), _signature(c)) for c in res.candidates]
    assert len(sigs) == len(set(sigs))
    d1 = [c for c in res.candidates if c.config.pipeline == 1]
    assert d1, "the local plan has data-parallel rows"
    for c in d1:
        assert "parallel" in c.name or c.name == "single device"
    merged = [c for c in d1 if c.alternatives]
    assert merged and all(schedule_label(c.config) not in c.alternatives for c in merged)
    doc = res.to_dict()
    assert all("alternatives" in c and "name" in c for c in doc["candidates"])


def _key_of(c):  # type: ignore[no-untyped-def]
    k = c.config
    return (k.tensor, k.pipeline, k.data, k.micro_batch, c.microbatches, k.recompute)


def test_nothing_is_lost(local) -> None:  # type: ignore[no-untyped-def]
    """Without pruning every fitting configuration is a row or an alternative of one with the same t, D, W,
    b and recomputation, and the kept row is the best-ranked of its twins."""
    cl, prof = local
    req = TrainingRequest(global_batch=8, top=10_000)
    planner = Planner(prof, cl, req)
    res = planner.search(prune=False)
    seen = [(_key_of(c), schedule_label(c.config)) for c in res.candidates]
    seen += [(_key_of(c), alt) for c in res.candidates for alt in c.alternatives]
    assert len(seen) == len(set(seen))
    fitting = [cfg for cfg in Planner(prof, cl, req).configs(Counter()) if predict(prof, cl, req, cfg).fits]
    assert len(seen) == len(fitting)
    times = [c.iteration_time for c in res.candidates]
    assert times == sorted(times)
    # collapsing again changes nothing: the kept rows are pairwise different
    for c in res.candidates:
        c.alternatives = []
    assert len(collapse(list(res.candidates))) == len(res.candidates)


@pytest.mark.parametrize("top", [5, 8, 10])  # the top 3 of this case have no twins under the operator model
def test_pruned_search_keeps_the_exact_top_k_of_distinct_rows(local, top: int) -> None:  # type: ignore[no-untyped-def]
    """The bound counts configurations that differ: after collapsing, the pruned search's k rows are the k
    best distinct ones of the full search."""
    cl, prof = local
    req = TrainingRequest(global_batch=8, top=top)
    pruned = Planner(prof, cl, req).search().candidates
    full = Planner(prof, cl, req.model_copy(update={"top": 10_000})).search(prune=False).candidates[:top]
    assert any(c.alternatives for c in full), "the case has twins to collapse"
    rows = [(c.config.label(), c.iteration_time) for c in pruned]
    assert rows == [(c.config.label(), c.iteration_time) for c in full]
    for p, f in zip(pruned, full, strict=True):  # a twin the bound skipped is not listed; none is made up
        assert set(p.alternatives) <= set(f.alternatives)
