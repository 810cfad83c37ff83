"""Predictions of NVIDIA's published, measured mixture-of-experts runs on DGX H100
(tests/data/h100_moe_public_runs.json): GPT OSS 120B in BF16, Megatron-Bridge's performance summaries (25.11 and
26.02 NeMo containers), 64 GPUs at TP 1, PP 4, EP 8, force-balanced routing, token-dropless.

A row gives the global batch, the micro-batch, the parallel sizes and the measured tokens/s/GPU; the iteration time
is ``GBS s / (tokens/s/GPU * GPUs)``. :func:`predict_moe` builds the operator-model profile of the model
(:class:`planner.model.ModelSpec`: sinks, sliding window on every other layer, the clamped quick-GELU gate, 128
experts of which 4 per token) with the recipe's kernels (:meth:`MoePublicRun.options`: bf16, cuDNN's fused attention,
which Transformer Engine runs for the sinks, no dropout, no sequence parallelism at TP 1, gradient-accumulation fusion,
one grouped GEMM over the rank's experts) and runtime (:meth:`MoePublicRun.environment`: the distributed optimizer's
overlapped reduction, Megatron-Core's blocking batched pipeline sends), and predicts the stated configuration with
:func:`planner.fidelity.predict_stated`: Megatron's even layer split (9 layers a stage, the embedding on the first, the
output layer and loss on the last), Megatron-Core's rank order (the pipeline outermost, so each EP group of 8 is one
node), 1F1B, the experts split over ``e = 8`` data-parallel replicas with their all-to-alls on the compute stream
(:mod:`planner.expert_parallel`), the distributed optimizer's ``4 + 12/d`` bytes per dense parameter and the experts'
state over their ``d/e`` copies, the shipped H100 description and DGX H100 cluster. Nothing is fitted to the rows.

Not in the operator model, so not in the prediction: the recipe's recomputation of the two norms and the experts'
activation (``recompute_modules: [layernorm, moe_act]``; :func:`recompute_seconds` estimates it) and Transformer
Engine's fused cross-entropy (the head is costed as Megatron-LM's separate fp32 passes; :func:`fused_loss_seconds`
estimates the difference). :func:`alltoall_seconds` says how much of the prediction the all-to-alls are.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cluster import Cluster
from planner.device import DeviceSpec
from planner.fidelity import predict_stated, recipe_environment, spec_profile
from planner.model import ModelSpec
from planner.operators import Kernel, OperatorOptions, head_operators, layer_operators, time_operators
from planner.search import Candidate


@dataclass(frozen=True)
class MoePublicRun:
    """One published measured run of a mixture of experts (tests/data/h100_moe_public_runs.json): the model's shape
    and recipe, and one row of the table as printed (GPUs, GBS, MBS, TP, PP, VP, EP, tokens/s/GPU, model
    TFLOP/s/GPU)."""

    model: str
    spec: ModelSpec
    recipe: dict
    release: str
    gpus: int
    batch: int
    micro_batch: int
    t: int
    p: int
    chunks: int
    expert: int
    tokens_per_gpu: float
    tflops_per_gpu: float
    url: str

    @property
    def label(self) -> str:
        return f"{self.model} {self.release} g={self.gpus}"

    @property
    def d(self) -> int:
        return self.gpus // (self.t * self.p)

    def measured_seconds(self) -> float:
        """Iteration time from the published throughput: ``GBS s / (tokens/s/GPU * GPUs)``."""
        return self.batch * self.spec.seq / (self.tokens_per_gpu * self.gpus)

    def model_flops_per_token(self) -> float:
        """The table's model FLOPs per token: its TFLOP/s/GPU over its tokens/s/GPU (Megatron-Bridge's count)."""
        return self.tflops_per_gpu * 1e12 / self.tokens_per_gpu

    def microbatches(self, micro_batch: int | None = None) -> int:
        """Micro-batches per pipeline and iteration, ``GBS / (MBS d)``, at the stated micro-batch or ``micro_batch``."""
        return self.batch // ((micro_batch or self.micro_batch) * self.d)

    def options(self) -> OperatorOptions:
        """The recipe's kernels: bf16, the flash kernel of the recipe's implementation (cuDNN's fused attention, the
        one Transformer Engine runs the sinks in), causal, dropout and sequence parallelism as the recipe has them,
        gradient-accumulation fusion, the experts as one grouped GEMM; no recomputation (the recipe's
        ``[layernorm, moe_act]`` is not an operator option: :func:`recompute_seconds`)."""
        r = self.recipe
        return OperatorOptions(attention=r["attention"], attention_impl=r["attention_impl"], causal=True,
                               dropout=bool(r["dropout"]), sequence_parallel=bool(r["sequence_parallel"]),
                               dtype="bf16",
                               grad_accumulation="fused" if r.get("gradient_accumulation_fusion") else "separate",
                               recompute="none", expert_gemm="grouped" if r.get("grouped_gemm") else "sequential")

    def environment(self) -> dict[str, str]:
        """The runtime of the recipe (:func:`planner.fidelity.recipe_environment`: the distributed optimizer's
        overlapped reduction, and blocking pipeline sends where the recipe batches them without overlapping them,
        Megatron-Core's defaults, which this recipe keeps)."""
        return recipe_environment(self.recipe)

    def shards_optimizer(self) -> bool:
        return bool(self.recipe.get("distributed_optimizer"))


def _chunks(vp: int | str | None) -> int:
    """The model chunks of a printed VP column: ``n/a`` (no virtual pipeline) is 1."""
    return 1 if vp in (None, "n/a") else int(vp)


def moe_public_runs(data: dict) -> list[MoePublicRun]:
    """The rows of tests/data/h100_moe_public_runs.json as :class:`MoePublicRun`; a row the planner cannot express
    (context parallelism, FSDP) is refused."""
    out = []
    for key, m in data["models"].items():
        shape = {k: v for k, v in m["shape"].items() if not k.endswith("_note")}
        spec = ModelSpec(name=key, source=m["url"], **shape)
        for r in m["rows"]:
            if r.get("cp", 1) != 1 or r.get("fsdp", 0):
                raise ValueError(f"{key} {r['release']}: CP/FSDP rows cannot be expressed by the planner")
            if r["seq"] != spec.seq:
                raise ValueError(f"{key} {r['release']}: sequence {r['seq']}, the shape's {spec.seq}")
            out.append(MoePublicRun(model=key, spec=spec, recipe=m["recipe"], release=r["release"], gpus=r["gpus"],
                                    batch=r["gbs"], micro_batch=r["mbs"], t=r["tp"], p=r["pp"],
                                    chunks=_chunks(r.get("vp")), expert=r["ep"],
                                    tokens_per_gpu=r["tokens_per_s_per_gpu"],
                                    tflops_per_gpu=r["model_tflops_per_gpu"], url=m["url"]))
    return out


def predict_moe(run: MoePublicRun, base: Cluster, device: DeviceSpec, options: OperatorOptions | None = None,
                environment: dict[str, str] | None = None, micro_batch: int | None = None,
                spec: ModelSpec | None = None) -> Candidate:
    """The prediction of ``run`` in its stated configuration (module docstring), timed even where the memory model
    says it does not fit (compare ``max(candidate.memory)`` with the device's). What-if arguments: ``options`` (the
    kernels), ``environment`` (entries replacing the recipe's runtime), ``micro_batch`` (another MBS at the same
    GBS), ``spec`` (another shape of the model, e.g. without its attention window)."""
    b = micro_batch or run.micro_batch
    prof = spec_profile(spec or run.spec, device, (b,), run.t, "bf16", options or run.options(),
                        {**run.environment(), **(environment or {})})
    return predict_stated(prof, run.t, run.p, run.gpus, run.batch, b, run.chunks, False, base, label=run.label,
                          shard_optimizer=run.shards_optimizer(), check_memory=False, expert=run.expert)


def alltoall_seconds(cand: Candidate) -> float:
    """Seconds per iteration the expert-parallel all-to-alls (dispatch, combine and the token counts' exchange, forward
    and backward: :meth:`planner.cost.ConfigCosts.ep_seconds`) add to the compute stream of the pipeline device that
    has the most of them, times the micro-batches per pipeline. The recipe does not overlap them (``moe_a2a_overlap``
    False): an upper bound on what an overlap could take off."""
    costs = cand.costs
    if costs is None:
        raise ValueError("alltoall_seconds: the candidate was not costed")
    return max(costs.ep_seconds(d) for d in range(costs.schedule.devices)) * cand.microbatches


def slot_seconds(cand: Candidate) -> float:
    """The slowest stage's forward plus backward of one micro-batch (:meth:`planner.cost.ConfigCosts.fwd`, ``bwd``):
    the pace of a 1F1B pipeline, whose iteration is about ``m + p - 1`` such slots."""
    costs = cand.costs
    if costs is None:
        raise ValueError("slot_seconds: the candidate was not costed")
    return max(costs.fwd(s) + costs.bwd(s) for s in range(costs.schedule.stages))


#: the operators Megatron-Core's ``recompute_modules: [layernorm, moe_act]`` re-run in the backward
#: (:func:`planner.operators.layer_operators`' names: the two norms and the experts' activation)
RECOMPUTED_OPERATORS = ("norm1", "norm2", "experts_act")


def recompute_seconds(run: MoePublicRun, device: DeviceSpec, micro_batch: int | None = None) -> float:
    """An estimate of what the recipe's selective recomputation adds per iteration (not in the prediction: module
    docstring): the forward seconds of :data:`RECOMPUTED_OPERATORS` in the layers of one stage (``layers / p``, the
    even split, the windowed and global layers as the model alternates them), once per micro-batch slot of the 1F1B
    pipeline (``m + p - 1``), at the operator model's rates (busy-throughout clock)."""
    b = micro_batch or run.micro_batch
    spec = run.spec
    per = spec.layers // run.p
    total = 0.0
    for i in range(per):
        ops = layer_operators(spec, b, run.t, run.options(), window=spec.layer_window(i), expert=run.expert)
        times = time_operators(ops, device, "bf16").per_op
        total += sum(times[name][0] for name in RECOMPUTED_OPERATORS if name in times)
    return total * (run.microbatches(b) + run.p - 1)


def fused_loss_seconds(run: MoePublicRun, device: DeviceSpec, micro_batch: int | None = None) -> float:
    """An estimate of what Transformer Engine's fused cross-entropy (the recipe's ``cross_entropy_fusion_impl: te``)
    takes off the prediction, per iteration (a negative number): the head's ``cross_entropy`` operator as
    :func:`planner.operators.cross_entropy` costs it (Megatron-LM's separate fp32 passes, ``el + 34`` bytes a logit
    forward and ``12 + el`` backward) less a fused kernel that reads the 16-bit logits twice and writes the gradient
    into them once in the forward (``3 el``) and scales it in place in the backward (``2 el``), at the device's
    memory rate; once per micro-batch slot of the last stage (``m + p - 1``)."""
    b = micro_batch or run.micro_batch
    el = 2
    ops = head_operators(run.spec, b, run.t, run.options())
    unfused = next(op for op in ops if op.name == "cross_entropy")
    logits = b * run.spec.seq * -(-run.spec.vocab // run.t)
    fwd = Kernel("cross_entropy.te", 5.0 * logits, 3.0 * el * logits)
    bwd = Kernel("cross_entropy.te.bwd", 1.0 * logits, 2.0 * el * logits)
    then = sum(k.time(device, "bf16") for k in (*unfused.fwd, *unfused.bwd_i, *unfused.bwd_w))
    now = fwd.time(device, "bf16") + bwd.time(device, "bf16")
    return (now - then) * (run.microbatches(b) + run.p - 1)
