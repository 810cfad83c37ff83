"""The operators of a mixture-of-experts MLP (:attr:`planner.model.ModelSpec.experts`): what a transformer layer
runs in place of its dense MLP, for :func:`planner.operators.layer_operators`.

Symbols as in :mod:`planner.operators`: ``T = b s`` tokens, ``h`` hidden, ``t`` tensor-parallel size, ``el`` bytes
per element; ``E`` experts, ``k`` experts per token, ``f_e`` an expert's width. The layer (Fedus et al. 2022,
"Switch Transformers", section 2.1; Jiang et al. 2024, "Mixtral of Experts", section 2.1; Megatron-Core's
``MoELayer``: router, token dispatcher, experts, combine):

1. **router**: a ``(T, E, h)`` GEMM of the norm's output (replicated on the tensor-parallel ranks; with sequence
   parallelism on each rank's ``T/t`` rows, as Megatron-Core routes before its dispatcher gathers the tokens);
2. **routing**: softmax of the scores in fp32, top-k and (Mixtral) renormalisation of the ``k`` weights, over
   ``T x E`` scores; saves the fp32 probabilities for its backward (DeepSeek's variants, ``ModelSpec.router_score``
   etc.: a sigmoid as the softmax; group-limited choice and the choice's bias one more pass over the scores each);
3. **permute**: each token copied once per chosen expert, grouped by expert (``T k`` rows of ``h``; Megatron-Core's
   ``permute``, an index-select); backward the scatter-add of the copies' gradients back to ``T`` rows;
4. **experts**: per expert the MLP of the dense layer's form on its tokens, split over the ``t`` ranks as the
   dense MLP is (gate/up by columns, down by rows: Megatron-Core's expert tensor parallelism equal to ``t``):
   ``(m_e, 2 f_e / t, h)`` (gated; ``f_e / t`` otherwise), the activation, ``(m_e, h, f_e / t)``; with expert
   parallelism ``e`` (:mod:`planner.expert_parallel`) the rank's ``E/e`` experts on ``e m_e`` rows each;
5. **combine**: each copy times its routing weight, summed back into its token's row (``unpermute`` with probs);
   saves the experts' outputs, which the weights' gradient reads. With ``router_weights_on_input`` (Llama 4's
   ``Llama4TextMoe``; Megatron-Core's ``moe_apply_probs_on_input``) the copies are scaled before the experts instead
   and the combine is an unweighted sum: the same passes, without the experts' outputs saved.

The tensor-parallel collectives are the dense MLP's (an all-reduce of ``T x h``, or with sequence parallelism
Megatron-Core's default dispatcher's all-gather and combine reduce-scatter of the same tensor): :mod:`planner.cost`
adds them as for any layer, except with sequence parallelism and expert parallelism, where Megatron-Core's all-to-all
dispatcher gathers the ``T k`` token copies instead (:meth:`planner.cost.ConfigCosts._moe_gathers`).

**Tokens per expert**: ``m_e = ceil(T k / E)``, the balanced load a load-balancing loss trains towards (Switch
Transformers, section 2.2; Mixtral, section 5 measures near-uniform use). On one device the imbalance barely
matters: every expert runs on the same GPU, so the grouped GEMMs' FLOPs are those of ``T k`` tokens whatever the
split (only the tiles' quantisation changes); it matters once experts are spread over devices (expert
parallelism: the busiest rank sets the pace), where pipeplan still assumes the balanced load.

**Expert GEMMs** (``OperatorOptions.expert_gemm``): ``"grouped"`` -- one grouped GEMM over the ``E`` experts
(Megatron-Core's ``--moe-grouped-gemm``, ``TEGroupedMLP``/``GroupedMLP``; torchtitan's ``grouped_mm``; Hugging Face
transformers 5's default ``experts_implementation="grouped_mm"``), timed as a
batch of ``E`` GEMMs of ``(m_e, n, k)`` -- or ``"sequential"``: a loop over the experts, each GEMM and
element-wise kernel launched per expert (Hugging Face's ``MixtralExperts.forward`` under
``experts_implementation="eager"``, transformers 5, and before it the only one: gather the
expert's tokens, ``linear`` by ``gate_up_proj``, the activation and product, ``linear`` by ``down_proj``, the
weight, ``index_add_``; Megatron-Core's ``SequentialMLP``), where small experts are launch- and tile-bound.
"""

from __future__ import annotations

import math
from dataclasses import replace

from planner.model import ModelSpec
from planner.operators import (
    Kernel,
    Operator,
    OperatorOptions,
    clamped_glu,
    elementwise,
    gemm,
    mlp_activation,
)


def tokens_per_expert(tokens: float, spec: ModelSpec) -> int:
    """``m_e = ceil(T k / E)``: each expert's rows under balanced routing (module docstring)."""
    return max(1, math.ceil(tokens * int(spec.experts_per_token or 1) / int(spec.experts or 1)))


def _repeat(op: Operator, n: int) -> Operator:
    """``op`` run ``n`` times, one launch per kernel per time (a loop over the experts; ``op`` itself at 1)."""
    return replace(op, fwd=op.fwd * n, bwd_i=op.bwd_i * n, bwd_w=op.bwd_w * n, saved_bytes=op.saved_bytes * n,
                   out_bytes=op.out_bytes * n)


def moe_operators(spec: ModelSpec, tokens: float, rows: float, t: int, options: OperatorOptions, el: int,
                  accumulate: bool, eager: bool, expert: int = 1) -> list[Operator]:
    """The operators of one mixture-of-experts MLP's ``1/t`` shard (module docstring), after the norm and before
    the residual add: ``tokens`` = ``T`` rows the experts see, ``rows`` those the router sees (``T/t`` with
    sequence parallelism), ``accumulate``: weight gradients added into the main-gradient buffer by separate
    kernels (:func:`planner.operators.gemm`), ``eager``: eager PyTorch's element-wise kernels. ``expert``: the
    expert-parallel size ``e`` (:mod:`planner.expert_parallel`): the rank runs ``E/e`` experts on the ``T k`` copies
    the dispatch brings it under balanced routing, ``ceil(e T k / E)`` rows each (the all-to-alls are
    :mod:`planner.cost`'s)."""
    E, k, h = int(spec.experts or 1), int(spec.experts_per_token or 1), spec.hidden
    local = E // expert  # the rank's experts
    f_t = -(-spec.f_e // t)
    copies = tokens * k  # T k rows after the permute
    m_e = tokens_per_expert(tokens * expert, spec)
    bias = spec.bias
    router = gemm("router", int(math.ceil(rows)), E, h, el, accumulate=accumulate)
    scores = rows * E
    # fwd: read the scores (el), write the fp32 probabilities, top-k reads them and writes k weights and indices;
    # bwd: the top-k's gradient scattered into E columns, the softmax's backward (read probabilities and gradient).
    # Group-limited routing (router_groups) and the choice's bias (router_bias) pass over the fp32 scores once more
    # each (read and write: the group scores and mask, the biased copy); a sigmoid costs what the softmax does
    extra = 8.0 * scores * ((spec.router_groups is not None) + spec.router_bias)
    routing = Operator("routing", (Kernel("routing", 8.0 * scores + extra / 4.0,
                                          (el + 8.0) * scores + 12.0 * rows * k + extra),),
                       (Kernel("routing.bwd", 4.0 * scores, (12.0 + el) * scores + 4.0 * rows * k),), (),
                       saved_bytes=4.0 * scores + 12.0 * rows * k)
    cols = (2 if spec.gated_mlp else 1) * f_t
    # grouped: each kernel once over the E experts' tokens (a batch of E GEMMs); sequential: each launched per expert
    rows_each, batch, launches = (copies, local, 1) if options.expert_gemm == "grouped" else (m_e, 1, local)
    permute = _repeat(elementwise("permute", rows_each * h, el, reads=1, writes=1, flops_per=0.0, bwd_reads=1,
                                  bwd_writes=1, saved_bytes=8.0 * rows_each), launches)
    experts = [_repeat(op, launches) for op in (
        gemm("experts_up", m_e, cols, h, el, batch=batch, accumulate=accumulate, bias_rows=m_e if bias else 0),
        mlp_activation("experts_act", spec.gated_mlp, batch * m_e * f_t, el, eager, clamped_glu(spec)),
        gemm("experts_down", m_e, h, f_t, el, batch=batch, accumulate=accumulate, bias_rows=m_e if bias else 0))]
    if spec.router_weights_on_input:
        # Llama 4 (Megatron-Core's moe_apply_probs_on_input): the copies scaled by their weights before the experts
        # (read the copies and weights, write the scaled copies; bwd: the copies' gradients and the weights', reading
        # the unscaled copies the router's GEMM has saved already: nothing more saved), the combine an unweighted sum
        # (bwd: the gradient copied back to the T k rows), saving nothing
        scale = elementwise("weight_input", copies * h, el, reads=1, writes=1, flops_per=1.0, bwd_reads=2,
                            bwd_writes=1, saved_bytes=0.0)
        combine = Operator("combine", (Kernel("combine", copies * h, el * (copies * h + tokens * h)),),
                           (Kernel("combine.bwd", 0.0, el * (tokens * h + copies * h)),), (), saved_bytes=0.0)
        return [router, routing, scale, permute, *experts, combine]
    # combine: read the copies and their weights, write T x h; bwd: the copies' gradients (read dY, weights; write
    # T k h) and the weights' (read dY and the saved copies); saves the experts' outputs
    combine = Operator("combine", (Kernel("combine", 2.0 * copies * h, el * (copies * h + tokens * h) + 4.0 * copies),),
                       (Kernel("combine.bwd", 4.0 * copies * h, el * (2.0 * tokens * h + 2.0 * copies * h)
                               + 8.0 * copies),), (), saved_bytes=el * copies * h)
    return [router, routing, permute, *experts, combine]

