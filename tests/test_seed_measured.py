"""The measured CPU profile of ``make serve``'s seed step (issue 13 item 2): combined over the processes that
measured it at once, stored once, first in a fresh database (with the local cluster)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from executor.emulate import uniform_profile
from planner.cluster import AllReduceFit, Cluster, ExecutorOverhead, Link, load_cluster
from planner.profile import ModelProfile
from profiler.concurrent import combine


def _timed(fwd: float) -> ModelProfile:
    return uniform_profile(3, fwd=fwd, bwd=2 * fwd).model_copy(update={"device": "cpu", "source": "measured"})


def test_combine_keeps_the_median_per_layer_and_size() -> None:
    profs = [_timed(0.001), _timed(0.005), _timed(0.002)]
    out = combine(profs)
    for layer in out.layers:
        assert layer.fwd_time == {b: pytest.approx(0.002 * b) for b in layer.fwd_time}
        assert layer.bwd_time == {b: pytest.approx(0.004 * b) for b in layer.bwd_time}
    assert out.environment["concurrent_processes"] == "3" and "3 processes at once" in out.notes
    assert [x.param_bytes for x in out.layers] == [x.param_bytes for x in profs[0].layers]


@pytest.mark.slow  # database
def test_seed_measures_once_and_puts_the_local_pair_first(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import api.seed as seed_mod
    from db.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'seed.db'}"
    upgrade(url)
    calls: list[int] = []

    def fake() -> ModelProfile:  # the real one takes seconds of torch: tests/test_serve_e2e.py runs it
        calls.append(1)
        return _timed(0.001).model_copy(update={"name": "gpt-tiny"})

    def fake_cluster() -> Cluster:  # the real one runs gloo processes: tests/test_serve_e2e.py runs it
        calls.append(2)
        base = load_cluster(seed_mod.EXAMPLES / "clusters" / f"{seed_mod.LOCAL_CLUSTER}.json")
        return base.model_copy(update={"intra": Link(alpha=1e-3, beta=1e-9),
                                       "executor": ExecutorOverhead(compute=1e-4)})

    monkeypatch.setattr(seed_mod, "measured_cpu_profile", fake)
    monkeypatch.setattr(seed_mod, "measured_local_cluster", fake_cluster)
    lines: list[str] = []
    first = seed_mod.seed(url, progress=lines.append)
    # make serve prints what it seeds as it goes: a line before each step and one with its time after
    starts = [x for x in lines if x.endswith(" ...")]
    ends = [x for x in lines if re.search(r": done in \d+\.\d s$", x)]
    assert len(starts) == len(ends) == 4 and len(lines) == 8, lines
    assert lines.index(starts[0]) < lines.index(ends[0]) and "measuring cluster local-cpu-4" in starts[0]
    assert any("profiling gpt-tiny on this CPU" in x for x in starts) and any("example clusters" in x for x in starts)
    assert first["clusters"][0][:2] == (f"{seed_mod.LOCAL_CLUSTER} (measured)", 1)
    assert [n for n, _i, _c in first["clusters"]].count(seed_mod.LOCAL_CLUSTER) == 0, "the file's: not stored too"
    assert first["profiles"][0] == ("gpt-tiny on cpu (measured)", 1, True)
    lines.clear()
    again = seed_mod.seed(url, progress=lines.append)
    assert sum("measured before" in x and x.endswith("kept") for x in lines) == 2, lines  # said, not measured
    assert calls == [2, 1], "timings differ run to run: what is stored measured is kept, not measured again"
    assert again["profiles"][0] == ("gpt-tiny on cpu (measured)", 1, False)
    assert not any(created for rows in again.values() for _n, _i, created in rows)


def test_a_measured_allreduce_fit_replaces_the_algorithm_up_to_its_rank_count() -> None:
    from planner.cost import allreduce_time, rabenseifner

    # the example file's own measured fit removed: the base is the algorithm's cluster
    base = load_cluster(Path(__file__).resolve().parent.parent / "examples" / "clusters" / "local-cpu-4.json")
    base = base.model_copy(update={"allreduce_fit": None})
    fit = AllReduceFit(ranks=4, link=Link(alpha=3e-3, beta=4e-9))
    cl = base.model_copy(update={"allreduce_fit": fit})
    assert allreduce_time(cl, [0, 1, 2, 3], 1e6) == pytest.approx(3e-3 + 4e-9 * 1e6)
    assert allreduce_time(cl, [0, 1], 1e6) == pytest.approx(3e-3 + 4e-9 * 1e6), "a group running beside others"
    wider = cl.model_copy(update={"allreduce_fit": AllReduceFit(ranks=2, link=fit.link)})
    assert allreduce_time(wider, [0, 1, 2, 3], 1e6) == pytest.approx(rabenseifner(4, 1e6, base.intra)), "more ranks"
    assert allreduce_time(base, [0, 1, 2, 3], 1e6) == pytest.approx(rabenseifner(4, 1e6, base.intra))
    assert cl.content_hash() != base.content_hash()
    assert cl.model_copy(update={"allreduce_fit": None}).content_hash() == base.content_hash()


def test_the_seeded_profile_covers_the_new_plan_pages_default_batch() -> None:
    """The new-plan page's default global batch on the seeded local cluster reaches micro-batch sizes up to the
    batch itself (one replica, one micro-batch): the measured profile has each power of two up to it, so that
    plan's candidates are timed, not extrapolated (planner.mismatch.size_warnings; with sizes 1-8 its first
    candidate was data parallel at an extrapolated b = 16)."""
    from api.seed import MEASURED

    page = (Path(__file__).resolve().parent.parent / "api" / "templates" / "new_plan.html").read_text()
    default = int(re.search(r'id="global-batch"[^>]*value="(\d+)"', page).group(1))  # type: ignore[union-attr]
    sizes = MEASURED[1]
    assert [b for b in (2 ** k for k in range(default.bit_length())) if default % b == 0] == sizes
