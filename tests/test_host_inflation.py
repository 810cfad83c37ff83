"""Processes taking turns on a CPU core cost more core time (planner.cluster.HostCpu.cpu_inflation,
planner.cost.host_inflation, measured by profiler.local_cluster.measure_host), and the executor's own
optimizer is costed as what it runs (executor.emulate.executor_request)."""

from __future__ import annotations

import pytest

from executor.emulate import Emulator, executor_request, uniform_profile
from executor.plan import RunPlan
from planner.cluster import Cluster, HostCpu, Link
from planner.cost import ConfigCosts, host_inflation
from planner.request import Config, TrainingRequest
from planner.schedules import build
from profiler.local_cluster import round_inflations

FAST = Link(alpha=0.0, beta=0.0)


def cpu(procs: int, cores: float, inflation: float = 1.0, slowdown: float = 2.0) -> Cluster:
    host = HostCpu(cores=2, effective_cores=cores, processes=procs, slowdown=slowdown, cpu_inflation=inflation)
    return Cluster(name="cpu", nodes=1, gpus_per_node=procs, device="cpu", memory_bytes=2**40, peak_flops=1e12,
                   memory_bandwidth=1e15, intra=FAST, inter=FAST, host=host)


def costs(cluster: Cluster, D: int, W: int, schedule: str = "1f1b", N: int = 4) -> ConfigCosts:
    prof = uniform_profile(8, fwd=0.001, bwd=0.002, param_bytes=4)
    config = Config(tensor=1, pipeline=D, data=W, micro_batch=1, schedule=schedule)
    bounds = [(i * 8 // D, (i + 1) * 8 // D) for i in range(D)]
    return ConfigCosts(prof, cluster, TrainingRequest(global_batch=N * W), config, build(schedule, D, N), bounds)


def test_inflation_is_taken_in_proportion_to_the_sharing() -> None:
    host = HostCpu(cores=2, effective_cores=1.0, processes=4, slowdown=3.0, cpu_inflation=1.2)
    assert host_inflation(host, 1.0) == 1.0  # a core of its own: no turns
    assert host_inflation(host, 2.0) == pytest.approx(1.1)  # half way to the measured sharing
    assert host_inflation(host, 3.0) == pytest.approx(1.2)
    assert host_inflation(host, 5.0) == pytest.approx(1.2)  # not beyond what was measured
    assert host_inflation(host.model_copy(update={"cpu_inflation": 1.0}), 3.0) == 1.0
    assert host_inflation(None, 3.0) == 1.0


def test_shared_cores_stretch_compute_by_share_and_inflation() -> None:
    # D=1, W=4 on 2 cores: all four compute all along, share 2 = the measured slowdown -> the whole inflation
    plain, turns = costs(cpu(4, 2.0), D=1, W=4), costs(cpu(4, 2.0, inflation=1.25), D=1, W=4)
    assert plain.share == pytest.approx(2.0, rel=1e-2) and turns.share == pytest.approx(2.0, rel=1e-2)
    assert turns.core_stretch == pytest.approx(2.0 * 1.25, rel=1e-2)
    assert turns.compute("F", 0, 1, 0) == pytest.approx(1.25 * plain.compute("F", 0, 1, 0), rel=1e-2)
    assert turns.step(0) == pytest.approx(1.25 * plain.step(0), rel=1e-2)


def test_no_sharing_no_inflation() -> None:
    c = costs(cpu(2, 2.0, inflation=1.5), D=2, W=1)
    assert c.share == 1.0 and c.core_stretch == 1.0
    assert c.compute("F", 0, 1, 0) == pytest.approx(c.work("F", 0, 1))


def test_measured_inflation_is_cpu_together_over_cpu_alone() -> None:
    # (alone wall, together wall, together CPU, alone CPU) per round, by rank; rank 0's alone figures
    got = {0: [(1.0, 4.0, 1.2, 1.0), (1.0, 3.0, 1.0, 0.8)], 1: [(0.0, 2.0, 1.0, 0.0), (0.0, 3.0, 1.4, 0.0)]}
    assert round_inflations(got, 2, 2) == [pytest.approx(1.1), pytest.approx(1.5)]


def test_an_old_host_hashes_as_before() -> None:
    c = cpu(4, 2.0)
    assert "cpu_inflation" in c.model_dump()["host"]
    old = c.model_dump(mode="json")
    old["host"].pop("cpu_inflation")
    assert Cluster.model_validate(old).content_hash() == c.content_hash()
    assert cpu(4, 2.0, inflation=1.2).content_hash() != c.content_hash()


def test_the_executor_run_costs_its_own_sgd_state() -> None:
    plan = RunPlan.direct("1f1b", 2, 4, model="gpt-tiny", micro_batch=1, dtype="float32", iterations=1, warmup=0)
    assert executor_request(plan).bytes_per_param == 8.0  # fp32 weight + gradient, no optimizer state
    prof = uniform_profile(4, fwd=0.001, bwd=0.002, param_bytes=4000)
    cl = cpu(2, 2.0).model_copy(update={"memory_bandwidth": 1e9})
    em = Emulator(plan, plan.compute_schedule(), prof, cl, emulated=False)
    params = sum(lay.params for lay in prof.layers[:2])
    assert em.costs.step_work(0) == pytest.approx(params * 2 * 8.0 / 1e9)  # read + write 8 bytes each
    f64 = RunPlan.direct("1f1b", 2, 4, model="gpt-tiny", micro_batch=1, dtype="float64", iterations=1, warmup=0)
    assert executor_request(f64).bytes_per_param == 16.0


def test_the_measured_cluster_records_the_step_bandwidth_it_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    import profiler.local_cluster as lc
    import profiler.overhead as ov
    from planner.cluster import ExecutorOverhead

    link = {"alpha": 1e-4, "beta": 1e-9}
    monkeypatch.setattr(lc, "measure_links", lambda procs: {"intra_node": link, "allreduce": link})
    monkeypatch.setattr(lc, "measure_host", lambda procs: HostCpu(cores=2, effective_cores=2.0, processes=procs,
                                                                 cpu_inflation=1.1))
    monkeypatch.setattr(ov, "measure_overhead", lambda **kw: (ExecutorOverhead(compute=1e-4), {}))
    seen = []
    monkeypatch.setattr(ov, "measure_emulated_overhead", lambda procs, cluster, **kw: (
        seen.append((procs, cluster.host)) or ExecutorOverhead(compute=3e-5), {}))
    monkeypatch.setattr(lc, "measure_step_bandwidth", lambda: 12.5e9)
    c, _ = lc.measured_cluster(cpu(4, 2.0).model_copy(update={"memory_bandwidth": 20e9, "host": None}))
    assert c.memory_bandwidth == 12.5e9 and "12.5 GB/s" in c.notes
    assert c.host is not None and c.host.cpu_inflation == 1.1
    # the emulated overhead: measured on all 4 processes at once, on this host (real messages), not rescaled
    assert c.executor is not None and c.executor.emulated is not None and c.executor.emulated.compute == 3e-5
    assert seen == [(4, c.host)]


def test_step_bandwidth_counts_the_bytes_the_cost_model_counts() -> None:
    # 2 bytes_per_param per parameter, float32 SGD: 16 bytes a parameter in a positive, finite time
    from profiler.local_cluster import measure_step_bandwidth

    bw = measure_step_bandwidth(params=64_000, width=128, repeats=3)
    assert 0 < bw < float("inf")


def test_step_bandwidth_steps_after_a_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    # the step is timed as the executor runs it: gradients made by a backward just before, then the executor's
    # SGD.step and zero_grad; the bytes counted are 16 per parameter of the Linear chain
    from executor.sgd import SGD
    from profiler.local_cluster import measure_step_bandwidth

    calls: list[str] = []
    real_step, real_zero = SGD.step, SGD.zero_grad

    def step(self: SGD) -> None:
        assert all(p.grad is not None for p in self.params)  # fresh from a backward
        calls.append("step")
        real_step(self)

    def zero(self: SGD) -> None:
        calls.append("zero")
        real_zero(self)

    monkeypatch.setattr(SGD, "step", step)
    monkeypatch.setattr(SGD, "zero_grad", zero)
    ticks = iter(range(1000))
    monkeypatch.setattr("time.thread_time", lambda: float(next(ticks)))  # every timed step: 1 "second"
    bw = measure_step_bandwidth(params=2 * 128 * 128, width=128, repeats=3)
    assert calls == ["step", "zero"] * 5
    assert bw == 16.0 * 2 * (128 * 128 + 128)  # two Linear(128, 128): weights and biases, 16 bytes each


def test_emulated_compute_is_charged_the_overhead_measured_emulated() -> None:
    from planner.cluster import ExecutorOverhead

    real = ExecutorOverhead(compute=3e-4, send=1e-4, recv=1e-4, step=2e-3,
                            emulated=ExecutorOverhead(compute=5e-5, send=2e-5, recv=2e-5, step=1e-3))
    cl = cpu(2, 2.0).model_copy(update={"executor": real})
    config = Config(tensor=1, pipeline=2, data=1, micro_batch=1, schedule="1f1b")
    prof = uniform_profile(8, fwd=0.001, bwd=0.002, param_bytes=4)
    args = (prof, cl, TrainingRequest(global_batch=4), config, build("1f1b", 2, 4), [(0, 4), (4, 8)])
    run, emu = ConfigCosts(*args), ConfigCosts(*args, emulated=True)
    # stage 0's F: compute + its send; stage 1's F: its receive + compute
    assert run.compute("F", 0, 1, 0) - run.work("F", 0, 1) == pytest.approx(3e-4 + 1e-4)
    assert emu.compute("F", 0, 1, 0) - emu.work("F", 0, 1) == pytest.approx(5e-5 + 2e-5)
    assert emu.compute("F", 1, 1, 1) - emu.work("F", 1, 1) == pytest.approx(2e-5 + 5e-5)
    without = cl.model_copy(update={"executor": real.model_copy(update={"emulated": None})})
    old = ConfigCosts(prof, without, *args[2:], emulated=True)
    assert old.compute("F", 0, 1, 0) - old.work("F", 0, 1) == pytest.approx(3e-4 + 1e-4)  # as before
    # a cluster measured before the field existed hashes as before
    assert without.content_hash() == Cluster.model_validate_json(
        without.model_dump_json(exclude={"executor": {"emulated"}})).content_hash()
