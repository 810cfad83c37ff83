"""Partitioners against brute force."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.partition import PartitionError, balance_by_cost, pipedream_partition


def compositions(L: int, S: int):
    for cuts in itertools.combinations(range(1, L), S - 1):
        b = (0, *cuts, L)
        yield [(b[k], b[k + 1]) for k in range(S)]


def brute_balanced(cost, S, memory=None, caps=None, scale=None, fixed=None):
    best = math.inf
    for bounds in compositions(len(cost), S):
        ok = True
        if memory is not None:
            for k, (i, j) in enumerate(bounds):
                if fixed[k] + scale[k] * sum(memory[i:j]) > caps[k]:
                    ok = False
        if ok:
            best = min(best, max(sum(cost[i:j]) for i, j in bounds))
    return best


costs = st.lists(st.integers(0, 20).map(float), min_size=1, max_size=9)


@settings(max_examples=150, deadline=None)
@given(cost=costs, data=st.data())
def test_balanced_equals_brute_force(cost, data):
    S = data.draw(st.integers(1, len(cost)))
    got = balance_by_cost(cost, S)
    assert got.stages == S
    assert all(j > i for i, j in got.bounds)
    assert got.bounds[0][0] == 0 and got.bounds[-1][1] == len(cost)
    assert got.bottleneck == pytest.approx(brute_balanced(cost, S))


@settings(max_examples=150, deadline=None)
@given(cost=costs, data=st.data())
def test_balanced_with_memory_equals_brute_force(cost, data):
    L = len(cost)
    S = data.draw(st.integers(1, L))
    memory = data.draw(st.lists(st.integers(0, 10).map(float), min_size=L, max_size=L))
    scale = [float(S - k) for k in range(S)]  # 1F1B: stage k keeps S-k micro-batches
    fixed = data.draw(st.lists(st.integers(0, 5).map(float), min_size=S, max_size=S))
    caps = data.draw(st.lists(st.integers(0, 80).map(float), min_size=S, max_size=S))
    expect = brute_balanced(cost, S, memory, caps, scale, fixed)
    if expect == math.inf:
        with pytest.raises(PartitionError, match="fits the memory"):
            balance_by_cost(cost, S, memory, caps, scale, fixed)
    else:
        got = balance_by_cost(cost, S, memory, caps, scale, fixed)
        assert got.bottleneck == pytest.approx(expect)
        for k, (i, j) in enumerate(got.bounds):
            assert fixed[k] + scale[k] * sum(memory[i:j]) <= caps[k]


@settings(max_examples=150, deadline=None)
@given(cost=costs, data=st.data())
def test_balanced_with_any_fits_table_equals_brute_force(cost, data):
    """``fits`` tables of any shape (not only memory that grows with the layers): the one-pass optimum the
    search with memory uses finds the brute force's bottleneck, and its partition is one that fits."""
    L = len(cost)
    S = data.draw(st.integers(1, L))
    tables = [[[data.draw(st.booleans()) for _ in range(L + 1)] for _ in range(L + 1)] for _ in range(S)]
    best = math.inf
    for bounds in compositions(L, S):
        if all(tables[k][i][j] for k, (i, j) in enumerate(bounds)):
            best = min(best, max(sum(cost[i:j]) for i, j in bounds))
    if best == math.inf:
        with pytest.raises(PartitionError, match="fits the memory"):
            balance_by_cost(cost, S, fits=lambda k: np.array(tables[k]))
    else:
        got = balance_by_cost(cost, S, fits=lambda k: np.array(tables[k]))
        assert got.bottleneck == best
        assert all(tables[k][i][j] for k, (i, j) in enumerate(got.bounds))


def test_heavy_ends_get_fewer_blocks():
    # embedding and LM head heavier than a block: first and last stages hold fewer layers
    cost = [6.0] + [2.0] * 12 + [6.0]
    p = balance_by_cost(cost, 4)
    sizes = [j - i for i, j in p.bounds]
    assert sizes[0] < sizes[1] and sizes[-1] < sizes[1]


def test_balanced_errors():
    with pytest.raises(PartitionError, match="non-empty stages"):
        balance_by_cost([1.0, 2.0], 3)
    with pytest.raises(PartitionError, match="finite"):
        balance_by_cost([1.0, float("nan")], 1)


def brute_pipedream(T, C, M, sync):
    L = len(T)
    best = math.inf
    for S in range(1, min(L, M) + 1):
        for bounds in compositions(L, S):
            for reps in itertools.product(range(1, M + 1), repeat=S):
                if sum(reps) != M:
                    continue
                v = 0.0
                for k, ((i, j), m) in enumerate(zip(bounds, reps, strict=True)):
                    v = max(v, max(sum(T[i:j]), sync(i, j, m) if m > 1 else 0.0) / m)
                    if k > 0:
                        v = max(v, 2 * C[i - 1])
                best = min(best, v)
    return best


@settings(max_examples=60, deadline=None)
@given(T=st.lists(st.integers(1, 20).map(float), min_size=1, max_size=7), data=st.data())
def test_pipedream_equals_brute_force(T, data):
    L = len(T)
    C = data.draw(st.lists(st.integers(0, 10).map(float), min_size=L, max_size=L))
    w = data.draw(st.lists(st.integers(0, 10).map(float), min_size=L, max_size=L))
    M = data.draw(st.integers(1, 4))

    def sync(i, j, m):  # PipeDream: 4 (m-1) |w| / m bytes per worker, bandwidth 1
        return 4 * (m - 1) * sum(w[i:j]) / m

    plan = pipedream_partition(T, C, M, sync)
    assert plan.slowest == pytest.approx(brute_pipedream(T, C, M, sync))
    assert sum(plan.replicas) == M
    assert plan.noam == math.ceil(M / plan.replicas[0])
    # the plan's own value is what it claims
    v = 0.0
    for k, ((i, j), m) in enumerate(zip(plan.bounds, plan.replicas, strict=True)):
        v = max(v, max(sum(T[i:j]), sync(i, j, m) if m > 1 else 0.0) / m)
        if k > 0:
            v = max(v, 2 * C[i - 1])
    assert v == pytest.approx(plan.slowest)


def test_heavy_layer_fits_only_a_later_stage():
    """Found by hypothesis: packing early stages greedily leaves a layer that only the last stage can
    hold to a middle stage that cannot; the exact test must still find the partition."""
    cost = [0.0] * 8
    memory = [0.0] * 6 + [1.0, 0.0]
    got = balance_by_cost(cost, 3, memory, [0.0, 0.0, 1.0], [3.0, 2.0, 1.0], [0.0, 0.0, 0.0])
    assert got.bounds[2][0] <= 6 < got.bounds[2][1]
