"""Megatron-LM tensor parallelism for the zoo's transformer blocks (Shoeybi et al., "Megatron-LM", 2019,
section 3, figure 3).

* ``f`` (:class:`CopyToTensorParallel`): identity forward, all-reduce of the gradient backward; ``g``
  (:class:`ReduceFromTensorParallel`): all-reduce forward, identity backward -- the conjugate pair.
* :class:`ColumnParallelLinear`: ``Y_i = f(X) A_i`` with the output features split over the t ranks (no
  gather: the next layer consumes the split).
* :class:`RowParallelLinear`: ``Y = g(sum_i X_i B_i) + b`` with the input features split.
* :class:`TensorParallelBlock`: the pre-norm block of :mod:`executor.models.blocks` with attention split by
  heads (QKV column-parallel, output projection row-parallel) and the MLP split column/row (section 3,
  figure 3a/3b): two all-reduces forward and two backward per block. It is built from a full seeded
  :class:`~executor.models.blocks.Block` (:meth:`TensorParallelBlock.from_block`), so ``t = 2`` computes what
  ``t = 1`` does; :meth:`TensorParallelBlock.full_state` gathers the shards back to the full names.

* :class:`TensorParallelMoE`: a mixture-of-experts MLP (:class:`~executor.models.llama.SparseMoE`) with every
  expert split as the dense MLP and the router replicated (Megatron-Core's expert tensor parallelism with
  expert-parallel size 1); one all-reduce forward of the routing-weighted sum, as the dense MLP's. A shared expert
  (Qwen2 MoE, DeepSeekMoE) is split as the dense MLP, with its own ``f`` and ``g`` (Megatron-Core's
  ``SharedExpertMLP``: one more all-reduce of ``T h`` forward and one backward, as :mod:`planner.cost` charges
  it); its gate's weight ``(1, h)`` is replicated and reads the whole input, scaling the whole (all-reduced) output.
  The dense layers of a mixture of experts (``dense_layers``) are split as any dense MLP.

gpt-oss (:class:`TensorParallelLlamaBlock`): attention sinks split with the query heads, column-parallel biases with
their columns, row-parallel ones added once after the all-reduce, the router's bias replicated with the router.

OLMo 2 and OLMoE (:class:`TensorParallelLlamaBlock`, ``qk_norm_scope`` "projection"): the query norm over the whole
query projection and the key norm over the whole key projection, each split with its projection's columns, normalise
by the whole row's mean square: each rank sums the squares of its columns and the rows' sums are all-reduced
(:func:`split_rms_norm`, through :class:`SumOverTensorParallel`: one all-reduce of ``b s`` sums forward and one
backward per norm, as :mod:`planner.cost` charges them); OLMo 2's norms of the branches' outputs follow the
row-parallel all-reduce and are replicated.

LayerNorms, the embedding and the head are replicated: their inputs and (thanks to ``f``) their output
gradients are identical on every rank of the group, hence so are their gradients.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from executor.models.blocks import Block


class CopyToTensorParallel(torch.autograd.Function):
    """Megatron's ``f``: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx, x, group):  # type: ignore[no-untyped-def, override]
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class ReduceFromTensorParallel(torch.autograd.Function):
    """Megatron's ``g``: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):  # type: ignore[no-untyped-def, override]
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        return grad, None


class SumOverTensorParallel(torch.autograd.Function):
    """The sum over the group of each rank's ``x``, on every rank: all-reduce forward, and all-reduce backward too --
    unlike ``g``, whose output feeds replicated computation (the same gradient on every rank), this sum feeds each
    rank's own columns, so each rank's gradient of it is a part, and the gradient of every rank's ``x`` is their
    sum."""

    @staticmethod
    def forward(ctx, x, group):  # type: ignore[no-untyped-def, override]
        ctx.group = group
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):  # type: ignore[no-untyped-def, override]
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def split_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, width: int, group: object) -> torch.Tensor:
    """An RMSNorm over rows of ``width`` of which ``x (..., w)`` holds this rank's ``w`` columns and ``weight (w,)``
    their weights (OLMo 2's query and key norms over the whole projections split by heads):
    ``x w / sqrt(sum_all(x^2) / width + eps)``, the rows' sums of squares of every rank's columns added by one
    all-reduce of the ``b s`` sums (:class:`SumOverTensorParallel`). Its backward needs the whole row too (RMSNorm's
    gradient has the row's mean of ``g w x``), which that all-reduce's backward brings: one more all-reduce of ``b s``
    sums. Computed in float32 at least, as ``F.rms_norm`` (bfloat16 rows' sums move as float32, the planner's 4
    bytes a row; float64 stays float64); the output in ``x``'s dtype. The weight's gradient is this rank's columns'
    whole (every row is on every rank)."""
    acc = torch.promote_types(x.dtype, torch.float32)
    xf = x.to(acc)
    total = SumOverTensorParallel.apply(xf.pow(2).sum(dim=-1, keepdim=True), group)
    return (xf * torch.rsqrt(total / width + eps) * weight.to(acc)).to(x.dtype)


class _ShardedLinear(nn.Module):
    """A linear layer holding one tensor-parallel shard of a full layer's weight (and bias)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group: object) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())
        self.bias = nn.Parameter(bias.detach().clone()) if bias is not None else None
        self.group = group


class ColumnParallelLinear(_ShardedLinear):
    """``f(x) @ A_i^T + b_i``: rows ``index`` of the full weight (output features)."""

    @classmethod
    def from_linear(cls, full: nn.Linear, rank: int, size: int, group: object,
                    rows: torch.Tensor | None = None) -> ColumnParallelLinear:
        out = full.weight.shape[0]
        if rows is None:
            n = out // size
            rows = torch.arange(rank * n, (rank + 1) * n)
        return cls(full.weight[rows], full.bias[rows] if full.bias is not None else None, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.local(CopyToTensorParallel.apply(x, self.group))

    def local(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ A_i^T + b_i`` of an input already through ``f``: linears reading one input share its ``f``, one
        all-reduce of its gradient (Megatron-LM's one ``f`` before the attention and one before the MLP, section 3)."""
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(_ShardedLinear):
    """``g(x_i @ B_i^T) + b``: columns of the full weight (input features); bias added once."""

    @classmethod
    def from_linear(cls, full: nn.Linear, rank: int, size: int, group: object) -> RowParallelLinear:
        n = full.weight.shape[1] // size
        return cls(full.weight[:, rank * n:(rank + 1) * n], full.bias, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = ReduceFromTensorParallel.apply(F.linear(x, self.weight), self.group)
        return y + self.bias if self.bias is not None else y


class _SplitNorm(nn.Module):
    """This rank's columns of an RMSNorm over a width tensor parallelism splits (``weight`` its ``width / t``, applied
    by :func:`split_rms_norm`; ``width`` the whole norm's, ``eps`` its epsilon)."""

    def __init__(self, weight: torch.Tensor, width: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone())
        self.width, self.eps = width, eps


def _split_norm(norm: nn.Module | None, rank: int, size: int) -> _SplitNorm | None:
    """Columns ``[rank w/t, (rank+1) w/t)`` of an RMSNorm of width ``w`` (None for None)."""
    if norm is None:
        return None
    w = norm.weight.shape[0]
    n = w // size
    return _SplitNorm(norm.weight[rank * n:(rank + 1) * n], w, norm.eps)  # (the block's: the spec's norm_eps)


def _qkv_rows(hidden: int, heads: int, rank: int, size: int) -> torch.Tensor:
    """Rows of the fused QKV weight ``(3h, h)`` holding this rank's heads of q, k and v."""
    hd = hidden // heads
    local = heads // size
    per = torch.arange(rank * local * hd, (rank + 1) * local * hd)
    return torch.cat([per + i * hidden for i in range(3)])


class TensorParallelBlock(nn.Module):
    """A zoo :class:`Block` split over a tensor-parallel group (module docstring)."""

    takes_targets = False

    def __init__(self, block: Block, rank: int, size: int, group: object) -> None:
        super().__init__()
        attn = block.attn
        hidden = attn.qkv.weight.shape[1]
        self.heads, self.size, self.rank, self.group, self.hidden = attn.heads, size, rank, group, hidden
        self.local_heads = attn.heads // size
        self.causal = attn.causal
        self.ln1, self.ln2 = block.ln1, block.ln2
        self.qkv = ColumnParallelLinear.from_linear(attn.qkv, rank, size, group,
                                                    _qkv_rows(hidden, attn.heads, rank, size))
        self.proj = RowParallelLinear.from_linear(attn.proj, rank, size, group)
        self.fc = ColumnParallelLinear.from_linear(block.mlp.fc, rank, size, group)
        self.mlp_proj = RowParallelLinear.from_linear(block.mlp.proj, rank, size, group)
        self.register_buffer("mask", attn.mask.clone(), persistent=False)

    @classmethod
    def from_block(cls, block: Block, rank: int, size: int, group: object) -> TensorParallelBlock:
        return cls(block, rank, size, group)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        hl = self.hidden // self.size
        hd = self.hidden // self.heads
        q, k, v = self.qkv(x).split(hl, dim=2)
        q = q.view(b, s, self.local_heads, hd).transpose(1, 2)
        k = k.view(b, s, self.local_heads, hd).transpose(1, 2)
        v = v.view(b, s, self.local_heads, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        if self.causal:
            att = att.masked_fill(~self.mask[:, :, :s, :s], float("-inf"))
        att = F.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(b, s, hl)
        return self.proj(y)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln1(x))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln2(x))))

    # ---- gathering the shards back (checks) --------------------------------------------------------
    def _gather(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        parts = [torch.empty_like(t) for _ in range(self.size)]
        dist.all_gather(parts, t.detach().contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)

    def _gather_qkv(self, t: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(t) for _ in range(self.size)]
        dist.all_gather(parts, t.detach().contiguous(), group=self.group)
        thirds = [p.chunk(3, dim=0) for p in parts]
        return torch.cat([torch.cat([th[i] for th in thirds], dim=0) for i in range(3)], dim=0)

    def full_state(self) -> dict[str, torch.Tensor]:
        """The parameters under the names of the full :class:`Block` (a collective on the group)."""
        out = {f"ln1.{k}": v.detach().clone() for k, v in self.ln1.named_parameters()}
        out |= {f"ln2.{k}": v.detach().clone() for k, v in self.ln2.named_parameters()}
        out["attn.qkv.weight"] = self._gather_qkv(self.qkv.weight)
        out["attn.qkv.bias"] = self._gather_qkv(self.qkv.bias)
        out["attn.proj.weight"] = self._gather(self.proj.weight, 1)
        out["attn.proj.bias"] = self.proj.bias.detach().clone()
        out["mlp.fc.weight"] = self._gather(self.fc.weight, 0)
        out["mlp.fc.bias"] = self._gather(self.fc.bias, 0)
        out["mlp.proj.weight"] = self._gather(self.mlp_proj.weight, 1)
        out["mlp.proj.bias"] = self.mlp_proj.bias.detach().clone()
        return out


def gathered_linears(columns: list[tuple[str, nn.Module | None]], rows: list[tuple[str, nn.Module | None]],
                     gather: Callable[[torch.Tensor, int], torch.Tensor]) -> dict[str, torch.Tensor]:
    """The full ``<name>.weight`` / ``<name>.bias`` of column-parallel linears (weight and bias gathered along
    their output features, dim 0) and row-parallel ones (weight gathered along its input features, dim 1; the bias
    replicated, copied), with ``gather(tensor, dim)`` (a collective on the group); a None linear is skipped."""
    out: dict[str, torch.Tensor] = {}
    for name, lin in columns:
        if lin is not None:
            out[f"{name}.weight"] = gather(lin.weight, 0)
            if lin.bias is not None:
                out[f"{name}.bias"] = gather(lin.bias, 0)
    for name, lin in rows:
        if lin is not None:
            out[f"{name}.weight"] = gather(lin.weight, 1)
            if lin.bias is not None:
                out[f"{name}.bias"] = lin.bias.detach().clone()
    return out


class TensorParallelExpert(nn.Module):
    """One :class:`~executor.models.llama.Expert` split as the dense MLP: ``gate`` and ``up`` column-parallel, ``down``
    row-parallel without its all-reduce (:meth:`partial`: this rank's share of the expert's output, before its bias,
    of an input already through ``f``: the layer's tokens pass through it once, not once per expert's linear), or
    with it (:meth:`forward`: the whole output, through its own ``f`` and ``g``, as a shared expert runs)."""

    def __init__(self, expert: nn.Module, rank: int, size: int, group: object) -> None:
        super().__init__()
        from executor.models.llama import glu

        self._glu, self.act, self.offset, self.clamp = glu, expert.act, expert.offset, expert.clamp
        self.gate = (ColumnParallelLinear.from_linear(expert.gate, rank, size, group)
                     if expert.gate is not None else None)
        self.up = ColumnParallelLinear.from_linear(expert.up, rank, size, group)
        self.down = RowParallelLinear.from_linear(expert.down, rank, size, group)

    def partial(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(self._inner(x), self.down.weight)

    def _inner(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's columns of the activation, of an input through ``f``: the gate's and up's shards and their
        biases' (split with their columns), through :func:`~executor.models.llama.glu` (elementwise: gpt-oss's clamp
        and offset per column)."""
        up = self.up.local(x)
        if self.gate is None:
            return self.act(up)
        return self._glu(self.act, self.gate.local(x), up, self.offset, self.clamp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The whole output on the whole input ``x``, as the dense MLP of :class:`TensorParallelLlamaBlock`: ``x``
        through ``f``, ``down``'s ``g`` and its (replicated) bias."""
        return self.down(self._inner(CopyToTensorParallel.apply(x, self.down.group)))


class TensorParallelMoE(nn.Module):
    """A :class:`~executor.models.llama.SparseMoE` split over a tensor-parallel group: each expert as the dense MLP
    (:class:`TensorParallelExpert`), the router replicated (Megatron-Core's expert tensor parallelism, expert-parallel
    size 1: ``megatron/core/transformer/moe``, the router's weight whole on every rank).

    Llama 4's ``router_weights_on_input`` (:func:`~executor.models.llama.mix` ``on_input``): the weights scale the
    tokens before the experts' column-parallel ``gate`` and ``up``, both through ``f``: the gradient of each scaled
    row is this rank's share, so ``f``'s all-reduces make the tokens' and the weights' gradients whole, as with the
    weights on the outputs; ``down``'s biases (none in Llama 4) are then added unweighted.

    The router reads the block's input ``x`` (the same on every rank) directly, so every rank routes every token
    alike. The routing weights multiply each expert's *partial* output (this rank's share of ``down``) before the
    one all-reduce ``g`` of the sum ``(T, h)``; the gradient of a routing weight on a rank is therefore only this
    rank's share, and the weights pass through ``f`` (identity forward, all-reduce of the gradient backward): the
    router's weight and input get the full gradient, the same on every rank. The experts read ``f(x)`` (the tokens
    through ``f`` once: one all-reduce of their gradient, as the dense MLP's, not one per expert's linear): the
    gradient of ``x`` is the router's (full) plus the all-reduced experts'.
    ``down``'s biases (replicated) are weighted after the all-reduce, with the weights outside ``f`` (their
    gradient through them already whole); ``gate``'s and ``up``'s biases (gpt-oss's) are split with their columns.
    The router's bias (gpt-oss's ``GptOssTopKRouter.bias``) is replicated with its weight: every rank computes the
    same logits and routes alike, and gets the whole gradient.

    A shared expert (``shared_expert``) is split as the dense MLP and runs through its own ``f`` and ``g``
    (:meth:`TensorParallelExpert.forward`; Megatron-Core's ``SharedExpertMLP``); its gate (``shared_expert_gate``,
    replicated) reads the whole input and scales the whole output, so its gradient is the full one on every rank
    without a collective of its own (:func:`~executor.models.llama.shared_output`)."""

    def __init__(self, moe: nn.Module, rank: int, size: int, group: object) -> None:
        super().__init__()
        self.group, self.top_k, self.normalize, self.on_input = group, moe.top_k, moe.normalize, moe.on_input
        self.router = moe.router
        self.experts = nn.ModuleList(TensorParallelExpert(e, rank, size, group) for e in moe.experts)
        self.shared_expert = (TensorParallelExpert(moe.shared_expert, rank, size, group)
                              if moe.shared_expert is not None else None)
        self.shared_expert_gate = moe.shared_expert_gate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from executor.models.llama import mix, shared_output

        tokens = x.reshape(-1, x.shape[-1])
        weights, index = self.router.choose(tokens, x.dtype)  # (every rank alike: the router replicated)
        partial = mix(CopyToTensorParallel.apply(tokens, self.group), CopyToTensorParallel.apply(weights, self.group),
                      index, [e.partial for e in self.experts], self.on_input)
        y = ReduceFromTensorParallel.apply(partial, self.group)
        biases = [e.down.bias for e in self.experts]
        if biases[0] is not None:  # (weighted, or with the weights on the inputs each added whole)
            chosen = torch.stack(biases)[index]
            y = y + (chosen.sum(dim=1) if self.on_input else (weights.unsqueeze(-1) * chosen).sum(dim=1))
        shared = shared_output(self, tokens)
        return (y if shared is None else y + shared).view(x.shape)

    def full_state(self, gather: Callable[[torch.Tensor, int], torch.Tensor]) -> dict[str, torch.Tensor]:
        """The parameters under the names of the full :class:`~executor.models.llama.SparseMoE`, the shards
        gathered with ``gather(tensor, dim)`` (a collective on the group)."""
        out = router_state(self.router) | shared_state(self, gather)
        for e, expert in enumerate(self.experts):
            out |= gathered_linears([(f"experts.{e}.gate", expert.gate), (f"experts.{e}.up", expert.up)],
                                    [(f"experts.{e}.down", expert.down)], gather)
        return out


def router_state(router: nn.Module) -> dict[str, torch.Tensor]:
    """The router's parameters (replicated: whole on every tensor and expert rank), its weight and, gpt-oss's, its bias,
    under the names of the whole :class:`~executor.models.llama.SparseMoE`."""
    return {f"router.{n}": p.detach().clone() for n, p in router.named_parameters()}


def shared_state(moe: nn.Module, gather: Callable[[torch.Tensor, int], torch.Tensor]) -> dict[str, torch.Tensor]:
    """A tensor-parallel mixture of experts' shared expert (its shards gathered with ``gather``) and gate (replicated)
    under the names of the whole :class:`~executor.models.llama.SparseMoE`; empty without a shared expert."""
    out: dict[str, torch.Tensor] = {}
    if moe.shared_expert is not None:
        se = moe.shared_expert
        out |= gathered_linears([("shared_expert.gate", se.gate), ("shared_expert.up", se.up)],
                                [("shared_expert.down", se.down)], gather)
    if moe.shared_expert_gate is not None:
        out["shared_expert_gate.weight"] = moe.shared_expert_gate.weight.detach().clone()
    return out


class TensorParallelLatentAttention(nn.Module):
    """Multi-head latent attention (:class:`~executor.models.mla.LatentAttention`) split by heads over a
    tensor-parallel group as Megatron-Core's ``MLASelfAttention``: the down projections (``q_a_proj``,
    ``kv_a_proj_with_mqa``) and the latents' norms replicated, whole on every rank, as is the shared rotated key;
    ``q_b_proj`` (or ``q_proj``) and ``kv_b_proj`` column-parallel, rank ``r`` holding heads ``[r a/t, (r+1) a/t)``
    (each head's rows are consecutive); ``o_proj`` row-parallel.

    Collectives: forward the output projection's all-reduce ``g`` of ``T h``; backward the ``f`` of each input of the
    split part, where the replicated part hands over to it: the query latent (``T c'``; without one, the block's
    input, ``T h``, through ``q_proj``'s own ``f``) and the normed key/value latent with the shared key, concatenated
    (``T (c + r)``). Their gradients, each rank's heads' share, are all-reduced there, so the replicated projections
    and norms upstream get the whole gradient on every rank with no collective of their own, and so does the block's
    input through them."""

    def __init__(self, attn: nn.Module, rank: int, size: int, group: object) -> None:
        super().__init__()
        from executor.models.mla import latent_attention

        self._attention = latent_attention
        self.group, self.size = group, size
        self.head_dim, self.rope_dim, self.v_dim = attn.head_dim, attn.rope_dim, attn.v_dim
        self.theta, self.cap, self.window = attn.theta, attn.cap, attn.window
        self.q_a_proj, self.q_a_layernorm = attn.q_a_proj, attn.q_a_layernorm  # (replicated)
        self.q_b_proj = (ColumnParallelLinear.from_linear(attn.q_b_proj, rank, size, group)
                         if attn.q_b_proj is not None else None)
        self.q_proj = (ColumnParallelLinear.from_linear(attn.q_proj, rank, size, group)
                       if attn.q_proj is not None else None)
        self.kv_a_proj_with_mqa, self.kv_a_layernorm = attn.kv_a_proj_with_mqa, attn.kv_a_layernorm  # (replicated)
        self.kv_b_proj = ColumnParallelLinear.from_linear(attn.kv_b_proj, rank, size, group)
        self.o_proj = RowParallelLinear.from_linear(attn.o_proj, rank, size, group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.q_proj is not None:
            q = self.q_proj(x)  # (x through q_proj's f)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))  # (the query latent through q_b_proj's f)
        c = self.kv_a_layernorm.normalized_shape[0]
        latent, k_rot = self.kv_a_proj_with_mqa(x).split([c, self.rope_dim], dim=-1)
        both = CopyToTensorParallel.apply(torch.cat([self.kv_a_layernorm(latent), k_rot], dim=-1), self.group)
        latent, k_rot = both.split([c, self.rope_dim], dim=-1)
        y = self._attention(q, self.kv_b_proj.local(latent), k_rot, self.head_dim, self.rope_dim, self.v_dim,
                            self.theta, self.cap, self.window)
        return self.o_proj(y)

    def full_state(self, gather: Callable[[torch.Tensor, int], torch.Tensor]) -> dict[str, torch.Tensor]:
        """The parameters under the names of the whole :class:`~executor.models.mla.LatentAttention`, the split ones
        gathered with ``gather(tensor, dim)`` (a collective on the group)."""
        out: dict[str, torch.Tensor] = {}
        for name in ("q_a_proj", "q_a_layernorm", "kv_a_proj_with_mqa", "kv_a_layernorm"):
            module = getattr(self, name)
            if module is not None:
                out |= {f"{name}.{k}": v.detach().clone() for k, v in module.named_parameters()}
        return out | gathered_linears([("q_b_proj", self.q_b_proj), ("q_proj", self.q_proj),
                                       ("kv_b_proj", self.kv_b_proj)], [("o_proj", self.o_proj)], gather)


class TensorParallelLlamaBlock(nn.Module):
    """A :class:`~executor.models.llama.LlamaBlock` split over a tensor-parallel group (Megatron-LM section 3,
    with grouped-query attention as Megatron-Core shards it; a dense layer of a mixture of experts, ``dense_layers``,
    as any dense one).

    Query heads are split (``q`` column-parallel, ``o`` row-parallel); the key/value heads too when ``t``
    divides their number ``k``: rank ``r`` holds query heads ``[r a/t, (r+1) a/t)`` and key/value heads
    ``[r k/t, (r+1) k/t)``, which are exactly the ones its query heads read. When ``t`` does not divide ``k``,
    ``k`` and ``v`` are replicated: every rank computes all key/value heads and uses those of its query heads;
    their weights pass through ``f`` (identity forward, all-reduce of the gradient backward), so each rank ends
    with the sum of every rank's contribution, the gradient of the full layer. The MLP is split as GPT's:
    ``gate`` and ``up`` column-parallel, ``down`` row-parallel; a mixture of experts as :class:`TensorParallelMoE`
    (each expert so, the shared expert too with its own collectives, the router and the shared expert's gate
    replicated). Norms are replicated (Gemma 2's norms of the
    attention's and the MLP's outputs too: they follow the row-parallel all-reduce); the query and key norms
    (``qk_norm``, Qwen3) see only this rank's heads, so their weights pass through ``f`` too.

    gpt-oss (biases on every linear layer, attention sinks, the clamped gate with its offset): the column-parallel
    linears' biases (``q``, ``k``, ``v``, ``gate``, ``up``, each expert's ``gate`` and ``up``) are split with their
    columns, the row-parallel ones' (``o``, ``down``) added once, after the all-reduce (Megatron-Core's
    ``RowParallelLinear``: the bias added to the reduced output); the sinks (one per query head) are split with the
    query heads; the gate's clamp and offset are elementwise, so each rank applies them to its columns
    (:func:`~executor.models.llama.glu`); the router's bias is replicated with the router (:class:`TensorParallelMoE`).

    Partial rotary (``rotary_dim``: GLM-4.5, Phi-4-mini) rotates each head's first dimensions; a rank holds whole
    heads, so it rotates its heads as the whole block does. GLM-4.5's query/key/value biases without an output bias
    (``qkv_bias``) are split with their columns, as gpt-oss's.

    Llama 4 (transformers' ``Llama4TextAttention``) needs nothing more: the rotary on adjacent pairs and the weightless
    L2 norm of each query and key head act on whole heads, the chunked mask and the NoPE layers' query temperature on
    positions, which every rank holds all of (no parameter, no collective); its routing weights on the experts'
    inputs as :class:`TensorParallelMoE` says.

    OLMo 2, OLMo 3 and OLMoE (``qk_norm_scope`` "projection"): the query norm's weight (``a d``) is split with ``q``'s
    columns, rank ``r`` holding its heads' ``a d / t``, and the query rows are normed by :func:`split_rms_norm` (the
    rows' sums of squares all-reduced, ``b s`` of them, forward and backward); the key norm's (``k d``) likewise with
    ``k``'s columns where the key/value heads are split; where they are replicated (``t`` does not divide ``k``)
    every rank computes whole key rows, so the key norm is whole on every rank, no all-reduce of rows, its weight
    through ``f`` (each rank's query heads' share of its gradient summed), as ``k``'s. OLMo 2's reordered norm
    (``post_norm``): no input norms, the output norms replicated after the row-parallel all-reduces (as Gemma 2's).
    """

    takes_targets = False

    def __init__(self, block: nn.Module, rank: int, size: int, group: object) -> None:
        super().__init__()
        from executor.models.llama import ATTENTION_SETTINGS, attention, block_attention, glu, sandwich_forward

        self._forward, self._glu = sandwich_forward, glu
        self._attention, self._block_attention = attention, block_attention
        a, k, d = block.heads, block.kv_heads, block.head_dim
        if a % size:
            raise ValueError(f"tensor parallelism t={size} must divide the query heads ({a})")
        self.size, self.rank, self.group, self.head_dim = size, rank, group, d
        # the block's attention settings (the rotary base, or None on Llama 4's NoPE layers; the partial rotary, the
        # soft-cap, the window; Llama 4's pairs, L2 norm, chunk and temperature): per head or per position, so a rank's
        # whole heads take them as the whole block does
        for name in ATTENTION_SETTINGS:
            setattr(self, name, getattr(block, name))
        self.act, self.gated, self.offset, self.clamp = block.act, block.gated, block.offset, block.clamp
        self.input_norm, self.post_norm = block.input_norm, block.post_norm
        self.attn_out_norm, self.mlp_out_norm = block.attn_out_norm, block.mlp_out_norm  # (Gemma 2; replicated)
        local = a // size
        self.projection_norms = block.projection_norms
        self.kv_sharded = k % size == 0 or block.mla is not None
        if self.projection_norms:  # (OLMo 2, OLMoE: split with q's columns; k's too when its heads are split)
            self.q_norm = _split_norm(block.q_norm, rank, size)
            self.k_norm = _split_norm(block.k_norm, rank, size) if self.kv_sharded else block.k_norm
        else:  # (Qwen3: over each head, whole on every rank)
            self.q_norm, self.k_norm = block.q_norm, block.k_norm
        # multi-head latent attention (kv_lora_rank) in place of q, k, v and o
        self.mla = (TensorParallelLatentAttention(block.mla, rank, size, group) if block.mla is not None
                    else None)
        self.q = ColumnParallelLinear.from_linear(block.q, rank, size, group) if self.mla is None else None
        if self.mla is not None:
            self.k = self.v = None
            self.register_buffer("kv_index", None, persistent=False)
        elif self.kv_sharded:
            self.k = ColumnParallelLinear.from_linear(block.k, rank, size, group)
            self.v = ColumnParallelLinear.from_linear(block.v, rank, size, group)
            self.register_buffer("kv_index", None, persistent=False)
        else:
            self.k = _ShardedLinear(block.k.weight, block.k.bias, group)
            self.v = _ShardedLinear(block.v.weight, block.v.bias, group)
            per_kv = a // k  # query heads per key/value head
            self.register_buffer("kv_index", torch.arange(rank * local, (rank + 1) * local) // per_kv,
                                 persistent=False)
        self.o = RowParallelLinear.from_linear(block.o, rank, size, group) if self.mla is None else None
        # gpt-oss's attention sinks, split with the query heads: this rank's heads' own (no collective: each head's
        # sink meets only its own scores)
        self.sinks = (nn.Parameter(block.sinks.detach()[rank * local:(rank + 1) * local].clone())
                      if block.sinks is not None else None)
        if block.moe is not None:  # a mixture of experts: each expert split as the dense MLP, the shared one too
            width = block.moe.experts[0].up.weight.shape[0]
            if width % size:
                raise ValueError(f"tensor parallelism t={size} must divide the experts' MLP width ({width})")
            shared = block.moe.shared_expert
            if shared is not None and shared.up.weight.shape[0] % size:
                raise ValueError(f"tensor parallelism t={size} must divide the shared expert's MLP width "
                                 f"({shared.up.weight.shape[0]})")
            self.moe: TensorParallelMoE | None = TensorParallelMoE(block.moe, rank, size, group)
            self.gate = self.up = self.down = None
        else:
            self.moe = None
            self.gate = (ColumnParallelLinear.from_linear(block.gate, rank, size, group)
                         if block.gate is not None else None)
            self.up = ColumnParallelLinear.from_linear(block.up, rank, size, group)
            self.down = RowParallelLinear.from_linear(block.down, rank, size, group)

    @classmethod
    def from_block(cls, block: nn.Module, rank: int, size: int, group: object) -> TensorParallelLlamaBlock:
        return cls(block, rank, size, group)

    def _replicated(self, lin: _ShardedLinear, x: torch.Tensor) -> torch.Tensor:
        w = CopyToTensorParallel.apply(lin.weight, self.group)
        b = CopyToTensorParallel.apply(lin.bias, self.group) if lin.bias is not None else None
        return F.linear(x, w, b)

    def _head_norm(self, norm: nn.Module | None, x: torch.Tensor) -> torch.Tensor:
        """``norm`` over each head of ``x (b, s, heads, d)`` (Qwen3), its weight's gradient summed over the group; ``x``
        itself without per-head norms."""
        if norm is None or self.projection_norms:
            return x
        return F.rms_norm(x, (self.head_dim,), CopyToTensorParallel.apply(norm.weight, self.group), norm.eps)

    def _projection_norm(self, norm: nn.Module | None, x: torch.Tensor, sharded: bool) -> torch.Tensor:
        """OLMo 2's ``norm`` over a whole projection of which ``x (b, s, w)`` holds this rank's columns (``sharded``:
        :func:`split_rms_norm`, its weight this rank's columns) or all of them (replicated key rows: the whole norm,
        its weight through ``f``); ``x`` itself without projection-wide norms."""
        if norm is None or not self.projection_norms:
            return x
        if sharded:
            return split_rms_norm(x, norm.weight, norm.eps, norm.width, self.group)
        return F.rms_norm(x, (x.shape[-1],), CopyToTensorParallel.apply(norm.weight, self.group), norm.eps)

    def attend(self, x: torch.Tensor) -> torch.Tensor:
        if self.mla is not None:
            return self.mla(x)
        b, s, _ = x.shape
        d = self.head_dim
        xc = CopyToTensorParallel.apply(x, self.group)  # q, k and v read x through one f
        q = self._projection_norm(self.q_norm, self.q.local(xc), True)
        q = self._head_norm(self.q_norm, q.view(b, s, -1, d)).transpose(1, 2)
        if self.kv_sharded:
            k = self._projection_norm(self.k_norm, self.k.local(xc), True)
            k = self._head_norm(self.k_norm, k.view(b, s, -1, d)).transpose(1, 2)
            v = self.v.local(xc).view(b, s, -1, d).transpose(1, 2)
        else:
            k = self._projection_norm(self.k_norm, self._replicated(self.k, xc), False)
            k = self._head_norm(self.k_norm, k.view(b, s, -1, d))
            k = k.transpose(1, 2).index_select(1, self.kv_index)
            v = self._replicated(self.v, xc).view(b, s, -1, d).transpose(1, 2).index_select(1, self.kv_index)
        return self.o(self._block_attention(self, q, k, v, self._attention))

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        if self.moe is not None:
            return self.moe(h)
        hc = CopyToTensorParallel.apply(h, self.group)  # gate and up read h through one f
        up = self.up.local(hc)
        inner = (self._glu(self.act, self.gate.local(hc), up, self.offset, self.clamp) if self.gate is not None
                 else self.act(up))
        return self.down(inner)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._forward(self, x, self.attend, self.mlp)

    def _gather(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        parts = [torch.empty_like(t) for _ in range(self.size)]
        dist.all_gather(parts, t.detach().contiguous(), group=self.group)
        return torch.cat(parts, dim=dim)

    def full_state(self) -> dict[str, torch.Tensor]:
        """The parameters under the names of the full :class:`LlamaBlock` (a collective on the group)."""
        out: dict[str, torch.Tensor] = {}
        norms = [("input_norm", self.input_norm), ("post_norm", self.post_norm), ("attn_out_norm", self.attn_out_norm),
                 ("mlp_out_norm", self.mlp_out_norm)]
        for name, norm in (("q_norm", self.q_norm), ("k_norm", self.k_norm)):
            if isinstance(norm, _SplitNorm):  # (OLMo 2's projection-wide norms, split with their columns)
                out[f"{name}.weight"] = self._gather(norm.weight, 0)
            else:
                norms.append((name, norm))
        for name, norm in norms:
            if norm is not None:
                out |= {f"{name}.{k}": v.detach().clone() for k, v in norm.named_parameters()}
        columns = [("q", self.q), ("gate", self.gate), ("up", self.up)]
        if self.kv_sharded:
            columns += [("k", self.k), ("v", self.v)]
        else:
            for name, lin in (("k", self.k), ("v", self.v)):
                out |= {f"{name}.{k}": v.detach().clone() for k, v in lin.named_parameters()}
        out |= gathered_linears(columns, [("o", self.o), ("down", self.down)], self._gather)
        if self.sinks is not None:
            out["sinks"] = self._gather(self.sinks, 0)
        if self.mla is not None:
            out |= {f"mla.{k}": v for k, v in self.mla.full_state(self._gather).items()}
        if self.moe is not None:
            out |= {f"moe.{k}": v for k, v in self.moe.full_state(self._gather).items()}
        return out
