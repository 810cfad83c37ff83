"""Expert parallelism (EP) for the zoo's mixture of experts: each layer's ``E`` experts split over ``e`` data-parallel
copies, the tokens sent to the copy that holds their experts and the outputs sent back (Lepikhin et al., "GShard",
2020, section 2.2-2.3, its all-to-all dispatch and combine; Megatron-Core's ``MoEAlltoAllTokenDispatcher``,
``megatron/core/transformer/moe/token_dispatcher.py``: the same steps, here without capacity or dropped tokens).

Symbols: ``T`` tokens of a micro-batch on a rank (``b s`` rows), ``k`` experts per token (top-k), ``h`` the hidden
size, ``E`` experts per layer, ``e`` the expert-parallel size; EP rank ``i`` holds experts ``[i E/e, (i+1) E/e)``
(:mod:`executor.groups`: copy ``w`` of the ``W`` data-parallel copies is EP rank ``w % e``; the router (gpt-oss's
bias with it) and every other parameter are replicated as without EP; so is DeepSeek-V3's bias of the choice, each
EP rank counting the choices of its own tokens, which the step sums over every copy before the update:
:meth:`executor.interpreter.RankRuntime._update_expert_bias`). A shared expert and its gate (Qwen2 MoE, DeepSeekMoE:
``shared_expert_ffn_hidden``, ``shared_expert_gate``) are no experts EP splits: every EP rank holds them whole (``1/t``
of the shared expert with tensor parallelism, as the dense MLP) and runs them on its own tokens, and their gradients
are reduced over every data-parallel copy as any dense parameter's (:func:`expert_parameters` leaves them out). The
dense layers of a mixture of experts (``dense_layers``) have no experts and nothing to split.

The forward of one layer on one rank (:class:`ExpertParallelMoE`):

1. route locally (the router is replicated): ``weights, index (T, k)`` as :func:`executor.models.llama.route`;
2. sort the ``T k`` token copies by expert (stably: by token within an expert), so by destination EP rank;
3. exchange the per-expert counts: one ``all_to_all_single`` of ``E`` int64 per rank (``E/e`` to each peer);
   each rank then knows how many rows it sends to and receives from each peer, and how many of each of its
   experts;
4. dispatch: ``all_to_all_single`` of the ``T k`` sorted rows of ``h`` with uneven ``input_split_sizes`` /
   ``output_split_sizes`` (:class:`AllToAll`; gloo takes the single-tensor form with uneven splits, not the list
   form ``all_to_all``);
5. run each local expert on the rows it received (from every peer), an expert without rows on an empty batch
   (its weights still get a gradient, of zeros, as :func:`~executor.models.llama.mix` does);
6. combine: the outputs all-to-all back (the reverse splits), then each token's output is the routing-weighted sum
   of its ``k`` experts' outputs (``index_add``, as ``mix``).

Llama 4's ``router_weights_on_input`` (transformers' ``Llama4TextMoe``; Megatron-Core's
``--moe-apply-probs-on-input``, which scales the tokens before the dispatch too): each token copy is multiplied by its
routing weight on its own rank, before step 4, and step 6 sums the returned outputs unweighted. The weight's gradient
comes back through the dispatch's reverse all-to-all with the row's, to the rank that routed the token; with ``t >
1`` the weights pass through ``f`` as before (each tensor rank's expert slice gives its share of the row's gradient).

Backward: each :class:`AllToAll` is the reverse all-to-all of the gradient, so an expert's weight gradient on its
owner sums the contributions of the tokens of all ``e`` copies of its EP group; the executor then all-reduces the
experts' gradients over the expert-data group (the ``W/e`` copies with the same EP rank, times the stage's holders)
and the other parameters over all copies, both summed: the loss of each copy is scaled by ``1 / (W N)``, as
without EP (:mod:`executor.interpreter`).

Communication per MoE layer and micro-batch on each rank: forward one count exchange (``E`` int64) and two
all-to-alls of ``T k h`` elements (``T k`` rows of ``h`` leave and, summed over the peers, as many arrive on a
balanced routing; the rows a rank sends to itself are in the count); backward two all-to-alls of ``T k h``.

With tensor parallelism (``t > 1``; no sequence parallelism: the ``T`` tokens are replicated over the ``t`` ranks)
each tensor rank holds its ``1/t`` slice of its local experts (split as the dense MLP,
:class:`executor.tensor_parallel.TensorParallelExpert`) and exchanges all ``T k`` rows with the EP peers of its
own tensor rank (the expert group is per tensor rank); each expert's output is then this rank's partial sum, and
after the combine the one tensor all-reduce ``g`` of ``(T, h)`` sums them, as :class:`TensorParallelMoE` does.
Backward, the tokens (``T h``) and the routing weights (``T k``) pass through ``f`` (one all-reduce of their
gradients each: the partial gradients of the rows the experts read, and of the weights that multiplied partial
outputs). Experts' ``down`` biases (none in Mixtral or Qwen3 MoE; gpt-oss's ``down_proj_bias``) are added as
``b / t`` on each tensor rank, which ``g`` sums to ``b``; their gradient, the same on every tensor rank, passes back
unscaled (:class:`SplitBias`), so they need no communication of their own. Each expert's biases go with the expert:
its EP rank holds them (``gate``'s and ``up``'s split with their columns over t, ``down``'s whole), and ``down``'s
joins the expert's output before the combine, since the token's own rank does not hold it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn


class AllToAll(torch.autograd.Function):
    """``all_to_all_single`` of the rows of ``x`` over ``group``: ``input_splits[j]`` consecutive rows to rank
    ``j`` of the group, ``output_splits[j]`` rows from it; backward the reverse all-to-all of the gradient."""

    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group):  # type: ignore[no-untyped-def, override]
        ctx.splits, ctx.group = (list(output_splits), list(input_splits)), group
        out = x.new_empty((sum(output_splits), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), list(output_splits), list(input_splits), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        output_splits, input_splits = ctx.splits
        back = grad.new_empty((sum(input_splits), *grad.shape[1:]))
        dist.all_to_all_single(back, grad.contiguous(), input_splits, output_splits, group=ctx.group)
        return back, None, None, None


def all_to_all(x: torch.Tensor, output_splits: list[int], input_splits: list[int], group: Any) -> torch.Tensor:
    """:class:`AllToAll` (differentiable)."""
    return AllToAll.apply(x, output_splits, input_splits, group)


def exchange_counts(per_expert: torch.Tensor, group: Any) -> torch.Tensor:
    """Each rank's token copies per expert ``(E,)`` (int64, experts in order, so ``E/e`` per EP rank) exchanged:
    returns ``(e, E/e)``, row ``j`` the copies EP rank ``j`` sends to each of this rank's experts."""
    size = dist.get_world_size(group)
    got = torch.empty_like(per_expert)
    dist.all_to_all_single(got, per_expert.contiguous(), group=group)
    return got.view(size, -1)


class SplitBias(torch.autograd.Function):
    """``b / t``: one tensor rank's share of a replicated bias that the tensor all-reduce sums back to ``b``.
    Backward the gradient unscaled: the all-reduce's backward is the identity, so the gradient reaching each
    share is the same on every tensor rank, and ``b``'s gradient is ``t`` times ``1/t`` of it."""

    @staticmethod
    def forward(ctx, b, t):  # type: ignore[no-untyped-def, override]
        return b / t

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        return grad, None


class ExpertParallelMoE(nn.Module):
    """A :class:`~executor.models.llama.SparseMoE` whose experts are split over an expert group of ``ep_size``
    ranks (module docstring): this rank keeps the router and experts ``[ep_rank E/e, (ep_rank+1) E/e)``, under
    their own indices (``experts.<j>`` of an ``nn.ModuleDict``, so parameter names are the whole layer's). With
    ``tp_size > 1`` each kept expert is this tensor rank's slice
    (:class:`~executor.tensor_parallel.TensorParallelExpert`)."""

    def __init__(self, moe: nn.Module, ep_rank: int, ep_size: int, ep_group: Any, tp_rank: int = 0,
                 tp_size: int = 1, tp_group: Any = None) -> None:
        super().__init__()
        E = len(moe.experts)
        if E % ep_size:
            raise ValueError(f"expert: the expert-parallel size {ep_size} must divide the experts ({E})")
        self.num_experts, self.per_rank, self.ep_size, self.ep_group = E, E // ep_size, ep_size, ep_group
        self.first = ep_rank * self.per_rank
        self.tp_size, self.tp_group = tp_size, tp_group
        self.top_k, self.normalize, self.router = moe.top_k, moe.normalize, moe.router
        self.on_input = moe.on_input  # (Llama 4: the weights scale the rows before the dispatch)
        # the shared expert (no expert EP splits): whole on every EP rank, split over t as the dense MLP
        self.shared_expert, self.shared_expert_gate = moe.shared_expert, moe.shared_expert_gate
        local = range(self.first, self.first + self.per_rank)
        if tp_size > 1:
            from executor.tensor_parallel import TensorParallelExpert

            self.experts = nn.ModuleDict({str(j): TensorParallelExpert(moe.experts[j], tp_rank, tp_size, tp_group)
                                          for j in local})
            if moe.shared_expert is not None:
                self.shared_expert = TensorParallelExpert(moe.shared_expert, tp_rank, tp_size, tp_group)
        else:
            self.experts = nn.ModuleDict({str(j): moe.experts[j] for j in local})

    def _expert(self, expert: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """One local expert on its rows: the whole output (t = 1), or this tensor rank's partial one, its ``down``
        bias as a ``1/t`` share (:class:`SplitBias`); the input needs no ``f`` here, the tokens passed it whole."""
        if self.tp_size == 1:
            return expert(x)
        y = expert.partial(x)  # (TensorParallelExpert: of rows already through f)
        bias = expert.down.bias
        return y if bias is None else y + SplitBias.apply(bias, self.tp_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from executor.models.llama import shared_output
        from executor.tensor_parallel import CopyToTensorParallel, ReduceFromTensorParallel

        h = x.shape[-1]
        tokens = x.reshape(-1, h)
        weights, index = self.router.choose(tokens, x.dtype)  # (the router and its bias replicated)
        source = tokens
        if self.tp_size > 1:  # the experts' rows and the weights give partial gradients on each tensor rank
            source = CopyToTensorParallel.apply(tokens, self.tp_group)
            weights = CopyToTensorParallel.apply(weights, self.tp_group)
        k = index.shape[1]
        flat = index.reshape(-1)  # the T k token copies, copy c = token c // k
        order = torch.argsort(flat, stable=True)  # by expert, hence by destination EP rank
        per_expert = torch.bincount(flat, minlength=self.num_experts)
        received = exchange_counts(per_expert, self.ep_group)  # (e, E/e)
        # rows to and from each peer, and per local expert (one copy to the host: the split sizes are Python ints)
        e = self.ep_size
        counts = torch.cat([per_expert.view(e, -1).sum(dim=1), received.sum(dim=1), received.sum(dim=0)]).tolist()
        send, recv, sizes = counts[:e], counts[e:2 * e], counts[2 * e:]
        rows = source[order // k]
        if self.on_input:  # (Llama 4: each copy scaled by its weight before it leaves; the outputs summed unweighted)
            rows = rows * weights.reshape(-1)[order, None]
        got = all_to_all(rows, recv, send, self.ep_group)  # per peer, by expert within it
        # the received rows grouped by local expert (stably: by peer, then as the peer sent them)
        local = torch.arange(self.per_rank, device=x.device).repeat(e)
        by_expert = torch.argsort(torch.repeat_interleave(local, received.reshape(-1), output_size=sum(recv)),
                                  stable=True)
        rows = got[by_expert].split(sizes)
        out = torch.cat([self._expert(e, r) for e, r in zip(self.experts.values(), rows, strict=True)])
        unsorted = torch.empty_like(by_expert)
        unsorted[by_expert] = torch.arange(by_expert.numel(), device=x.device)
        back = all_to_all(out[unsorted], send, recv, self.ep_group)  # the copies in `order` again
        if not self.on_input:
            back = back * weights.reshape(-1)[order, None]
        y = tokens.new_zeros(tokens.shape).index_add(0, order // k, back)
        if self.tp_size > 1:
            y = ReduceFromTensorParallel.apply(y, self.tp_group)
        shared = shared_output(self, tokens)  # (this rank's tokens; t > 1: through the shared expert's own f and g)
        return (y if shared is None else y + shared).view(x.shape)

    def full_state(self, gather: Any) -> dict[str, torch.Tensor]:
        """This rank's parameters under the whole :class:`~executor.models.llama.SparseMoE`'s names: the router,
        the shared expert and its gate, and its local experts (the others are held by the EP peers, which report
        theirs), their tensor shards gathered with ``gather(tensor, dim)`` (a collective on the tensor group) when
        ``t > 1``."""
        from executor.tensor_parallel import gathered_linears, router_state, shared_state

        out = router_state(self.router)
        if self.tp_size > 1:
            out |= shared_state(self, gather)
        else:
            for name in ("shared_expert", "shared_expert_gate"):
                module = getattr(self, name)
                if module is not None:
                    out |= {f"{name}.{n}": p.detach().clone() for n, p in module.named_parameters()}
        for j, expert in self.experts.items():
            if self.tp_size > 1:
                out |= gathered_linears([(f"experts.{j}.gate", expert.gate), (f"experts.{j}.up", expert.up)],
                                        [(f"experts.{j}.down", expert.down)], gather)
            else:
                out |= {f"experts.{j}.{n}": p.detach().clone() for n, p in expert.named_parameters()}
        return out


def expert_parameters(module: nn.Module) -> list[nn.Parameter]:
    """The parameters of the experts that :class:`ExpertParallelMoE` layers of ``module`` hold (reduced over
    the expert-data group, not over every data-parallel copy); not the shared expert's nor its gate's, which every
    copy holds (reduced over all of them, as the router's)."""
    return [p for m in module.modules() if isinstance(m, ExpertParallelMoE) for p in m.experts.parameters()]

