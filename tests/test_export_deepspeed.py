"""The DeepSpeed export read by DeepSpeed's own ``DeepSpeedConfig`` (deepspeed 0.19.8, installed with
``--no-deps`` beside the pinned torch: ``make venv``): its batch check (train batch = micro-batch x
accumulation steps x data-parallel world), its pipeline section, precision and ZeRO stage; the topology
section builds DeepSpeed's ``PipeModelDataParallelTopology``.

``DeepSpeedConfig`` asks ``deepspeed.comm`` for the rank (no process group here: it is told rank 0) and an
``mpu`` for the data-parallel world size (a stand-in answering W, as Megatron's ``mpu`` would)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.export import ExportInput, export
from planner.request import Config
from planner.runspec import RunSpec

dsc = pytest.importorskip("deepspeed.runtime.config", reason="deepspeed is not installed (make venv installs "
                                                              "deepspeed==0.19.8 --no-deps)")
topology = pytest.importorskip("deepspeed.runtime.pipe.topology")


class DataParallel:
    """What DeepSpeedConfig asks of Megatron's ``mpu``: the data-parallel world size."""

    def __init__(self, w: int) -> None:
        self.w = w

    def get_data_parallel_world_size(self) -> int:
        return self.w


@pytest.fixture(scope="module", autouse=True)
def rank_zero():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dsc.dist, "get_rank", lambda: 0)
        yield


@settings(max_examples=40, deadline=None)
@given(t=st.sampled_from([1, 2, 8]), D=st.sampled_from([1, 2, 4, 16]), W=st.integers(1, 12),
       b=st.sampled_from([1, 2, 4]), n=st.integers(1, 4), recompute=st.booleans(),
       dtype=st.sampled_from(["bf16", "fp16", "fp32"]))
def test_deepspeed_reads_the_export(t: int, D: int, W: int, b: int, n: int,
                                    recompute: bool, dtype: str) -> None:
    N = D * n
    spec = RunSpec(config=Config(tensor=t, pipeline=D, data=W, micro_batch=b, schedule="1f1b", recompute=recompute),
                   microbatches=N, partition=[(2 * s, 2 * s + 2) for s in range(D)])
    doc = json.loads(export("deepspeed", ExportInput(spec=spec, dtype=dtype)).main.content)
    cfg = dsc.DeepSpeedConfig(doc, mpu=DataParallel(W))
    assert (cfg.train_batch_size, cfg.train_micro_batch_size_per_gpu, cfg.gradient_accumulation_steps) == (
        W * N * b, b, N)
    assert cfg.pipeline["stages"] == D
    assert cfg.pipeline["activation_checkpoint_interval"] == (1 if recompute else 0)
    assert cfg.pipeline["parts"] == [2 * s for s in range(D + 1)]
    assert cfg.zero_optimization_stage == 0
    assert cfg.bfloat16_config.enabled == (dtype == "bf16") and cfg.float16_config.enabled == (dtype == "fp16")
    topo = topology.PipeModelDataParallelTopology(**cfg.pipeline["topology"])
    assert (topo.get_dim("pipe"), topo.get_dim("model"), topo.get_dim("data")) == (D, t, W)
    assert topo.world_size() == t * D * W
    # DeepSpeed's batch check is real: another data-parallel width is refused
    with pytest.raises(AssertionError, match="train_batch_size is not equal"):
        dsc.DeepSpeedConfig(doc, mpu=DataParallel(W + 1))
