"""What the executor's transformers-parity tests share: our layers of a spec beside transformers' model of it (both
float64), our weights copied into it with a per-family block copier, the logits of our layers, and the logit
differences with named pieces of the model changed."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from executor.models import ModelConfig, build_layers, get_config
from executor.models.data import synthetic_batch
from planner.model import ModelSpec


def randn(t: torch.Tensor, std: float, gen: torch.Generator) -> torch.Tensor:
    """Normal values of ``t``'s shape and dtype drawn from ``gen``, times ``std``."""
    return torch.randn(t.shape, generator=gen, dtype=t.dtype) * std


def built(spec: ModelSpec, make_hf: Callable[[], nn.Module]) -> tuple[ModelConfig, list[nn.Module], nn.Module]:
    """The config of ``spec``, our layers of it (seed 2) and transformers' model ``make_hf()`` (built after them),
    both float64 in eval mode; the same parameter count, ModelSpec's (a tied head's weight, the embedding's one
    Parameter, counted once, as transformers' model counts its tied ``lm_head``)."""
    cfg = get_config(spec)
    layers = [m.double().eval() for m in build_layers(cfg, seed=2)]
    hf = make_hf().double().eval()
    ours = {id(p): p for m in layers for p in m.parameters()}
    assert sum(p.numel() for p in hf.parameters()) == cfg.total_params() == sum(p.numel() for p in ours.values())
    return cfg, layers, hf


def copied(cfg: ModelConfig, layers: list[nn.Module], hf: nn.Module,
           copy_block: Callable[[nn.Module, nn.Module, torch.Generator], None], gen: torch.Generator,
           norm_off_one: bool = False) -> torch.Tensor:
    """Our embedding, each block (``copy_block(ours, theirs, gen)``, in order), final norm and LM head copied into
    transformers' ``hf`` (a ``*ForCausalLM``); the batch of 2 sequences (seed 3) both are compared on.
    ``norm_off_one``: our final norm's weight drawn in [0.5, 1.5) from ``gen`` (after the blocks') before it is
    copied: at one, a final norm whose weight were not applied would not show."""
    with torch.no_grad():
        hf.model.embed_tokens.weight.copy_(layers[0].tok.weight)
        for ours, theirs in zip(layers[1:-1], hf.model.layers, strict=True):
            copy_block(ours, theirs, gen)
        if norm_off_one:
            layers[-1].norm.weight.uniform_(0.5, 1.5, generator=gen)
        hf.model.norm.weight.copy_(layers[-1].norm.weight)
        hf.lm_head.weight.copy_(layers[-1].weight)
    ids, _ = synthetic_batch(cfg, 2, seed=3)
    return ids


def copy_routed_experts(ours: nn.Module, theirs: nn.Module) -> None:
    """Our router and routed experts into transformers 5's sparse MoE block (Mixtral's, Qwen's, DeepSeek's):
    ``gate.weight`` the router, scaled up first so that the routing weights are far from uniform, and the experts fused
    (``gate_up_proj[e]`` = gate over up, ``down_proj[e]`` = down). Call under ``torch.no_grad()``."""
    ours.router.weight.mul_(20)
    theirs.gate.weight.copy_(ours.router.weight)
    for e, expert in enumerate(ours.experts):
        theirs.experts.gate_up_proj[e].copy_(torch.cat([expert.gate.weight, expert.up.weight]))
        theirs.experts.down_proj[e].copy_(expert.down.weight)


def copy_unbiased_attention(ours: nn.Module, theirs: nn.Module, input_norm: nn.Module, post_norm: nn.Module,
                            gen: torch.Generator) -> None:
    """Our block's q, k, v and o (no biases) into transformers' attention ``theirs`` (``q_proj``...), q and k scaled
    up 12 times and v and o 10 (scores of order one and more, so that positions and norms matter), and its two norms
    into ``input_norm`` and ``post_norm``, first moved off one. Call under ``torch.no_grad()``."""
    for a, b in ((ours.q, theirs.q_proj), (ours.k, theirs.k_proj), (ours.v, theirs.v_proj), (ours.o, theirs.o_proj)):
        a.weight.mul_(12 if a in (ours.q, ours.k) else 10)
        b.weight.copy_(a.weight)
        assert a.bias is None and b.bias is None
    for norm, target in ((ours.input_norm, input_norm), (ours.post_norm, post_norm)):
        norm.weight.uniform_(0.5, 1.5, generator=gen)
        target.weight.copy_(norm.weight)


def logits(layers: list[nn.Module], ids: torch.Tensor) -> torch.Tensor:
    """Our layers' logits of ``ids``: the embedding and blocks in turn, then the head."""
    x = ids
    for m in layers[:-1]:
        x = m(x)
    return layers[-1].logits(x)


def broken_diffs(layers: list[nn.Module], ids: torch.Tensor, want: torch.Tensor,
                 broken: dict[str, list[tuple[object, str, object]]]) -> dict[str, float]:
    """The largest logit difference from ``want`` with each named set of ``(object, attribute, value)`` changes
    applied (and undone after)."""
    diffs = {}
    for name, changes in broken.items():
        saved = [(m, attr, getattr(m, attr)) for m, attr, _ in changes]
        for m, attr, value in changes:
            setattr(m, attr, value)
        try:
            diffs[name] = (logits(layers, ids) - want).abs().max().item()
        finally:
            for m, attr, value in saved:
                setattr(m, attr, value)
    return diffs
