"""The simulator's figures against the closed forms of the papers (issue 2's oracles)."""

from __future__ import annotations

import pytest

from planner.schedules import build
from planner.schedules.hanayo import bubble_ratio_closed_form
from planner.simulate import UnitCosts, simulate


def peaks(res):
    return [d.peak_activations for d in res.devices]


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("D,N", [(1, 1), (2, 1), (4, 4), (4, 8), (8, 3), (8, 16), (5, 7)])
@pytest.mark.parametrize("fwd,bwd", [(1, 2), (1, 1), (1.5, 2.5)])
def test_gpipe_1f1b_bubble(name, D, N, fwd, bwd):
    res = simulate(build(name, D, N), UnitCosts(fwd, bwd))
    assert res.bubble_ratio == pytest.approx((D - 1) / (N + D - 1))
    assert res.makespan == pytest.approx((N + D - 1) * (fwd + bwd))


@pytest.mark.parametrize("D,N", [(4, 4), (4, 8), (8, 3), (8, 16)])
def test_activation_peaks(D, N):
    assert peaks(simulate(build("gpipe", D, N))) == [N] * D
    assert peaks(simulate(build("1f1b", D, N))) == [min(D - s, N) for s in range(D)]


@pytest.mark.parametrize("D", [4, 6, 8, 16, 32])
def test_chimera_f1_n_eq_d(D):
    N = D
    res = simulate(build("chimera", D, N))
    assert res.bubble_ratio == pytest.approx((D - 2) / (3 * N / 2 + D - 2))
    same = simulate(build("chimera", D, N), UnitCosts(1, 1))
    assert same.bubble_ratio == pytest.approx((D - 2) / (2 * N + D - 2))
    assert all(D // 2 + 1 <= p <= D for p in peaks(res))
    # Chimera 3.4: the critical path explains the makespan
    assert res.critical_forward * 1 + res.critical_backward * 2 == pytest.approx(res.makespan)


def test_chimera_figures():
    assert simulate(build("chimera", 4, 4)).makespan == 16
    assert simulate(build("chimera", 4, 4)).bubble_ratio == pytest.approx(0.25)
    r8 = simulate(build("chimera", 8, 8))
    assert r8.makespan == 36 and r8.bubble_ratio == pytest.approx(1 / 3)


@pytest.mark.parametrize("D,f", [(8, 2), (12, 2), (12, 3), (16, 2), (16, 4), (32, 2), (32, 4), (32, 8)])
def test_chimera_f_gt_1(D, f):
    N = D
    res = simulate(build("chimera", D, N, pipelines=f), UnitCosts(1, 1))
    bubbles_per_device = res.makespan - 2 * N
    assert bubbles_per_device == (D // f // 2 - 1) * 2
    assert all(D - D // (2 * f) + 1 <= p <= D for p in peaks(res))


@pytest.mark.parametrize("D", [4, 8, 16])
@pytest.mark.parametrize("K", [2, 3, 4])
def test_chimera_direct_concat_seamless_when_f_eq_b(D, K):
    """Section 3.5: with equal forward and backward, direct concatenation adds no bubbles."""
    res = simulate(build("chimera", D, K * D, concat="direct"), UnitCosts(1, 1))
    assert res.makespan - 2 * K * D == D - 2


@pytest.mark.parametrize("D", [8, 16])
def test_forward_doubling_beats_direct_with_backward_twice_forward(D):
    direct = simulate(build("chimera", D, 2 * D, concat="direct"))
    doubled = simulate(build("chimera", D, 2 * D, concat="forward-doubling"))
    assert doubled.bubble_ratio < direct.bubble_ratio


def test_interleaved_like_chimera_n_less_than_d():
    res = simulate(build("chimera", 8, 1))
    assert res.makespan == 8 * 3  # one micro-batch crosses 8 stages forward and back


@pytest.mark.parametrize("P,N", [(2, 2), (4, 4), (8, 8), (4, 8)])
def test_hanayo_w1_equals_chimera_2p(P, N):
    """Hanayo figure 5: W = 1 on P devices = Chimera on 2P devices with 2N micro-batches (per-stage
    times F = 1, B = 2)."""
    hanayo = simulate(build("hanayo", P, N, waves=1))
    chimera = simulate(build("chimera", 2 * P, 2 * N))
    if N == P:
        assert hanayo.makespan == chimera.makespan
    else:  # beyond one unit, the single wave keeps one 1F1B pipeline and beats concatenation
        assert hanayo.makespan <= chimera.makespan


def test_hanayo_p4_n4_makespan_36():
    assert simulate(build("hanayo", 4, 4, waves=1)).makespan == 36


@pytest.mark.parametrize("P", [4, 8])
def test_hanayo_bubble_falls_with_waves(P):
    ratios = []
    for W in (1, 2, 4):
        # time of a device's share of the model fixed: each of the 2W stages takes 1/(2W) of it
        res = simulate(build("hanayo", P, P, waves=W), UnitCosts(1 / (2 * W), 2 / (2 * W)))
        ratios.append(res.bubble_ratio)
    assert ratios[0] > ratios[1] > ratios[2]


def test_hanayo_closed_form():
    for P in (2, 4, 8, 16):
        for W in (1, 2, 4):
            assert bubble_ratio_closed_form(P, W) == pytest.approx((2 * P - 2) / (3 * P * W + P - 1))


@pytest.mark.parametrize("D,N,f,concat", [(4, 4, 1, "direct"), (8, 24, 1, "direct"), (8, 32, 2, "forward-doubling"),
                                          (16, 16, 4, "direct"), (6, 13, 1, "backward-halving")])
def test_chimera_prefix_is_a_prefix_of_the_lists(D, N, f, concat):
    """The planner bounds the warm-up memory on a partial merge: it must be a prefix of the full lists."""
    from planner.schedules import chimera

    full = chimera.build(D, N, pipelines=f, concat=concat).actions
    for slots in (1, D, 4 * D):
        part = chimera.prefix(D, N, slots, pipelines=f, concat=concat)
        assert all(full[d][:len(row)] == row for d, row in enumerate(part))
        assert all(len(row) <= slots for row in part)


@pytest.mark.parametrize("P,N,W", [(4, 8, 1), (4, 16, 2), (8, 8, 4)])
def test_hanayo_prefix_is_a_prefix_of_the_lists(P, N, W):
    from planner.schedules import hanayo

    full = hanayo.build(P, N, waves=W).actions
    part = hanayo.prefix(P, N, 4 * P, waves=W)
    assert all(full[d][:len(row)] == row for d, row in enumerate(part)) and any(part)
