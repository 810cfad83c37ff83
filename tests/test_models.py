"""Tests of the model zoo (executor/models): shapes, layers vs whole model, stages, tying, seeds, data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from executor.models import (
    PRESETS,
    Stage,
    build_layers,
    get_config,
    layer_kinds,
    layer_names,
    tied_parameters,
)
from executor.models.analytic import layer_params, model_params
from executor.models.data import TokenFile, micro_batch, micro_batches, synthetic_batch
from executor.models.gpt import GPT

torch.set_num_threads(1)


def clone_grads(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ["gpt-tiny", "bert-tiny"])
def test_shapes_and_names(name: str) -> None:
    cfg = get_config(name)
    layers = build_layers(cfg)
    assert len(layers) == cfg.layers + 2 == len(layer_names(cfg)) == len(layer_kinds(cfg))
    ids, targets = synthetic_batch(cfg, 3)
    assert ids.shape == targets.shape == (3, cfg.seq)
    x = layers[0](ids)
    assert x.shape == (3, cfg.seq, cfg.hidden)
    for block in layers[1:-1]:
        x = block(x)
        assert x.shape == (3, cfg.seq, cfg.hidden)
    loss = layers[-1](x, targets)
    assert loss.shape == () and torch.isfinite(loss)
    # random init: loss near ln(vocab)
    assert abs(loss.item() - np.log(cfg.vocab)) < 1.0


@pytest.mark.parametrize("name", ["gpt-tiny", "bert-tiny"])
def test_param_counts_match_analytic(name: str) -> None:
    cfg = get_config(name)
    layers = build_layers(cfg)
    counts = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    assert counts == layer_params(cfg)
    assert sum(p.numel() for p in Stage(layers).parameters()) == model_params(cfg)


def test_layers_in_sequence_equal_whole_model() -> None:
    cfg = get_config("gpt-tiny")
    layers = build_layers(cfg, seed=3)
    ids, targets = synthetic_batch(cfg, 4, seed=3)
    _, whole = GPT(layers)(ids, targets)
    x = ids
    for layer in layers[:-1]:
        x = layer(x)
    assert torch.allclose(layers[-1](x, targets), whole, atol=1e-6)
    assert torch.allclose(Stage(layers)(ids, targets), whole, atol=1e-6)


@pytest.mark.parametrize("name", ["gpt-tiny", "bert-tiny"])
def test_stages_chained_give_same_loss_and_grads(name: str) -> None:
    cfg = get_config(name)
    ids, targets = synthetic_batch(cfg, 4, seed=1)

    reference = Stage(build_layers(cfg, seed=7))
    ref_loss = reference(ids, targets)
    ref_loss.backward()
    ref_grads = clone_grads(reference)

    # three stages, each built on its own (as separate processes would), activations detached between
    n = cfg.num_profile_layers
    bounds = [(0, 2), (2, 4), (4, n)]
    stages = [Stage(build_layers(cfg, seed=7, start=i, stop=j)) for i, j in bounds]
    x = ids
    outs: list[torch.Tensor] = []
    inputs: list[torch.Tensor] = []
    for stage in stages[:-1]:
        outs.append(stage(x))
        x = outs[-1].detach().requires_grad_()
        inputs.append(x)
    loss = stages[-1](x, targets)
    assert torch.allclose(loss, ref_loss, atol=1e-6)
    loss.backward()
    outs[1].backward(inputs[1].grad)
    outs[0].backward(inputs[0].grad)

    # untied parameters: equal gradients layer by layer
    tied = {f"layers.{i}.{name_}" for i, name_ in tied_parameters(cfg)[0]}
    checked = 0
    for (i, _), stage in zip(bounds, stages, strict=True):
        for name_, p in stage.named_parameters():
            local_index, rest = name_.split(".", 2)[1:]
            ref_name = f"layers.{i + int(local_index)}.{rest}"
            if ref_name not in tied:
                checked += 1
                assert torch.allclose(p.grad, ref_grads[ref_name], atol=1e-6), ref_name
    assert checked == len(ref_grads) - 1
    # tied: the sum of the two copies' gradients is the shared parameter's gradient
    (first_idx, first_name), (last_idx, last_name) = tied_parameters(cfg)[0]
    first = dict(stages[0].layers[first_idx].named_parameters())[first_name]
    last = dict(stages[-1].layers[-1].named_parameters())[last_name]
    assert torch.equal(first, last)  # identical copies from the seed
    assert torch.allclose(first.grad + last.grad, ref_grads[f"layers.{first_idx}.{first_name}"], atol=1e-6)
    assert last_idx == n - 1


def test_tied_embeddings_share_one_parameter() -> None:
    cfg = get_config("gpt-tiny")
    layers = build_layers(cfg)
    assert layers[-1].weight is layers[0].tok.weight
    untied = build_layers(cfg.with_(tied_embeddings=False))
    assert untied[-1].weight is not untied[0].tok.weight
    assert not torch.equal(untied[-1].weight, untied[0].tok.weight)
    assert tied_parameters(cfg.with_(tied_embeddings=False)) == []


def test_determinism_from_seed() -> None:
    cfg = get_config("gpt-tiny")
    torch.manual_seed(123)  # the global RNG must not matter
    a = Stage(build_layers(cfg, seed=5)).state_dict()
    torch.manual_seed(456)
    b = Stage(build_layers(cfg, seed=5)).state_dict()
    c = Stage(build_layers(cfg, seed=6)).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    # a slice built alone has the full model's weights
    part = build_layers(cfg, seed=5, start=2, stop=4)
    full = build_layers(cfg, seed=5)
    for x, y in zip(part, full[2:4], strict=True):
        for (_, p), (_, q) in zip(x.named_parameters(), y.named_parameters(), strict=True):
            assert torch.equal(p, q)


def test_synthetic_data_deterministic_and_sliced() -> None:
    cfg = get_config("gpt-tiny")
    ids, targets = synthetic_batch(cfg, 8, seed=2, step=3)
    ids2, _ = synthetic_batch(cfg, 8, seed=2, step=3)
    assert torch.equal(ids, ids2)
    assert not torch.equal(ids, synthetic_batch(cfg, 8, seed=2, step=4)[0])
    assert torch.equal(ids[:, 1:], targets[:, :-1])  # next-token targets
    mbs = micro_batches(ids, targets, 2)
    assert len(mbs) == 4 and torch.equal(mbs[1][0], ids[2:4])
    assert torch.equal(micro_batch(cfg, 8, 2, 1, seed=2, step=3)[1], targets[2:4])
    with pytest.raises(ValueError, match="divide"):
        micro_batches(ids, targets, 3)
    bert = get_config("bert-tiny")
    inp, tgt = synthetic_batch(bert, 4)
    masked = tgt != -100
    assert masked.any(dim=1).all()
    assert (inp[masked] == bert.vocab - 1).all()


@pytest.mark.parametrize(("suffix", "dtype"), [(".bin", np.uint16), (".bin", np.uint32), (".npy", np.uint16)])
def test_token_file_loader(tmp_path: Path, suffix: str, dtype: type) -> None:
    tokens = (np.arange(1000) % 251).astype(dtype)
    path = tmp_path / f"train{suffix}"
    if suffix == ".npy":
        np.save(path, tokens)
    else:
        tokens.tofile(path)
    data = TokenFile(path, dtype=np.dtype(dtype).name)
    assert len(data) == 1000
    x, y = data.batch(4, 16, seed=1, step=0)
    assert x.shape == y.shape == (4, 16) and x.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    for row in x:  # windows are consecutive tokens of the file
        start = int(np.flatnonzero(tokens == row[0].item())[0])
        assert np.array_equal(row.numpy() % 251, (np.arange(start, start + 16) % 251))
    x2, _ = data.batch(4, 16, seed=1, step=0)
    assert torch.equal(x, x2)
    assert len(list(data.batches(2, 16, steps=3))) == 3
    layers = build_layers("gpt-tiny")
    assert torch.isfinite(Stage(layers)(x[:, :16] % 256, y % 256))


def test_presets() -> None:
    assert {"gpt-tiny", "bert-tiny", "gpt2-medium", "gpt2-1.3b", "bert-48", "gpt3-175b"} <= set(PRESETS)
    # Chimera's GPT-2 "1.3B": 48 layers of hidden 1536 (planner.model), 1.36B parameters outside the embedding
    big = PRESETS["gpt2-1.3b"]
    assert (big.layers, big.hidden) == (48, 1536)
    assert abs(big.layers * big.layer_params() / 1e9 - 1.36) < 0.01
    assert abs(model_params(PRESETS["gpt3-175b"]) / 1e9 - 175) < 2
    assert PRESETS["bert-48"].seq == 128 and PRESETS["gpt2-1.3b"].seq == 632
    with pytest.raises(ValueError, match="unknown model"):
        get_config("gpt-huge")


def test_zoo_reads_the_one_registry() -> None:
    """Every zoo preset is planner.model's preset (defined once), the executor adding only dropout."""
    from planner.model import PRESETS as SPECS

    assert set(PRESETS) == set(SPECS)
    for name, spec in SPECS.items():
        assert PRESETS[name].spec() == spec
        assert get_config(spec) == PRESETS[name]
    assert PRESETS["hanayo-gpt"].seq == 1024 and PRESETS["hanayo-gpt"].vocab == 50257
