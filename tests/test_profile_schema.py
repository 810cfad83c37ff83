"""Tests of the model-profile schema (planner/profile.py): interpolation, validation, JSON round trip."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from planner.profile import LayerProfile, ModelProfile, TransformerShape, load_profile, save_profile


def layer(
    fwd: dict[int, float] | None = None, bwd: dict[int, float] | None = None, **kw: object
) -> LayerProfile:
    fwd = fwd if fwd is not None else {1: 1.0, 2: 1.5, 4: 2.5, 8: 4.5}
    bwd = bwd if bwd is not None else {b: 2 * t for b, t in fwd.items()}
    args: dict[str, object] = dict(
        name="block.0",
        kind="transformer",
        fwd_time=fwd,
        bwd_time=bwd,
        output_bytes_per_sample=100,
        stashed_bytes_per_sample=1000,
        input_bytes_per_sample=100,
        params=10,
        param_bytes=40,
    )
    args.update(kw)
    return LayerProfile(**args)  # type: ignore[arg-type]


def model(layers: list[LayerProfile] | None = None, **kw: object) -> ModelProfile:
    args: dict[str, object] = dict(
        name="m",
        layers=layers if layers is not None else [layer()],
        device="cpu",
        dtype="fp32",
        source="measured",
        shape=TransformerShape(hidden=8, seq=4, heads=2, vocab=16, layers=1),
        environment={"torch": "x"},
    )
    args.update(kw)
    return ModelProfile(**args)  # type: ignore[arg-type]


# --- interpolation ---------------------------------------------------------------------------------


def test_exact_at_measured_points_and_linear_between() -> None:
    lp = layer()
    for b, t in lp.fwd_time.items():
        assert lp.time("fwd", b) == pytest.approx(t)
    assert lp.time("fwd", 3) == pytest.approx(2.0)
    assert lp.time("fwd", 6) == pytest.approx(3.5)
    assert lp.time("bwd", 3) == pytest.approx(4.0)


def test_extrapolation_above_uses_per_sample_floor() -> None:
    lp = layer()  # last slope 0.5/sample < per-sample at b=8 (0.5625) -> proportional floor wins
    assert lp.time("fwd", 16) == pytest.approx(4.5 * 2)
    steep = layer(fwd={1: 1.0, 2: 3.0})  # slope 2/sample > per-sample 1.5 -> linear extrapolation
    assert steep.time("fwd", 4) == pytest.approx(7.0)


def test_below_smallest_size_between_proportional_and_constant() -> None:
    lp = layer(fwd={2: 2.0, 4: 3.0})
    # first segment extended: 2 - 0.5 * 1 = 1.5; within [1.0, 2.0]
    assert lp.time("fwd", 1) == pytest.approx(1.5)
    single = layer(fwd={4: 2.0})
    assert single.time("fwd", 1) == pytest.approx(2.0)
    assert single.time("fwd", 8) == pytest.approx(4.0)


def test_recompute_falls_back_to_fwd_plus_bwd() -> None:
    lp = layer()
    assert lp.time("recompute", 2) == pytest.approx(1.5 + 3.0)
    lp2 = layer(recompute_time={1: 9.0, 2: 10.0, 4: 11.0, 8: 12.0})
    assert lp2.time("recompute", 2) == pytest.approx(10.0)


def test_time_rejects_bad_arguments() -> None:
    lp = layer()
    with pytest.raises(ValueError, match="> 0"):
        lp.time("fwd", 0)
    with pytest.raises(ValueError, match="kind"):
        lp.time("sideways", 1)  # type: ignore[arg-type]


tables = st.dictionaries(
    st.integers(min_value=1, max_value=64),
    st.floats(min_value=1e-6, max_value=10.0, allow_nan=False),
    min_size=1,
    max_size=6,
)


def monotone(table: dict[int, float]) -> dict[int, float]:
    """The same sizes with times made non-decreasing in b (cumulative max)."""
    out: dict[int, float] = {}
    best = 0.0
    for b in sorted(table):
        best = max(best, table[b])
        out[b] = best
    return out


@settings(max_examples=200, deadline=None)
@given(tables, st.floats(min_value=0.01, max_value=200.0))
def test_interpolation_bounds(table: dict[int, float], b: float) -> None:
    lp = layer(fwd=table, bwd=table)
    t = lp.time("fwd", b)
    xs = sorted(table)
    assert math.isfinite(t) and t >= 0
    if b < xs[0]:
        t1 = table[xs[0]]
        assert t1 * b / xs[0] - 1e-12 <= t <= t1 + 1e-12
    elif b > xs[-1]:
        assert t >= table[xs[-1]] * b / xs[-1] - 1e-12
    else:
        assert min(table.values()) - 1e-12 <= t <= max(table.values()) + 1e-12


@settings(max_examples=200, deadline=None)
@given(tables, st.floats(min_value=0.01, max_value=100.0), st.floats(min_value=0.0, max_value=100.0))
def test_interpolation_monotone_when_measurements_are(table: dict[int, float], b: float, db: float) -> None:
    mono = monotone(table)
    lp = layer(fwd=mono, bwd=mono)
    assert lp.time("fwd", b + db) >= lp.time("fwd", b) - 1e-9


@settings(max_examples=100, deadline=None)
@given(tables)
def test_interpolation_continuous_at_measured_points(table: dict[int, float]) -> None:
    lp = layer(fwd=table, bwd=table)
    for b, t in table.items():
        for eps in (1e-7, -1e-7):
            assert lp.time("fwd", b + eps) == pytest.approx(t, rel=1e-4, abs=1e-6)


# --- validation ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(fwd={1: -1.0}, bwd={1: 1.0}), "fwd_time\\[1\\]: time -1.0 must be >= 0"),
        (dict(fwd={1: float("nan")}, bwd={1: 1.0}), "must be finite"),
        (dict(fwd={1: 1.0}, bwd={1: float("inf")}), "bwd_time\\[1\\]: .* must be finite"),
        (dict(fwd={}, bwd={}), "fwd_time: needs at least one micro-batch size"),
        (dict(fwd={1: 1.0, 2: 2.0}, bwd={1: 1.0}), "same micro-batch sizes"),
        (dict(fwd={0: 1.0}, bwd={0: 1.0}), "micro-batch size 0 must be >= 1"),
    ],
)
def test_time_validation_errors(kw: dict[str, dict[int, float]], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        layer(**kw)


@pytest.mark.parametrize(
    "field", ["output_bytes_per_sample", "stashed_bytes_per_sample", "params", "param_bytes"]
)
def test_negative_sizes_rejected(field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        layer(**{field: -1})


def test_model_validation_errors() -> None:
    with pytest.raises(ValidationError, match="layers: a profile needs at least one layer"):
        model(layers=[])
    with pytest.raises(ValidationError, match="source"):
        model(source="guessed")
    with pytest.raises(ValidationError, match="schema_version"):
        model(schema_version=2)
    # heads need not divide the hidden size: GLM-4.5's 96 heads of 128 over a hidden size of 4096
    assert TransformerShape(hidden=4096, seq=4, heads=96, vocab=16, layers=1).heads == 96
    assert TransformerShape(hidden=8, seq=4, heads=2, vocab=16, layers=1).ffn_hidden == 32


# --- JSON round trip and hash -----------------------------------------------------------------------


def test_json_round_trip_and_hash(tmp_path: Path) -> None:
    prof = model(
        layers=[layer(name="emb", kind="embedding"), layer(recompute_time={1: 3.0, 2: 4.0, 4: 5.0, 8: 6.0})]
    )
    path = tmp_path / "p.json"
    save_profile(prof, path)
    loaded = load_profile(path)
    assert loaded == prof
    assert loaded.content_hash() == prof.content_hash()
    assert len(prof.content_hash()) == 64
    assert json.loads(path.read_text())["layers"][0]["fwd_time"]["1"] == 1.0
    changed = prof.model_copy(update={"notes": "different"})
    assert changed.content_hash() != prof.content_hash()
