"""Zero-bubble's split backward (executor.split_backward): ``I`` then ``W`` give exactly the gradients of one
whole backward, and ``W`` runs only the weights' branches -- no input gradient is computed twice."""

from __future__ import annotations

import torch
from torch import nn

from executor.split_backward import split_input


class Spy(torch.autograd.Function):
    """Identity whose backward counts its calls: it sits on the activations' path, so a ``W`` that walked the
    graph from the output again would call it a second time."""

    calls = 0

    @staticmethod
    def forward(ctx, x):  # type: ignore[no-untyped-def]
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):  # type: ignore[no-untyped-def]
        Spy.calls += 1
        return g


def _stage(seed: int = 0) -> nn.ModuleList:
    torch.manual_seed(seed)
    return nn.ModuleList([nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, dropout=0.0,
                                                     dtype=torch.float64) for _ in range(3)])


def _run(layers: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
    y = x
    for layer in layers:
        y = Spy.apply(layer(y))
    return y


def _reference(layers: nn.ModuleList, x0: torch.Tensor, g: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    for p in layers.parameters():
        p.grad = None
    x = x0.clone().requires_grad_(True)
    torch.autograd.backward(_run(layers, x), g, inputs=[*layers.parameters(), x])
    assert x.grad is not None
    return [p.grad.clone() for p in layers.parameters()], x.grad.clone()


def _forward(seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor,
                                torch.Tensor]:
    """A stage's parameters, their reference gradients and input gradient (one whole backward), and a fresh
    forward (no gradients yet): ``params, ref, ref_dx, x, out, g``."""
    layers = _stage(seed)
    params = list(layers.parameters())
    x0 = torch.randn(2, 5, 16, dtype=torch.float64)
    g = torch.randn(2, 5, 16, dtype=torch.float64)
    ref, ref_dx = _reference(layers, x0, g)
    for p in params:
        p.grad = None
    x = x0.clone().requires_grad_(True)
    return params, ref, ref_dx, x, _run(layers, x), g


def test_split_equals_one_backward_and_walks_the_activations_once() -> None:
    params, ref, ref_dx, x, out, g = _forward(0)
    Spy.calls = 0
    dx, split = split_input(out, g, x, params)
    assert Spy.calls == 3  # I: once through each layer's output
    assert all(p.grad is None for p in params)  # I computes no weight gradient
    assert split.joins and not split.rest
    split.weights(out, g, retain_graph=False)
    assert Spy.calls == 3, "W walked the activations' path again"
    assert torch.equal(dx, ref_dx)
    for got, want in zip((p.grad for p in params), ref, strict=True):
        assert got is not None and torch.equal(got, want)


def test_first_stage_cut_carries_the_gradient_into_the_embedding() -> None:
    """The first stage's input is token ids (no gradient): cut after the embedding, ``I`` computes the
    gradient at the cut and ``W`` carries it on into the embedding's weight."""
    layers = _stage(1)
    emb = nn.Embedding(11, 16, dtype=torch.float64)
    ids = torch.randint(0, 11, (2, 5))
    g = torch.randn(2, 5, 16, dtype=torch.float64)
    params = [emb.weight, *layers.parameters()]
    e = emb(ids)
    torch.autograd.backward(_run(layers, e), g, inputs=params)
    ref = [p.grad.clone() for p in params]  # type: ignore[union-attr]
    for p in params:
        p.grad = None
    e = emb(ids)
    leaf = e.detach().requires_grad_(True)
    out = _run(layers, leaf)
    _, split = split_input(out, g, leaf, params, tail=e)
    assert split.behind == [emb.weight] and emb.weight.grad is None
    split.weights(out, g, retain_graph=False)
    for got, want in zip((p.grad for p in params), ref, strict=True):
        assert got is not None and torch.equal(got, want)


def test_first_stage_cut_with_the_head_tied_to_the_embedding() -> None:
    """A one-stage run holds the embedding and the LM head that shares its weight: the weight is reached both
    behind the cut and after it (the head's join), and ``W`` accumulates both parts. It got only the head's
    part before (the tied weight was not counted behind the cut), so a one-device ZB-H1 run trained wrong."""
    layers = _stage(3)
    emb = nn.Embedding(11, 16, dtype=torch.float64)
    ids = torch.randint(0, 11, (2, 5))
    params = [emb.weight, *layers.parameters()]

    def head(y: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(y, emb.weight).logsumexp(-1).sum()

    torch.autograd.backward(head(_run(layers, emb(ids))), inputs=params)
    ref = [p.grad.clone() for p in params]  # type: ignore[union-attr]
    for p in params:
        p.grad = None
    e = emb(ids)
    leaf = e.detach().requires_grad_(True)
    out = head(_run(layers, leaf))
    _, split = split_input(out, None, leaf, params, tail=e)
    assert split.behind == [emb.weight]
    split.weights(out, None, retain_graph=False)
    for got, want in zip((p.grad for p in params), ref, strict=True):
        assert got is not None and torch.allclose(got, want, rtol=0, atol=1e-12)


def test_a_weight_used_twice_is_left_to_a_whole_backward() -> None:
    """A parameter two joins reach (the same linear applied twice) is not split, and still exact."""
    torch.manual_seed(2)
    lin = nn.Linear(8, 8, dtype=torch.float64)
    other = nn.Linear(8, 8, dtype=torch.float64)
    params = [*lin.parameters(), *other.parameters()]
    x0 = torch.randn(4, 8, dtype=torch.float64)

    def run(x: torch.Tensor) -> torch.Tensor:
        return other(torch.tanh(lin(torch.tanh(lin(x))))).sum()

    x = x0.clone().requires_grad_(True)
    torch.autograd.backward(run(x), inputs=[*params, x])
    ref = [p.grad.clone() for p in params]  # type: ignore[union-attr]
    for p in params:
        p.grad = None
    x = x0.clone().requires_grad_(True)
    out = run(x)
    _, split = split_input(out, None, x, params)
    assert {id(p) for p in split.rest} == {id(p) for p in lin.parameters()}
    assert [id(p) for _, ps in split.joins for p in ps] and all(
        id(p) in {id(q) for q in other.parameters()} for _, ps in split.joins for p in ps)
    split.weights(out, None, retain_graph=False)
    for got, want in zip((p.grad for p in params), ref, strict=True):
        assert got is not None and torch.allclose(got, want, rtol=0, atol=1e-14)


def test_a_join_without_its_gradient_falls_back_to_a_whole_backward() -> None:
    """Should I not have reached a join, W still gives every weight its gradient (by the whole backward)."""
    params, ref, _, x, out, g = _forward(3)
    _, split = split_input(out, g, x, params)
    split.captured.pop(0)
    split.weights(out, g, retain_graph=False)
    for got, want in zip((p.grad for p in params), ref, strict=True):
        assert got is not None and torch.allclose(got, want, rtol=0, atol=1e-12)


def test_the_profiler_measures_what_i_keeps_for_w() -> None:
    """profile_model records, per layer, the gradients the executor's I keeps for W: for a GPT block the outputs
    of its two norms (h each), QKV (3h), projection (h), MLP up (4h) and down (h) per token; the LM head its
    norm and logits; the embedding (its input is token ids) its output's gradient, kept at the executor's cut."""
    from executor.models import get_config
    from profiler.run import profile_model

    torch.set_num_threads(1)
    cfg = get_config("gpt-tiny")
    prof = profile_model(cfg, micro_batches=[1, 2], threads=1, repeats=1, warmup=0)
    blocks = [lay for lay in prof.layers if lay.kind == "transformer"]
    assert blocks and all(lay.held_grad_bytes_per_sample == 4 * cfg.seq * 11 * cfg.hidden for lay in blocks)
    assert prof.layers[0].held_grad_bytes_per_sample == 4 * cfg.seq * cfg.hidden
    assert (prof.layers[-1].held_grad_bytes_per_sample or 0) > 4 * cfg.seq * cfg.vocab
