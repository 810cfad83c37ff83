"""The profiler on real model code: a tiny Hugging Face Llama built by transformers (CPU), and a user's own model
through ``--module`` -- the README's worked example, profiled and planned."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from pipeplan.cli import app
from planner.profile import load_profile
from profiler.hf_config import read_hf_config
from profiler.hf_model import read_hf_layer_model
from profiler.layer_model import LayerModel, from_factory, profile_layer_model

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "tests" / "fixtures" / "tiny-llama" / "config.json"
runner = CliRunner()


@pytest.mark.slow
def test_hf_tiny_llama_profile(tmp_path: Path) -> None:
    out = tmp_path / "llama.json"
    res = runner.invoke(app, ["profile", "--hf-config", str(TINY), "--hf-layers", "2", "--micro-batches", "1,2",
                              "--repeats", "2", "--warmup", "1", "--threads", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    prof = load_profile(out)
    spec = read_hf_config(TINY)
    assert [layer.name for layer in prof.layers] == ["embedding", *(f"block.{i}" for i in range(6)), "head"]
    # the library's modules hold exactly the parameters ModelSpec counts
    assert [layer.params for layer in prof.layers] == [spec.vocab * spec.hidden, *[spec.layer_params()] * 6,
                                                       spec.head_params()]
    assert prof.total_params == spec.total_params()
    assert prof.environment["measured_decoder_layers"] == "2"
    assert prof.shape is not None and prof.shape.layers == 6 and prof.shape.seq == 16
    block = prof.layers[1]
    assert all(block.fwd_time[b] > 0 and block.bwd_time[b] > 0 for b in (1, 2))
    assert block.output_bytes_per_sample == 16 * 64 * 4  # (s, h) fp32
    assert block.stashed_bytes_per_sample > block.output_bytes_per_sample
    assert prof.layers[5].fwd_time == prof.layers[2].fwd_time  # blocks past the measured ones reuse the last


@pytest.mark.slow
@pytest.mark.parametrize("fixture", ["tiny-mixtral", "tiny-qwen3-moe"])
def test_hf_tiny_moe_profile(fixture: str, tmp_path: Path) -> None:
    """Mixtral's and Qwen3 MoE's decoder layers (the library's sparse MoE blocks, its grouped-GEMM experts) measured
    through ``pipeplan profile --hf-config``: each block holds every expert and the router as ModelSpec counts them,
    and the profile says its layers were routed by random weights, not a trained router."""
    out = tmp_path / "moe.json"
    config = ROOT / "tests" / "fixtures" / fixture
    res = runner.invoke(app, ["profile", "--hf-config", str(config), "--hf-layers", "2", "--micro-batches", "1,2",
                              "--repeats", "2", "--warmup", "1", "--threads", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    warnings = [line for line in res.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == ["warning: --hf-config: the 4-expert layers are timed with the routing of random weights "
                        "(tokens spread about evenly over the experts), not a trained router's"], res.stderr
    prof = load_profile(out)
    spec = read_hf_config(config)
    assert spec.experts == 4 and spec.experts_per_token == 2
    assert [layer.params for layer in prof.layers] == [spec.vocab * spec.hidden, *[spec.layer_params()] * 4,
                                                       spec.head_params()]
    assert prof.total_params == spec.total_params() and "not a trained router's" in prof.notes
    assert json.loads(prof.environment["model_spec"])["experts"] == 4
    block = prof.layers[1]
    assert all(block.fwd_time[b] > 0 and block.bwd_time[b] > 0 for b in (1, 2))
    assert block.output_bytes_per_sample == 16 * 64 * 4  # (s, h) fp32


def _one_layer_profile(fixture: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """``pipeplan profile --hf-config`` of a fixture with ``--hf-layers 1`` (micro-batch 1, 2 repeats): the profile
    and the fixture's ModelSpec."""
    out, config = tmp_path / f"{fixture}.json", ROOT / "tests" / "fixtures" / fixture
    res = runner.invoke(app, ["profile", "--hf-config", str(config), "--hf-layers", "1", "--micro-batches", "1",
                              "--repeats", "2", "--warmup", "1", "--threads", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    return load_profile(out), read_hf_config(config)


@pytest.mark.slow
def test_hf_profile_with_a_dense_layer_and_a_shared_expert(tmp_path: Path) -> None:
    """Qwen2 MoE (a gated shared expert; its layer 1 dense, ``mlp_only_layers``) through ``pipeplan profile
    --hf-config --hf-layers 1``: layer 0 (experts) and the first dense layer (1) are built and measured, each block
    reuses its kind's times, the profile and its notes say which, and each block holds what ModelSpec counts."""
    prof, spec = _one_layer_profile("tiny-qwen2-moe", tmp_path)
    assert prof.environment["measured_decoder_layers"] == "2"
    assert prof.environment["repeated_blocks"] in prof.notes and "the first of each kind" in prof.notes
    assert [layer.params for layer in prof.layers[1:5]] == [spec.block_params(i) for i in range(4)]
    assert [layer.expert_params for layer in prof.layers[1:5]] == [4 * spec.expert_params(), 0,
                                                                  4 * spec.expert_params(), 4 * spec.expert_params()]
    assert prof.total_params == spec.total_params()
    assert prof.layers[3].fwd_time == prof.layers[1].fwd_time != prof.layers[2].fwd_time


@pytest.mark.slow
def test_hf_profile_of_deepseek_v3_layers(tmp_path: Path) -> None:
    """DeepSeek-V3's layers as transformers builds them (latent attention, a sigmoid group-limited router, a shared
    expert; the first layer dense) through ``pipeplan profile --hf-config --hf-layers 1``: the dense layer and one with
    experts measured, each block's parameters ModelSpec's, the routed experts only in expert_params, and the
    profile's shape records the latent width its tensor-parallel collectives move."""
    prof, spec = _one_layer_profile("tiny-deepseek-v3", tmp_path)
    assert prof.environment["measured_decoder_layers"] == "2"
    assert [layer.params for layer in prof.layers[1:4]] == [spec.block_params(i) for i in range(3)]
    assert [layer.expert_params for layer in prof.layers[1:4]] == [0, 8 * spec.expert_params(),
                                                                  8 * spec.expert_params()]
    assert prof.total_params == spec.total_params()
    assert prof.shape is not None and prof.shape.latent_width == 48 + 32 + 8
    # the latent down-projections and norms, whole on every tensor rank
    assert [layer.replicated_params for layer in prof.layers[1:4]] == [64 * 48 + 48 + 64 * (32 + 8) + 32] * 3
    assert prof.layers[3].fwd_time == prof.layers[2].fwd_time != prof.layers[1].fwd_time


def _logits(lm):  # type: ignore[no-untyped-def]
    """The layer model's logits of a sample of 2 and its loss."""
    ids, targets = lm.sample(2)
    x = ids
    for layer in lm.layers:
        x = layer(x)
    return x, lm.loss(x, targets)


@pytest.mark.slow
def test_hf_gpt2_layers_and_tied_head() -> None:
    lm, spec = read_hf_layer_model(ROOT / "examples" / "models" / "gpt2", seq=8)
    assert len(lm.layers) == 3 and len(lm.repeat) == 14 and lm.tied_params == {13: spec.vocab * spec.hidden}
    x, loss = _logits(lm)
    assert x.shape == (2, 8, spec.vocab) and torch.isfinite(loss)


@pytest.mark.slow
def test_hf_gemma2_layers_soft_capped_head() -> None:
    """Gemma 2 through the library's own modules (its eager attention: it refuses SDPA): the parameters
    ModelSpec counts (four norms a layer), the head's logits soft-capped at the config's final cap."""
    lm, spec = read_hf_layer_model(ROOT / "tests" / "fixtures" / "tiny-gemma2", seq=16, measure_layers=2)
    assert spec.sandwich_norm and spec.logit_softcap == 3.0
    assert [sum(p.numel() for p in m.parameters()) for m in lm.layers[1:3]] == [spec.layer_params()] * 2
    x, loss = _logits(lm)
    assert x.shape == (2, 16, spec.vocab) and float(x.detach().abs().max()) <= 3.0 and torch.isfinite(loss)


@pytest.mark.slow
def test_hf_gemma3_layers_with_their_rotary_tables() -> None:
    """Gemma 3 through the library's own modules: its rotary embedding takes the layer type (the local layers'
    own base), its layers hold the parameters ModelSpec counts (four norms, the query/key norms)."""
    lm, spec = read_hf_layer_model(ROOT / "tests" / "fixtures" / "tiny-gemma3", seq=16, measure_layers=3)
    assert spec.qk_norm and spec.global_every == 3
    assert [sum(p.numel() for p in m.parameters()) for m in lm.layers[1:4]] == [spec.layer_params()] * 3
    x, loss = _logits(lm)
    assert x.shape == (2, 16, spec.vocab) and torch.isfinite(loss)


def test_readme_module_example(tmp_path: Path) -> None:
    """The README's worked example, command for command."""
    prof_path, plan_path = tmp_path / "custom.json", tmp_path / "plan.json"
    res = runner.invoke(app, ["profile", "--module", f"{ROOT}/examples/custom_model.py:build",
                              "--micro-batches", "1,2,4", "--threads", "1", "--repeats", "2", "--out", str(prof_path)])
    assert res.exit_code == 0, res.output
    prof = load_profile(prof_path)
    assert prof.name == "custom_model" and len(prof.layers) == 8
    assert prof.layers[1].params == 2 * 256 + 2 * (256 * 1024) + 1024 + 256  # norm, 256 -> 1024 -> 256
    assert prof.layers[-1].params == 2 * 256 + 256 * 10 + 10  # norm, classifier
    cluster = str(ROOT / "examples" / "clusters" / "local-cpu-4.json")
    res = runner.invoke(app, ["plan", "--profile", str(prof_path), "--cluster", cluster,
                              "--global-batch", "16", "--max-tensor", "1", "--json"])
    assert res.exit_code == 0, res.output
    plan_path.write_text(res.output)
    cands = json.loads(res.output)["candidates"]
    assert cands and all(c["tensor"] == 1 for c in cands)
    assert all(sum(b - a for a, b in c["partition"]) == 8 for c in cands if c.get("partition"))


def test_layer_model_contract_errors() -> None:
    with pytest.raises(ValueError, match="pkg.module:build"):
        from_factory("examples/custom_model.py")
    with pytest.raises(ValueError, match="no callable"):
        from_factory("examples/custom_model.py:nothing")
    with pytest.raises(ValueError, match="cannot import"):
        from_factory("no_such_package.model:build")
    with pytest.raises(ValueError, match="non-empty list"):
        LayerModel([], lambda b: (torch.zeros(b), torch.zeros(b)), torch.nn.functional.mse_loss)
    res = runner.invoke(app, ["profile", "--model", "gpt-tiny", "--module", "x:y"])
    assert res.exit_code != 0 and "exactly one" in res.output


def test_profile_layer_model_measures_each_layer() -> None:
    layers = [torch.nn.Linear(8, 8), torch.nn.Linear(8, 32), torch.nn.Linear(32, 4)]
    lm = LayerModel(layers, lambda b: (torch.randn(b, 8), torch.randint(0, 4, (b,))),
                    torch.nn.functional.cross_entropy)
    prof = profile_layer_model(lm, [1, 4], repeats=2, warmup=1)
    assert [layer.params for layer in prof.layers] == [72, 288, 132]
    assert [layer.output_bytes_per_sample for layer in prof.layers[:2]] == [8 * 4, 32 * 4]


@pytest.mark.slow
def test_hf_profile_of_gpt_oss_layers(tmp_path: Path) -> None:
    """gpt-oss's layers as transformers builds them (sinks, which its SDPA path refuses: timed in its eager
    attention; biased experts and router) through ``pipeplan profile --hf-config --hf-layers 1``: each block's
    parameters ModelSpec's (the sinks and every bias), the routed experts with their biases in expert_params."""
    prof, spec = _one_layer_profile("tiny-gpt-oss", tmp_path)
    assert [layer.params for layer in prof.layers[1:4]] == [spec.block_params(i) for i in range(3)]
    assert [layer.expert_params for layer in prof.layers[1:4]] == [4 * spec.expert_params()] * 3
    assert spec.expert_params() == 3 * 64 * 32 + 2 * 32 + 64 and prof.total_params == spec.total_params() == 130328
    assert all(layer.fwd_time[1] > 0 and layer.bwd_time[1] > 0 for layer in prof.layers[1:4])
