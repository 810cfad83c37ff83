"""The measured CPU profile of ``make serve``'s seed step (issue 13 item 2): combined over the processes that
measured it at once, stored once, first in a fresh database (with the local cluster)."""

from __future__ import annotations

import pytest

from executor.emulate import uniform_profile
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

    monkeypatch.setattr(seed_mod, "measured_cpu_profile", fake)
    first = seed_mod.seed(url)
    assert first["clusters"][0][:2] == (seed_mod.LOCAL_CLUSTER, 1)
    assert first["profiles"][0] == ("gpt-tiny on cpu (measured)", 1, True)
    again = seed_mod.seed(url)
    assert calls == [1], "timings differ run to run: a stored measured profile is kept, not measured again"
    assert again["profiles"][0] == ("gpt-tiny on cpu (measured)", 1, False)
    assert not any(created for rows in again.values() for _n, _i, created in rows)
