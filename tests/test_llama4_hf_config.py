"""Llama 4's config.json read as a ModelSpec (profiler/hf_config.py's ``_llama4``): the tiny fixture field for field,
the published Scout and Maverick configs (multimodal ``llama4``: their ``text_config``) counted as transformers'
``Llama4ForCausalLM`` counts them, each refusal naming the config's field, and ``pipeplan profile --hf-config`` of
the fixture (transformers' own layers, timed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from profiler.hf_config import HFConfigError, read_hf_config, spec_from_hf_dict

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "tests" / "fixtures" / "tiny-llama4"
MODELS = ROOT / "examples" / "models"


def _tiny(**changes: object) -> dict[str, Any]:
    """The fixture's fields with ``changes`` (a None value: the field left out; "null": the field null)."""
    data = json.loads((TINY / "config.json").read_text())
    data.update(changes)
    return {k: None if v == "null" else v for k, v in data.items() if v is not None}


def _transformers_count(text_config: dict[str, Any], meta: bool) -> int:
    """transformers' ``Llama4ForCausalLM`` of a ``llama4_text`` config's fields: its parameter count (on the meta
    device: no memory)."""
    import torch
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    fields = {k: v for k, v in text_config.items() if k != "model_type"}
    # (transformers 5's strict Llama4TextConfig refuses Scout's published whole number 4: given as its truth)
    fields["attn_temperature_tuning"] = bool(fields.get("attn_temperature_tuning", True))
    cfg = Llama4TextConfig(**fields)
    if meta:
        with torch.device("meta"):
            model = Llama4ForCausalLM(cfg)
    else:
        model = Llama4ForCausalLM(cfg)
    return sum(p.numel() for p in model.parameters())


def test_the_tiny_fixture_field_for_field() -> None:
    """tests/fixtures/tiny-llama4: 4 layers, experts (4 of 32, top 1, a shared one of 32) on layers 1 and 3 (its
    interleave_moe_layer_step 2), the dense ones 96 wide, layer 3 without rotary positions (no_rope_layer_interval
    4), chunks of 8, the query/key L2 norm, the NoPE layer's query temperature (floor 4, scale 0.1)."""
    s = read_hf_config(TINY)
    assert (s.name, s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim, s.ffn_hidden, s.vocab, s.seq) == (
        "tiny-llama4", 4, 64, 4, 2, 16, 96, 128, 16)
    assert (s.gated_mlp, s.activation, s.norm, s.position, s.tied_embeddings, s.bias, s.qkv_bias, s.qk_norm) == (
        True, "silu", "rmsnorm", "rotary", False, False, False, False)
    assert (s.experts, s.experts_per_token, s.expert_ffn_hidden, s.shared_expert_ffn_hidden) == (4, 1, 32, 32)
    assert (s.normalize_topk, s.router_score, s.router_weights_on_input, s.shared_expert_gate) == (
        False, "sigmoid", True, False)
    assert (s.dense_layers, s.nope_layers, s.rope_interleaved, s.qk_l2_norm) == ((0, 2), (3,), True, True)
    assert (s.attention_chunk, s.query_temperature, s.rope_theta, s.norm_eps) == (8, (4, 0.1), 5e5, 1e-5)
    assert (s.router_groups, s.router_bias, s.routed_scaling, s.sliding_window) == (None, False, 1.0, None)
    assert [s.moe_layer(i) for i in range(4)] == [False, True, False, True]
    assert [s.rotary_layer(i) for i in range(4)] == [True, True, True, False]
    assert s.source == f"Hugging Face config {TINY / 'config.json'}"  # nothing not modelled to note


def test_the_tiny_fixture_counts_as_transformers_model() -> None:
    """The parameter count, in all and per decoder layer, equals transformers' Llama4ForCausalLM built from the
    fixture (164,928: a dense layer 30,848, one with experts 43,392)."""
    import torch
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    data = _tiny()
    spec = spec_from_hf_dict(data, "tiny")
    assert spec == read_hf_config(TINY).model_copy(update={"name": "tiny", "source": ""})
    torch.manual_seed(0)
    model = Llama4ForCausalLM(Llama4TextConfig(**{k: v for k, v in data.items() if k != "model_type"}))
    assert spec.total_params() == sum(p.numel() for p in model.parameters()) == 164_928
    layers = [sum(p.numel() for p in layer.parameters()) for layer in model.model.layers]
    assert layers == [spec.block_params(i) for i in range(4)] == [30_848, 43_392, 30_848, 43_392]
    experts = model.model.layers[1].feed_forward.experts
    assert sum(p.numel() for p in experts.parameters()) == spec.experts * spec.expert_params()


@pytest.mark.parametrize(("name", "total"), [("llama-4-scout", 107_769_861_120), ("llama-4-maverick", 400_711_848_960)])
def test_the_published_configs_count_as_transformers_model(name: str, total: int) -> None:
    """Scout's and Maverick's language models (their text_config) hold as many parameters as transformers'
    Llama4ForCausalLM built from it on the meta device."""
    data = json.loads((MODELS / name / "config.json").read_text())
    spec = read_hf_config(MODELS / name)
    assert spec.total_params() == _transformers_count(data["text_config"], meta=True) == total


def test_scout_and_maverick() -> None:
    """Scout (meta-llama/Llama-4-Scout-17B-16E): 48 layers, every one with 16 experts, the query/key L2 norm, its
    llama3 rotary scaling noted as not modelled; Maverick (Llama-4-Maverick-17B-128E): 128 experts on the odd
    layers, dense ones of 16384 between, no query/key norm. Both: every fourth layer without rotary positions,
    chunks of 8192, the NoPE layers' temperature (8192, 0.1), the vision tower said to be left out."""
    said: list[str] = []
    scout = read_hf_config(MODELS / "llama-4-scout", seq=8192, warn=said.append)
    assert (scout.layers, scout.hidden, scout.heads, scout.k, scout.d, scout.vocab, scout.seq) == (
        48, 5120, 40, 8, 128, 202048, 8192)
    assert (scout.experts, scout.experts_per_token, scout.f_e, scout.shared_expert_ffn_hidden, scout.f) == (
        16, 1, 8192, 8192, 16384)
    assert scout.dense_layers == () and scout.nope_layers == tuple(range(3, 48, 4)) and scout.qk_l2_norm
    assert (scout.attention_chunk, scout.query_temperature, scout.rope_theta) == (8192, (8192, 0.1), 5e5)
    assert "rope_scaling (llama3) not modelled" in scout.source and "vision tower" in scout.source
    assert len(said) == 1 and "vision tower" in said[0]
    maverick = read_hf_config(MODELS / "llama-4-maverick", seq=8192)
    assert (maverick.experts, maverick.dense_layers, maverick.nope_layers) == (128, tuple(range(0, 48, 2)),
                                                                               tuple(range(3, 48, 4)))
    assert not maverick.qk_l2_norm and maverick.query_temperature == (8192, 0.1) and maverick.rope_interleaved
    assert "rope_scaling" not in maverick.source
    # the default sequence: the longest context each model states (Scout base 256k, Maverick 1M)
    assert read_hf_config(MODELS / "llama-4-scout").seq == 262144
    assert read_hf_config(MODELS / "llama-4-maverick").seq == 1048576


def test_the_multimodal_wrapper_reads_its_language_model() -> None:
    """A ``llama4`` config (Llama4ForConditionalGeneration) is read as its ``text_config``, the vision tower and the
    projector said to be left out; the same spec as the text config alone."""
    said: list[str] = []
    wrapped = {"model_type": "llama4", "architectures": ["Llama4ForConditionalGeneration"], "text_config": _tiny(),
               "vision_config": {"model_type": "llama4_vision_model", "num_hidden_layers": 2, "hidden_size": 32}}
    spec = spec_from_hf_dict(wrapped, "tiny", warn=said.append)
    assert spec.model_copy(update={"source": ""}) == spec_from_hf_dict(_tiny(), "tiny")
    assert len(said) == 1 and "llama4" in said[0] and "vision tower" in said[0] and "vision tower" in spec.source
    with pytest.raises(HFConfigError) as err:
        spec_from_hf_dict({k: v for k, v in wrapped.items() if k != "text_config"})
    assert err.value.field == "text_config" and "missing" in err.value.message
    # Llama4Config's text_config defaults are Scout's too: the shape must be stated in it
    for field in ("num_local_experts", "intermediate_size_mlp", "head_dim"):
        with pytest.raises(HFConfigError) as err:
            spec_from_hf_dict({**wrapped, "text_config": _tiny(**{field: None})})
        assert err.value.field == f"text_config.{field}" and "Scout" in err.value.message, str(err.value)


def test_scouts_whole_number_temperature_flag_is_read_as_its_truth() -> None:
    """Scout's published ``attn_temperature_tuning`` is 4, which transformers 5's strict Llama4TextConfig refuses
    (it declares a bool): read as true; 0 as false (no query temperature); a string is still refused."""
    from transformers import Llama4TextConfig

    with pytest.raises(Exception, match="attn_temperature_tuning"):
        Llama4TextConfig(attn_temperature_tuning=4)
    assert spec_from_hf_dict(_tiny(attn_temperature_tuning=4)).query_temperature == (4, 0.1)
    assert spec_from_hf_dict(_tiny(attn_temperature_tuning=0)).query_temperature is None
    assert spec_from_hf_dict(_tiny(attn_temperature_tuning=False)).query_temperature is None
    with pytest.raises(HFConfigError) as err:
        spec_from_hf_dict(_tiny(attn_temperature_tuning="yes"))
    assert err.value.field == "attn_temperature_tuning", str(err.value)
    scout = json.loads((MODELS / "llama-4-scout" / "config.json").read_text())
    assert scout["text_config"]["attn_temperature_tuning"] == 4  # as published
    assert spec_from_hf_dict(scout["text_config"]).query_temperature == (8192, 0.1)


def test_what_transformers_derives_is_read() -> None:
    """Without the lists transformers derives them as Llama4TextConfig.__post_init__ does: ``moe_layers`` from
    ``interleave_moe_layer_step``, ``no_rope_layers`` from ``no_rope_layer_interval``, ``layer_types`` from both
    and ``attention_chunk_size`` (null: full attention everywhere); the lists given are read as they are."""
    every = spec_from_hf_dict(_tiny(interleave_moe_layer_step=1))
    assert every.dense_layers == () and every.moe_layers == 4
    listed = spec_from_hf_dict(_tiny(interleave_moe_layer_step=None, moe_layers=[0, 3]))
    assert listed.dense_layers == (1, 2)
    assert spec_from_hf_dict(_tiny(no_rope_layer_interval=2)).nope_layers == (1, 3)
    assert spec_from_hf_dict(_tiny(no_rope_layers=[0, 1, 1, 1])).nope_layers == (0,)
    unchunked = spec_from_hf_dict({**_tiny(), "attention_chunk_size": None})  # (null: stated, not left out)
    assert unchunked.attention_chunk is None and all(unchunked.layer_chunk(i) is None for i in range(4))
    chunked = spec_from_hf_dict(_tiny(layer_types=["chunked_attention"] * 3 + ["full_attention"]))
    assert [chunked.layer_chunk(i) for i in range(4)] == [8, 8, 8, None]
    untuned = spec_from_hf_dict(_tiny(no_rope_layers=[1, 1, 1, 1], layer_types=["chunked_attention"] * 4))
    assert untuned.nope_layers == () and untuned.query_temperature is None  # (no NoPE layer to scale)
    assert not spec_from_hf_dict(_tiny(use_qk_norm=False)).qk_l2_norm
    jitter = spec_from_hf_dict(_tiny(router_jitter_noise=0.01))
    assert "router_jitter_noise (0.01) not modelled" in jitter.source


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"attention_bias": True}, "attention_bias", "biases the query, key, value and output projections"),
    ({"num_local_experts": None}, "num_local_experts", "missing"),
    # (Llama4TextConfig has no num_experts alias: the default, Scout's 16, would be taken)
    ({"num_local_experts": None, "num_experts": 4}, "num_local_experts", "missing"),
    ({"num_experts_per_tok": None}, "num_experts_per_tok", "missing"),
    ({"intermediate_size": None}, "intermediate_size", "missing"),
    ({"intermediate_size_mlp": None}, "intermediate_size_mlp", "missing"),
    ({"head_dim": None}, "head_dim", "missing"),
    ({"num_key_value_heads": None}, "num_key_value_heads", "missing"),
    ({"interleave_moe_layer_step": None}, "interleave_moe_layer_step", "missing (and no moe_layers)"),
    ({"interleave_moe_layer_step": 0}, "interleave_moe_layer_step", "a whole number of 1 or more"),
    ({"interleave_moe_layer_step": 5}, "moe_layers", "empty: every layer would be dense"),
    ({"moe_layers": [1, 4]}, "moe_layers", "4 is not a layer of the 4"),
    ({"moe_layers": []}, "moe_layers", "empty: every layer would be dense"),
    ({"num_experts_per_tok": 5}, "num_experts_per_tok", "5 is more than the 4 experts"),
    ({"intermediate_size_mlp": 0}, "intermediate_size_mlp", "positive integer"),
    ({"layer_types": ["full_attention"] * 4}, "layer_types", "chunked attention on the layers with rotary"),
    ({"layer_types": ["sliding_attention"] * 4}, "layer_types", "not supported"),
    ({"attention_chunk_size": "null", "layer_types": ["chunked_attention"] * 3 + ["full_attention"]}, "layer_types",
     "full attention everywhere where it is null"),
    ({"no_rope_layers": [1, 1, 0]}, "no_rope_layers", "3 entries for 4 layers"),
    ({"no_rope_layers": [1, 1, 1, 0, 1]}, "no_rope_layers", "5 entries for 4 layers"),
    # (transformers lets it through where layer_types is given: the model would read the first 4)
    ({"no_rope_layers": [1, 1, 1, 0, 1], "layer_types": ["chunked_attention"] * 3 + ["full_attention"]},
     "no_rope_layers", "5 entries for 4 layers"),
    ({"no_rope_layers": [1, 2, 1, 0]}, "no_rope_layers", "1 for rotary positions and 0 for none"),
    ({"no_rope_layers": [0, 0, 0, 0], "layer_types": ["full_attention"] * 4}, "no_rope_layers",
     "every layer is without rotary positions"),
    ({"attention_chunk_size": 0}, "attention_chunk_size", "a whole number of 1 or more"),
    ({"floor_scale": 0}, "floor_scale", "a whole number of 1 or more"),
    ({"attn_scale": -0.1}, "attn_scale", "a number of 0 or more"),
    ({"use_qk_norm": "yes"}, "use_qk_norm", "expected bool"),
])
def test_bad_llama4_config_names_the_field(changes: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(HFConfigError) as err:
        spec_from_hf_dict(_tiny(**changes))
    assert err.value.field == field and words in err.value.message, str(err.value)


# ---- pipeplan profile --hf-config: transformers' own layers, timed -------------------------------------------------

def test_the_layers_built_and_the_lowered_config() -> None:
    """One layer of each kind is built (experts or dense, rotary positions or none: layers 0, 1 and 3 of the
    fixture), the lowered model's moe_layers and no_rope_layers by their new numbers; block 2 reuses block 0."""
    from profiler.hf_model import built_layers, hf_layer_model, lowered_config, repeated_blocks

    spec = read_hf_config(TINY)
    assert built_layers(spec, 1) == [0, 1, 3] and built_layers(spec, 2) == [0, 1, 3]
    assert repeated_blocks(spec, 1) == "block.2 (dense, rotary) reuses block.0"
    cfg = lowered_config(_tiny(), spec, [0, 1, 3])
    assert (cfg.num_hidden_layers, cfg.moe_layers, cfg.no_rope_layers) == (3, [1, 2], [1, 1, 0])
    assert cfg.layer_types == ["chunked_attention", "chunked_attention", "full_attention"]
    scout = read_hf_config(MODELS / "llama-4-scout", seq=64)
    assert built_layers(scout, 1) == [0, 3]
    text = json.loads((MODELS / "llama-4-scout" / "config.json").read_text())["text_config"]
    lowered = lowered_config(text, scout, [0, 3])  # (the file's 48-entry lists and Scout's whole-number flag)
    assert (lowered.moe_layers, lowered.no_rope_layers, lowered.attn_temperature_tuning) == ([0, 1], [1, 0], True)
    lm, built = hf_layer_model(_tiny(), "tiny", seq=16)
    assert built == spec.model_copy(update={"name": "tiny", "source": ""})
    assert lm.repeat == [0, 1, 2, 1, 3, 4] and len(lm.layers) == 5
    assert [sum(p.numel() for p in lm.layers[j].parameters()) for j in (1, 2, 3)] == [30_848, 43_392, 43_392]
    assert lm.expert_params == {2: 4 * spec.expert_params(), 4: 4 * spec.expert_params()}


def test_hf_profile_of_the_tiny_llama4(tmp_path: Path) -> None:
    """``pipeplan profile --hf-config`` of the fixture: three decoder layers measured, each block's parameters
    ModelSpec's, and the notes (and warnings) saying that the chunks are not applied and that transformers'
    Llama4TextExperts runs every expert on every token (4 / 1 times the routed work)."""
    from typer.testing import CliRunner

    from pipeplan.cli import app
    from planner.profile import load_profile

    out = tmp_path / "l4.json"
    res = CliRunner().invoke(app, ["profile", "--hf-config", str(TINY), "--micro-batches", "1", "--repeats", "1",
                                   "--warmup", "0", "--out", str(out)])
    assert res.exit_code == 0, res.output
    prof = load_profile(out)
    spec = read_hf_config(TINY)
    blocks = [x for x in prof.layers if x.kind == "transformer"]
    assert [b.params for b in blocks] == [spec.block_params(i) for i in range(4)]
    assert prof.environment["measured_decoder_layers"] == "3"
    assert "the first of each kind among them, experts or dense and with rotary positions or without" in prof.notes
    assert "not within the model's 8-token attention chunks" in prof.notes
    assert "Transformers' Llama4TextExperts runs every one of the 4 experts on every token" in prof.notes
    assert "4 times the routed work" in prof.notes and "routing of random weights" not in prof.notes
    assert "Llama4TextExperts runs every one" in res.output
