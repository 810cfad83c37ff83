"""Operator-level model of a transformer layer: the kernels of one tensor-parallel shard, their FLOPs, bytes
moved and GEMM shapes, and their times on a :class:`planner.device.DeviceSpec`.

A layer (pre-norm GPT/Llama decoder or BERT encoder, :class:`planner.model.ModelSpec`) is the list
(Megatron-LM, Narayanan et al. SC'21, section 3.2 and figure 5; Shoeybi et al. 2019, figure 3):

``norm1 -> QKV projection -> attention -> output projection -> [all-reduce] -> dropout+residual ->
norm2 -> MLP up (+ gate) -> activation -> MLP down -> [all-reduce] -> dropout+residual``

Gemma 2 (``ModelSpec.sandwich_norm``, ``attention_softcap``, ``logit_softcap``, ``embedding_scale``; Gemma Team
2024, section 2) adds a norm after each output projection (before its residual add), the scores' soft-cap before
the unfused softmax (:func:`softcap`; the flash kernel caps in-kernel, FlashAttention-2's ``softcap``, so its
time is taken as the uncapped kernel's), the logits' soft-cap before the loss, and the embeddings' ``sqrt(h)``.
A layer with a sliding window (``ModelSpec.layer_window``: Mistral, Gemma 2's every other layer) runs the flash
kernel over the pairs within it only (:func:`window_share`). A mixture of experts (``ModelSpec.experts``: Mixtral,
Qwen3 MoE) runs the router, the dispatch, the experts and the combine of :mod:`planner.moe` in place of the MLP.
gpt-oss (``ModelSpec.attention_sinks``, ``glu_clamp``, ``glu_linear_offset``) adds the sinks' passes around the
unfused softmax (:func:`sink_scores`; the flash kernels take them in-kernel) and, under eager kernels, its clamped
gate's seven kernels (:func:`eager_clamped_glu`; fused, one kernel as SwiGLU's); its biases are the GEMMs'.

Symbols: ``b`` micro-batch, ``s`` sequence, ``h`` hidden, ``a`` query heads, ``k`` key/value heads, ``d``
head dimension, ``f`` MLP width, ``t`` tensor-parallel size, ``T = b s`` tokens, ``el`` bytes per element.

**Tensor parallelism** (Megatron 3.2): QKV and MLP-up are split by columns (each rank ``a/t`` query
heads, ``max(k/t, 1)`` key/value heads, ``f/t`` MLP columns), the output projection and MLP-down by rows,
so the GEMMs are ``(m, n, k) = (T, (a d + 2 k d)/t, h)``, ``(T, h, a d/t)``, ``(T, f/t, h)`` (twice or one
double-width GEMM when gated), ``(T, h, f/t)``; attention runs ``b a/t`` heads per rank. Norms, dropouts
and residual adds run on the full ``T x h`` on every rank, or on ``T/t`` rows with sequence parallelism
(Korthikanti et al. 2022, section 4.2.2). The collectives are not operators here: the cost model adds
them from the cluster's links (:mod:`planner.cost`).

**Attention**: ``"unfused"`` is what the 2021 Megatron runs did: a batched GEMM for the scores ``Q K^T``
(``b a/t`` GEMMs of ``(s, s, d)``), one fused scale+mask+softmax kernel (Megatron 4.2, "custom kernels"),
attention dropout, and a batched GEMM for ``P V`` (``(s, d, s)``). ``"flash"`` is one fused kernel
(FlashAttention, Dao et al. 2022) whose forward has the two GEMMs' FLOPs, moves only Q, K, V, O, and
whose backward recomputes the scores (2.5x the forward FLOPs: 5 GEMMs of the same size; FlashAttention-2
section 3.1.2). ``causal=True`` halves the attention FLOPs of the flash kernel (it skips masked blocks);
the unfused GEMMs compute the whole square, as Megatron's did. The flash kernel is not timed as a GEMM: its
FLOPs run at the measured rate of the implementation the run used (``OperatorOptions.attention_impl``:
``"flash2"`` FlashAttention-2, the default -- what Megatron-LM's ``--use-flash-attn`` and Transformer Engine's
flash-attn backend run, on A100 and H100 alike -- ``"flash3"`` FlashAttention-3 (Hopper only) or ``"cudnn"``,
cuDNN's fused attention, which Transformer Engine prefers on Hopper unless ``NVTE_FUSED_ATTN=0``), from the
device's ``attention_efficiency`` (:meth:`planner.device.DeviceSpec.attention_time`: FlashAttention-2 paper
section 4.1 on the A100; FlashAttention-3 paper figures 5 and 6 on the H100); a device without figures for it
times the kernel on its GEMM curve (``gemm`` shape ``(s, s, d, b a/t)``).

**Backward** of a GEMM ``Y = X W`` (X ``m x k``, W ``k x n``): the input gradient ``dX = dY W^T`` is a
``(m, k, n)`` GEMM and the weight gradient ``dW = X^T dY`` a ``(k, n, m)`` GEMM, each with the forward's
FLOPs; attention's GEMMs have no weights, so both of their gradient GEMMs are input-gradient work. An
element-wise kernel's backward reads the output gradient and what it saved and writes the input gradient.
The backward is kept as its input-gradient part I and weight-gradient part W (zero-bubble pipelines, Qi et
al. 2023). **Recomputation** (full, per layer: Megatron 3.5) re-runs the forward list before the backward.

**Selective recomputation** (Korthikanti et al. 2022, section 5, Table 2; Megatron-LM's
``--recompute-granularity selective``, ``OperatorOptions.recompute = "selective"``): the attention core
(``Q K^T`` scores, softmax, attention dropout, attention over ``V``: the ``5 a s / h`` term of their eq. 1)
stashes nothing of its own beyond its inputs ``Q``, ``K``, ``V`` (already counted as the scores' and
attention-over-values' saved operands) and the RNG state of its dropout, and its forward kernels are
re-run at the start of the layer's backward (Megatron's ``_checkpointed_attention_forward`` re-runs the
whole ``CoreAttention``, the last ``P V`` GEMM included): they count in the input-gradient part I
(:attr:`Operator.recomputed`, :attr:`PassTimes.rerun`), never in W. Full recomputation of such a layer
re-runs its whole forward once, the core included, so it does not pay the core's re-run a second time
(:attr:`PassTimes.recompute`). With ``attention="flash"`` the core is the flash kernel, and Megatron-Core
checkpoints it all the same (``megatron/core/transformer/attention.py``: ``if self.checkpoint_core_attention
and self.training: core_attn_out = self._checkpointed_attention_forward(...)``, whatever the kernel --
Transformer Engine's flash or fused attention): its forward is re-run before its backward, and it stashes
Q, K and V only, not its row log-sum-exp. (Megatron-LM's legacy ``ParallelAttention`` skipped the
checkpoint for flash attention: ``if not self.use_flash_attn: if self.checkpoint_core_attention: ...``; the
runs that stack measured used unfused attention.)

**Kernels** (``OperatorOptions.kernels``): ``"fused"`` times the kernels Megatron-LM and Transformer Engine
run -- one fused kernel per norm, rotary embedding, activation (bias-GeLU, SwiGLU) and bias-dropout-add, the
Q, K and V projections as one GEMM. ``"eager"`` times what eager PyTorch runs for torchtitan's and Hugging
Face's model code without ``torch.compile``, one ATen kernel per op, each with its own bytes: RMSNorm computed
in fp32 as eight kernels forward and fourteen backward (:func:`eager_rms_norm`; LayerNorm is one ATen kernel
either way), rotary embeddings as fp32 complex products (:func:`eager_rope`), grouped-query keys and values
copied to every query head (:func:`eager_repeat_kv`), SwiGLU as ``silu`` and a product
(:func:`eager_swiglu`), each residual add and dropout apart with autograd's sum of the residual stream's two
gradients (:func:`eager_residual`), the Llama family's separate q/k/v and gate/up projections with the sums
of their input's gradients (:func:`eager_grad_sum`), and the loss over fp32 logits
(:func:`eager_cross_entropy`). The GEMMs and the attention kernel are the same either way. A LayerNorm and
GeLU model (GPT-2, BERT) differs little: LayerNorm and ``F.gelu`` are one kernel each in eager PyTorch too, so
only its residual adds and dropouts (apart), its bias (inside the GEMM, ``addmm``, where Megatron's QKV adds it
by a kernel of its own) and its loss (ATen's one-pass ``log_softmax`` against Megatron's multi-pass
vocabulary-parallel loss) change, and its eager layer can come out 1-3% faster than Megatron's. (Hugging Face's
GPT-2 runs ``gelu_new`` as a Python formula, several kernels; the model's ``activation = "gelu"`` is one.)

**Op checkpointing** (``OperatorOptions.recompute = "op"``, torchtitan's selective op activation
checkpointing, :func:`checkpoint_ops`): each layer keeps the outputs of its odd-numbered weight GEMMs and of
the attention kernel, and re-runs every other operator's forward in the backward.

**Time** of one kernel (Calculon, Isaev et al. SC'23, section 3): compute
``FLOPs / (peak * gemm_efficiency(shape))`` and memory ``bytes / (bandwidth * memory_efficiency(bytes))``
combined by the device's rule -- their maximum (``roofline``) or their sum (``no_overlap``, Calculon's
rule for the A100 and H100, which the shipped A100/H100 descriptions use) -- plus the per-kernel overhead
(:meth:`planner.device.DeviceSpec.kernel_time`); element-wise FLOPs run at the vector peak.

**Stashed activations** (what autograd keeps for the backward): each operator lists the tensors it saves;
for GPT shapes (MHA, ``f = 4h``, LayerNorm, dropout, unfused attention) the sum is Korthikanti et al.
2022's ``s b h (34 + 5 a s / h)`` bytes at 16-bit (eq. 1), ``s b h (10 + 24/t + 5 a s/(h t))`` with
tensor parallelism (eq. 2) and ``s b h (34 + 5 a s/h) / t`` with sequence parallelism too (eq. 4);
with selective recomputation the ``5 a s / h`` term goes: ``s b h (10 + 24/t)`` (tensor parallel) and
``34 s b h / t`` (+ sequence parallel), their Table 2.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

from planner.device import DeviceSpec
from planner.dtypes import DTYPE_BYTES
from planner.model import ModelSpec, tensor_split_error


@dataclass(frozen=True)
class Kernel:
    """One kernel launch: ``flops``, ``nbytes`` read + written, and its GEMM shape ``(m, n, k, batch)``
    (None for element-wise / reduction kernels, which run on the vector engine)."""

    name: str
    flops: float
    nbytes: float
    gemm: tuple[int, int, int, int] | None = None
    #: a fused attention kernel: (implementation, causal, backward); timed at the device's measured rate for
    #: the implementation (:meth:`DeviceSpec.attention_time`) where it has one, else on the GEMM curve
    attention: tuple[str, bool, bool] | None = None

    def time(self, device: DeviceSpec, dtype: str) -> float:
        if self.attention is not None and self.gemm is not None:
            impl, causal, backward = self.attention
            t = device.attention_time(self.flops, impl, self.gemm[0], backward=backward, causal=causal, dtype=dtype,
                                      heads=self.gemm[3])
            if t is not None:
                return t
        return device.kernel_time(self.flops, self.nbytes, gemm=self.gemm, dtype=dtype)


def gemm_seconds(device: DeviceSpec, m: int, n: int, k: int, batch: int = 1, dtype: str = "bf16") -> float:
    """One GEMM kernel ``(batch, m, k) @ (batch, k, n)`` on ``device``: the forward kernel of :func:`gemm`
    (its operands and output streamed once), timed by the device's kernel-time rule. What a measured GEMM is
    compared with."""
    return gemm("gemm", m, n, k, DTYPE_BYTES.get(dtype, 2), batch).fwd[0].time(device, dtype)


@dataclass(frozen=True)
class Operator:
    """One operator of the layer: its forward kernels, its backward split into input-gradient (``bwd_i``)
    and weight-gradient (``bwd_w``) kernels, and the bytes it stashes for the backward."""

    name: str
    fwd: tuple[Kernel, ...]
    bwd_i: tuple[Kernel, ...]
    bwd_w: tuple[Kernel, ...] = ()
    saved_bytes: float = 0.0
    #: selective recomputation: the forward kernels are re-run before the backward (counted in I)
    recomputed: bool = False
    #: bytes of the operator's output (what torchtitan's selective op checkpointing keeps of a saved operator)
    out_bytes: float = 0.0
    #: a weight GEMM (``aten.mm`` under eager PyTorch: what the op-checkpointing policy counts)
    mm: bool = False
    #: bytes the operator holds beyond what it stashes while its forward or backward runs, freed when it ends
    #: (the loss's copies of the logits and their gradients: :func:`cross_entropy`, :func:`eager_cross_entropy`)
    transient_bytes: float = 0.0

    @property
    def fwd_flops(self) -> float:
        return sum(k.flops for k in self.fwd)

    @property
    def bwd_flops(self) -> float:
        return sum(k.flops for k in self.bwd_i + self.bwd_w)


@dataclass(frozen=True)
class OperatorOptions:
    """Implementation choices of the layer (what the measured run did)."""

    attention: Literal["unfused", "flash"] = "unfused"
    #: which fused attention kernel ``attention="flash"`` is (module docstring): "flash2" (FlashAttention-2,
    #: the default), "flash3" (FlashAttention-3) or "cudnn" (cuDNN's fused attention); unused when unfused
    attention_impl: Literal["flash2", "flash3", "cudnn"] = "flash2"
    causal: bool = False  # only the flash kernel skips masked blocks
    dropout: bool = True  # GPT-2/3 and BERT train with dropout; Llama does not
    sequence_parallel: bool = False
    dtype: str = "bf16"
    #: "separate": each weight gradient is added into the main-gradient buffer by its own kernel (Megatron's
    #: DDP hook ``param.main_grad.add_(param.grad)``, 2021): read grad and main grad, write main grad, per
    #: micro-batch; "fused": the weight-gradient GEMM accumulates in place (gradient-accumulation fusion)
    grad_accumulation: Literal["separate", "fused"] = "separate"
    #: activation recomputation inside the layer, a property of the run like the attention kernel
    #: (Megatron's ``--recompute-granularity selective``): "selective" re-runs the attention core in the
    #: backward instead of stashing its tensors -- the unfused core's ``s x s`` ones, or the flash kernel's
    #: forward, as Megatron-Core checkpoints it too (module docstring); "op": torchtitan's selective op
    #: checkpointing, every other weight GEMM and every element-wise operator re-run (:func:`checkpoint_ops`).
    #: Full recomputation is the planner's per-candidate choice (``Config.recompute``), not an option here.
    recompute: Literal["none", "selective", "op"] = "none"
    #: how the layer's memory-bound operators run (module docstring, "Kernels"): "fused" -- Megatron-LM's and
    #: Transformer Engine's fused kernels, one per norm, rotary embedding, activation and bias-dropout-add,
    #: Q/K/V one GEMM -- or "eager" -- PyTorch eager ops as torchtitan's and Hugging Face's Llama code runs them
    #: without ``torch.compile``: each norm, rotary embedding, activation and residual add as separate kernels
    kernels: Literal["fused", "eager"] = "fused"
    #: a mixture of experts' expert GEMMs (:mod:`planner.moe`): "grouped" -- one grouped GEMM over the experts
    #: (Megatron-Core's ``--moe-grouped-gemm``, torchtitan) -- or "sequential": a loop over the experts, each
    #: kernel launched per expert (Hugging Face's ``experts_implementation="eager"``; Megatron-Core's ``SequentialMLP``)
    expert_gemm: Literal["grouped", "sequential"] = "grouped"


def gemm(name: str, m: int, n: int, k: int, el: int, batch: int = 1, *, weight: bool = True,
         save_input: bool = True, save_weight_side: float = 0.0, accumulate: bool = False,
         bias_rows: float = 0.0, bias_add: bool = False) -> Operator:
    """``batch`` GEMMs ``(m x k) @ (k x n)``: forward, input gradient ``(m, k, n)`` and, for a weight
    (``weight=True``), weight gradient ``(k, n, m)``; a weightless (attention) GEMM's second operand is an
    activation, so both gradients are input-gradient work. Saves its input ``m k`` (and
    ``save_weight_side`` elements for a weightless GEMM's second operand). ``accumulate``: the weight
    gradient is then added into the main-gradient buffer by a separate kernel (3 ``k n`` element moves).

    Bias (Megatron-LM's linear layers, 2021-22): ``bias_rows`` > 0 gives the weight-gradient part a
    reduction kernel that sums the ``bias_rows x n`` output gradient into the bias gradient (autograd's
    reduction over the broadcast bias, or ``grad_output.sum(0)``), reading it once; ``bias_add``: the
    forward adds the bias by a separate element-wise kernel (Megatron's QKV projection: ``output =
    matmul(input, weight.t()); output = output + bias``; the other three linears use ``skip_bias_add`` and
    fuse their bias into the bias-GeLU or bias-dropout-add kernel)."""
    flops = 2.0 * batch * m * n * k
    fwd = Kernel(name, flops, el * batch * (m * k + k * n + m * n), (m, n, k, batch))
    dgrad = Kernel(name + ".dgrad", flops, el * batch * (m * n + k * n + m * k), (m, k, n, batch))
    wgrad = Kernel(name + ".wgrad", flops, el * batch * (m * k + m * n + k * n), (k, n, m, batch))
    saved = el * batch * m * k * (1 if save_input else 0) + el * save_weight_side
    if weight:  # (``batch`` weights: a grouped GEMM's, one per expert, planner.moe)
        acc = (Kernel(name + ".grad_acc", float(batch * k * n), 3.0 * el * batch * k * n),) if accumulate else ()
        bgrad = ((Kernel(name + ".bgrad", batch * bias_rows * n, el * batch * (bias_rows * n + n)),)
                 if bias_rows > 0 else ())
        badd = (Kernel(name + ".bias", float(batch * m * n), el * batch * (2.0 * m * n + n)),) if bias_add else ()
        return Operator(name, (fwd, *badd), (dgrad,), (wgrad, *acc, *bgrad), saved, out_bytes=el * batch * m * n,
                        mm=True)
    return Operator(name, (fwd,), (dgrad, wgrad), (), saved, out_bytes=el * batch * m * n)


def elementwise(name: str, elements: float, el: int, *, reads: float, writes: float, flops_per: float,
                bwd_reads: float, bwd_writes: float, saved_bytes: float, extra_bytes: float = 0.0,
                bwd_extra_bytes: float = 0.0) -> Operator:
    """An element-wise (or row-reduction) kernel over ``elements``: ``reads``/``writes`` tensors of that
    size forward and ``bwd_reads``/``bwd_writes`` backward, plus ``extra_bytes`` (e.g. a dropout mask)."""
    fwd = Kernel(name, flops_per * elements, el * elements * (reads + writes) + extra_bytes)
    bwd = Kernel(name + ".bwd", flops_per * elements, el * elements * (bwd_reads + bwd_writes) + bwd_extra_bytes)
    return Operator(name, (fwd,), (bwd,), (), saved_bytes)


def _passes(name: str, fwd: list[tuple[str, float]], bwd: list[tuple[str, float]], flops: float,
            saved_bytes: float) -> Operator:
    """An operator that eager PyTorch runs as one kernel per ATen op: ``fwd``/``bwd`` list each kernel's
    (name, bytes read + written); ``flops`` per kernel (element-wise work: a few per element, vector rate)."""
    return Operator(name, tuple(Kernel(f"{name}.{k}", flops, nb) for k, nb in fwd),
                    tuple(Kernel(f"{name}.bwd.{k}", flops, nb) for k, nb in bwd), (), saved_bytes)


def eager_rms_norm(name: str, rows: float, width: int, el: int, weight: bool = True) -> Operator:
    """RMSNorm as eager PyTorch runs torchtitan's ``RMSNorm`` (``torchtitan/models/norms.py``, 2024:
    ``output = self._norm(x.float()).type_as(x); return output * self.weight`` with ``_norm(x) = x *
    torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)``; Hugging Face's ``LlamaRMSNorm`` is the same ops) over
    ``rows x width`` elements ``N``. Forward, one kernel each: the cast up (read ``el``, write 4 bytes per
    element), ``pow`` (4 + 4), ``mean`` (read 4), ``+ eps`` and ``rsqrt`` (per row), ``x * r`` (4 + 4), the cast
    down (4 + ``el``), ``* weight`` (``el`` + ``el``): ``28 + 4 el`` bytes per element. Backward (autograd's
    formulas, ``tools/autograd/derivatives.yaml``): ``* weight``: the input gradient (2 ``el``), the weight
    gradient's product (3 ``el``) and row sum (``el``); the cast's backward up (``el`` + 4); ``x * r``: the
    gradient of ``x`` (8) and of ``r`` (product 12, row sum 4); ``mean``'s expand-and-divide (write 4); ``pow``'s
    ``grad * (2 * x.pow(1))`` (copy 8, scale 8, product 12); the sum of ``x``'s two gradients (12); the cast
    back (4 + ``el``): ``76 + 8 el``. Saves the fp32 input, the per-row ``r`` and the cast-down output
    (``(4 + el) N`` bytes) where the fused kernel saves its input only. ``weight`` False: a norm without one (Llama
    4's ``Llama4TextWeightlessRMSNorm``), without the weight's product and its gradient's three kernels."""
    n, r = rows * width, rows
    fwd = [("cast_up", (el + 4) * n), ("pow", 8 * n), ("mean", 4 * n + 4 * r), ("add_eps", 8 * r),
           ("rsqrt", 8 * r), ("mul_r", 8 * n + 4 * r), ("cast_down", (4 + el) * n), ("mul_weight", 2 * el * n)]
    bwd = [("mul_weight", 2 * el * n), ("weight_grad", 3 * el * n), ("weight_grad_sum", el * n),
           ("cast_down", (el + 4) * n), ("mul_r", 8 * n + 4 * r), ("r_grad", 12 * n), ("r_grad_sum", 4 * n + 4 * r),
           ("rsqrt", 16 * r), ("mean", 4 * n + 4 * r), ("pow_copy", 8 * n), ("pow_scale", 8 * n),
           ("pow_mul", 12 * n), ("grad_sum", 12 * n), ("cast_up", (4 + el) * n)]
    if not weight:
        fwd = [k for k in fwd if k[0] != "mul_weight"]
        bwd = [k for k in bwd if not k[0].startswith(("mul_weight", "weight_grad"))]
    return _passes(name, fwd, bwd, n, (4 + el) * n + 4 * r)


def eager_rope(name: str, tensors: tuple[float, ...], el: int) -> Operator:
    """Rotary embeddings as torchtitan's ``apply_rotary_emb`` runs them (``torchtitan/models/llama/model.py``,
    2024: ``torch.view_as_complex(xq.float().reshape(...))``, a complex multiply by ``freqs_cis``,
    ``view_as_real(...).flatten(3)``, ``type_as(xq)``), on each of ``tensors`` (the query and key elements):
    forward the cast up (``el`` + 4 bytes per element), the complex product (4 + 4) and the cast down (4 +
    ``el``); backward the same three in reverse (the product by the conjugate). Saves nothing of its own (the
    frequency table is a buffer). Hugging Face's ``rotate_half`` form moves about as much (five ``el``-byte
    kernels, ~19 bytes per element forward at 16 bits)."""
    fwd: list[tuple[str, float]] = []
    bwd: list[tuple[str, float]] = []
    for i, e in enumerate(tensors):
        fwd += [(f"cast_up{i}", (el + 4) * e), (f"mul{i}", 8 * e), (f"cast_down{i}", (4 + el) * e)]
        bwd += [(f"cast_up{i}", (el + 4) * e), (f"mul{i}", 8 * e), (f"cast_down{i}", (4 + el) * e)]
    return _passes(name, fwd, bwd, sum(tensors), 0.0)


def partial_rope_cat(name: str, elements: float, el: int) -> Operator:
    """Partial rotary in eager PyTorch (transformers' ``apply_rotary_pos_emb`` with ``rotary_dim`` below the head's:
    ``torch.cat((q_embed, q_pass), dim=-1)``, and the key's) over the query and key ``elements``: the concatenation
    reads and writes each once; backward, the gradient is split back (read, write). Saves nothing."""
    e = el * elements
    return _passes(name, [("cat", 2 * e)], [("split", 2 * e)], 0.0, 0.0)


def eager_repeat_kv(name: str, kv: float, q: float, el: int) -> Operator:
    """torchtitan's and Hugging Face's ``repeat_kv`` for grouped-query attention: ``expand`` + ``reshape``
    copies the keys and the values (``kv`` elements each) to every query head (``q`` elements each); the
    backward sums them back over the repeats."""
    copy = el * (kv + q)
    return _passes(name, [("keys", copy), ("values", copy)], [("keys", copy), ("values", copy)], q, 0.0)


def eager_swiglu(name: str, elements: float, el: int) -> Operator:
    """``F.silu(w1(x)) * w3(x)`` in eager PyTorch over ``elements`` (``T x f/t``): forward ``silu`` (read and
    write ``el``) and the product (read 2, write 1); backward the product's two gradients (read 2, write 1
    each) and ``silu_backward`` (read 2, write 1). Saves the gate's output, the ``silu`` output and the up
    projection's output (3 ``el`` per element; the fused kernel saves its two inputs)."""
    e = el * elements
    return _passes(name, [("silu", 2 * e), ("mul", 3 * e)],
                   [("mul_grad_a", 3 * e), ("mul_grad_b", 3 * e), ("silu", 3 * e)], 4.0 * elements, 3 * e)


def clamped_glu(spec: ModelSpec) -> bool:
    """Whether the gated MLP's gate is gpt-oss's clamped one with an offset (``glu_clamp``, ``glu_linear_offset``)."""
    return spec.glu_clamp is not None or spec.glu_linear_offset != 0.0


def eager_clamped_glu(name: str, elements: float, el: int) -> Operator:
    """gpt-oss's gate in eager PyTorch over ``elements`` (``T x f/t``; transformers' ``GptOssExperts._apply_gate``:
    ``gate.clamp(max=limit)``, ``up.clamp(-limit, limit)``, ``glu = gate * sigmoid(gate * alpha)``, ``(up + 1) *
    glu``): forward seven kernels -- the two clamps, the scale, the sigmoid and the add (read and write ``el``
    each), the two products (read 2, write 1); backward the outer product's two gradients and the inner's two (read
    2, write 1 each), the sigmoid's (read 2, write 1), the scale's (read 1, write 1), autograd's sum of the clamped
    gate's two gradients (read 2, write 1) and the two clamps' masked gradients (read 2, write 1 each); the add
    passes its gradient through. Saves the clamped gate and up, the sigmoid and the product (4 ``el`` per
    element)."""
    e = el * elements
    fwd = [("clamp_gate", 2 * e), ("clamp_up", 2 * e), ("scale", 2 * e), ("sigmoid", 2 * e), ("mul_glu", 3 * e),
           ("add_offset", 2 * e), ("mul", 3 * e)]
    bwd = [("mul_grad_a", 3 * e), ("mul_grad_b", 3 * e), ("mul_glu_grad_a", 3 * e), ("mul_glu_grad_b", 3 * e),
           ("sigmoid", 3 * e), ("scale", 2 * e), ("grad_sum", 3 * e), ("clamp_gate", 3 * e), ("clamp_up", 3 * e)]
    return _passes(name, fwd, bwd, 2.0 * elements, 4 * e)


def sink_scores(name: str, elements: float, el: int) -> Operator:
    """gpt-oss's attention sinks around an unfused softmax over ``elements`` scores (transformers'
    ``eager_attention_forward``: the sinks joined to the scores as one more column, ``torch.cat``, the row maximum
    taken and subtracted, then the softmax, the sink column dropped after it): forward the copy (read and write
    ``el``), the maximum (read) and the subtraction (read and write); backward the maximum's gradient (read the
    gradient to sum it per row, write it scattered), and the copy's (read, write the scores' part). The flash
    kernels take the sinks in-kernel (one more term in each row's sum; FlashAttention-3's and cuDNN's learnable
    softmax): nothing to add there. Saves nothing the softmax does not."""
    e = el * elements
    return _passes(name, [("cat", 2 * e), ("max", e), ("sub", 2 * e)], [("max", 2 * e), ("cat", 2 * e)],
                   elements, 0.0)


def eager_residual(name: str, elements: float, el: int, dropout: bool) -> Operator:
    """``x + dropout(y)`` in eager PyTorch over ``elements``: the dropout kernel where the model trains with
    one (read ``el``, write ``el`` and a 1-byte mask; backward read the gradient and the mask), the add (read 2,
    write 1). Backward, the residual stream's input is read by the add and by the next norm, so autograd sums
    its two gradients (read 2, write 1). Saves the mask."""
    e = el * elements
    fwd = ([("dropout", 2 * e + elements)] if dropout else []) + [("add", 3 * e)]
    bwd = ([("dropout", 2 * e + elements)] if dropout else []) + [("grad_sum", 3 * e)]
    return _passes(name, fwd, bwd, elements, float(elements) if dropout else 0.0)


def mlp_activation(name: str, gated: bool, elements: float, el: int, eager: bool, clamped: bool = False) -> Operator:
    """An MLP's activation over ``elements`` (``T x f/t``): with a gated MLP SwiGLU's ``act(gate) * up`` -- one
    fused kernel (Megatron's ``bias_swiglu``; gpt-oss's clamped gate with its offset, ``clamped``: Megatron-Core's
    ``weighted_bias_quick_geglu_impl``, one kernel too) that saves its two inputs, or eager PyTorch's two
    (:func:`eager_swiglu`; :func:`eager_clamped_glu`'s seven where ``clamped``) -- else the fused bias + GeLU
    (Megatron 4.2; one ATen kernel in eager PyTorch too), which saves its input."""
    if gated:
        if eager:
            return eager_clamped_glu(name, elements, el) if clamped else eager_swiglu(name, elements, el)
        return elementwise(name, elements, el, reads=2, writes=1, flops_per=8.0, bwd_reads=3, bwd_writes=2,
                           saved_bytes=el * 2 * elements)
    return elementwise(name, elements, el, reads=1, writes=1, flops_per=15.0, bwd_reads=2, bwd_writes=1,
                       saved_bytes=el * elements)


def softcap(name: str, elements: float, el: int, eager: bool) -> Operator:
    """Gemma 2's soft-capping ``cap tanh(x / cap)`` over ``elements`` (Gemma Team 2024, "Gemma 2", section 2:
    attention scores capped at 50, final logits at 30): Hugging Face's code runs it as three eager kernels (``/
    cap``, ``tanh``, ``* cap``, each read and write ``el`` per element); a fused one reads and writes once. Its
    backward ``grad (1 - tanh^2)`` reads the gradient and the saved ``tanh`` output and writes one gradient
    (eager: the product's kernels around ``tanh``'s backward, three passes again). Saves the ``tanh`` output."""
    e = el * elements
    if eager:
        return _passes(name, [("div", 2 * e), ("tanh", 2 * e), ("mul", 2 * e)],
                       [("mul", 2 * e), ("tanh", 3 * e), ("div", 2 * e)], 2.0 * elements, e)
    return elementwise(name, elements, el, reads=1, writes=1, flops_per=4.0, bwd_reads=2, bwd_writes=1,
                       saved_bytes=e)


def eager_grad_sum(name: str, elements: float, el: int, extra_uses: int) -> Operator:
    """Backward only: autograd's sums of the gradients of one tensor that ``1 + extra_uses`` operators read
    (the norm's output that the separate Q, K and V projections, or the gate and up projections, multiply):
    one add per extra use (read 2, write 1)."""
    return _passes(name, [], [(f"add{i}", 3 * el * elements) for i in range(extra_uses)], elements, 0.0)


def checkpoint_ops(ops: list[Operator], input_bytes: float) -> list[Operator]:
    """torchtitan's selective op activation checkpointing (``selective_ac_option = "op"``,
    ``torchtitan/models/llama/parallelize_llama.py``, 2024: ``_save_list`` and the custom policy "Saves output of
    all compute ops, except every second mm") applied to one block: the weight GEMMs (``aten.mm``) are counted in
    call order and the odd ones keep their output, as the flash kernel does (output and row log-sum-exp); every
    other operator -- the even GEMMs, norms, rotary embeddings, activations, batched attention GEMMs -- is re-run
    in the backward (``torch.utils.checkpoint``'s recomputation, before the block's backward) and stashes
    nothing. The block keeps its input (``input_bytes``). The trailing operators whose backward needs nothing
    saved (the last residual add without dropout) are not re-run: recomputation stops once the backward has
    what it needs (``torch.utils.checkpoint``'s early stop)."""
    out: list[Operator] = []
    count = 0
    last_needed = max(i for i, op in enumerate(ops) if op.mm or op.saved_bytes > 0)
    for i, op in enumerate(ops):
        if op.mm:
            count += 1
            keep = count % 2 == 1
        else:
            keep = op.name == "flash_attn"
        if keep:
            out.append(replace(op, recomputed=False, saved_bytes=op.out_bytes))
        else:
            out.append(replace(op, recomputed=i <= last_needed and bool(op.fwd), saved_bytes=0.0))
    out[0] = replace(out[0], saved_bytes=out[0].saved_bytes + input_bytes)
    return out


def _shard(total: int, t: int) -> int:
    """Megatron's split of ``total`` heads (or columns) over ``t`` ranks (at least one per rank: key/value
    heads fewer than ``t`` are replicated)."""
    return max(total // t, 1)


def window_share(s: int, window: int | None, causal: bool) -> float:
    """The share of the ``s x s`` (query, key) pairs a fused kernel computes: all (bidirectional), the causal
    half (1/2, the convention of the FLOP counts here: FlashAttention-2 section 4.1), or, within a window of
    ``w < s`` keys per query (the query itself included), ``(w (w + 1) / 2 + (s - w) w) / s^2``: the first
    ``w`` queries see the tokens before them, each later one ``w``."""
    if not causal:
        return 1.0
    if window is None or window >= s:
        return 0.5
    return (window * (window + 1) / 2 + (s - window) * window) / (s * s)


def chunk_share(s: int, chunk: int) -> float:
    """The share of the ``s x s`` (query, key) pairs a causal kernel computes when each query attends within its
    chunk of ``chunk`` positions only (Llama 4's chunked attention, ``ModelSpec.attention_chunk``: transformers'
    ``create_chunked_causal_mask``, a block-diagonal causal mask): each whole chunk ``c (c + 1) / 2`` pairs, the last,
    shorter one ``r (r + 1) / 2``; the causal half (1/2) where the chunk is the whole sequence."""
    if chunk >= s:
        return 0.5
    whole, rest = divmod(s, chunk)
    return (whole * chunk * (chunk + 1) / 2 + rest * (rest + 1) / 2) / (s * s)


def layer_operators(spec: ModelSpec, b: int, t: int = 1, options: OperatorOptions | None = None,
                    window: int | None = None, expert: int = 1, expert_tensor: int | None = None,
                    moe: bool | None = None, rotary: bool = True, chunk: int | None = None) -> list[Operator]:
    """The operators of one transformer layer's ``1/t`` shard for a micro-batch of ``b`` sequences; ``window``:
    the layer's attention window (:meth:`planner.model.ModelSpec.layer_window`; None: causal over the whole
    sequence). The flash kernel skips the blocks outside the window (FlashAttention-2's ``window_size``); the
    unfused core computes the whole square and masks it, as Hugging Face's eager attention does, at the same cost
    with or without a window. ``expert``: a mixture of experts' expert-parallel size
    (:func:`planner.moe.moe_operators`); ``expert_tensor`` 1 (at ``t > 1``, with sequence parallelism): its experts
    whole on each rank, run on the copies of the rank's own ``T/t`` tokens routed to them (Megatron-Core's
    ``--expert-tensor-parallel-size 1``; None: split over ``t`` as the dense MLP). ``moe``: whether this layer's
    MLP is the mixture of experts or the dense one (:meth:`planner.model.ModelSpec.moe_layer`; default: whether the
    model has experts); a mixture of experts' shared expert (``shared_expert_ffn_hidden``) is a dense MLP of its
    width beside it, split over ``t`` (Megatron-Core's ``SharedExpertMLP``, whatever the experts' split), its output
    scaled by ``sigmoid(x w)`` with ``shared_expert_gate`` and added to the experts'. ``rotary``: whether the layer
    has rotary positions (:meth:`planner.model.ModelSpec.rotary_layer`: Llama 4's NoPE layers have none, and scale
    their queries by ``query_temperature`` instead: one elementwise pass); ``chunk``: its attention chunk
    (:meth:`planner.model.ModelSpec.layer_chunk`, :func:`chunk_share`: the flash kernel computes the pairs within each
    chunk, at the causal kernel's rate of a sequence the chunk's length; the unfused core masks the whole square, the
    same cost as without). Llama 4's ``qk_l2_norm`` on a rotary layer is the per-head query/key norm without its
    weight (``qk_norm``'s elements; eager, torchtitan's RMSNorm's kernels but the weight's: :func:`eager_rms_norm`)."""
    o = options or OperatorOptions()
    el = DTYPE_BYTES.get(o.dtype.lower(), 2)
    s, h, d, f = spec.seq, spec.hidden, spec.d, spec.f
    if (why := tensor_split_error(spec.heads, t)) is not None:
        raise ValueError(why)
    T = b * s
    a_t = spec.heads // t
    k_t = _shard(spec.k, t)
    rows = T // t if (o.sequence_parallel and T % t == 0) else (T / t if o.sequence_parallel else T)
    ln_el = rows * h  # elements of a norm / dropout-add (sequence-split with SP)
    acc = o.grad_accumulation == "separate"
    bias = spec.bias
    norm_flops = 8.0 if spec.norm == "layernorm" else 5.0
    # eager PyTorch (module docstring, "Kernels"): RMSNorm as separate ops (LayerNorm is one ATen kernel either
    # way), Llama-family projections as separate GEMMs (q/k/v and gate/up: torchtitan's and Hugging Face's
    # Llama, Mistral and Qwen code; GPT-2's c_attn stays one GEMM), the bias in the GEMM (``addmm``). Op
    # checkpointing is torchtitan's, whose model code has those separate GEMMs whatever the kernels (compiled
    # too), so it counts them; autograd's sums of their input gradients are eager kernels only
    eager = o.kernels == "eager"
    eager_norm = eager and spec.norm == "rmsnorm"
    split = spec.gated_mlp and (eager or o.recompute == "op")
    ops: list[Operator] = []

    def norm(name: str) -> Operator:
        if eager_norm:
            return eager_rms_norm(name, rows, h, el)
        # reads x (and weights), writes y; backward reads dy, x, writes dx; saves its input
        return elementwise(name, ln_el, el, reads=1, writes=1, flops_per=norm_flops, bwd_reads=2, bwd_writes=1,
                           saved_bytes=el * ln_el)

    def dropout_add(name: str) -> Operator:
        if eager:
            return eager_residual(name, ln_el, el, o.dropout)
        # Megatron's fused bias + dropout + residual add: reads x and the residual, writes the sum and a
        # 1-byte mask; backward reads the gradient and the mask, writes the gradient of x. Saves the mask.
        mask = ln_el if o.dropout else 0.0
        return elementwise(name, ln_el, el, reads=2, writes=1, flops_per=3.0, bwd_reads=1, bwd_writes=1,
                           saved_bytes=mask, extra_bytes=mask, bwd_extra_bytes=mask)

    def gathered(op: Operator) -> Operator:
        # with SP a column-parallel GEMM's input is all-gathered from T/t rows; only the local 1/t part is
        # stashed and the all-gather redone in the backward (Korthikanti et al. 2022, section 4.2.2)
        return replace(op, saved_bytes=el * ln_el) if o.sequence_parallel else op

    if not spec.post_norm:  # (OLMo 2's reordered norm: the attention reads the residual stream itself)
        ops.append(norm("norm1"))
    dv = spec.v_d  # each head's value width (head_dim but with latent attention)
    if spec.mla:  # multi-head latent attention's projections in place of Q, K, V (planner.mla)
        from planner.mla import mla_operators

        ops.extend(mla_operators(spec, T, a_t, el, acc, gathered, eager, rows if o.sequence_parallel else None))
    elif split:
        # three GEMMs reading one input (saved once, by the first) and autograd's two sums of its gradients
        for i, (gname, cols) in enumerate((("wq", a_t * d), ("wk", k_t * d), ("wv", k_t * d))):
            op = gemm(gname, T, cols, h, el, accumulate=acc, bias_rows=T if bias else 0, save_input=i == 0)
            ops.append(gathered(op) if i == 0 else op)
        if eager:
            ops.append(eager_grad_sum("qkv_grad_sum", T * h, el, 2))
    else:
        ops.append(gathered(gemm("qkv", T, (a_t + 2 * k_t) * d, h, el, accumulate=acc, bias_rows=T if bias else 0,
                                 bias_add=bias and not eager)))
    qk_el = T * (a_t + k_t) * d  # the query and key elements of this rank's heads
    if spec.mla:
        pass  # (its latents' norms and rotary are planner.mla's)
    elif spec.qk_norm:
        # Qwen3: RMSNorm over each head's query and key (as norm1: saves its input); OLMo 2 (qk_norm_scope
        # projection): one over the rank's whole query projection and one over its keys, each row's sum of squares
        # all-reduced over the tensor-parallel group (planner.cost), the same elements
        rows_qk, width_qk = (T, (a_t + k_t) * d) if spec.qk_norm_scope == "projection" else (T * (a_t + k_t), d)
        ops.append(eager_rms_norm("qk_norm", rows_qk, width_qk, el) if eager else
                   elementwise("qk_norm", qk_el, el, reads=1, writes=1, flops_per=5.0, bwd_reads=2, bwd_writes=1,
                               saved_bytes=el * qk_el))
    if spec.qk_l2_norm and rotary and not spec.mla:
        # Llama 4: each head's query and key over its root mean square, no weight, after the rotary (the order does
        # not change the cost); saves its fp32 input and per-row factor as the weighted norm does
        ops.append(eager_rms_norm("qk_l2_norm", T * (a_t + k_t), d, el, weight=False) if eager else
                   elementwise("qk_l2_norm", qk_el, el, reads=1, writes=1, flops_per=4.0, bwd_reads=2, bwd_writes=1,
                               saved_bytes=el * qk_el))
    if spec.query_temperature is not None and not rotary:
        # Llama 4's NoPE layers: each query times its position's temperature (a per-position factor, broadcast):
        # reads and writes the queries; the backward scales their gradient alike; saves nothing (the factor is
        # recomputed from the positions)
        q_el = T * a_t * d
        ops.append(elementwise("q_temperature", q_el, el, reads=1, writes=1, flops_per=1.0, bwd_reads=1,
                               bwd_writes=1, saved_bytes=0.0))
    if spec.mla or not rotary:
        pass
    elif spec.position == "rotary" and eager:
        rot = spec.rot_d  # (partial rotary: the first rot dimensions of each head; the rest joined back after)
        ops.append(eager_rope("rope", (T * a_t * rot, T * k_t * rot), el))
        if rot < d:
            ops.append(partial_rope_cat("rope_cat", qk_el, el))
    elif spec.position == "rotary":
        # rotary positions on the queries and keys (Su et al. 2021; Transformer Engine's fused RoPE kernel):
        # read and write them, the cos/sin table is small; the backward rotates the gradients back; saves nothing.
        # Partial rotary (rotary_dim < d): the kernel rotates the first rotary_dim of each head and copies the rest
        # (Transformer Engine's fused RoPE passes them through), the same bytes
        ops.append(elementwise("rope", qk_el, el, reads=1, writes=1, flops_per=3.0 * spec.rot_d / d, bwd_reads=1,
                               bwd_writes=1, saved_bytes=0.0))
    heads_b = b * a_t
    sel = o.recompute == "selective"  # the attention core re-run in the backward (module docstring)
    repeated = eager and a_t > k_t  # grouped-query attention: eager code copies K and V to every query head
    if repeated:
        ops.append(eager_repeat_kv("repeat_kv", T * k_t * d, T * a_t * d, el))
    kv_heads = a_t if repeated else k_t  # the key/value heads the attention kernel reads
    if o.attention == "unfused":
        # scores S = Q K^T per head: saves Q and K (the GEMM's two operands; selective: what the re-run
        # starts from)
        ops.append(replace(gemm("scores", s, s, d, el, heads_b, weight=False, save_input=True,
                                save_weight_side=b * kv_heads * s * d), recomputed=sel))
        E = heads_b * s * s
        if spec.attention_softcap is not None:  # Gemma 2, before the softmax (the flash kernel caps in-kernel)
            ops.append(replace(softcap("attn_softcap", E, el, eager),
                               saved_bytes=0.0 if sel else el * E, recomputed=sel))
        if spec.attention_sinks:  # gpt-oss: the sink column joined to the scores before the softmax
            ops.append(replace(sink_scores("attn_sinks", E, el), recomputed=sel))
        ops.append(replace(elementwise("softmax", E, el, reads=1, writes=1, flops_per=5.0, bwd_reads=2,
                                       bwd_writes=1, saved_bytes=0.0 if sel else el * E), recomputed=sel))
        if o.dropout:
            # selective: the mask is regenerated from the saved RNG state (Megatron's CudaRNGStatesTracker)
            ops.append(replace(elementwise("attn_dropout", E, el, reads=1, writes=1, flops_per=2.0, bwd_reads=1,
                                           bwd_writes=1, saved_bytes=0.0 if sel else E, extra_bytes=E,
                                           bwd_extra_bytes=E), recomputed=sel))
        # P V per head: saves P (the dropout output) and V; without dropout P is the softmax's saved output;
        # selective: V only (P is recomputed)
        ops.append(replace(gemm("attn_v", s, dv, s, el, heads_b, weight=False, save_input=o.dropout and not sel,
                                save_weight_side=b * kv_heads * s * dv), recomputed=sel))
    else:
        # Q K^T over d and P V over dv (equal but with latent attention: 192 and 128). FlashAttention-2 takes one head
        # size for Q, K and V: V padded to d (FlashAttention-3 and cuDNN run 192/128 as they are)
        dk = d if o.attention_impl == "flash2" else dv
        share = window_share(s, window, o.causal) if chunk is None or not o.causal else chunk_share(s, chunk)
        fl = share * 2.0 * heads_b * s * s * (d + dk)
        # backward: S = Q K^T again and dQ, dK over d, dP = dO V^T and dV over dv: 2 s^2 (3 d + 2 dv), 2.5 times
        # the forward at d = dv (FlashAttention-2, section 3.1.2)
        bwd_fl = 2.5 * fl if dk == d else share * 2.0 * heads_b * s * s * (3 * d + 2 * dk)
        io = el * (heads_b * s * (d + dk) + b * kv_heads * s * (d + dk))  # read Q, K, V, write O
        # the kernel's rate is read at the sequence whose causal rows are as long, on average, as this one's
        # (a window of w keys: the causal kernel at 2w); the measured figures are by sequence length
        seq = s if window is None or window >= s or not o.causal else min(s, 2 * window)
        if chunk is not None and o.causal:  # (chunks: a causal kernel over each, the chunk's length)
            seq = min(s, chunk)
        fwd = Kernel("flash_attn", fl, io, (seq, s, d, heads_b), (o.attention_impl, o.causal, False))
        bwd = Kernel("flash_attn.bwd", bwd_fl, 2 * io, (seq, s, d, heads_b), (o.attention_impl, o.causal, True))
        # saves Q, K, V and the row log-sum-exp (fp32); O is the output projection's saved input. Selective
        # (Megatron-Core): checkpointed, the forward re-run before the backward, Q, K, V kept, not the LSE
        qkv_saved = el * (heads_b * s * d + b * kv_heads * s * (d + dv))
        ops.append(Operator("flash_attn", (fwd,), (bwd,), (), qkv_saved + (0.0 if sel else 4.0 * heads_b * s),
                            recomputed=sel, out_bytes=el * heads_b * s * dv + 4.0 * heads_b * s))
    ops.append(gemm("proj", T, h, a_t * dv, el, accumulate=acc, bias_rows=rows if bias else 0))
    if spec.sandwich_norm or spec.post_norm:  # Gemma 2, OLMo 2: the attention's output normed before the residual add
        ops.append(norm("post_attn_norm"))
    ops.append(dropout_add("dropout_add1"))
    if not spec.post_norm:
        ops.append(norm("norm2"))

    def mlp(width: int, prefix: str = "") -> list[Operator]:
        """The dense MLP of ``width`` (the shared expert's with ``prefix``), split over ``t`` by its columns. The
        shared expert's first GEMM reads the norm's output the router has stashed already (the same tensor, or
        with sequence parallelism the same ``T/t`` shard): it stashes nothing more."""
        first = (lambda op: replace(op, saved_bytes=0.0)) if prefix else gathered
        w_t = -(-width // t)  # (the columns a rank holds, rounded up)

        def name(dense: str, part: str) -> str:  # the dense MLP's operator names, or the prefixed part
            return f"{prefix}{part}" if prefix else dense

        out: list[Operator] = []
        if not spec.gated_mlp:
            out.append(first(gemm(name("mlp_up", "up"), T, w_t, h, el, accumulate=acc, bias_rows=T if bias else 0)))
        elif split:  # gate and up apart, reading one input (saved once, by the gate)
            out.append(first(gemm(name("w1", "w1"), T, w_t, h, el, accumulate=acc, bias_rows=T if bias else 0)))
            out.append(gemm(name("w3", "w3"), T, w_t, h, el, accumulate=acc, bias_rows=T if bias else 0,
                            save_input=False))
            if eager:
                out.append(eager_grad_sum(name("mlp_grad_sum", "sum"), T * h, el, 1))
        else:
            out.append(first(gemm(name("mlp_up_gate", "up_gate"), T, 2 * w_t, h, el, accumulate=acc,
                                  bias_rows=T if bias else 0)))
        act = "act_mul" if spec.gated_mlp else "act"
        out.append(mlp_activation(f"{prefix}{act}", spec.gated_mlp, T * w_t, el, eager, clamped_glu(spec)))
        out.append(gemm(name("mlp_down", "down"), T, h, w_t, el, accumulate=acc, bias_rows=rows if bias else 0))
        return out

    if spec.moe if moe is None else moe:  # a mixture of experts in place of the dense MLP (planner.moe)
        from planner.moe import moe_operators

        if expert_tensor is not None and expert_tensor not in (1, t):
            raise ValueError(f"expert_tensor: 1 or t ({t}), got {expert_tensor}")
        if expert_tensor == 1 and t > 1:  # the experts whole, on the rank's own T/t tokens (sequence parallelism)
            if not o.sequence_parallel:
                raise ValueError("expert_tensor 1 at t > 1 needs sequence parallelism: each rank routes its own "
                                 "T/t tokens (Megatron-Core runs tensor-parallel experts only with it)")
            ops.extend(moe_operators(spec, rows, rows, 1, o, el, acc, eager, expert))
        else:
            ops.extend(moe_operators(spec, T, rows, t, o, el, acc, eager, expert))
        if spec.shared_expert_ffn_hidden is not None:
            ops.extend(mlp(spec.shared_expert_ffn_hidden, "shared_"))
            if spec.shared_expert_gate:
                # sigmoid(x w) of the MLP's input rows (a GEMV, w of h, on the rank's rows), then the shared output
                # times it: reads the output and the score, writes the product; saves both for the backward
                ops.append(gemm("shared_gate", int(math.ceil(rows)), 1, h, el, accumulate=acc, save_input=False))
                ops.append(elementwise("shared_gate_mul", ln_el, el, reads=1, writes=1, flops_per=5.0,
                                       bwd_reads=2, bwd_writes=1, saved_bytes=el * (ln_el + rows)))
            # the experts' and the shared expert's outputs summed (Megatron-Core's MoELayer: output + shared)
            ops.append(elementwise("shared_add", ln_el, el, reads=2, writes=1, flops_per=1.0, bwd_reads=1,
                                   bwd_writes=0, saved_bytes=0.0))
    else:
        ops.extend(mlp(f))
    if spec.sandwich_norm or spec.post_norm:  # Gemma 2, OLMo 2: the MLP's output normed before the residual add
        ops.append(norm("post_mlp_norm"))
    ops.append(dropout_add("dropout_add2"))
    if o.recompute == "op":
        return checkpoint_ops(ops, el * ln_el)
    return ops


def head_operators(spec: ModelSpec, b: int, t: int = 1, options: OperatorOptions | None = None) -> list[Operator]:
    """Final norm, the vocabulary-parallel output projection ``(T, V/t, h)`` and the cross-entropy
    (softmax over ``V/t`` logits in fp32, Megatron's vocab-parallel loss)."""
    o = options or OperatorOptions()
    el = DTYPE_BYTES.get(o.dtype.lower(), 2)
    T, h = b * spec.seq, spec.hidden
    v_t = -(-spec.vocab // t)
    rows = T / t if o.sequence_parallel else T
    acc = o.grad_accumulation == "separate"
    eager = o.kernels == "eager"
    final_norm = (eager_rms_norm("final_norm", rows, h, el) if eager and spec.norm == "rmsnorm" else
                  elementwise("final_norm", rows * h, el, reads=1, writes=1, flops_per=8.0, bwd_reads=2,
                              bwd_writes=1, saved_bytes=el * rows * h))
    capped = [softcap("logit_softcap", T * v_t, el, eager)] if spec.logit_softcap is not None else []
    return [final_norm, gemm("logits", T, v_t, h, el, accumulate=acc), *capped,
            eager_cross_entropy(T * v_t, el) if eager else cross_entropy(T * v_t, el)]


def cross_entropy(logits: float, el: int) -> Operator:
    """Megatron-LM's vocabulary-parallel cross-entropy (``mpu/cross_entropy.py``, 2021-22) over ``logits``
    elements of this rank's ``T x V/t`` shard, as the separate passes it runs: the 16-bit logits cast to
    fp32 (``output.float()``, read ``el`` write 4 bytes), the row max (read 4), ``sub_`` of the max (read
    4, write 4), ``exp`` (read 4, write 4), the row sum (read 4), ``div_`` to the softmax it saves (read 4,
    write 4): ``el + 34`` bytes per logit forward; backward ``mul_`` by the loss gradient (read 4, write
    4) and the cast back to 16 bits (read 4, write ``el``): ``12 + el``. (The one-hot subtraction and the
    all-reduces of the row max and sum touch ``T`` elements only.)"""
    fwd = Kernel("cross_entropy", 5.0 * logits, (el + 34.0) * logits)
    bwd = Kernel("cross_entropy.bwd", 2.0 * logits, (12.0 + el) * logits)
    # transient: the forward holds the 16-bit logits beside their fp32 copy, which the in-place passes turn
    # into the saved softmax; the backward turns that softmax into the gradient in place (``grad_input =
    # softmax``, ``sub_``, ``mul_``) and casts it back to 16 bits beside it: ``el`` per logit either way
    return Operator("cross_entropy", (fwd,), (bwd,), (), 4.0 * logits, transient_bytes=el * logits)


def eager_cross_entropy(logits: float, el: int) -> Operator:
    """The loss as torchtitan runs it in eager PyTorch (``F.cross_entropy(pred.flatten(0, 1).float(), labels)``,
    ``torchtitan/train.py``, 2024; Hugging Face's ``ForCausalLMLoss`` upcasts the logits the same way) over
    ``logits`` elements: forward the cast to fp32 (read ``el``, write 4 bytes), ``log_softmax`` (read 4, write
    4; ATen's one kernel) and the NLL gather (per row); backward the NLL gradient (a zero fill and a scatter:
    write 4), ``log_softmax``'s backward (read 8, write 4) and the cast back (read 4, write ``el``). Saves the
    ``log_softmax`` output (4 bytes per logit). Transient (beyond that stash): the forward holds the 16-bit
    logits and their fp32 copy (``el + 4`` per logit); torchtitan frees the logits before the backward (``del
    pred``: "need to free to before bwd to avoid peaking memory"), whose NLL gradient and ``log_softmax``
    gradient are fp32 (8), then the latter beside its 16-bit cast (``4 + el``): the largest of the three."""
    op = _passes("cross_entropy", [("cast_up", (el + 4.0) * logits), ("log_softmax", 8.0 * logits)],
                 [("nll", 4.0 * logits), ("log_softmax", 12.0 * logits), ("cast_down", (4.0 + el) * logits)],
                 3.0 * logits, 4.0 * logits)
    return replace(op, transient_bytes=max(el + 4.0, 8.0) * logits)


def embedding_operators(spec: ModelSpec, b: int, t: int = 1, options: OperatorOptions | None = None) -> list[Operator]:
    """Word (vocab-parallel) and position embedding lookup: a gather of ``T x h``, plus the add and
    dropout; backward scatters ``T x h`` gradients into the embedding's gradient."""
    o = options or OperatorOptions()
    el = DTYPE_BYTES.get(o.dtype.lower(), 2)
    T, h = b * spec.seq, spec.hidden
    lookup = elementwise("embedding", T * h, el, reads=1, writes=1, flops_per=0.0, bwd_reads=1, bwd_writes=1,
                         saved_bytes=8.0 * T)
    w = Kernel("embedding.wgrad", 0.0, el * 2 * T * h)
    # its weight gradient scatters the output gradient: what a split backward keeps for W (out_bytes)
    lookup = Operator(lookup.name, lookup.fwd, (), (w,), lookup.saved_bytes, out_bytes=el * T * h)
    mask = T * h if o.dropout else 0.0
    drop = elementwise("embedding_dropout", T * h, el, reads=2, writes=1, flops_per=2.0, bwd_reads=1, bwd_writes=1,
                       saved_bytes=mask, extra_bytes=mask, bwd_extra_bytes=mask)
    if not spec.embedding_scale:
        return [lookup, drop]
    # Gemma: the embeddings times sqrt(h), an element-wise pass each way (saves nothing: a constant factor)
    scale = elementwise("embedding_scale", T * h, el, reads=1, writes=1, flops_per=1.0, bwd_reads=1, bwd_writes=1,
                        saved_bytes=0.0)
    return [lookup, scale, drop]


@dataclass
class PassTimes:
    """Seconds of one list of operators on one device: forward, backward input gradient (I, including the
    selective re-run ``rerun``), weight gradient (W), and the bytes they stash."""

    fwd: float = 0.0
    bwd_i: float = 0.0
    bwd_w: float = 0.0
    saved_bytes: float = 0.0
    #: the largest :attr:`Operator.transient_bytes` of the list (held beside the stash while that operator runs)
    transient_bytes: float = 0.0
    #: seconds of the forward kernels selective recomputation re-runs in the backward (part of ``bwd_i``)
    rerun: float = 0.0
    #: bytes of the output gradients of the operators with weight-gradient kernels: what a split backward's
    #: ``I`` keeps for its ``W`` (``dW = dY^T X`` needs ``dY``; zero-bubble, Qi et al. 2024, section 2)
    held_grad_bytes: float = 0.0
    per_op: dict[str, tuple[float, float, float]] = field(default_factory=dict)

    @property
    def bwd(self) -> float:
        return self.bwd_i + self.bwd_w

    @property
    def recompute(self) -> float:
        """Backward with full recomputation: the forward re-run plus the backward (Megatron 3.5). The
        full re-run already recomputes what selective recomputation would re-run, so that is not paid
        twice."""
        return self.fwd + self.bwd - self.rerun


def time_operators(ops: list[Operator], device: DeviceSpec, dtype: str) -> PassTimes:
    """Forward, input-gradient and weight-gradient seconds of ``ops`` on ``device``."""
    out = PassTimes()
    for op in ops:
        f = sum(k.time(device, dtype) for k in op.fwd)
        i = sum(k.time(device, dtype) for k in op.bwd_i)
        w = sum(k.time(device, dtype) for k in op.bwd_w)
        out.fwd += f
        if op.recomputed:  # selective: the forward kernels again, before this operator's backward
            i += f
            out.rerun += f
        out.bwd_i += i
        out.bwd_w += w
        out.saved_bytes += op.saved_bytes
        if op.bwd_w:
            out.held_grad_bytes += op.out_bytes
        out.transient_bytes = max(out.transient_bytes, op.transient_bytes)
        out.per_op[op.name] = (f, i, w)
    return out


def layer_flops(ops: list[Operator]) -> tuple[float, float]:
    """(forward, backward) FLOPs of an operator list."""
    return sum(op.fwd_flops for op in ops), sum(op.bwd_flops for op in ops)
