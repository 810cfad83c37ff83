"""planner.cost.experienced_concurrency reads the simulation's compute, step and copy spans
(planner.schedules.timing.SimResult.host_spans: the encoded replay gives them without building the timeline)
and takes the integral with numpy; host_share encodes the schedule once for its simulations. The floats are
those of the event-by-event loop over the timeline it replaced -- exactly, not approximately: the plans a CPU
cluster gets are byte-identical."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from executor.emulate import uniform_profile
from planner.cluster import Cluster, ExecutorOverhead, HostCpu, Link
from planner.cost import ConfigCosts, _cpu_fraction, experienced_concurrency, host_share
from planner.request import Config, TrainingRequest
from planner.schedules import build
from planner.schedules.ir import ALLREDUCE, SEND_B, SEND_F, STEP
from planner.schedules.timing import timeline_spans
from planner.simulate import simulate

SLOW = Link(alpha=2e-4, beta=1e-9)


def cpu(procs: int, cores: float, overlaps: bool, overhead: float) -> Cluster:
    return Cluster(name="cpu", nodes=1, gpus_per_node=procs, device="cpu", memory_bytes=2**40, peak_flops=1e12,
                   memory_bandwidth=1e15, intra=SLOW, inter=SLOW,
                   host=HostCpu(cores=2, effective_cores=cores, comm_overlaps_compute=overlaps),
                   executor=ExecutorOverhead(compute=overhead, send=overhead / 2, step=overhead) if overhead else None)


def costs(schedule: str, D: int, W: int, N: int, *, emulated: bool, overlaps: bool, cores: float = 1.5,
          overhead: float = 3e-4, eager: bool = False) -> ConfigCosts:
    prof = uniform_profile(8, fwd=0.001, bwd=0.002, param_bytes=4 * 10**6)
    config = Config(tensor=1, pipeline=D, data=W, micro_batch=1, schedule=schedule)
    sched = build(schedule, D, N)
    if eager:  # every stage all-reduced right after its last backward (mid-list all-reduces)
        sched = replace(sched, params={**sched.params, "eager": "all"})
    S = sched.stages
    bounds = [(i * 8 // S, (i + 1) * 8 // S) for i in range(S)]
    return ConfigCosts(prof, cpu(D * W, cores, overlaps, overhead), TrainingRequest(global_batch=N * W), config,
                       sched, bounds, emulated=emulated)


def reference_concurrency(costs: ConfigCosts, timeline: list, copies: float) -> float:
    """The loop over the timeline that experienced_concurrency was (planner/cost.py before the fast path)."""
    host = costs.cluster.host
    comm_counts = host is not None and not host.comm_overlaps_compute
    events: list[tuple[float, float, float]] = []
    for d, row in enumerate(timeline):
        for a, start, end in row:
            if end <= start:
                continue
            if a.kind in ("F", "B", "I", "W") or a.kind == STEP:
                frac = _cpu_fraction(costs, a.kind, a.stage if a.kind != STEP else -1, a.span, d) * copies
                events += [(start, frac, frac), (end, -frac, -frac)]
            elif comm_counts and a.kind in (SEND_F, SEND_B, ALLREDUCE):
                events += [(start, 0.0, copies), (end, 0.0, -copies)]
    events.sort(key=lambda e: e[0])
    num = den = k_cpu = k = 0.0
    last = events[0][0] if events else 0.0
    for at, dc, dk in events:
        dt = at - last
        num += k_cpu * k * dt
        den += k_cpu * dt
        k_cpu, k, last = k_cpu + dc, k + dk, at
    return num / den if den > 0 else 0.0


def reference_share(costs: ConfigCosts, iterations: int = 12, tolerance: float = 1e-3) -> float:
    """host_share as it was: a fresh simulation and its timeline on every step."""
    host = costs.cluster.host
    c = costs.config
    copies = min(c.pipeline * c.data * c.tensor, costs.cluster.gpus_per_node) / c.pipeline
    s, before = 1.0, None
    for _ in range(iterations):
        costs._share = s
        k = reference_concurrency(costs, simulate(costs.schedule, costs).timeline, copies)
        new = max(1.0, k / host.effective_cores)
        g = new - s
        if abs(g) <= tolerance * s:
            s = new
            break
        step = new
        if before is not None and g != before[1]:
            step = s - g * (s - before[0]) / (g - before[1])
        if not 1.0 <= step <= 2.0 * max(s, new):
            step = 0.5 * (s + new)
        before, s = (s, g), step
    costs._share = s
    return s


CASES = [("1f1b", 4, 1, 8), ("1f1b", 2, 2, 16), ("gpipe", 4, 1, 6), ("interleaved", 2, 1, 8),
         ("interleaved", 2, 2, 4), ("zb-h1", 4, 1, 8), ("zb-h1", 2, 2, 5), ("chimera", 4, 1, 8),
         ("chimera", 2, 2, 4), ("hanayo", 2, 1, 8), ("gems", 2, 1, 4)]


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("schedule,D,W,N", CASES)
@pytest.mark.parametrize("emulated", [False, True])
@pytest.mark.parametrize("overlaps", [False, True])
def test_fast_concurrency_and_share_are_the_loop_s_floats(schedule: str, D: int, W: int, N: int, emulated: bool,
                                                          overlaps: bool) -> None:
    for eager in (False, True):
        c = costs(schedule, D, W, N, emulated=emulated, overlaps=overlaps, eager=eager)
        # comm_share: an eager all-reduce takes that part of the compute after it (contention_debt; 0 for a
        # CPU device, set here so that the replay's delayed compute starts are covered too)
        for share, comm_share in ((1.0, 0.0), (1.37, 0.0), (1.21, 0.25)):
            c._share, c.comm_share = share, comm_share
            fast, slow = simulate(c.schedule, c), simulate(c.schedule, c)
            assert fast._spans is not None
            spans, ref = fast.host_spans(), timeline_spans(slow.timeline)
            assert callable(fast._timeline), "the spans are read without building the timeline"
            assert len(spans) == len(ref) == D
            for got, want in zip(spans, ref, strict=True):
                assert all(same(x, y) for x, y in zip(got, want, strict=True)), (schedule, eager, share, comm_share)
            for copies in (1.0, float(W), 1.5):
                k = experienced_concurrency(c, fast, copies)
                want = reference_concurrency(c, slow.timeline, copies)
                assert type(k) is float and k.hex() == want.hex(), (schedule, eager, share, copies, k, want)
                assert experienced_concurrency(c, slow.timeline, copies).hex() == want.hex()
        a = costs(schedule, D, W, N, emulated=emulated, overlaps=overlaps, eager=eager)
        b = costs(schedule, D, W, N, emulated=emulated, overlaps=overlaps, eager=eager)
        assert host_share(a).hex() == reference_share(b).hex(), (schedule, eager)


def test_a_pickled_result_reads_its_spans_from_the_timeline() -> None:
    import pickle

    c = costs("1f1b", 4, 1, 8, emulated=False, overlaps=False)
    res = simulate(c.schedule, c)
    back = pickle.loads(pickle.dumps(res))
    assert back._spans is None and back == res
    for got, want in zip(back.host_spans(), simulate(c.schedule, c).host_spans(), strict=True):
        assert all(same(x, y) for x, y in zip(got, want, strict=True))


def test_no_compute_gives_zero() -> None:
    c = costs("1f1b", 2, 1, 2, emulated=False, overlaps=False)
    assert experienced_concurrency(c, [[], []], 1.0) == 0.0
