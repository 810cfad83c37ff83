"""Hugging Face config.json -> ModelSpec (profiler/hf_config.py): every shipped example, and bad configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profiler.hf_config import HFConfigError, SeqError, read_hf_config, spec_from_hf_dict

ROOT = Path(__file__).resolve().parent.parent
MODELS = ROOT / "examples" / "models"

# published sizes (examples/models/README.md has the sources): (billions, the figure's last digit's half)
PUBLISHED = {
    "llama-3.1-8b": (8.03, 0.005),
    "llama-3.1-70b": (70.6, 0.05),
    "llama-3.1-405b": (405.9, 0.05),
    "qwen2.5-7b": (7.62, 0.005),
    "qwen3-8b": (8.19, 0.005),
    "phi-3-medium-4k": (14.0, 0.05),
    "mistral-7b": (7.24, 0.005),
    "gemma-2-9b": (9.24, 0.005),
    "gemma-3-1b": (1.0, 0.005),
    "gpt2": (0.124, 0.0005),
    "mixtral-8x7b": (46.7, 0.05),
    "qwen3-30b-a3b": (30.5, 0.05),
    "qwen1.5-moe-a2.7b": (14.3, 0.05),
    "deepseek-v2-lite": (15.7, 0.05),
    "deepseek-v3": (671, 0.5),
    "gpt-oss-120b": (116.83, 0.005),
    "gpt-oss-20b": (20.91, 0.005),
    # the card's "106B total" (the Hub's 110B adds the multi-token prediction layer, which transformers does not build)
    "glm-4.5-air": (106.85, 0.005),
    "olmo-2-7b": (7.30, 0.005),
    "olmoe-1b-7b": (6.92, 0.005),
    # the language models of the multimodal llama4 configs, as transformers' Llama4ForCausalLM counts them on the meta
    # device (107,769,861,120 and 400,711,848,960); Meta's cards' 109B and 400B add the vision tower and projector
    "llama-4-scout": (107.77, 0.005),
    "llama-4-maverick": (400.71, 0.005),
    # the card's "3B"; transformers' SmolLM3ForCausalLM of the file: 3,075,098,624 (tests/test_smollm3.py)
    "smollm3-3b": (3.075, 0.0005),
    # the card's "230 billion total parameters"; transformers' MiniMaxM2ForCausalLM of the file: 228,689,748,992
    # (tests/test_minimax_m2.py; the Hub's safetensors count, 228.70B, adds the bias buffers and the fp8 scales)
    "minimax-m2": (228.69, 0.005),
}


def test_every_example_is_listed() -> None:
    assert {p.parent.name for p in MODELS.glob("*/config.json")} == set(PUBLISHED)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_example_parses_to_the_published_size(name: str) -> None:
    spec = read_hf_config(MODELS / name / "config.json")
    assert spec.name == name
    size, tol = PUBLISHED[name]
    assert abs(spec.total_params() / 1e9 - size) <= tol, spec.total_params()


def test_llama_405b_shape() -> None:
    """Llama 3 paper (Dubey et al. 2024) Table 3: 126 layers, 16384 wide, FFN 53248, 128 heads, 8 KV heads."""
    s = read_hf_config(MODELS / "llama-3.1-405b", seq=8192)
    assert (s.layers, s.hidden, s.f, s.heads, s.k, s.d, s.vocab, s.seq) == (126, 16384, 53248, 128, 8, 128, 128256,
                                                                            8192)
    assert s.gated_mlp and s.norm == "rmsnorm" and s.position == "rotary" and not s.tied_embeddings
    assert not s.bias and not s.qkv_bias and s.rope_theta == 500000.0 and s.activation == "silu"


def test_dropout_as_trained() -> None:
    from profiler.hf_config import read_hf_json, trains_with_dropout

    assert trains_with_dropout(read_hf_json(MODELS / "gpt2"))
    for name in ("llama-3.1-8b", "mistral-7b", "qwen2.5-7b", "qwen3-8b", "phi-3-medium-4k", "gemma-2-9b",
                 "gemma-3-1b", "mixtral-8x7b", "qwen3-30b-a3b"):
        assert not trains_with_dropout(read_hf_json(MODELS / name)), name


def test_family_details() -> None:
    qwen = read_hf_config(MODELS / "qwen2.5-7b")
    assert qwen.qkv_bias and not qwen.bias and qwen.k == 4 and qwen.seq == 131072
    gpt2 = read_hf_config(MODELS / "gpt2" / "config.json")
    assert gpt2.tied_embeddings and gpt2.bias and gpt2.position == "learned" and gpt2.norm == "layernorm"
    assert (gpt2.layers, gpt2.hidden, gpt2.f, gpt2.seq, gpt2.vocab) == (12, 768, 3072, 1024, 50257)
    mistral = read_hf_config(MODELS / "mistral-7b")
    assert mistral.sliding_window == 4096 and mistral.global_every is None and mistral.vocab == 32000
    qwen3 = read_hf_config(MODELS / "qwen3-8b")  # per-head query/key norms, no biases, head_dim stated
    assert qwen3.qk_norm and not qwen3.qkv_bias and not qwen3.bias and (qwen3.d, qwen3.k) == (128, 8)
    assert not qwen.qk_norm and not mistral.qk_norm and not gpt2.qk_norm
    # Qwen3-8B's model card: 8.2B parameters, 6.95B of them not embeddings (the untied embedding and LM head)
    assert abs((qwen3.total_params() - 2 * qwen3.vocab * qwen3.hidden) / 1e9 - 6.95) < 0.005
    phi3 = read_hf_config(MODELS / "phi-3-medium-4k")  # Llama's computation, fused weights; a 2047-token window
    assert (phi3.k, phi3.d, phi3.f) == (10, 128, 17920) and not phi3.qk_norm and phi3.sliding_window == 2047
    part = json.loads((MODELS / "phi-3-medium-4k" / "config.json").read_text())
    # Phi-4-mini's partial rotary: the first 96 of each head's 128 dimensions (transformers' int(d * factor))
    assert spec_from_hf_dict({**part, "partial_rotary_factor": 0.75}, "phi-4-mini-like").rotary_dim == 96
    assert phi3.rotary_dim is None and phi3.rot_d == 128
    for factor, words in ((1.5, "gives 192"), (0.01, "gives 1"), (0.5078125, "gives 65")):
        with pytest.raises(HFConfigError, match=f"partial_rotary_factor: {factor:g} of the 128 dimensions of a head "
                                                f"{words}"):
            spec_from_hf_dict({**part, "partial_rotary_factor": factor}, "phi-4-mini-like")


def _llama(**changes: object) -> dict[str, object]:
    data = json.loads((ROOT / "tests" / "fixtures" / "tiny-llama" / "config.json").read_text())
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


@pytest.mark.parametrize(("changes", "field"), [
    ({"model_type": None}, "model_type"),
    # a Llama as a Qwen2 MoE without its experts: transformers' defaults (Qwen1.5-MoE-A2.7B's) are not taken
    ({"model_type": "qwen2_moe"}, "num_experts"),
    # a Mixtral must state its experts (MixtralConfig's default 8 is Mixtral 8x7B's)
    ({"model_type": "mixtral"}, "num_local_experts"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ({"hidden_size": "wide"}, "hidden_size"),
    ({"num_key_value_heads": 3}, "num_key_value_heads"),  # 4 query heads are no multiple of 3
    ({"hidden_act": "tanh"}, "hidden_act"),
    ({"num_hidden_layers": 10**9}, "num_hidden_layers"),
    # the shape must be stated: {"model_type": "llama"} alone was Llama 2 7B, transformers' defaults (QA, issue 13)
    ({"hidden_size": None}, "hidden_size"),
    ({"num_hidden_layers": None}, "num_hidden_layers"),
    ({"num_attention_heads": None}, "num_attention_heads"),
    ({"intermediate_size": None}, "intermediate_size"),
    ({"vocab_size": None}, "vocab_size"),
])
def test_bad_config_names_the_field(changes: dict[str, object], field: str) -> None:
    with pytest.raises(HFConfigError) as err:
        spec_from_hf_dict(_llama(**changes))
    assert err.value.field == field, str(err.value)


def test_a_bare_model_type_is_refused_not_filled_in() -> None:
    with pytest.raises(HFConfigError, match="missing: the model's shape must be stated") as err:
        spec_from_hf_dict({"model_type": "llama"})
    assert err.value.field in ("num_hidden_layers", "hidden_size", "num_attention_heads")
    gpt2 = json.loads((ROOT / "tests" / "fixtures" / "tiny-gpt2" / "config.json").read_text())
    with pytest.raises(HFConfigError) as err:
        spec_from_hf_dict({k: v for k, v in gpt2.items() if k != "n_embd"})
    assert err.value.field == "n_embd"


def test_tiny_llama_and_files(tmp_path: Path) -> None:
    spec = spec_from_hf_dict(_llama(), name="tiny")
    assert (spec.layers, spec.hidden, spec.heads, spec.k, spec.vocab, spec.seq) == (6, 64, 4, 2, 512, 16)
    assert read_hf_config(ROOT / "tests" / "fixtures" / "tiny-llama", seq=8).seq == 8
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(HFConfigError, match="not JSON"):
        read_hf_config(bad)
    with pytest.raises(HFConfigError, match="cannot read"):
        read_hf_config(tmp_path / "missing.json")


def test_a_seq_beyond_the_positions() -> None:
    """GPT-2's learned positions end at n_positions: a longer seq grew the position table (4096 on GPT-2's 1024,
    silently); it is refused, as the caller's seq, not a field of the file. Rotary positions reach further than
    max_position_embeddings but untrained: a warning, the spec as asked."""
    fixtures = ROOT / "tests" / "fixtures"
    assert read_hf_config(fixtures / "tiny-gpt2", seq=16).seq == 16
    with pytest.raises(SeqError, match=r"^seq: 17 is beyond the model's learned positions: its n_positions is 16"):
        read_hf_config(fixtures / "tiny-gpt2", seq=17)
    assert SeqError("x").field == "seq"  # (an HFConfigError: `pipeplan run --hf-config` words it in one line too)
    warned: list[str] = []
    assert read_hf_config(fixtures / "tiny-llama", seq=16, warn=warned.append).seq == 16 and warned == []
    spec = read_hf_config(fixtures / "tiny-llama", seq=64, warn=warned.append)
    assert spec.seq == 64 and len(warned) == 1 and warned[0].startswith(
        "seq 64 is beyond max_position_embeddings (16): the model was not trained for so long a sequence")
    assert warned[0] in spec.source


def test_llama_8b_flops_match_6n_plus_attention() -> None:
    """The operator model's FLOPs of Llama 3.1 8B (one sequence of 8192, forward + backward) within 2% of
    ``6 N s`` (N without the embedding table, whose lookup does no arithmetic) plus attention by hand:
    ``q k^T`` and ``att v`` are ``2 s^2 (a d)`` each forward (unmasked), three times that with the backward."""
    from planner.operators import embedding_operators, head_operators, layer_operators

    spec = read_hf_config(MODELS / "llama-3.1-8b", seq=8192)
    total = 0.0
    for operators, count in ((embedding_operators, 1), (layer_operators, spec.layers), (head_operators, 1)):
        total += count * sum(op.fwd_flops + op.bwd_flops for op in operators(spec, 1))
    n = spec.total_params() - spec.vocab * spec.hidden
    s, a_d = spec.seq, spec.heads * spec.d
    by_hand = 6 * n * s + spec.layers * 3 * (2 * 2 * s * s * a_d)
    assert abs(total / by_hand - 1) < 0.02, total / by_hand


def test_profile_analytic_hf_config(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pipeplan.cli import app
    from planner.profile import load_profile

    out = tmp_path / "p.json"
    res = CliRunner().invoke(app, ["profile-analytic", "--hf-config", str(MODELS / "qwen2.5-7b"), "--seq", "2048",
                                   "--device", "h100-80gb", "--out", str(out)])
    assert res.exit_code == 0, res.output
    prof = load_profile(out)
    assert prof.name == "qwen2.5-7b" and len(prof.layers) == 30 and prof.shape is not None
    assert prof.total_params == read_hf_config(MODELS / "qwen2.5-7b").total_params()
    assert prof.shape.seq == 2048 and prof.shape.ffn_hidden == 18944
    bad = CliRunner().invoke(app, ["profile-analytic", "--hf-config", str(tmp_path / "none.json"), "--out",
                                   str(out)])
    assert bad.exit_code != 0 and "cannot read" in bad.output


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_every_example_yields_a_plan_through_the_cli(name: str, tmp_path: Path) -> None:
    """config.json -> profile-analytic -> plan, on DGX H100 nodes (enough of them to hold 405B's states; two nodes for
    a model under 50B parameters, whose every schedule, t, D, b and e the search still tries)."""
    from typer.testing import CliRunner

    from pipeplan.cli import app

    prof = tmp_path / "p.json"
    runner = CliRunner()
    res = runner.invoke(app, ["profile-analytic", "--hf-config", str(MODELS / name), "--seq", "1024",
                              "--device", "h100-80gb", "--out", str(prof)])
    assert res.exit_code == 0, res.output
    gpus = {"llama-3.1-405b": "512", "deepseek-v3": "1024", "llama-4-maverick": "512"}.get(
        name, "16" if PUBLISHED[name][0] < 50 else "64")
    res = runner.invoke(app, ["plan", "--profile", str(prof), "--cluster", str(ROOT / "examples" / "clusters" /
                                                                              "dgx-h100-80gb.json"),
                              "--global-batch", "256", "--gpus", gpus, "--top", "2", "--json"])
    assert res.exit_code == 0, res.output
    cands = json.loads(res.output)["candidates"]
    assert cands and cands[0]["fits"] and cands[0]["tensor"] <= 8, cands[:1]


def test_gemma_features_the_exports_cannot_express_are_named() -> None:
    """Megatron-LM's and torchtitan's Llama-shaped model settings have no Gemma embedding scale, sandwich norms,
    soft-caps or GeGLU: an export of a Gemma 2 plan says so (planner.export.common.model_gaps_note); Llama's and
    Qwen3's say nothing; Gemma 1's names the scale and its GeGLU only."""
    from planner.export.common import model_gaps_note

    gemma2 = read_hf_config(MODELS / "gemma-2-9b")
    note = model_gaps_note(gemma2, "megatron", "arguments")
    assert note is not None and all(w in note for w in ("sqrt(hidden)", "outputs", "soft-capped at 50",
                                                        "soft-capped at 30", "GeGLU"))
    for name in ("llama-3.1-8b", "qwen3-8b"):
        assert model_gaps_note(read_hf_config(MODELS / name), "torchtitan", "flavor") is None
    gemma1 = spec_from_hf_dict({**json.loads((MODELS / "gemma-2-9b" / "config.json").read_text()),
                                "model_type": "gemma"}, name="gemma")
    assert gemma1.embedding_scale and not gemma1.sandwich_norm and gemma1.attention_softcap is None
    note = model_gaps_note(gemma1, "megatron", "arguments")
    assert note is not None and "soft" not in note and "GeGLU" in note


def test_sliding_windows_are_read_and_cost_the_flash_kernel_less(tmp_path: Path) -> None:
    """Mistral's window (every layer), Phi-3's and Gemma 2's (every other layer, from its ``layer_types``) are read
    into the spec; the analytic profile with the flash kernel gives the windowed layers less attention time where
    the window is shorter than the sequence, and the same where it spans it; the unfused core (which masks the
    whole square) costs the same either way. Qwen2's window is off (``use_sliding_window`` false)."""
    from planner.analytic import analytic_profile
    from planner.operators import OperatorOptions

    assert read_hf_config(MODELS / "qwen2.5-7b").sliding_window is None
    for name, window, every in (("mistral-7b", 4096, None), ("phi-3-medium-4k", 2047, None),
                                ("gemma-2-9b", 4096, 2)):
        spec = read_hf_config(MODELS / name, seq=2 * window)
        assert (spec.sliding_window, spec.global_every) == (window, every)
        full = spec.model_copy(update={"sliding_window": None, "global_every": None})
        flash = OperatorOptions(attention="flash")
        ours = analytic_profile(spec, "h100-80gb", options=flash, tensor_sizes=(1,))
        plain = analytic_profile(full, "h100-80gb", options=flash, tensor_sizes=(1,))
        fwd = [layer.fwd_time[1] for layer in ours.layers[1:-1]]
        for i, t in enumerate(fwd):
            windowed = spec.layer_window(i) is not None
            assert windowed == (every is None or (i + 1) % every != 0)
            assert (t < plain.layers[1 + i].fwd_time[1]) == windowed, (name, i)
        unfused = [analytic_profile(x, "h100-80gb", tensor_sizes=(1,)).layers[1].fwd_time[1] for x in (spec, full)]
        assert unfused[0] == unfused[1]
        short = read_hf_config(MODELS / name, seq=window)  # the window spans the sequence: full causal attention
        assert all(short.layer_window(i) is None for i in range(short.layers))


def test_a_window_pattern_other_than_every_nth_global_is_refused() -> None:
    data = {**json.loads((MODELS / "gemma-2-9b" / "config.json").read_text()),
            "layer_types": ["sliding_attention"] * 2 + ["full_attention"] * 40}
    with pytest.raises(HFConfigError, match="layer_types"):
        spec_from_hf_dict(data, name="g")


def test_a_multimodal_config_is_read_as_its_language_model() -> None:
    """Gemma 3 4B and up (model_type gemma3), Mistral Small 3.1 (mistral3) and LLaVA are published as multimodal
    configs: their language model is read from the text_config, transformers' defaults filled in (the file states
    only what differs: here Gemma 3 27B's shape), and what is left out is said (the vision tower); one without a
    text_config, or whose language model is of a type not read, is refused naming the field."""
    from profiler.hf_config import trains_with_dropout

    data = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"], "mm_tokens_per_image": 256,
            "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
                            "model_type": "gemma3_text", "num_attention_heads": 32, "num_hidden_layers": 62,
                            "num_key_value_heads": 16, "query_pre_attn_scalar": 168, "sliding_window": 1024},
            "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model", "num_hidden_layers": 27}}
    said: list[str] = []
    spec = spec_from_hf_dict(data, name="gemma-3-27b", seq=8192, warn=said.append)
    assert (spec.layers, spec.hidden, spec.heads, spec.k, spec.d, spec.vocab) == (62, 5376, 32, 16, 128, 262208)
    assert (spec.sliding_window, spec.global_every, spec.rope_local_theta) == (1024, 6, 10000.0) and spec.qk_norm
    assert abs(spec.total_params() / 1e9 - 27.0) < 0.05  # the language model of Gemma 3 27B
    assert len(said) == 1 and "vision tower" in said[0] and "vision tower" in spec.source
    assert not trains_with_dropout(data)
    with pytest.raises(HFConfigError, match="text_config"):
        spec_from_hf_dict({k: v for k, v in data.items() if k != "text_config"})
    # Mistral Small 3.1 (mistral3: a Mistral language model, 23.6B of its 24B beside the Pixtral encoder) and LLaVA
    mistral = spec_from_hf_dict({"model_type": "mistral3", "text_config": {
        "head_dim": 128, "hidden_size": 5120, "intermediate_size": 32768, "max_position_embeddings": 131072,
        "model_type": "mistral", "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8,
        "rope_theta": 1e9, "sliding_window": None, "vocab_size": 131072}}, name="ms", seq=8192)
    assert (mistral.layers, mistral.k, mistral.sliding_window) == (40, 8, None)
    assert abs(mistral.total_params() / 1e9 - 23.57) < 0.005
    llava = spec_from_hf_dict({"model_type": "llava", "text_config": {
        "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "intermediate_size": 11008, "vocab_size": 32064}}, name="llava", seq=2048)
    assert abs(llava.total_params() / 1e9 - 6.74) < 0.005  # Vicuna 7B (Llama 2 7B's shape)
    with pytest.raises(HFConfigError, match="text_config.model_type: .*'opt' is not supported"):
        spec_from_hf_dict({"model_type": "llava", "text_config": {"model_type": "opt"}})


# ---- mixtures of experts -------------------------------------------------------------------------------------------

FIXTURES = ROOT / "tests" / "fixtures"


def test_moe_examples_parse_to_their_published_counts() -> None:
    """Mixtral 8x7B (Jiang et al. 2024, section 2: 46.7B parameters, 13B active; its config.json: 32 layers of 8
    experts of 14336, top-2) and Qwen3-30B-A3B (model card: 30.5B, 3.3B activated, 48 layers, 128 experts, 8
    activated; its config.json: experts of 768, norm_topk_prob true)."""
    mixtral = read_hf_config(MODELS / "mixtral-8x7b")
    assert mixtral.total_params() == 46_702_792_704
    assert (mixtral.layers, mixtral.hidden, mixtral.heads, mixtral.k, mixtral.vocab, mixtral.seq) == (32, 4096, 32, 8,
                                                                                                     32000, 32768)
    assert (mixtral.experts, mixtral.experts_per_token, mixtral.f, mixtral.f_e) == (8, 2, 14336, 14336)
    assert mixtral.normalize_topk and mixtral.gated_mlp and not mixtral.qk_norm and mixtral.sliding_window is None
    assert mixtral.rope_theta == 1e6 and not mixtral.tied_embeddings
    qwen = read_hf_config(MODELS / "qwen3-30b-a3b")
    assert qwen.total_params() == 30_532_122_624
    assert (qwen.layers, qwen.hidden, qwen.heads, qwen.k, qwen.d, qwen.vocab, qwen.seq) == (48, 2048, 32, 4, 128,
                                                                                            151936, 40960)
    assert (qwen.experts, qwen.experts_per_token, qwen.f, qwen.f_e) == (128, 8, 6144, 768)
    assert qwen.normalize_topk and qwen.qk_norm and not qwen.qkv_bias and qwen.sliding_window is None
    # the model card's "Number of Parameters (Non-Embedding): 29.9B" (the untied embedding and LM head out)
    assert abs((qwen.total_params() - 2 * qwen.vocab * qwen.hidden) / 1e9 - 29.9) < 0.05
    # the active parameters: Mixtral's 12.9B ("13B active"), Qwen3's "3.3B activated" (3.35B)
    for spec, active in ((mixtral, 12.9), (qwen, 3.3)):
        n = spec.total_params() - spec.layers * (spec.mlp_params() - spec.active_mlp_params())
        assert abs(n / 1e9 - active) < 0.06, n


def test_moe_fixtures_and_their_defaults() -> None:
    """The tiny fixtures; Qwen3 MoE's norm_topk_prob takes transformers' default (false) where the file says none;
    Mixtral's expert count may be given by MixtralConfig's alias num_experts; a non-zero router_jitter_noise is
    noted as not modelled; Mixtral's and Qwen3 MoE's sliding windows apply to every layer."""
    mixtral = read_hf_config(FIXTURES / "tiny-mixtral")
    assert (mixtral.experts, mixtral.experts_per_token, mixtral.f_e, mixtral.normalize_topk) == (4, 2, 96, True)
    assert "router_jitter_noise" not in mixtral.source
    data = json.loads((FIXTURES / "tiny-qwen3-moe" / "config.json").read_text())
    qwen = spec_from_hf_dict(data, "q")
    assert (qwen.experts, qwen.experts_per_token, qwen.f, qwen.f_e, qwen.normalize_topk) == (4, 2, 96, 48, True)
    assert qwen.qk_norm and qwen.d == 32
    assert not spec_from_hf_dict({k: v for k, v in data.items() if k != "norm_topk_prob"}, "q").normalize_topk
    windowed = spec_from_hf_dict({**data, "use_sliding_window": True, "sliding_window": 8}, "q", seq=16)
    assert windowed.sliding_window == 8 and all(windowed.layer_window(i) == 8 for i in range(4))
    assert spec_from_hf_dict({**data, "sliding_window": 8}, "q").sliding_window is None  # use_sliding_window false
    tiny = json.loads((FIXTURES / "tiny-mixtral" / "config.json").read_text())
    alias = {k: v for k, v in tiny.items() if k != "num_local_experts"} | {"num_experts": 4}
    assert spec_from_hf_dict(alias, "m").experts == 4
    jitter = spec_from_hf_dict({**tiny, "router_jitter_noise": 0.01}, "m")
    assert "router_jitter_noise (0.01) not modelled" in jitter.source
    window = spec_from_hf_dict({**tiny, "sliding_window": 8}, "m", seq=16)
    assert all(window.layer_window(i) == 8 for i in range(4))


def _tiny(fixture: str, **changes: object) -> dict[str, object]:
    data = json.loads((FIXTURES / fixture / "config.json").read_text())
    data.update(changes)
    return {k: v for k, v in data.items() if v is not None}


@pytest.mark.parametrize(("fixture", "changes", "field", "words"), [
    ("tiny-mixtral", {"num_experts_per_tok": 5}, "num_experts_per_tok", "5 is more than the 4 experts"),
    ("tiny-qwen3-moe", {"num_experts_per_tok": 5}, "num_experts_per_tok", "5 is more than the 4 experts"),
    ("tiny-mixtral", {"num_local_experts": None}, "num_local_experts", "missing"),
    ("tiny-mixtral", {"num_experts_per_tok": None}, "num_experts_per_tok", "missing"),
    ("tiny-qwen3-moe", {"num_experts": None}, "num_experts", "missing"),
    ("tiny-qwen3-moe", {"moe_intermediate_size": None}, "moe_intermediate_size", "missing"),
    ("tiny-qwen3-moe", {"intermediate_size": None}, "intermediate_size", "missing"),
    ("tiny-mixtral", {"num_local_experts": 1, "num_experts_per_tok": 1}, "num_local_experts",
     "greater than or equal to 2"),
    ("tiny-qwen3-moe", {"num_experts": 0}, "num_experts", "positive integer"),
    ("tiny-qwen3-moe", {"num_experts_per_tok": "two"}, "num_experts_per_tok", "positive integer"),
    ("tiny-mixtral", {"num_local_experts": 10**6}, "num_local_experts", "beyond any published model"),
    ("tiny-qwen3-moe", {"moe_intermediate_size": -1}, "moe_intermediate_size", "positive integer"),
    ("tiny-qwen3-moe", {"decoder_sparse_step": 0}, "decoder_sparse_step", "a whole number of 1 or more"),
    ("tiny-qwen3-moe", {"decoder_sparse_step": 5}, "decoder_sparse_step", "every one of the 4 layers would be dense"),
    ("tiny-qwen3-moe", {"mlp_only_layers": [0, 1, 2, 3]}, "mlp_only_layers",
     "every one of the 4 layers would be dense"),
    ("tiny-qwen3-moe", {"mlp_only_layers": [4]}, "mlp_only_layers", "4 is not a layer of the 4"),
    ("tiny-qwen2-moe", {"shared_expert_intermediate_size": None}, "shared_expert_intermediate_size", "missing"),
    ("tiny-qwen2-moe", {"shared_expert_intermediate_size": 0}, "shared_expert_intermediate_size", "positive integer"),
    ("tiny-qwen2-moe", {"qkv_bias": "yes"}, "qkv_bias", "expected bool"),
    ("tiny-qwen3-moe", {"mlp_only_layers": "first"}, "mlp_only_layers", "expected a list"),
    ("tiny-mixtral", {"router_jitter_noise": -0.1}, "router_jitter_noise", "a number of 0 or more"),
])
def test_bad_moe_config_names_the_field(fixture: str, changes: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(HFConfigError) as err:
        spec_from_hf_dict(_tiny(fixture, **changes))
    assert err.value.field == field and words in err.value.message, str(err.value)


def test_an_unknown_model_type_is_refused_naming_those_read() -> None:
    with pytest.raises(HFConfigError) as err:
        spec_from_hf_dict(_tiny("tiny-mixtral", model_type="jamba"))
    assert err.value.field == "model_type" and "'jamba' is not supported" in err.value.message, str(err.value)
    assert "supported: " in err.value.message and "mixtral" in err.value.message
    assert "llama4_text" in err.value.message and "llama4" in err.value.message


def test_dense_layers_and_shared_experts() -> None:
    """Qwen MoE's dense layers (transformers' decoder layer: the dense MLP where ``layer_idx in mlp_only_layers`` or
    ``(layer_idx + 1) % decoder_sparse_step``) and Qwen2 MoE's gated shared expert; Qwen1.5-MoE-A2.7B's model card:
    "14.3B parameters in total and 2.7B activated" (24 layers of 60 experts of 1408, top 4, a shared expert of 5632),
    and the count equals transformers' Qwen2MoeForCausalLM's (checked on the meta device: 14,315,784,192)."""
    qwen = read_hf_config(MODELS / "qwen1.5-moe-a2.7b")
    assert qwen.total_params() == 14_315_784_192
    assert (qwen.experts, qwen.experts_per_token, qwen.f, qwen.f_e, qwen.shared_expert_ffn_hidden) == (60, 4, 5632,
                                                                                                      1408, 5632)
    assert qwen.shared_expert_gate and qwen.qkv_bias and not qwen.qk_norm and not qwen.normalize_topk
    assert qwen.dense_layers == () and qwen.moe_layers == 24 and qwen.seq == 8192
    active = qwen.total_params() - qwen.layers * (qwen.mlp_params() - qwen.active_mlp_params())
    # 2.69B with the untied embedding and LM head (0.62B): the card's 2.7B activated
    assert abs(active / 1e9 - 2.7) < 0.05, active
    tiny = read_hf_config(FIXTURES / "tiny-qwen2-moe")
    assert tiny.dense_layers == (1,) and [tiny.moe_layer(i) for i in range(4)] == [True, False, True, True]
    assert tiny.block_params(1) == tiny.layer_params(False) < tiny.layer_params() == tiny.block_params(0)
    # a dense layer: attention, norms and one MLP of intermediate_size; a layer with experts: 4 experts of 48, the
    # router, the shared expert of 80 and its gate
    assert tiny.layer_params() - tiny.layer_params(False) == (4 * 3 * 64 * 48 + 64 * 4 + 3 * 64 * 80 + 64
                                                              - 3 * 64 * 96)
    data = json.loads((FIXTURES / "tiny-qwen3-moe" / "config.json").read_text())
    every_other = spec_from_hf_dict({**data, "decoder_sparse_step": 2}, "q")
    assert every_other.dense_layers == (0, 2) and every_other.shared_expert_ffn_hidden is None
    both = spec_from_hf_dict({**data, "decoder_sparse_step": 2, "mlp_only_layers": [1]}, "q")
    assert both.dense_layers == (0, 1, 2) and both.moe_layers == 1
    no_gate = spec_from_hf_dict({**json.loads((FIXTURES / "tiny-qwen2-moe" / "config.json").read_text()),
                                 "qkv_bias": False}, "q")
    assert not no_gate.qkv_bias and no_gate.shared_expert_gate


def test_gpt_oss_configs() -> None:
    """gpt-oss (OpenAI 2025, "gpt-oss-120b & gpt-oss-20b Model Card", section 2.1 and Table 1: 116.83B parameters,
    5.13B active per token without the embedding, for 120b; 20.91B and 3.61B for 20b): 36 (24) layers of hidden 2880,
    64 query heads of 64, 8 key/value heads, 128 (32) experts of 2880, top 4, attention sinks, biases on every linear
    layer, the clamped quick-GELU gate times up + 1, a 128-token window on every other layer from the first. Each
    count equals transformers' GptOssForCausalLM's (checked on the meta device: 116,829,156,672 and 20,914,757,184)."""
    big = read_hf_config(MODELS / "gpt-oss-120b", seq=4096)
    assert big.total_params() == 116_829_156_672
    assert (big.layers, big.hidden, big.heads, big.k, big.d, big.f, big.vocab) == (36, 2880, 64, 8, 64, 2880, 201088)
    assert (big.experts, big.experts_per_token, big.f_e, big.normalize_topk) == (128, 4, 2880, True)
    assert big.bias and big.attention_sinks and not big.qkv_bias and not big.tied_embeddings
    assert (big.activation, big.glu_linear_offset, big.glu_clamp) == ("quick_gelu", 1.0, 7.0)
    assert (big.sliding_window, big.global_every, big.rope_theta) == (128, 2, 150000.0)
    assert [big.layer_window(i) for i in range(3)] == [128, None, 128]
    active = big.total_params() - big.layers * (big.mlp_params() - big.active_mlp_params()) - big.embedding_params()
    assert active == 5_132_849_472  # the card's 5.13B
    assert "rope_scaling (yarn)" in big.source
    small = read_hf_config(MODELS / "gpt-oss-20b")
    assert small.total_params() == 20_914_757_184 and (small.layers, small.experts) == (24, 32)
    data = json.loads((MODELS / "gpt-oss-120b" / "config.json").read_text())
    quantized = spec_from_hf_dict({**data, "quantization_config": {"quant_method": "mxfp4"}}, "q")
    assert quantized == spec_from_hf_dict(data, "q").model_copy(update={"source": quantized.source})
    assert "quantization_config (mxfp4) not modelled" in quantized.source


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"attention_bias": False}, "attention_bias", "experts and router always carry biases"),
    ({"swiglu_alpha": 1.0}, "swiglu_alpha", "1.702 (quick_gelu) only"),
    ({"swiglu_limit": -1.0}, "swiglu_limit", "a number above 0"),
    ({"num_local_experts": None}, "num_local_experts", "missing"),
])
def test_bad_gpt_oss_config_names_the_field(changes: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(HFConfigError) as err:
        spec_from_hf_dict(_tiny("tiny-gpt-oss", **changes))
    assert err.value.field == field and words in err.value.message, str(err.value)


def test_glm4_moe_configs() -> None:
    """GLM-4.5-Air (``glm4_moe``; Zhipu AI 2025, "GLM-4.5: Agentic, Reasoning, and Coding (ARC) Foundation Models",
    Table 1: 106B total, 12B active; 46 layers, the first dense, 128 routed experts of 1408 and 1 shared, top 8, 96
    heads of 128, 8 key/value heads, half of each head rotated, query/key/value biases): DeepSeek-V3's routing
    (sigmoid scores with the choice's bias, renormalised) beside standard grouped-query attention. The count equals
    transformers' Glm4MoeForCausalLM's (checked on the meta device: 106,852,245,504; the tiny fixture's 184,224)."""
    air = read_hf_config(MODELS / "glm-4.5-air")
    assert air.total_params() == 106_852_245_504
    assert (air.layers, air.hidden, air.heads, air.k, air.d, air.rotary_dim, air.vocab) == (46, 4096, 96, 8, 128, 64,
                                                                                            151552)
    assert (air.experts, air.experts_per_token, air.f_e, air.f, air.shared_expert_ffn_hidden) == (128, 8, 1408, 10944,
                                                                                                1408)
    assert air.dense_layers == (0,) and air.qkv_bias and not air.bias and not air.qk_norm and not air.mla
    assert (air.router_score, air.router_bias, air.router_groups, air.normalize_topk, air.routed_scaling) == (
        "sigmoid", True, None, True, 1.0)
    active = air.total_params() - air.moe_layers * (air.mlp_params() - air.active_mlp_params()) \
        - air.embedding_params() - air.vocab * air.hidden
    assert abs(active / 1e9 - 12) < 0.5, active
    assert "multi-token prediction layers are not planned" in air.source
    tiny = read_hf_config(FIXTURES / "tiny-glm4-moe")
    assert tiny.total_params() == 184_224 and tiny.qk_norm and tiny.rotary_dim == 8
    assert (tiny.router_groups, tiny.router_group_topk, tiny.routed_scaling) == (2, 1, 2.5)


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"n_shared_experts": None}, "n_shared_experts", "missing"),
    ({"first_k_dense_replace": None}, "first_k_dense_replace", "missing"),
    ({"first_k_dense_replace": 3}, "first_k_dense_replace", "every one of the 3 layers would be dense"),
    ({"use_qk_norm": "yes"}, "use_qk_norm", ""),
    ({"partial_rotary_factor": 0.1}, "partial_rotary_factor", "gives 1"),
])
def test_bad_glm4_moe_config_names_the_field(changes: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(HFConfigError) as err:
        spec_from_hf_dict(_tiny("tiny-glm4-moe", **changes))
    assert err.value.field == field and words in err.value.message, str(err.value)


def test_deepseek_configs() -> None:
    """DeepSeek-V3 (DeepSeek-AI 2024, "DeepSeek-V3 Technical Report", section 1 and 2.1: 671B parameters, 37B active
    per token; 61 layers, the first 3 dense, 256 routed experts of 2048 and 1 shared, 8 per token in at most 4 of 8
    groups, sigmoid scores with a bias for the choice, weights renormalised and times 2.5; latent attention with
    c = 512, c' = 1536, 128 heads of 128 + 64 query/key and 128 value dimensions) and DeepSeek-V2-Lite (15.7B: 27
    layers, the first dense, 64 experts of 1408 and 2 shared, top 6 by softmax, no query latent). Each count equals
    transformers' own model's (checked on the meta device: 671,026,404,352 and 15,706,484,224)."""
    v3 = read_hf_config(MODELS / "deepseek-v3")
    assert v3.total_params() == 671_026_404_352
    assert (v3.layers, v3.hidden, v3.heads, v3.k, v3.d, v3.v_d, v3.vocab) == (61, 7168, 128, 128, 192, 128, 129280)
    assert (v3.kv_lora_rank, v3.q_lora_rank, v3.qk_rope_head_dim) == (512, 1536, 64) and v3.mla
    assert (v3.experts, v3.experts_per_token, v3.f_e, v3.f, v3.shared_expert_ffn_hidden) == (256, 8, 2048, 18432, 2048)
    assert v3.dense_layers == (0, 1, 2) and not v3.shared_expert_gate
    assert (v3.router_score, v3.router_groups, v3.router_group_topk, v3.router_bias, v3.routed_scaling,
            v3.normalize_topk) == ("sigmoid", 8, 4, True, 2.5, True)
    active = v3.total_params() - v3.moe_layers * (v3.mlp_params() - v3.active_mlp_params())
    assert abs(active / 1e9 - 37) < 1, active
    assert "multi-token prediction layers are not planned" in v3.source and "rope_scaling (yarn)" in v3.source
    lite = read_hf_config(MODELS / "deepseek-v2-lite")
    assert lite.total_params() == 15_706_484_224
    assert lite.q_lora_rank is None and lite.kv_lora_rank == 512 and lite.dense_layers == (0,)
    assert (lite.experts, lite.experts_per_token, lite.shared_expert_ffn_hidden) == (64, 6, 2 * 1408)
    assert (lite.router_score, lite.router_groups, lite.normalize_topk, lite.routed_scaling) == ("softmax", None,
                                                                                                False, 1.0)
    tiny = json.loads((FIXTURES / "tiny-deepseek-v2-lite" / "config.json").read_text())
    grouped = spec_from_hf_dict({**tiny, "topk_method": "group_limited_greedy", "n_group": 4, "topk_group": 2}, "g")
    assert (grouped.router_groups, grouped.router_group_topk, grouped.router_score) == (4, 2, "softmax")
    assert spec_from_hf_dict({**tiny, "n_group": 4, "topk_group": 2}, "g").router_groups is None  # greedy: no groups
    noted = spec_from_hf_dict({**tiny, "norm_topk_prob": True}, "n")
    assert not noted.normalize_topk and "norm_topk_prob is not applied" in noted.source
    assert spec_from_hf_dict({**tiny, "n_shared_experts": 0}, "s").shared_expert_ffn_hidden is None


@pytest.mark.parametrize(("fixture", "changes", "field", "words"), [
    ("tiny-deepseek-v3", {"kv_lora_rank": None}, "kv_lora_rank", "missing"),
    ("tiny-deepseek-v2-lite", {"q_lora_rank": "absent"}, "q_lora_rank", ""),
    ("tiny-deepseek-v3", {"first_k_dense_replace": 3}, "first_k_dense_replace", "every one of the 3 layers"),
    ("tiny-deepseek-v3", {"qk_rope_head_dim": 0}, "qk_rope_head_dim", "a whole number of 1 or more"),
    ("tiny-deepseek-v3", {"topk_group": 5}, "topk_group", "more than the 4 groups"),
    ("tiny-deepseek-v3", {"n_group": 3}, "n_group", "does not divide the 8 experts"),
    ("tiny-deepseek-v3", {"routed_scaling_factor": 0.0}, "routed_scaling_factor", "a number above 0"),
    ("tiny-deepseek-v3", {"n_shared_experts": -1}, "n_shared_experts", "0 or more"),
    ("tiny-deepseek-v2-lite", {"topk_method": "noaux_tc"}, "topk_method", "greedy or group_limited_greedy"),
    ("tiny-deepseek-v3", {"attention_bias": True}, "attention_bias", "without biases"),
])
def test_bad_deepseek_config_names_the_field(fixture: str, changes: dict[str, object], field: str,
                                             words: str) -> None:
    data = json.loads((FIXTURES / fixture / "config.json").read_text())
    data.update(changes)
    with pytest.raises(HFConfigError) as err:  # (a change to None drops the field)
        spec_from_hf_dict({k: v for k, v in data.items() if v is not None or k not in changes})
    assert err.value.field == field and words in err.value.message, str(err.value)


def test_whole_numbers_for_float_fields_are_taken() -> None:
    """A config.json's ``0.0`` arrives as ``0`` from a JavaScript client (the UI's upload: ``JSON.parse`` then
    ``JSON.stringify``); transformers' strict config classes refuse an int for a float field (DeepSeek's
    ``attention_dropout``, Gemma's soft-caps ``30.0`` and ``50.0``), so the fields the class declares float are given
    as floats first. A wrong type is still refused naming the field."""
    data = json.loads((MODELS / "deepseek-v2-lite" / "config.json").read_text())
    js = {**data, "attention_dropout": 0, "routed_scaling_factor": 1, "initializer_range": 0}
    assert spec_from_hf_dict(js, "js") == spec_from_hf_dict(data, "js")
    with pytest.raises(HFConfigError) as err:
        spec_from_hf_dict({**data, "attention_dropout": "none"}, "js")
    assert err.value.field == "attention_dropout"
    with pytest.raises(HFConfigError) as err:  # (float() of it overflows: a 500 through the API before)
        spec_from_hf_dict({**data, "attention_dropout": 10**400}, "js")
    assert err.value.field == "attention_dropout" and "beyond any float" in err.value.message
    # a multimodal config's text_config, by its own type's declarations (Gemma 3's strict text config)
    text = {"model_type": "gemma3_text", "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
            "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 128, "vocab_size": 1024,
            "rope_theta": 1000000.0, "rms_norm_eps": 1e-06, "attention_dropout": 0.0,
            "final_logit_softcapping": 30.0}
    as_sent = {**text, "rope_theta": 1000000, "attention_dropout": 0, "final_logit_softcapping": 30}
    assert (spec_from_hf_dict({"model_type": "gemma3", "text_config": as_sent}, "g")
            == spec_from_hf_dict({"model_type": "gemma3", "text_config": text}, "g"))


def test_norm_epsilon_is_read() -> None:
    """The norms' epsilon (numerics only, no cost): Llama 3.1's rms_norm_eps 1e-5 is the default and left out of the
    record; Qwen3's and OLMo 2's 1e-6 kept; GPT-2's layer_norm_epsilon; a value outside (0, 1) refused naming the
    field."""
    assert read_hf_config(MODELS / "llama-3.1-8b").norm_eps == 1e-5
    assert "norm_eps" not in read_hf_config(MODELS / "llama-3.1-8b").model_dump()
    assert read_hf_config(MODELS / "qwen3-8b").norm_eps == read_hf_config(MODELS / "olmo-2-7b").norm_eps == 1e-6
    gpt2 = json.loads((MODELS / "gpt2" / "config.json").read_text())
    assert spec_from_hf_dict({**gpt2, "layer_norm_epsilon": 1e-6}, "g").norm_eps == 1e-6
    for bad in (0, 1.5, "small"):
        with pytest.raises(HFConfigError) as err:
            spec_from_hf_dict(_llama(rms_norm_eps=bad), "l")
        assert err.value.field == "rms_norm_eps", str(err.value)


@pytest.mark.parametrize("fixture", ["tiny-llama", "tiny-qwen3", "tiny-gemma2", "tiny-qwen3-moe", "tiny-olmo2"])
def test_attention_bias_without_mlp_bias_is_refused_where_it_biases_the_output(fixture: str) -> None:
    """Where transformers' attention takes ``attention_bias`` for its output projection too (Llama, Qwen3, Gemma, OLMo:
    ``o_proj`` with ``bias=config.attention_bias``), the file's attention biases without MLP biases are refused naming
    the field: planned as query/key/value biases only, the model would lack the output's (it was, silently)."""
    with pytest.raises(HFConfigError, match="attention_bias: true without mlp_bias") as err:
        spec_from_hf_dict(_tiny(fixture, attention_bias=True))
    assert err.value.field == "attention_bias"


def test_mlp_bias_without_attention_bias_is_refused_where_the_mlp_reads_it() -> None:
    """Llama's MLP reads ``mlp_bias`` (``LlamaMLP``: bias=config.mlp_bias): MLP biases without the attention's are no
    ModelSpec's, refused naming the field (they were dropped); Qwen3's MLP reads none, so its file's is ignored."""
    with pytest.raises(HFConfigError, match="mlp_bias: true without attention_bias") as err:
        spec_from_hf_dict(_tiny("tiny-llama", mlp_bias=True))
    assert err.value.field == "mlp_bias"
    assert not spec_from_hf_dict(_tiny("tiny-qwen3", mlp_bias=True)).bias


def test_attention_bias_read_as_transformers_reads_it() -> None:
    """Llama's with mlp_bias: every linear layer biased; Mistral's attention reads no attention_bias (its projections
    are unbiased whatever the file says), so the file's is ignored; GLM-4.5's biases q, k and v only."""
    both = spec_from_hf_dict(_tiny("tiny-llama", attention_bias=True, mlp_bias=True))
    assert both.bias and both.total_params() > spec_from_hf_dict(_tiny("tiny-llama")).total_params()
    mistral = _tiny("tiny-llama", model_type="mistral", attention_bias=True)
    mistral.pop("mlp_bias", None)
    assert not spec_from_hf_dict(mistral).qkv_bias
    glm = spec_from_hf_dict(_tiny("tiny-glm4-moe", attention_bias=True))
    assert glm.qkv_bias and not glm.bias
