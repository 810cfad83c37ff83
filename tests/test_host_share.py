"""A shared CPU host (planner.cluster.HostCpu, planner.cost.host_share): processes that outnumber the cores
share them (processor sharing), emulated compute holds no core, devices of their own are unchanged."""

from __future__ import annotations

import pytest

from executor.emulate import uniform_profile
from planner.cluster import Cluster, ExecutorOverhead, HostCpu, Link
from planner.cost import ConfigCosts, experienced_concurrency, host_share
from planner.request import Config, TrainingRequest
from planner.schedules import build
from planner.simulate import simulate

FAST = Link(alpha=0.0, beta=0.0)


def cpu(procs: int, cores: float | None, overhead: float = 0.0, overlaps: bool = False) -> Cluster:
    host = HostCpu(cores=2, effective_cores=cores, comm_overlaps_compute=overlaps) if cores is not None else None
    return Cluster(name="cpu", nodes=1, gpus_per_node=procs, device="cpu", memory_bytes=2**40, peak_flops=1e12,
                   memory_bandwidth=1e15, intra=FAST, inter=FAST, host=host,
                   executor=ExecutorOverhead(compute=overhead) if overhead else None)


def costs(cluster: Cluster, D: int, W: int, schedule: str = "1f1b", N: int = 4, emulated: bool = False) -> ConfigCosts:
    prof = uniform_profile(8, fwd=0.001, bwd=0.002, param_bytes=4)
    config = Config(tensor=1, pipeline=D, data=W, micro_batch=1, schedule=schedule)
    sched = build(schedule, D, N)
    bounds = [(i * 8 // D, (i + 1) * 8 // D) for i in range(D)]
    return ConfigCosts(prof, cluster, TrainingRequest(global_batch=N * W), config, sched, bounds, emulated=emulated)


def test_data_parallel_processes_all_computing_share_the_cores_evenly() -> None:
    # D=1, W=4 on 2 cores: the four processes compute at the same time all along -> each at half speed
    c = costs(cpu(4, 2.0), D=1, W=4)
    assert c.share == pytest.approx(2.0, rel=1e-2)
    alone = costs(cpu(4, None), D=1, W=4)
    assert c.compute("F", 0, 1, 0) == pytest.approx(2.0 * alone.compute("F", 0, 1, 0), rel=1e-2)
    assert simulate(c.schedule, c).makespan == pytest.approx(2.0 * simulate(alone.schedule, alone).makespan, rel=1e-2)


def test_no_more_processes_than_cores_or_no_host_changes_nothing() -> None:
    assert costs(cpu(2, 2.0), D=2, W=1).share == 1.0
    assert costs(cpu(4, None), D=4, W=1).share == 1.0
    assert host_share(costs(cpu(4, None), D=4, W=1)) == 1.0


def test_a_pipeline_with_bubbles_shares_less_than_its_process_count() -> None:
    # GPipe D=4 N=4 on 2 cores: warm-up and drain leave processes idle, so compute sees fewer than 4 at once
    c = costs(cpu(4, 2.0), D=4, W=1, schedule="gpipe")
    assert 1.0 < c.share < 2.0
    # a core's worth less: more sharing
    assert costs(cpu(4, 1.0), D=4, W=1, schedule="gpipe").share > c.share


def test_the_share_is_a_fixed_point_of_the_concurrency_it_produces() -> None:
    c = costs(cpu(4, 1.5), D=4, W=1, schedule="1f1b", N=8)
    s = c.share
    k = experienced_concurrency(c, simulate(c.schedule, c).timeline, copies=1.0)
    assert s == pytest.approx(max(1.0, k / 1.5), rel=1e-2)


def test_emulated_compute_holds_no_core_only_the_overhead_does() -> None:
    # 4 emulated processes on 2 cores: the waits are not stretched; without overhead nothing is shared
    plain = costs(cpu(4, 2.0), D=1, W=4, emulated=True)
    assert plain.share == 1.0
    assert plain.compute("F", 0, 1, 0) == pytest.approx(plain.work("F", 0, 1))
    over = costs(cpu(4, 1.0, overhead=0.004), D=1, W=4, emulated=True)
    assert over.share > 1.0
    assert over.compute("F", 0, 1, 0) == pytest.approx(over.work("F", 0, 1) + 0.004 * over.share)


def test_host_is_part_of_the_cluster_hash_only_when_set() -> None:
    a, b = cpu(4, None), cpu(4, 2.0)
    assert a.content_hash() != b.content_hash()
    assert b.model_copy(update={"host": None}).content_hash() == a.content_hash()
    with pytest.raises(ValueError, match="effective_cores"):
        HostCpu(cores=2, effective_cores=0)


def test_a_concurrent_profile_on_a_host_cluster_is_warned_about() -> None:
    from planner.mismatch import device_warnings

    prof = uniform_profile(2, fwd=0.001, bwd=0.002).model_copy(update={"device": "cpu"})
    assert device_warnings(prof, cpu(4, 2.0)) == []
    shared = prof.model_copy(update={"environment": {"concurrent_processes": "4"}})
    (w,) = device_warnings(shared, cpu(4, 2.0))
    assert "4 processes at once" in w and "counted twice" in w
    assert device_warnings(shared, cpu(4, None)) == [], "no host model: the concurrent profile is the way"


@pytest.mark.slow  # spawns processes that import torch
def test_measure_host_reports_a_slowdown_and_the_cores_it_implies() -> None:
    import os

    from profiler.local_cluster import measure_host

    h = measure_host(2, rounds=2, reps=20)
    assert h.cores == (os.cpu_count() or 1) and h.processes == 2 and h.slowdown > 0
    assert h.effective_cores == pytest.approx(min(float(h.cores), max(2 / h.slowdown, 0.5)))
    assert "2 processes" in h.source and "rounds" in h.source


@pytest.mark.slow  # spawns a process
def test_measuring_processes_that_die_fail_the_measurement_at_once() -> None:
    """Processes that end without their result (here they exit 3 at once) fail the measurement when they end,
    not when its timeout runs out."""
    import os
    import time

    from profiler.local_cluster import _spawn_ranks

    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="2 of 2 processes ended without a result \\(exit code 1"):
        _spawn_ranks(os._exit, 2, lambda r, queue: (3,), timeout=300, preload=())
    assert time.monotonic() - t0 < 60


def test_the_fixed_point_is_found_in_a_few_simulations(monkeypatch: pytest.MonkeyPatch) -> None:
    """The concurrency changes little with the share, so the secant iteration ends in 3-4 simulations; the half
    steps it replaced took 8-10 per configuration (68% of a local-cpu-4 plan's time). Its answer is the fixed
    point as closely as before (within the 1e-3 tolerance)."""
    import planner.simulate as sim

    calls: list[int] = []
    real = sim.simulate

    def counted(*a: object, **k: object) -> object:
        calls.append(1)
        return real(*a, **k)  # type: ignore[arg-type]

    for schedule, D, W, N, cores in (("1f1b", 4, 1, 8, 1.5), ("gpipe", 4, 1, 4, 2.0), ("1f1b", 2, 2, 16, 1.2),
                                     ("zb-h1", 4, 1, 8, 1.0)):
        c = costs(cpu(D * W, cores), D=D, W=W, schedule=schedule, N=N)
        calls.clear()
        monkeypatch.setattr(sim, "simulate", counted)
        s = host_share(c)
        monkeypatch.setattr(sim, "simulate", real)
        k = experienced_concurrency(c, simulate(c.schedule, c).timeline, copies=float(W))
        assert s == pytest.approx(max(1.0, k / cores), rel=2e-3), (schedule, s, k / cores)
        assert s > 1.0 and len(calls) <= 4, (schedule, len(calls))
