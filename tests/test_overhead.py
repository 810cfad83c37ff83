"""profiler.overhead: the executor's per-action overhead from its own trace (synthetic traces here; the
measurement itself runs in `pipeplan profile-links --local-procs 2 --executor-overhead`)."""

from __future__ import annotations

import pytest

from profiler.overhead import _fastest_rank_steps, _per_kind, split_from_trace


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
    # the split backward, from the ZB-H1 run: one figure per I and per W action, floored at 0
    assert len(raw["split"]["split_input"]) == len(raw["split"]["split_weight"]) == 3 * 2 * 4
    assert ex.split_input >= 0 and ex.split_weight >= 0


def test_split_from_trace() -> None:
    """Per I (W) action: duration less half the stage's profiled backward and ``compute``, over the stage's
    layers; the median over the actions."""
    events = []
    for it in range(2):
        b = it * 1000.0
        # stage 0 (2 layers, profiled backward 40 us): I 60 us, W 50 us; stage 1 (3 layers, 90 us): I 120, W 75
        events += [_ev(0, it, "0I0", "I", b, 60), _ev(0, it, "0W0", "W", b + 60, 50),
                   _ev(1, it, "1I0", "I", b, 120), _ev(1, it, "1W0", "W", b + 120, 75)]
    split, raw = split_from_trace({"traceEvents": events}, [40e-6, 90e-6], [2, 3], 10e-6, warmup=0)
    # no gaps (each rank's records abut); per layer: I (60-20-10)/2 = 15, (120-45-10)/3 = 21.7; W 10, 6.7
    assert raw["split_input"] == [pytest.approx(15e-6), pytest.approx(65e-6 / 3)] * 2
    assert split["split_input"] == pytest.approx((15e-6 + 65e-6 / 3) / 2)
    assert split["split_weight"] == pytest.approx((10e-6 + 20e-6 / 3) / 2)
    assert split_from_trace({"traceEvents": []}, [0.0], [1], 0.0, warmup=0)[0] == {"split_input": 0.0,
                                                                                  "split_weight": 0.0}


def test_overhead_is_the_expected_cost_not_the_typical_one() -> None:
    """Each figure is a mean: one F in four preempted (400 us over its profiled 100) makes the compute
    overhead 25 + 400/4 = 125 us, where a median would say 25; the posting records likewise (one of four
    10x longer)."""
    from profiler.overhead import overhead_from_trace

    events = []
    for it in range(4):
        b = it * 10_000.0
        slow = 400 if it == 3 else 0
        events += [_ev(0, it, "0F0", "F", b, 125 + slow), _ev(0, it, "post 0SEND_F0>1", "POST", b + 125 + slow,
                                                                    100 if it == 2 else 10),
                   _ev(0, it, "0SEND_F0", "SEND_F", b + 135 + slow + (90 if it == 2 else 0), 5)]
    ex, raw = overhead_from_trace({"traceEvents": events}, [100e-6], [100e-6], warmup=0, source="synthetic")
    assert ex.compute == pytest.approx(125e-6)  # (25 + 25 + 25 + 425) / 4, no gaps between the records
    assert raw["post_share_per_message"] == pytest.approx((10 + 10 + 100 + 10) / 4 * 1e-6)
    assert ex.send == pytest.approx(5e-6 + 32.5e-6)
    assert raw["F"]["median"] == pytest.approx(125e-6) and raw["F"]["mean"] == pytest.approx(225e-6)
