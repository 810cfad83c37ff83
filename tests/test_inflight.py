"""Shapes and in-flight counts computed without building the lists (what the planner bounds memory with)
against the built lists: exact where the builder says so, a lower bound otherwise."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from planner.schedules import BUILDERS, build, inflight, inflight_exact, shape, splits_backward
from planner.schedules.ir import Schedule

small = settings(max_examples=60, deadline=None)


def counted(s: Schedule) -> dict[tuple[int, int], int]:
    """Per (replica, stage), the most micro-batches alive at once in the lists, counted as the simulator
    counts them: a forward adds its micro-batches, a B -- or a split backward's W -- frees one."""
    alive: dict[tuple[int, int], int] = {}
    peak: dict[tuple[int, int], int] = {}
    for row in s.actions:
        for a in row:
            key = (a.replica, a.stage)
            if a.kind == "F":
                alive[key] = alive.get(key, 0) + a.span
                peak[key] = max(peak.get(key, 0), alive[key])
            elif a.kind in ("B", "W"):
                alive[key] = alive.get(key, 0) - 1
    return peak


def params_for(name: str, D: int, N: int, data: st.DataObject) -> dict | None:
    if name == "interleaved":
        v = data.draw(st.integers(1, 4))
        return {"chunks": v} if v == 1 or N % D == 0 else None
    if name == "chimera":
        if D % 2:
            return None
        f = data.draw(st.sampled_from([x for x in range(1, D // 2 + 1) if (D // 2) % x == 0]))
        return {"pipelines": f, "concat": data.draw(st.sampled_from(["direct", "forward-doubling"]))}
    if name == "hanayo":
        return {"waves": data.draw(st.integers(1, 3))}
    if name == "pipedream-2bw" and N < D:
        return None
    return {}


@small
@given(name=st.sampled_from(sorted(BUILDERS)), D=st.integers(1, 10), N=st.integers(1, 40), data=st.data())
def test_shape_and_inflight_match_the_built_lists(name, D, N, data):
    params = params_for(name, D, N, data)
    if params is None:
        return
    full = build(name, D, N, **params)
    sh = shape(name, D, N, **params)
    assert not any(sh.actions)
    assert (sh.name, sh.devices, sh.stages, sh.microbatches) == (full.name, full.devices, full.stages,
                                                                 full.microbatches)
    assert sh.placement == full.placement and sh.mb_replica == full.mb_replica
    assert sh.weight_versions == full.weight_versions and sh.synchronous == full.synchronous
    got, real = inflight(name, D, N, **params), counted(full)
    assert got is not None
    if inflight_exact(name):
        assert got == real
    else:
        assert all(got.get(k, 0) <= v for k, v in real.items()) and set(got) <= set(real)
    assert splits_backward(name) == any(a.kind == "W" for row in full.actions for a in row)


def test_interleaved_inflight_large_without_building():
    """The periodic shortcut agrees with the lists on a large case too."""
    D, N, v = 16, 96, 4
    assert inflight("interleaved", D, N, chunks=v) == counted(build("interleaved", D, N, chunks=v))
