"""Multi-head latent attention and DeepSeek's routing variants (ModelSpec's ``kv_lora_rank``, ``q_lora_rank``,
``qk_rope_head_dim``, ``v_head_dim``; ``router_score``, ``router_groups`` / ``router_group_topk``, ``router_bias``,
``routed_scaling``) on the surfaces that read a model: the Megatron-LM export writes and reads back
``--multi-latent-attention`` with its sizes and the router's arguments, refusing (naming the field) what Megatron-Core
cannot compute; torchtitan's note names what its settings leave out; the lowered Hugging Face model
(profiler.hf_model) keeps a dense layer and one with experts (DeepSeek's ``first_k_dense_replace``); the device
sweep's GEMM shapes are latent attention's projections."""

from __future__ import annotations

import pytest
from surfaces_support import edited, script_lines, two_stage_input

from planner.analytic import analytic_profile
from planner.export import ExportError, ExportInput, export, parse
from planner.export.megatron import parse as megatron_parse
from planner.model import ModelSpec
from planner.placement import pipeline_outermost_order
from planner.request import Config
from planner.runspec import RunSpec

#: the brief's tiny DeepSeek-V3 config.json (transformers' DeepseekV3Config fields)
TINY_V3_CONFIG = {
    "model_type": "deepseek_v3", "n_routed_experts": 8, "num_experts_per_tok": 2, "n_group": 4, "topk_group": 2,
    "first_k_dense_replace": 1, "n_shared_experts": 1, "moe_intermediate_size": 32, "hidden_size": 64,
    "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 48, "kv_lora_rank": 32,
    "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "intermediate_size": 96, "vocab_size": 128,
    "num_hidden_layers": 3, "max_position_embeddings": 16, "routed_scaling_factor": 2.5, "norm_topk_prob": True,
    "tie_word_embeddings": False, "hidden_act": "silu", "attention_bias": False, "rope_theta": 10000,
}

#: that config as a ModelSpec (what profiler.hf_config reads it as): layer 0 dense, 1-2 with 8 experts of 32 (top 2
#: in the best 2 of 4 groups, sigmoid scores with V3's bias, weights times 2.5) and a shared expert of 32; latent
#: attention with a query latent of 48, a key/value latent of 32, heads of 16 + 8 rotated (head_dim 24), values of 16
TINY_V3 = ModelSpec(name="tiny-deepseek-v3", layers=3, hidden=64, heads=4, head_dim=24, ffn_hidden=96, seq=16,
                    vocab=128, gated_mlp=True, activation="silu", norm="rmsnorm", position="rotary", bias=False,
                    tied_embeddings=False, experts=8, experts_per_token=2, expert_ffn_hidden=32,
                    shared_expert_ffn_hidden=32, dense_layers=(0,), router_score="sigmoid", router_groups=4,
                    router_group_topk=2, router_bias=True, routed_scaling=2.5, kv_lora_rank=32, q_lora_rank=48,
                    qk_rope_head_dim=8, v_head_dim=16)

#: DeepSeek-V3's routing shape (top 8 in the best 4 of 8 groups: k = 2 x router_group_topk, what Megatron-Core's
#: group score computes), small: 16 experts, top 4 in the best 2 of 4 groups; 4 layers, the first dense
V3ISH = TINY_V3.with_(**{"name": "v3ish", "layers": 4, "experts": 16, "experts_per_token": 4})

ROUTING_FIELDS = ("normalize_topk", "router_score", "router_groups", "router_group_topk", "router_bias",
                  "routed_scaling")
LATENT_FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim")


def _inp(model: ModelSpec, **cfg: object) -> ExportInput:
    return two_stage_input(model, 4, **{"tensor": 2, **cfg})


def _same_model(back, model: ModelSpec) -> None:
    """The parsed routing and latent attention are the model's."""
    assert {f: getattr(back, f) for f in ROUTING_FIELDS} == {f: getattr(model, f) for f in ROUTING_FIELDS}
    assert {f: getattr(back, f) for f in LATENT_FIELDS} == {f: getattr(model, f) for f in LATENT_FIELDS}
    assert back.head_dim == (model.d if model.mla else None)


# ---- Megatron-LM ----------------------------------------------------------------------------------------------------

def test_megatron_writes_latent_attention_and_the_routing() -> None:
    inp = _inp(V3ISH)
    out = export("megatron", inp)
    lines = script_lines(out.main.content)
    for line in ("--multi-latent-attention", "--rope-type rope", "--q-lora-rank 48", "--kv-lora-rank 32",
                 "--qk-head-dim 16", "--qk-pos-emb-head-dim 8", "--v-head-dim 16", "--qk-layernorm",
                 "--position-embedding-type rope", "--moe-router-score-function sigmoid",
                 "--moe-router-num-groups 4", "--moe-router-group-topk 2", "--moe-router-enable-expert-bias",
                 "--moe-router-topk-scaling-factor 2.5", "--moe-router-topk 4", "--num-experts 16"):
        assert line in lines, line
    text = out.main.content
    # every head its own key and value; sigmoid scores are renormalised by Megatron-Core without pre-softmax
    for absent in ("--num-query-groups", "--group-query-attention", "--kv-channels", "--moe-router-pre-softmax"):
        assert absent not in text, absent
    # what the arguments write is not named as left out; the note says why --rope-type is there
    assert not any("kv_lora_rank" in n or "(router_" in n for n in out.notes), out.notes
    assert any(n.startswith("--rope-type rope keeps") for n in out.notes)
    back = parse(out)
    assert back.config == inp.config and back.microbatches == 4 and back.layer_counts == [2, 2]
    assert (back.shared_expert_ffn_hidden, back.dense_layers) == (32, (0,))
    _same_model(back, V3ISH)


def test_megatron_round_trip_without_a_query_latent_and_with_softmax_groups() -> None:
    """DeepSeek-V2-Lite's attention (no query latent) with V2-style group-limited softmax routing at k = groups kept
    (Megatron's group score, the best k / router_group_topk = 1 expert's, is then the model's), not renormalised
    (pre-softmax), scaled."""
    model = V3ISH.with_(**{"q_lora_rank": None, "router_score": "softmax", "router_bias": False,
                                     "normalize_topk": False, "router_group_topk": 4, "routed_scaling": 16.0,
                                     "v_head_dim": 24})
    out = export("megatron", _inp(model))
    text = out.main.content
    assert "--q-lora-rank" not in text and "--moe-router-score-function" not in text
    assert "--moe-router-enable-expert-bias" not in text
    lines = script_lines(text)
    assert {"--moe-router-pre-softmax", "--moe-router-topk-scaling-factor 16.0", "--v-head-dim 24",
            "--moe-router-group-topk 4"} <= set(lines)
    _same_model(parse(out), model)


def test_megatron_without_latent_attention_or_routing_variants_writes_neither() -> None:
    plain = V3ISH.with_(**{"kv_lora_rank": None, "q_lora_rank": None, "qk_rope_head_dim": None,
                                     "v_head_dim": None, "head_dim": 8, "kv_heads": 2, "router_score": "softmax",
                                     "router_groups": None, "router_group_topk": None, "router_bias": False,
                                     "routed_scaling": 1.0})
    out = export("megatron", _inp(plain))
    text = out.main.content
    for absent in ("--multi-latent-attention", "--rope-type", "--kv-lora-rank", "--qk-head-dim", "--v-head-dim",
                   "--qk-layernorm", "--moe-router-score-function", "--moe-router-num-groups",
                   "--moe-router-enable-expert-bias", "--moe-router-topk-scaling-factor"):
        assert absent not in text, absent
    # (as before)
    assert {"--group-query-attention", "--num-query-groups 2", "--kv-channels 8"} <= set(script_lines(text))
    back = parse(out)
    _same_model(back, plain)
    assert (back.kv_lora_rank, back.head_dim, back.routed_scaling) == (None, None, 1.0)


@pytest.mark.parametrize(("update", "field", "why"), [
    # Megatron-Core renormalises the chosen sigmoid scores whenever k > 1
    ({"normalize_topk": False}, "normalize_topk false with router_score sigmoid and 4 experts", "renormalises"),
    # ... and never at k = 1, where the renormalised weight would be 1
    ({"experts_per_token": 1, "router_groups": None, "router_group_topk": None}, "normalize_topk true with "
     "router_score sigmoid and 1 expert", "sigmoid score at k = 1"),
    # softmax top-1 runs only with --moe-router-pre-softmax (the unrenormalised probability)
    ({"experts_per_token": 1, "router_groups": None, "router_group_topk": None, "router_score": "softmax",
      "router_bias": False}, "normalize_topk true with 1 expert per token", "Please use --moe-router-pre-softmax"),
    # V3's group score (its best two experts') with k = router_group_topk: Megatron would score the best one
    ({"experts_per_token": 2}, "router_group_topk 2 with 2 experts per token", "best two experts' sigmoid"),
    # V2's (its best expert's) with k = 2 router_group_topk (DeepSeek-V2: top 6 in 3 groups)
    ({"router_score": "softmax", "router_bias": False}, "router_group_topk 2 with 4 experts per token",
     "best expert's softmax"),
])
def test_megatron_refuses_what_megatron_core_cannot_compute(update: dict, field: str, why: str) -> None:
    model = V3ISH.with_(**update)  # (a valid model: with_ validates)
    with pytest.raises(ExportError, match="megatron: ") as err:
        export("megatron", _inp(model))
    assert field in str(err.value) and why in str(err.value), str(err.value)


def test_the_brief_tiny_v3_config_is_refused_for_its_group_score() -> None:
    """The tiny DeepSeek-V3 config routes to 2 experts in the best 2 groups: DeepSeek-V3 scores a group by its best
    two experts (transformers' DeepseekV3TopkRouter), Megatron-Core by its best k / router_group_topk = 1."""
    with pytest.raises(ExportError, match=r"router_group_topk 2 with 2 experts per token.*k / router_group_topk = 1"):
        export("megatron", _inp(TINY_V3))


@pytest.mark.parametrize(("update", "pre_softmax"), [
    ({"experts_per_token": 1, "router_groups": None, "router_group_topk": None, "normalize_topk": False}, False),
    ({"experts_per_token": 1, "router_groups": None, "router_group_topk": None, "normalize_topk": False,
      "router_score": "softmax", "router_bias": False}, True),
])
def test_megatron_top1_routing_that_it_computes(update: dict, pre_softmax: bool) -> None:
    """Top-1: the sigmoid score as the weight (Megatron-Core's default at k = 1), the softmax probability
    (--moe-router-pre-softmax)."""
    model = V3ISH.with_(**update)
    out = export("megatron", _inp(model))
    assert ("--moe-router-pre-softmax" in out.main.content) == pre_softmax
    _same_model(parse(out), model)


def test_megatron_parse_reads_what_megatron_runs() -> None:
    text = export("megatron", _inp(V3ISH)).main.content
    # sigmoid scores are renormalised at k > 1 whatever --moe-router-pre-softmax says
    assert megatron_parse(edited(text, add="--moe-router-pre-softmax")).normalize_topk is True
    # Megatron's defaults for the latent sizes not given
    back = megatron_parse(edited(text, drop=("--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim",
                                                "--kv-lora-rank", "--q-lora-rank")))
    assert (back.kv_lora_rank, back.q_lora_rank, back.qk_rope_head_dim, back.v_head_dim, back.head_dim) == (
        32, None, 64, 128, 192)
    # group-limited routing without its group count, and an expert bias under softmax, are refused as Megatron does
    with pytest.raises(ExportError, match="--moe-router-group-topk without --moe-router-num-groups"):
        megatron_parse(edited(text, drop=("--moe-router-num-groups",)))
    with pytest.raises(ExportError, match="--moe-router-enable-expert-bias needs"):
        megatron_parse(edited(text, drop=("--moe-router-score-function",)))
    with pytest.raises(ExportError, match="--moe-router-topk-scaling-factor 'x'"):
        megatron_parse(edited(text, drop=("--moe-router-topk-scaling-factor",),
                                 add="--moe-router-topk-scaling-factor x"))


def test_megatron_export_of_an_analytical_profile() -> None:
    """The profile's model_spec carries latent attention and the routing to the export."""
    prof = analytic_profile(V3ISH, "a100-80gb")
    run = RunSpec(config=Config(tensor=2, pipeline=2, data=2, micro_batch=1, schedule="1f1b"), microbatches=4,
                  partition=[(0, 3), (3, 6)])
    out = export("megatron", ExportInput.from_profile(run, prof))
    assert "--multi-latent-attention" in out.main.content and "--moe-router-group-topk 2" in out.main.content
    _same_model(parse(out), V3ISH)


# ---- torchtitan and DeepSpeed -------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["torchtitan", "deepspeed"])
def test_other_exports_run_it_and_say_what_they_do_not_write(fmt: str) -> None:
    inp = _inp(V3ISH, tensor=1)
    out = export(fmt, inp)
    back = parse(out)
    assert back.config == inp.config.model_copy(update={"order": pipeline_outermost_order(2, 2)})
    if fmt == "torchtitan":
        gap = next(n for n in out.notes if n.startswith("torchtitan: the model has"))
        assert ("multi-head latent attention (kv_lora_rank 32, q_lora_rank 48, qk_rope_head_dim 8 of head_dim 24, "
                "v_head_dim 16)") in gap
        for words in ("sigmoid scores (router_score)",
                      "the top 4 within each token's best 2 of 4 expert groups (router_groups, router_group_topk)",
                      "a per-expert bias on the scores for the choice only (router_bias)",
                      "the chosen weights times 2.5 (routed_scaling)"):
            assert words in gap, words
        assert any("torchtitan's deepseek_v3 model" in n for n in out.notes)
        # a mixture of experts with plain softmax routing and standard attention: neither is named
        plain = V3ISH.with_(**{"kv_lora_rank": None, "q_lora_rank": None, "qk_rope_head_dim": None,
                                         "v_head_dim": None, "head_dim": 16, "router_score": "softmax",
                                         "router_groups": None, "router_group_topk": None, "router_bias": False,
                                         "routed_scaling": 1.0})
        notes = export(fmt, _inp(plain, tensor=1)).notes
        gap = next(n for n in notes if n.startswith("torchtitan: the model has"))
        assert "latent" not in gap and "routed with" not in gap and "(router_" not in gap
        assert not any("deepseek_v3" in n for n in notes)


# ---- profiler.hf_model: the lowered DeepSeek model --------------------------------------------------------------

@pytest.mark.parametrize(("model_type", "measure", "chosen", "first_dense"), [
    ("deepseek_v3", 1, [0, 1], 1), ("deepseek_v3", 2, [0, 1], 1), ("deepseek_v3", 3, [0, 1, 2], 1),
    ("deepseek_v2", 1, [0, 1], 1),
])
def test_lowered_config_keeps_a_layer_of_each_kind(model_type: str, measure: int, chosen: list[int],
                                                   first_dense: int) -> None:
    from profiler.hf_model import built_layers, lowered_config

    assert built_layers(TINY_V3, measure) == chosen
    data = {**TINY_V3_CONFIG, "model_type": model_type}
    cfg = lowered_config(data, TINY_V3, chosen)
    assert (cfg.num_hidden_layers, cfg.first_k_dense_replace) == (len(chosen), first_dense)


def test_lowered_config_renumbers_deepseek_dense_layers() -> None:
    """Three dense layers first (DeepSeek-V3's), one layer measured: layers 0 and 3 built, the first dense; the
    lowered model states no dense layer where the model has none (transformers' DeepSeek-V3 default is 3)."""
    from profiler.hf_model import built_layers, lowered_config

    deep = TINY_V3.with_(**{"layers": 6, "dense_layers": (0, 1, 2)})
    chosen = built_layers(deep, 1)
    assert chosen == [0, 3]
    cfg = lowered_config({**TINY_V3_CONFIG, "num_hidden_layers": 6, "first_k_dense_replace": 3}, deep, chosen)
    assert (cfg.num_hidden_layers, cfg.first_k_dense_replace) == (2, 1)
    none = TINY_V3.with_(**{"dense_layers": ()})
    data = {k: v for k, v in TINY_V3_CONFIG.items() if k != "first_k_dense_replace"}
    assert lowered_config(data, none, built_layers(none, 1)).first_k_dense_replace == 0


def test_hf_deepseek_v3_profile(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny DeepSeek-V3 built by transformers with one decoder layer asked for: the dense layer 0 and the first
    layer with experts built (DeepseekV3MLP, DeepseekV3MoE), each block's parameters the library's modules' (those of
    its kind in ModelSpec), its expert_params the 8 routed experts' in a layer with experts only; block.2 reuses
    block.1. (The spec is given here as profiler.hf_config reads the config: this tests the lowering.)"""
    import profiler.hf_model as hf_model
    from profiler.layer_model import profile_layer_model

    monkeypatch.setattr(hf_model, "spec_from_hf_dict", lambda data, name, seq=None: TINY_V3)
    monkeypatch.setattr(hf_model, "SUPPORTED", (*hf_model.SUPPORTED, "deepseek_v3"))
    lm, spec = hf_model.hf_layer_model(TINY_V3_CONFIG, "tiny-deepseek-v3", measure_layers=1)
    decoders = lm.layers[1:-1]
    assert [type(d.layer.mlp).__name__ for d in decoders] == ["DeepseekV3MLP", "DeepseekV3MoE"]
    assert [type(d.layer.self_attn).__name__ for d in decoders] == ["DeepseekV3Attention"] * 2
    assert [sum(p.numel() for p in d.parameters()) for d in decoders] == [spec.block_params(0), spec.block_params(1)]
    assert lm.repeat == [0, 1, 2, 2, 3]
    routed = 8 * spec.expert_params()
    assert routed == 8 * 3 * 64 * 32 and lm.expert_params == {2: routed, 3: routed}
    assert hf_model.repeated_blocks(spec, 1) == "block.2 (experts) reuses block.1"
    prof = profile_layer_model(lm, [1], repeats=1, warmup=0)
    blocks = prof.layers[1:-1]
    assert [b.params for b in blocks] == [spec.block_params(i) for i in range(3)]
    assert [b.expert_params for b in blocks] == [0, routed, routed]
    assert blocks[2].fwd_time == blocks[1].fwd_time != blocks[0].fwd_time
    assert prof.total_params == spec.total_params()


# ---- profiler.device: the sweep's GEMM shapes -------------------------------------------------------------------

def test_device_shapes_of_latent_attention() -> None:
    from profiler.device import model_shapes

    T, s = 32, 16  # b = 2
    mlp = {1: [(T, 192, 64, 1), (T, 64, 96, 1)], 2: [(T, 96, 64, 1), (T, 64, 48, 1)]}
    want = set()
    for t in (1, 2):
        a_t = 4 // t
        want |= {(T, 48, 64, 1),  # query down-projection, whole on every rank
                 (T, a_t * 24, 48, 1),  # query up-projection: a_t heads of head_dim 24
                 (T, 32 + 8, 64, 1),  # key/value down-projection with the shared rotated key, whole
                 (T, a_t * (24 - 8 + 16), 32, 1),  # key/value up-projection: unrotated keys and values
                 (s, s, 24, 2 * a_t), (s, 16, s, 2 * a_t),  # scores over head_dim, values of v_head_dim 16
                 (T, 64, a_t * 16, 1), *mlp[t]}  # output projection reads a_t v
    assert model_shapes(TINY_V3, [2], [1, 2]) == sorted(want)
    # without a query latent: one query projection from the hidden state
    direct = model_shapes(TINY_V3.with_(**{"q_lora_rank": None}), [2], [1])
    assert (T, 96, 64, 1) in direct and (T, 48, 64, 1) not in direct and (T, 96, 48, 1) not in direct
    # standard attention keeps its fused QKV shapes
    plain = TINY_V3.with_(**{"kv_lora_rank": None, "q_lora_rank": None, "qk_rope_head_dim": None,
                                       "v_head_dim": None, "head_dim": 16})
    assert (T, 3 * 64, 64, 1) in model_shapes(plain, [2], [1]) and (s, 16, s, 8) in model_shapes(plain, [2], [1])
