"""profiler.overhead: the executor's per-action overhead from its own trace (synthetic traces here; the
measurement itself runs in `pipeplan profile-links --local-procs 2 --executor-overhead`)."""

from __future__ import annotations

import pytest

from profiler.overhead import _fastest_rank_steps, _per_kind


def _ev(tid: int, it: int, name: str, cat: str, ts_us: float, dur_us: float) -> dict:
    return {"ph": "X", "tid": tid, "name": name, "cat": cat, "ts": ts_us, "dur": dur_us, "args": {"iteration": it}}


def test_per_kind_and_gaps() -> None:
    events = [{"ph": "M", "name": "thread_name", "tid": 0}]
    for it in range(3):
        base = it * 1000.0
        events += [_ev(0, it, "0F0", "F", base, 100), _ev(0, it, "post 0SEND_F0>1", "POST", base + 110, 10),
                   _ev(0, it, "0SEND_F0", "SEND_F", base + 120, 5),
                   _ev(0, it, "optimizer", "OPT", base + 140, 20), _ev(0, it, "STEP", "STEP", base + 130, 50 + it)]
    kinds, gap = _per_kind({"traceEvents": events}, warmup=1)
    assert len(kinds["F"]) == 2 and kinds["F"][0] == ("0F0", pytest.approx(100e-6))
    # span 181/182 us, covered 100 + 10 + 5 + 51/52 (OPT inside STEP): 15 us over 3 actions
    assert gap == pytest.approx(5e-6)
    steps = _fastest_rank_steps({"traceEvents": events + [_ev(1, 2, "STEP", "STEP", 2000, 7)]}, warmup=1)
    assert steps == [pytest.approx(51e-6), pytest.approx(7e-6)]


@pytest.mark.slow  # launches the executor on 2 processes
def test_measure_overhead_end_to_end() -> None:
    from profiler.overhead import measure_overhead

    ex, raw = measure_overhead(procs=2, microbatches=4, iterations=3, warmup=1)
    # send/recv/step are record durations (> 0); compute is what the records exceed the profiled layers by,
    # clamped at 0 (on a loaded machine the profile may come out slower than the run)
    assert ex.send > 0 and ex.recv > 0 and ex.step > 0 and ex.compute >= 0
    assert "gloo processes" in ex.source
    assert raw["F"]["count"] == 3 * 2 * 4 and raw["B"]["count"] == 3 * 2 * 4
