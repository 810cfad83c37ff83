"""The optimizer STEP's terms measured on the executor's runs (issue 11, cpufid3): the tied-embedding
all-reduce between the devices holding the first and the last stage (planner.cost.ConfigCosts.tied_allreduce),
with what the executor-overhead measurement already holds of it taken out."""

from __future__ import annotations

import pytest

from executor.emulate import uniform_profile
from planner.cluster import AllReduceFit, Cluster, ExecutorOverhead, Link
from planner.cost import OVERHEAD_TIED_BYTES, ConfigCosts
from planner.request import Config, TrainingRequest
from planner.schedules import build

FIT = Link(alpha=5e-4, beta=2e-9)
FAST = Link(alpha=0.0, beta=0.0)


def cluster(executor: ExecutorOverhead | None = ExecutorOverhead()) -> Cluster:
    return Cluster(name="cpu", nodes=1, gpus_per_node=4, device="cpu", memory_bytes=2**40, peak_flops=1e12,
                   memory_bandwidth=1e15, intra=FAST, inter=FAST, allreduce_fit=AllReduceFit(ranks=4, link=FIT),
                   executor=executor)


def costs(cl: Cluster, D: int, tied: int, schedule: str = "1f1b", W: int = 1, emulated: bool = False) -> ConfigCosts:
    prof = uniform_profile(8, fwd=0.001, bwd=0.002, param_bytes=4 * 1000)
    last = prof.layers[-1].model_copy(update={"params": 1000 + tied, "param_bytes": 4 * (1000 + tied),
                                              "tied_params": tied})
    prof = prof.model_copy(update={"layers": [*prof.layers[:-1], last]})
    config = Config(tensor=1, pipeline=D, data=W, micro_batch=1, schedule=schedule)
    bounds = [(i * 8 // D, (i + 1) * 8 // D) for i in range(D)]
    return ConfigCosts(prof, cl, TrainingRequest(global_batch=4 * W), config, build(schedule, D, 4), bounds,
                       emulated=emulated)


def test_tied_allreduce_is_the_fit_of_the_tied_bytes_on_the_end_devices() -> None:
    c = costs(cluster(), 4, tied=131072)
    want = FIT.alpha + FIT.beta * 131072 * 4  # float32 gradients, 2 ranks: the measured all-reduce fit
    assert c.tied_allreduce(0) == pytest.approx(want)
    assert c.tied_allreduce(3) == pytest.approx(want)
    assert c.tied_allreduce(1) == 0.0 and c.tied_allreduce(2) == 0.0  # holding neither end
    assert c.step(0) - c.step(1) == pytest.approx(want)  # the same model state per stage otherwise


def test_tied_allreduce_takes_out_what_the_overhead_measurement_holds() -> None:
    # the executor-overhead step figure already contains one all-reduce of the nearly-nothing model's embedding
    c = costs(cluster(ExecutorOverhead(step=2e-3)), 2, tied=131072)
    full = FIT.alpha + FIT.beta * 131072 * 4
    assert c.tied_allreduce(0) == pytest.approx(full - (FIT.alpha + FIT.beta * OVERHEAD_TIED_BYTES))


def test_no_tied_allreduce_without_tied_parameters_one_stage_or_emulated() -> None:
    assert costs(cluster(), 2, tied=0).tied_allreduce(0) == 0.0
    assert costs(cluster(), 1, tied=131072).tied_allreduce(0) == 0.0
    emu = costs(cluster(), 2, tied=131072, emulated=True)
    # an emulated STEP runs none
    assert emu.step(0) == pytest.approx(costs(cluster(), 2, tied=0, emulated=True).step(0))


def test_tied_allreduce_spans_the_data_parallel_copies() -> None:
    c = costs(cluster(), 2, tied=1000, W=2)  # 4 ranks: the two ends of both copies, still within the fit's 4
    assert c.tied_allreduce(0) == pytest.approx(FIT.alpha + FIT.beta * 4000)
    big = cluster().model_copy(update={"allreduce_fit": AllReduceFit(ranks=2, link=FIT)})
    assert costs(big, 2, tied=1000, W=2).tied_allreduce(0) != pytest.approx(FIT.alpha + FIT.beta * 4000)


def test_no_tied_allreduce_on_clusters_without_our_executor() -> None:
    # GPU clusters (no measured executor overhead): not costed (planner.cost.ConfigCosts.tied_allreduce)
    assert costs(cluster(None), 4, tied=131072).tied_allreduce(0) == 0.0


def test_overhead_tied_bytes_match_the_overhead_model() -> None:
    from profiler.overhead import NEARLY_NOTHING

    assert OVERHEAD_TIED_BYTES == NEARLY_NOTHING["vocab"] * NEARLY_NOTHING["hidden"] * 4
