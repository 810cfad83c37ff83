"""planner.bounds._single_machine (Carlier 1982's bound of 1|r_j, q_j|C_max over the sets ``r >= rho``,
``q >= kappa`` of each device's action classes) is the same float, bit for bit, as the formula as written
(:func:`planner.bounds._single_machine_reference`, its ``(devices, C, C)`` arrays): under random releases,
deliveries and work -- ties among them, classes without work, one device or many, blocks of devices of any
size -- and on the arrays the search's own configurations give it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import planner.bounds
from planner.analytic import analytic_profile
from planner.bounds import _single_machine, _single_machine_reference
from planner.cluster import load_cluster
from planner.device import device_for_cluster
from planner.model import PRESETS
from planner.request import TrainingRequest
from planner.search import Planner

EX = Path(__file__).resolve().parent.parent / "examples" / "clusters"


def _same(release: np.ndarray, tail: np.ndarray, work: np.ndarray) -> None:
    fast, ref = _single_machine(release, tail, work), _single_machine_reference(release, tail, work)
    assert np.float64(fast).tobytes() == np.float64(ref).tobytes(), (fast, ref)


def _draw(rng: np.random.Generator, shape: tuple[int, int], levels: int) -> np.ndarray:
    """Values with many ties (a few levels, some thirds: sums that round) or none (uniform)."""
    kind = rng.integers(3)
    if kind == 0:
        return rng.integers(0, levels, shape) * rng.choice([1.0, 0.1, 1 / 3])
    if kind == 1:
        return rng.uniform(0.0, 10.0, shape)
    return np.round(rng.exponential(3.0, shape), int(rng.integers(0, 4)))


@pytest.mark.parametrize("block", [1, 7, 1 << 18])
def test_same_float_as_the_formula_on_random_classes(block, monkeypatch):
    monkeypatch.setattr(planner.bounds, "_BLOCK", block)  # a device per block, a few, all at once
    rng = np.random.default_rng(20260129 + block)
    for _ in range(400):
        shape = (int(rng.integers(1, 7)), int(rng.integers(1, 30)))
        release, tail, work = (_draw(rng, shape, 6) for _ in range(3))
        if rng.random() < 0.5:  # classes without work (a zero, or below)
            work[rng.random(shape) < 0.3] = rng.choice([0.0, -1.0])
        _same(release, tail, work)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4), st.integers(1, 12), st.data())
def test_same_float_as_the_formula_hypothesis(devices, classes, data):
    values = st.one_of(st.integers(0, 4).map(float), st.floats(0.0, 1e6, allow_nan=False, allow_infinity=False))
    arrays = [np.array(data.draw(st.lists(values, min_size=devices * classes, max_size=devices * classes)),
                       dtype=float).reshape(devices, classes) for _ in range(3)]
    _same(*arrays)


def test_same_float_where_the_formula_needs_its_nan_to_num():
    """A negative or infinite release or delivery of a class with work, no class with work: the fast path
    hands these to the formula (the same float by construction), and says 0 where nothing has work."""
    rng = np.random.default_rng(7)
    r, q, w = rng.uniform(0, 5, (3, 8)), rng.uniform(0, 5, (3, 8)), rng.uniform(0, 1, (3, 8))
    for field, value in (("r", -1.0), ("r", np.inf), ("q", -2.5), ("q", np.inf), ("w", np.inf)):
        r2, q2, w2 = r.copy(), q.copy(), w.copy()
        {"r": r2, "q": q2, "w": w2}[field][1, 3] = value
        _same(r2, q2, w2)
    _same(r, q, np.zeros_like(w))
    assert _single_machine(r, q, np.zeros_like(w)) == 0.0


@pytest.mark.parametrize("preset,cluster,gpus,batch", [("bert-48", "piz-daint-p100-16gb.json", 16, 64),
                                                       ("gpt2-1.3b", "dgx-a100-80gb.json", 32, 64)])
def test_same_float_on_the_search_s_own_classes(preset, cluster, gpus, batch, monkeypatch):
    """The release bound of every configuration of a search (interleaved stages, Chimera's and Hanayo's many
    stage copies per device, split backwards: the arrays the search gives it) is the same with either."""
    cl = load_cluster(EX / cluster)
    planner_ = Planner(analytic_profile(PRESETS[preset], device_for_cluster(cl)), cl,
                       TrainingRequest(global_batch=batch, gpus=gpus, allow_async=True))
    seen: Counter[str] = Counter()
    calls: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    monkeypatch.setattr(planner.bounds, "_single_machine", lambda *a: calls.append(a) or _single_machine(*a))
    for cfg in planner_.configs(Counter()):
        cand, costs = planner_.prepare(cfg)
        if costs is None:
            continue
        calls.clear()
        planner_.bounds.release_bound(costs.schedule, costs)
        for args in calls:
            _same(*args)
        seen[cfg.schedule] += 1
    assert len(seen) >= 5, seen
