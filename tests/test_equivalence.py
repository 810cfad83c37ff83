"""Candidates that run the same thing are one row (planner.equivalence, issue 13 item 4)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.analytic import transformer_profile
from planner.candidate import Candidate
from planner.cluster import load_cluster
from planner.equivalence import _signature, canonical, collapse, held, schedule_label
from planner.request import ASYNC_SCHEDULES, Config, TrainingRequest
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
    # top 30: with the host model (local-cpu-4.json's measured `host`) pipelines rank above data parallelism
    res = plan(prof, cl, TrainingRequest(global_batch=8, top=30))
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


# ---- issue 13 follow-up: rows are merged iff what they run is the same ---------------------------------------

VARIANTS: list[tuple[str, dict]] = [
    ("1f1b", {}), ("gpipe", {}), ("zb-h1", {}), ("interleaved", {"chunks": 1}), ("interleaved", {"chunks": 2}),
    ("hanayo", {"waves": 1}), ("hanayo", {"waves": 2}), ("chimera", {"pipelines": 1, "concat": "direct"}),
    ("gems", {}), ("pipedream", {}), ("pipedream-2bw", {}),
]
LAYERS = 48


def _candidate(name: str, params: dict, D: int, N: int, fits: bool = True) -> Candidate | None:
    """A candidate of ``name`` on D devices with N micro-batches and an even partition of LAYERS layers, as the
    search leaves it: simulated (its costs hold the full lists) when it fits, else rejected before its lists
    were built (no costs)."""
    cfg = Config(tensor=1, pipeline=D, data=1, micro_batch=2, schedule=name, **params)
    try:
        sched = build(name, D, N, **params)
    except ValueError:
        return None
    per = LAYERS // sched.stages
    part = [[s * per, (s + 1) * per if s < sched.stages - 1 else LAYERS] for s in range(sched.stages)]
    cand = Candidate(cfg, N, partition=part, iteration_time=1.0, fits=fits)
    if fits:
        cand.costs = SimpleNamespace(schedule=sched)  # type: ignore[assignment]
    return cand


def _lowered(c: Candidate) -> tuple:
    """Every device's lowered list (compute, sends and receives, all-reduces, step) with each stage written
    as the layers it holds: what the executor walks, independent of planner.equivalence."""
    s = c.run_spec.lowered()
    return tuple(tuple((a.kind, a.replica, tuple(c.partition[a.stage]) if a.stage >= 0 else None, a.mb, a.span,
                        a.peer) for a in row) for row in s.actions)


@settings(max_examples=150, deadline=None)
@given(D=st.integers(1, 4), N=st.integers(1, 6), i=st.integers(0, len(VARIANTS) - 1),
       j=st.integers(0, len(VARIANTS) - 1), fits=st.booleans())
def test_merged_iff_the_lowered_lists_are_identical(D: int, N: int, i: int, j: int, fits: bool) -> None:
    """Two rows of the same t, D, W, b, N, recomputation and synchrony are one row exactly when every device's
    lowered list is the same (D >= 2; with D = 1 the pipeline's stages of the one device run back to back and
    are one stage, the module docstring), whether they fit (simulated) or not (rejected before simulation).
    Identical lists are always one row; a synchronous and an asynchronous schedule never are (PipeDream runs
    1F1B's lists without a flush, on stashed weights)."""
    a, b = _candidate(*VARIANTS[i], D, N, fits), _candidate(*VARIANTS[j], D, N, fits)
    if a is None or b is None or i == j:
        return
    same_lists = _lowered(a) == _lowered(b)
    same_sync = (a.config.schedule in ASYNC_SCHEDULES) == (b.config.schedule in ASYNC_SCHEDULES)
    rows = collapse([a, b])
    merged = len(rows) == 1
    if same_lists and same_sync:
        assert merged, (VARIANTS[i], VARIANTS[j], D, N)
        assert rows[0].alternatives == [schedule_label(b.config)]
    if D >= 2:
        assert merged == (same_lists and same_sync), (VARIANTS[i], VARIANTS[j], D, N)
    if not same_sync:
        assert not merged


@pytest.mark.parametrize("fits", [True, False])
def test_one_microbatch_on_two_devices_1f1b_and_gpipe_are_one_row(fits: bool) -> None:
    """D = 2, N = 1: 1F1B and GPipe run F0 B0 on each device (and interleaved with one chunk is 1F1B)."""
    a, b, c = (_candidate(n, p, 2, 1, fits) for n, p in (("1f1b", {}), ("gpipe", {}), ("interleaved", {"chunks": 1})))
    rows = collapse([a, b, c])
    assert len(rows) == 1 and rows[0].name == "1f1b" and rows[0].alternatives == ["gpipe", "interleaved(chunks=1)"]


def test_plan_collapses_rows_that_do_not_fit_too() -> None:
    """The plan's rows that do not fit (shown under "show infeasible") are collapsed like the fitting ones:
    gpt2-medium on the 4 GiB local cluster, D = 2 with one micro-batch per pipeline, runs out of memory the
    same way under 1F1B and GPipe."""
    cl = load_cluster(EX / "local-cpu-4.json")
    prof = transformer_profile("gpt2-medium", 24, 1024, 16, 1024, 50257, cl.peak_flops, cl.device)
    res = plan(prof, cl, TrainingRequest(global_batch=8, top=20, schedules=["1f1b", "gpipe"]))
    rows = [c for c in res.infeasible if c.config.pipeline == 2 and c.microbatches == 1]
    assert rows, "the case has D = 2, N = 1 rows that do not fit"
    keys = [_key_of(c) for c in rows]
    assert len(keys) == len(set(keys)), [c.config.label() for c in rows]
    assert any(c.alternatives == ["gpipe"] or c.alternatives == ["1f1b"] for c in rows)
