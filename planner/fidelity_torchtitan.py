"""Predictions of torchtitan's published FSDP2 runs (``tests/data/torchtitan_runs.json``): Llama 2 and 3 on 64
A100 80GB GPUs, 1D parallelism (every GPU one FSDP rank, ``t = 1, D = 1, W = 64``), eager PyTorch.

A row states the model, the local batch (one micro-batch per GPU per iteration: global batch = local batch x
64), the activation checkpointing and the measured tokens per second per GPU (WPS); the iteration time is
``local_batch x seq / WPS``. :func:`predict_row` predicts it as the planner would for a user who profiles with
the row's stack: :func:`planner.analytic.analytic_profile` with the flash kernel (torch's SDPA runs
FlashAttention-2 on the A100), no dropout, the stated kernels (``"eager"``: torchtitan's code without
``torch.compile``, :mod:`planner.operators` "Kernels"; ``"fused"``: the Megatron / Transformer Engine kernels
the operator model timed before, for comparison) and checkpointing, with sharded weights
(``shard_parameters``: :mod:`planner.fsdp`, torchtitan's FSDP2 defaults) on ``examples/clusters/dgx-a100-80gb.json``.

Checkpointing (torchtitan's ``[activation_checkpoint]``): ``"none"``; ``"full"`` -- every block re-runs its
forward (the planner's ``Config.recompute``); ``"selective op"`` -- the operator model's ``recompute = "op"``
(:func:`planner.operators.checkpoint_ops`); ``"selective layer"`` (``selective_ac_option = "2"``: every second
block fully checkpointed) is not a configuration the planner searches (it recomputes every layer or none), so
:func:`predict_row` gives it as the mean of the ``"none"`` and ``"full"`` predictions, which is what it is
when the layers' times add up (one stage, one micro-batch, the collectives hidden), and says so.

Each row is timed whatever the memory model says (the run fitted on 80 GB); the predicted peak is reported
beside it (with the 2 GiB reserve for the CUDA context, NCCL and the allocator, and the loss's fp32 logits and
gradients held while it runs: :func:`planner.cost.layer_transient`): every row's is under 80 GiB but Llama 2
13B's without checkpointing, 2.5 GiB over where the run fit (80.5 GiB of model memory with eager kernels, 71 GiB
of it the 40 layers' stash of 1.78 GiB each, what autograd keeps for torchtitan's ops, 2 GiB the loss's
transient). The source's one stated failure, Llama 2 70B at local batch 2 with op checkpointing out of memory
(``out_of_memory`` in the data), is predicted at 106 GiB, and the local batch 1 it ran instead at 66 GiB.
:func:`h100_memory`: torchtitan's two H100 FSDP rows' peak memory (8 and 128 GPUs, the allocator's maximum
reserved, 82.4 and 67.0 GiB) are predicted at 76.9 and 62.9 GiB (61 and 47 without the loss's transient).
Nothing here is fitted to the rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from planner.analytic import analytic_profile
from planner.candidate import Candidate
from planner.cluster import Cluster, load_cluster
from planner.device import DeviceSpec
from planner.model import ModelSpec
from planner.operators import OperatorOptions
from planner.request import Config, TrainingRequest
from planner.search import predict

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "examples" / "clusters" / "dgx-a100-80gb.json"
GPUS = 64
#: torchtitan's activation checkpointing as the operator model's selective option and the planner's full flag
AC = {"none": ("none", False), "full": ("none", True), "selective op": ("op", False)}


@dataclass(frozen=True)
class TorchtitanRun:
    """One row: the model (Llama: RMSNorm, rotary positions, SwiGLU, grouped-query attention where
    ``kv_heads`` < ``heads``, untied head, no biases), the local batch, the checkpointing and the measured
    WPS and MFU."""

    model: str
    spec: ModelSpec
    local_batch: int
    ac: str
    wps: float
    mfu_percent: float

    @property
    def label(self) -> str:
        return f"{self.model} b={self.local_batch} {self.ac}"

    def measured_seconds(self) -> float:
        return self.local_batch * self.spec.seq / self.wps

    def model_flops_per_token(self) -> float:
        """torchtitan's MFU numerator per token: ``6 N + 12 l h s`` with ``N`` all parameters."""
        s = self.spec
        return 6 * s.total_params() + 12 * s.layers * s.hidden * s.seq


def torchtitan_runs(data: dict, key: str = "rows") -> list[TorchtitanRun]:
    """The measured rows (``key="rows"``) or the configurations the source says ran out of memory
    (``key="out_of_memory"``, without a throughput: ``wps`` and ``mfu_percent`` 0)."""
    out = []
    for r in data[key]:
        shape = data["models"][r["model"]]["shape"]
        spec = ModelSpec(name=r["model"], gated_mlp=True, activation="silu", norm="rmsnorm", position="rotary",
                         tied_embeddings=False, bias=False, **shape)
        out.append(TorchtitanRun(model=r["model"], spec=spec, local_batch=r["local_batch"], ac=r["ac"],
                                 wps=r.get("wps", 0.0), mfu_percent=r.get("mfu_percent", 0.0)))
    return out


@dataclass(frozen=True)
class RowPrediction:
    seconds: float
    memory_gib: float
    #: how the row was predicted, where it is not one configuration ("selective layer")
    note: str = ""


def predict_row(run: TorchtitanRun, kernels: str = "eager", cluster: Cluster | None = None) -> RowPrediction:
    """The predicted iteration time and peak memory of ``run`` with ``kernels`` (module docstring)."""
    base = cluster or load_cluster(CLUSTER)
    base = base.model_copy(update={"memory_bytes": 1 << 50})  # timed even where it would not fit
    if run.ac == "selective layer":
        none = predict_row(_with_ac(run, "none"), kernels, cluster)
        full = predict_row(_with_ac(run, "full"), kernels, cluster)
        return RowPrediction((none.seconds + full.seconds) / 2, (none.memory_gib + full.memory_gib) / 2,
                             "every second block recomputed: the mean of none and full")
    if run.ac not in AC:
        raise ValueError(f"ac: {run.ac!r} is not one of {', '.join([*AC, 'selective layer'])}")
    selective, full = AC[run.ac]
    cand = predict_fsdp(run.spec, "A100-SXM4-80GB", base, GPUS, run.local_batch, kernels, selective, full)
    return RowPrediction(cand.iteration_time, max(cand.memory) / 2**30)


def predict_fsdp(spec: ModelSpec, device: DeviceSpec | str, cluster: Cluster, gpus: int, b: int, kernels: str,
                 selective: str = "none", full: bool = False) -> Candidate:
    """A torchtitan run as the planner predicts it: the operator model's profile of ``spec`` on ``device`` (flash
    kernel, no dropout, ``kernels``, the ``selective`` option, torch DDP's overlapped reduction) planned as
    FSDP over ``gpus`` (``t = 1, D = 1``), one micro-batch of ``b`` per GPU, fully recomputed or not."""
    prof = analytic_profile(spec, device, micro_batches=(b,), tensor_sizes=(1,),
                            options=OperatorOptions(attention="flash", dropout=False, recompute=selective,  # type: ignore[arg-type]
                                                    kernels=kernels),  # type: ignore[arg-type]
                            dp_allreduce="overlapped")
    return predict(prof, cluster, TrainingRequest(global_batch=gpus * b, shard_parameters=True),
                   Config(tensor=1, pipeline=1, data=gpus, micro_batch=b, schedule="1f1b", recompute=full))


#: Llama 3.1 8B, the model of torchtitan's H100 tables (Llama 3 8B's shape), at their sequence 8192
LLAMA31_8B = ModelSpec(name="llama3.1-8b", layers=32, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336,
                       vocab=128256, seq=8192, gated_mlp=True, activation="silu", norm="rmsnorm", position="rotary",
                       tied_embeddings=False, bias=False)


def predict_h100(gpus: int, kernels: str = "eager", device: DeviceSpec | str = "H100-SXM5-80GB") -> Candidate:
    """torchtitan's H100 FSDP row of Llama 3.1 8B on ``gpus`` GPUs (local batch 2, op checkpointing) on the
    shipped DGX H100 cluster, timed whatever the memory model says (``device``: another description, e.g. with
    their memory bandwidth)."""
    cluster = load_cluster(ROOT / "examples" / "clusters" / "dgx-h100-80gb.json")
    cluster = cluster.model_copy(update={"memory_bytes": 1 << 50, "gpus": max(cluster.gpus, gpus)})
    return predict_fsdp(LLAMA31_8B, device, cluster, gpus, 2, kernels, "op")


def h100_memory(gpus: int) -> float:
    """Predicted peak memory (GiB, with the 2 GiB reserve) of :func:`predict_h100` with eager kernels
    (``h100_fsdp_memory`` in the data; memory does not depend on the devices' speed)."""
    return max(predict_h100(gpus).memory) / 2**30


def _with_ac(run: TorchtitanRun, ac: str) -> TorchtitanRun:
    return TorchtitanRun(run.model, run.spec, run.local_batch, ac, run.wps, run.mfu_percent)
