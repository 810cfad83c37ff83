"""Oracles of the interleaved, ZB-H1, PipeDream, PipeDream-2BW and GEMS builders."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst

from planner.schedules import build
from planner.schedules.validate import validate
from planner.simulate import UnitCosts, simulate


def peaks(res):
    return [d.peak_activations for d in res.devices]


# ---- interleaved 1F1B (Megatron-LM 2.2.2) ----------------------------------------------------------

@pytest.mark.parametrize("D", [2, 3, 4, 8])
@pytest.mark.parametrize("v", [1, 2, 3, 4])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_interleaved_bubble(D, v, k):
    """Per-chunk times t/v: bubble (D-1)(tf+tb)/v on top of the ideal N(tf+tb)."""
    N = k * D
    res = simulate(build("interleaved", D, N, chunks=v), UnitCosts(1 / v, 2 / v))
    assert res.makespan == pytest.approx(N * 3 + (D - 1) * 3 / v)


@pytest.mark.parametrize("D,N", [(1, 1), (2, 1), (4, 4), (4, 6), (8, 3), (8, 16)])
def test_interleaved_v1_is_1f1b(D, N):
    assert build("interleaved", D, N, chunks=1).actions == build("1f1b", D, N).actions


@pytest.mark.parametrize("D,v,N", [(4, 2, 4), (4, 2, 8), (4, 3, 12), (8, 2, 16), (8, 4, 8)])
def test_interleaved_peak_activations(D, v, N):
    """Device d keeps its warm-up forwards plus one: min((D-d-1)*2 + (v-1)*D + 1, N*v) chunk activations."""
    res = simulate(build("interleaved", D, N, chunks=v))
    assert peaks(res) == [min((D - d - 1) * 2 + (v - 1) * D + 1, N * v) for d in range(D)]


def test_interleaved_placement_and_params():
    s = build("interleaved", 4, 8, chunks=3)
    assert s.stages == 12 and s.placement == [[st % 4 for st in range(12)]]
    assert s.stages_on(1) == [(0, 1), (0, 5), (0, 9)]


def test_interleaved_errors():
    with pytest.raises(ValueError, match="multiple of devices"):
        build("interleaved", 4, 6, chunks=2)
    with pytest.raises(ValueError, match="chunks"):
        build("interleaved", 4, 8, chunks=0)


# ---- ZB-H1 (Qi et al. 2024, 3.1) -------------------------------------------------------------------

ZB_COSTS = UnitCosts(1, 2, input_grad=1, weight_grad=1)


@pytest.mark.parametrize("D,N", [(2, 2), (2, 5), (3, 3), (4, 4), (4, 8), (4, 5), (8, 8), (8, 24), (16, 16)])
def test_zb_h1_beats_1f1b_with_same_memory(D, N):
    """Faster, with 1F1B's peak: activations stay until their W (the weight gradients need them), so every
    stage holds 1F1B's stage-0 count ``min(D, N)`` -- the paper's "same peak memory" -- where 1F1B's later
    stages hold fewer."""
    zb = simulate(build("zb-h1", D, N), ZB_COSTS)
    base = simulate(build("1f1b", D, N), ZB_COSTS)
    assert zb.makespan < base.makespan
    assert zb.makespan == pytest.approx(3 * N + (D - 1))  # bubble (D-1)(T_F + T_I - T_W)
    assert base.makespan == pytest.approx(3 * (N + D - 1))
    assert peaks(base) == [min(D - d, N) for d in range(D)]
    assert peaks(zb) == [min(D, N)] * D
    assert max(peaks(zb)) == max(peaks(base))


def test_zb_h1_splits_every_backward():
    s = build("zb-h1", 4, 6)
    kinds = {a.kind for row in s.actions for a in row}
    assert kinds == {"F", "I", "W"}
    validate(s)


# ---- PipeDream and PipeDream-2BW -----------------------------------------------------------------

@pytest.mark.parametrize("D,N", [(1, 1), (4, 2), (4, 8), (8, 8)])
def test_pipedream(D, N):
    s = build("pipedream", D, N)
    assert not s.synchronous and s.params["update"] == "per-microbatch"
    assert s.weight_versions == [D - st for st in range(D)]
    assert s.actions == build("1f1b", D, N).actions
    validate(s)


@pytest.mark.parametrize("D,N", [(1, 1), (4, 4), (4, 8), (8, 16)])
def test_pipedream_2bw(D, N):
    s = build("pipedream-2bw", D, N)
    assert not s.synchronous and s.params["update"] == "every-N"
    assert s.weight_versions == [2] * D
    assert s.actions == build("1f1b", D, N).actions
    validate(s)


def test_pipedream_2bw_needs_n_ge_d():
    with pytest.raises(ValueError, match=r"microbatches \(N=3\) must be >= devices \(D=4\)"):
        build("pipedream-2bw", 4, 3)


# ---- GEMS ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("D,N", [(2, 2), (4, 4), (4, 8), (8, 8), (8, 16), (16, 16)])
def test_gems_bubble_above_chimera_and_one_activation(D, N):
    gems = simulate(build("gems", D, N))
    chimera = simulate(build("chimera", D, N))
    assert gems.bubble_ratio > chimera.bubble_ratio
    assert gems.makespan == N * (2 * D + 1) + D - 1
    # Chimera Table 2 / section 2: GEMS stores the activations of one micro-batch (M_a) per worker
    assert peaks(gems) == [1] * D


def test_gems_bubble_does_not_fall_with_n():
    """Chimera section 2: GEMS's bubble 'cannot be alleviated by a larger N': it tends to (D-1)/(D+1/2)."""
    D = 8
    ratios = [simulate(build("gems", D, N)).bubble_ratio for N in (8, 16, 32)]
    assert all(r > (D - 1) / (D + 0.5) for r in ratios)
    assert ratios[-1] == pytest.approx((D - 1) / (D + 0.5), abs=0.01)


def test_gems_structure():
    s = build("gems", 4, 5)
    assert s.placement == [[0, 1, 2, 3], [3, 2, 1, 0]]
    assert s.mb_replica == [0, 1, 0, 1, 0]
    assert [str(a) for a in s.actions[3][:4]] == ["3F0", "3B0", "r1:0F1", "r1:0B1"]
    validate(s)


def test_gems_at_most_two_in_flight():
    """A micro-batch is in flight from its first forward's start to its last backward's end."""
    D, N = 4, 8
    res = simulate(build("gems", D, N))
    span: dict[int, list[float]] = {}
    for row in res.timeline:
        for a, st, en in row:
            if a.kind in ("F", "B"):
                lo_hi = span.setdefault(a.mb, [st, en])
                lo_hi[0], lo_hi[1] = min(lo_hi[0], st), max(lo_hi[1], en)
    for t in sorted({x for v in span.values() for x in v}):
        assert sum(1 for lo, hi in span.values() if lo <= t < hi) <= 2


class _HeldCosts(UnitCosts):
    """ZB_COSTS whose I keeps half a micro-batch's activations of output gradients until its W."""

    def held_grads(self, stage: int) -> float:
        return 0.5


@pytest.mark.parametrize("D,N", [(2, 5), (4, 8), (8, 24)])
def test_zb_h1_keeps_the_output_gradients_from_i_to_w(D, N):
    """A split backward's I adds the output gradients its W needs (``dW = dY^T X``): stage s holds, besides its
    D micro-batches' activations, those of the s micro-batches whose W it defers and of the one just past its
    I. The encoded replay, the lowered one and the list count (Warmup.peaks, what the search reads before
    simulating) agree."""
    from planner.schedules import lower
    from planner.schedules.replay import replay_lowered
    from planner.shapes import Warmup

    costs = _HeldCosts(1, 2, input_grad=1, weight_grad=1)
    sched = build("zb-h1", D, N)
    got = peaks(simulate(sched, costs))
    assert got == [D + 0.5 * (s + 1) for s in range(D)]
    assert peaks(replay_lowered(lower(sched), costs)) == got
    import numpy as np
    assert Warmup(sched, sched.actions, 0).peaks(np.ones(D), np.full(D, 0.5)) == got
    assert peaks(simulate(sched, ZB_COSTS)) == [min(D, N)] * D  # without held gradients (UnitCosts has none)


@settings(max_examples=150, deadline=None)
@given(hst.integers(1, 10), hst.integers(1, 30), hst.data())
def test_zb_h1_peak_is_known_before_its_lists(D, N, data):
    """Each stage's activation peak counted in the built lists (what the simulator counts) is ``inflight *
    activation + held_at_peak * held_grads`` for any per-stage sizes: the most alive micro-batches and the most
    held output gradients come at one point of the list (:func:`planner.schedules.zb_h1.held_at_peak`)."""
    import numpy as np

    from planner.schedules import held_at_peak, inflight
    from planner.shapes import Warmup

    sizes = hst.floats(0.0, 10.0, allow_nan=False)
    act = np.array(data.draw(hst.lists(sizes, min_size=D, max_size=D)))
    held = np.array(data.draw(hst.lists(sizes, min_size=D, max_size=D)))
    sched = build("zb-h1", D, N)
    alive, kept = inflight("zb-h1", D, N), held_at_peak("zb-h1", D, N)
    want = [alive[(0, s)] * act[s] + kept[(0, s)] * held[s] for s in range(D)]
    assert Warmup(sched, sched.actions, 0).peaks(act, held) == pytest.approx(want, rel=1e-12, abs=1e-12)
