"""GLM-4.5 (``glm4_moe``: partial rotary, Q/K/V biases, a shared expert, a dense first layer, DeepSeek-V3's sigmoid
routing with the expert bias) and partial rotary alone (a Phi-4-mini-like dense model) on the export surfaces: the
Megatron-LM export writes ``rotary_dim`` as ``--rotary-percent rotary_dim / head_dim`` -- Megatron-Core rotates
``int(kv_channels * percent)`` dimensions of each head, its first, half against half, as transformers does -- beside
GLM-4.5's other arguments (``--kv-channels 128``, ``--add-qkv-bias``, ``--moe-layer-freq``, the shared expert, the
sigmoid router with its bias, the scaling factor, groups), and its parser reads them back; what it cannot read is
refused, naming the flag; torchtitan's note names what its settings leave out (``rotary_dim``, llama3's head width);
and the tiny GLM-4.5 config goes through the API: uploaded, planned, exported, read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from api_support import megatron_export, plan_on_two_gpus, torchtitan_notes, upload_fixture
from surfaces_support import assert_megatron_refuses, edited, script_flags, script_lines, two_stage_input

from planner.export import ExportError, ExportInput, export, parse
from planner.export.megatron import parse as megatron_parse
from planner.export.megatron import rotary_percent
from planner.model import ModelSpec
from profiler.hf_config import read_hf_config, spec_from_hf_dict

ROOT = Path(__file__).resolve().parent.parent
AIR_DIR = ROOT / "examples" / "models" / "glm-4.5-air"

#: GLM-4.5-Air as profiler.hf_config reads its config.json (46 layers, hidden 4096, 96 heads of 128, 8 key/value
#: heads, 64 of each head's 128 dimensions rotated, 128 experts of 1408 top 8 with one shared, layer 0 dense)
AIR = read_hf_config(AIR_DIR, seq=4096)

#: GLM-4.5 (355B-A32B, Megatron-Bridge's GLM45ModelProvider355B): Air's config with its sizes, per-head query/key
#: norms, three dense layers and the routed weights scaled by 2.5
GLM_45 = spec_from_hf_dict({**json.loads((AIR_DIR / "config.json").read_text()), "num_hidden_layers": 92,
                            "hidden_size": 5120, "intermediate_size": 12288, "n_routed_experts": 160,
                            "moe_intermediate_size": 1536, "first_k_dense_replace": 3, "use_qk_norm": True,
                            "routed_scaling_factor": 2.5}, name="glm-4.5", seq=4096)

#: Phi-4-mini's shape (32 layers, hidden 3072, 24 heads of 128, 8 key/value heads, partial_rotary_factor 0.75: 96
#: of each head's 128 dimensions rotated; no biases), by hand: a dense model with partial rotary, its heads
#: hidden // heads wide
PHI4_MINI = ModelSpec(name="phi-4-mini-like", layers=32, hidden=3072, heads=24, kv_heads=8, ffn_hidden=8192,
                      gated_mlp=True, activation="silu", norm="rmsnorm", position="rotary", bias=False, rotary_dim=96,
                      vocab=200064, seq=4096)

#: the fields the Megatron export writes and its parser reads back (Parsed's names: ModelSpec's)
FIELDS = ("rotary_dim", "qk_norm", "bias", "qkv_bias", "shared_expert_ffn_hidden", "dense_layers", "normalize_topk",
          "router_score", "router_groups", "router_group_topk", "router_bias", "routed_scaling")


def _inp(model: ModelSpec, **cfg: object) -> ExportInput:
    return two_stage_input(model, 8, **{"tensor": 4, "expert": 2 if model.moe else 1, "order": "tp-dp-pp", **cfg})


def _model_fields(model: ModelSpec) -> dict[str, object]:
    """What the parser should read back of ``model``: its fields, ``rotary_dim`` None where every dimension turns."""
    want = {f: getattr(model, f) for f in FIELDS}
    want["rotary_dim"] = model.rot_d if model.rot_d < model.d else None
    if not model.moe:
        want |= {"shared_expert_ffn_hidden": None, "dense_layers": (), "normalize_topk": True,
                 "router_score": "softmax", "router_groups": None, "router_group_topk": None, "router_bias": False,
                 "routed_scaling": 1.0}
    return want


def _same_model(back, model: ModelSpec) -> None:
    assert {f: getattr(back, f) for f in FIELDS} == _model_fields(model)


# ---- Megatron-LM ----------------------------------------------------------------------------------------------------

def test_megatron_round_trip_of_glm_4_5_air() -> None:
    assert (AIR.d, AIR.rotary_dim, AIR.heads, AIR.hidden) == (128, 64, 96, 4096)  # (heads x head_dim != hidden)
    inp = _inp(AIR)
    out = export("megatron", inp)
    lines = script_lines(out.main.content)
    for line in ("--num-layers 46", "--hidden-size 4096", "--num-attention-heads 96", "--kv-channels 128",
                 "--group-query-attention", "--num-query-groups 8", "--ffn-hidden-size 10944", "--swiglu",
                 "--normalization RMSNorm", "--position-embedding-type rope", "--rotary-base 1000000",
                 "--rotary-percent 0.5", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
                 "--add-qkv-bias", "--num-experts 128", "--moe-router-topk 8", "--moe-ffn-hidden-size 1408",
                 "--moe-shared-expert-intermediate-size 1408", "--moe-layer-freq '([0]+[1]*45)'",
                 "--moe-router-score-function sigmoid", "--moe-router-enable-expert-bias",
                 "--expert-model-parallel-size 2"):
        assert line in lines, line
    flags = script_flags(out.main.content)
    # Air: no query/key norms, one group, no scaling (1.0), an ungated shared expert, rotate-half
    for absent in ("--qk-layernorm", "--moe-router-num-groups", "--moe-router-group-topk",
                   "--moe-router-topk-scaling-factor", "--moe-shared-expert-gate", "--rotary-interleaved",
                   "--moe-router-pre-softmax", "--multi-latent-attention"):
        assert absent not in flags, absent
    # everything the model has is written: no gap named
    assert not any(n.startswith("megatron: the model has") for n in out.notes), out.notes
    back = parse(out)
    assert (back.config, back.microbatches, back.layer_counts) == (inp.config, 8, [23, 23])
    _same_model(back, AIR)
    assert (back.rotary_dim, back.qk_norm, back.dense_layers) == (64, False, (0,))


def test_megatron_round_trip_of_glm_4_5() -> None:
    """GLM-4.5's query/key norms, three dense layers and scaling factor 2.5, as Megatron-Bridge's
    GLM45ModelProvider355B sets them (qk_layernorm, moe_layer_freq [0] * 3 + [1] * 89,
    moe_router_topk_scaling_factor)."""
    assert (GLM_45.qk_norm, GLM_45.routed_scaling, GLM_45.dense_layers, GLM_45.rotary_dim) == (True, 2.5, (0, 1, 2), 64)
    out = export("megatron", _inp(GLM_45))
    lines = script_lines(out.main.content)
    for line in ("--qk-layernorm", "--moe-router-topk-scaling-factor 2.5", "--moe-layer-freq '([0]*3+[1]*89)'",
                 "--num-experts 160", "--moe-ffn-hidden-size 1536", "--moe-shared-expert-intermediate-size 1536",
                 "--hidden-size 5120", "--kv-channels 128", "--rotary-percent 0.5"):
        assert line in lines, line
    back = parse(out)
    _same_model(back, GLM_45)
    assert (back.qk_norm, back.routed_scaling, back.dense_layers) == (True, 2.5, (0, 1, 2))


def test_megatron_groups_of_a_glm_config() -> None:
    """A GLM-4.5 config with router groups (n_group 8, topk_group 4, top 8: Megatron's group score, the best
    k / topk_group = 2 experts', is DeepSeek-V3's) writes them and reads them back."""
    model = AIR.with_(router_groups=8, router_group_topk=4)
    out = export("megatron", _inp(model))
    assert {"--moe-router-num-groups 8", "--moe-router-group-topk 4"} <= set(script_lines(out.main.content))
    _same_model(parse(out), model)


def _megatron_rotated(flags: dict[str, str]) -> tuple[int, list[float]]:
    """The dimensions of each head Megatron-Core rotates, and its inverse frequencies' exponents, from the written
    arguments: ``kv_channels`` (``--kv-channels``, else hidden // heads), ``dim = int(kv_channels * percent)`` where the
    percent is below 1 (RotaryEmbedding), ``arange(0, dim, 2) / dim``, and the table ``cat((freqs, freqs))`` as wide
    as the part ``_apply_rotary_pos_emb_bshd`` splits off (``t[..., :rot_dim]``)."""
    kv = int(flags.get("--kv-channels") or int(flags["--hidden-size"]) // int(flags["--num-attention-heads"]))
    percent = float(flags.get("--rotary-percent", "1.0"))
    dim = int(kv * percent) if percent < 1.0 else kv
    exponents = [i / dim for i in range(0, dim, 2)]
    return 2 * len(exponents), exponents


@pytest.mark.parametrize(("model", "written"), [
    (AIR, "0.5"),  # GLM-4.5-Air: 64 of 128
    (PHI4_MINI, "0.75"),  # Phi-4-mini: 96 of 128, no --kv-channels (hidden // heads)
    # 58 of 100: 100 * 0.58 is 57.99999999999999, which int() takes to 57; the next float up is written
    (PHI4_MINI.with_(head_dim=100, rotary_dim=58), "0.5800000000000001"),
    (PHI4_MINI.with_(rotary_dim=2), "0.015625"),  # the fewest
])
def test_megatron_rotary_is_the_models(model: ModelSpec, written: str) -> None:
    """The written percent, applied as Megatron-Core applies it, rotates the model's first ``rotary_dim`` of each
    head with transformers' frequencies (its ``int(head_dim * partial_rotary_factor)`` and ``arange(0, dim, 2) /
    dim``)."""
    out = export("megatron", _inp(model))
    flags = script_flags(out.main.content)
    assert flags["--rotary-percent"] == written == rotary_percent(model.rot_d, model.d)
    rotated, exponents = _megatron_rotated(flags)
    assert rotated == model.rotary_dim
    assert exponents == [i / model.rotary_dim for i in range(0, model.rotary_dim, 2)]
    assert parse(out).rotary_dim == model.rotary_dim
    assert not any(n.startswith("megatron: the model has") for n in out.notes), out.notes


def test_megatron_rotary_matches_transformers_glm4_moe() -> None:
    """transformers' own Glm4Moe rotary (``Glm4MoeRotaryEmbedding``, ``apply_rotary_pos_emb``) on the tiny fixture's
    config equals rotate-half over the first ``dim`` of each head with the table Megatron-Core builds from the
    written ``--rotary-base``, ``--rotary-percent`` and the head width (``dim = int(kv_channels * percent)``,
    ``base ** -(arange(0, dim, 2) / dim)``, ``cat((freqs, freqs))``), the other dimensions passed through."""
    torch = pytest.importorskip("torch")
    glm = pytest.importorskip("transformers.models.glm4_moe.modeling_glm4_moe")
    from transformers import AutoConfig

    data = json.loads((ROOT / "tests" / "fixtures" / "tiny-glm4-moe" / "config.json").read_text())
    model = spec_from_hf_dict(data, name="tiny-glm4-moe", seq=16)
    flags = script_flags(export("megatron", _inp(model, tensor=2)).main.content)
    rotated, exponents = _megatron_rotated(flags)
    assert rotated == model.rotary_dim == 8 and flags["--rotary-percent"] == "0.5"
    base = int(flags["--rotary-base"])
    positions = torch.arange(16, dtype=torch.float32)
    freqs = torch.outer(positions, base ** -torch.tensor(exponents, dtype=torch.float32))
    table = torch.cat((freqs, freqs), dim=-1)  # [seq, rotated]
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, model.heads, 16, model.d, generator=gen)
    k = torch.randn(1, model.k, 16, model.d, generator=gen)

    def megatron(t):  # rotate-half over t[..., :rotated], the rest unchanged
        x, rest = t[..., :rotated], t[..., rotated:]
        half = torch.cat((-x[..., rotated // 2:], x[..., :rotated // 2]), dim=-1)
        return torch.cat((x * table.cos() + half * table.sin(), rest), dim=-1)

    cfg = AutoConfig.for_model(**data)
    cos, sin = glm.Glm4MoeRotaryEmbedding(cfg)(q, positions[None].long())
    q_hf, k_hf = glm.apply_rotary_pos_emb(q, k, cos, sin)
    assert torch.allclose(q_hf, megatron(q), atol=1e-5) and torch.allclose(k_hf, megatron(k), atol=1e-5)
    assert torch.equal(q_hf[..., rotated:], q[..., rotated:])  # (the other half of each head: not turned)


@pytest.mark.parametrize("model", [PHI4_MINI.with_(rotary_dim=None), PHI4_MINI.with_(rotary_dim=128)])
def test_megatron_writes_no_percent_where_every_dimension_turns(model: ModelSpec) -> None:
    out = export("megatron", _inp(model))
    assert "--rotary-percent" not in out.main.content
    assert _megatron_rotated(script_flags(out.main.content))[0] == model.d == 128
    assert parse(out).rotary_dim is None


def test_megatron_round_trip_of_a_partial_rotary_dense_model() -> None:
    inp = _inp(PHI4_MINI)
    out = export("megatron", inp)
    flags = script_flags(out.main.content)
    assert flags["--rotary-percent"] == "0.75"
    for absent in ("--kv-channels", "--num-experts", "--moe-layer-freq", "--add-qkv-bias", "--qk-layernorm"):
        assert absent not in flags, absent
    back = parse(out)
    assert (back.config, back.microbatches, back.layer_counts) == (inp.config, 8, [16, 16])
    _same_model(back, PHI4_MINI)


@pytest.mark.parametrize(("update", "words"), [
    # GLM-4.5's router renormalises its top 8; Megatron-Core always does with sigmoid scores at k > 1
    ({"normalize_topk": False}, "normalize_topk false with router_score sigmoid and 8 experts"),
    # Megatron-Core scores a group by its best k / router_group_topk = 4 experts', the model by its best two
    ({"router_groups": 8, "router_group_topk": 2}, "router_group_topk 2 with 8 experts per token"),
    # --rotary-base is an integer
    ({"rope_theta": 1e6 + 0.5}, "rope_theta 1e+06: Megatron-LM's --rotary-base is an integer"),
])
def test_megatron_refuses_glm_variants_megatron_core_cannot_compute(update: dict, words: str) -> None:
    model = AIR.with_(**update)
    with pytest.raises(ExportError, match="megatron: ") as err:
        export("megatron", _inp(model))
    assert words in str(err.value), str(err.value)


def test_megatron_parse_reads_what_megatron_runs() -> None:
    text = export("megatron", _inp(AIR)).main.content
    # a percent of 1 or more rotates every dimension (RotaryEmbedding applies one below 1 only); no percent, none;
    # without rope the rotary arguments do nothing
    for whole in (edited(text, drop=("--rotary-percent",), add="--rotary-percent 1.0"),
                  edited(text, drop=("--rotary-percent",), add="--rotary-percent 1.5"),
                  edited(text, drop=("--rotary-percent",)),
                  edited(text, drop=("--position-embedding-type",))):
        assert megatron_parse(whole).rotary_dim is None
    # int(kv_channels * percent): 0.75 of 128 is 96
    assert megatron_parse(edited(text, drop=("--rotary-percent",), add="--rotary-percent 0.75")).rotary_dim == 96
    # per-head query/key norms: --qk-layernorm without latent attention
    assert megatron_parse(edited(text, add="--qk-layernorm")).qk_norm is True
    # adjacent pairs of the rotated part turned (Llama 4's form, ModelSpec's rope_interleaved): read back, not refused
    interleaved = megatron_parse(edited(text, add="--rotary-interleaved"))
    assert (interleaved.rope_interleaved, interleaved.rotary_dim) == (True, 64)
    assert megatron_parse(text).rope_interleaved is False
    refused = [
        (edited(text, drop=("--rotary-percent",), add="--rotary-percent 0.5078125"),
         "int(128 x 0.5078125) = 65 dimensions"),
        (edited(text, drop=("--rotary-percent",), add="--rotary-percent 0.001"), "int(128 x 0.001) = 0 dimensions"),
        (edited(text, drop=("--rotary-percent",), add="--rotary-percent -0.5"), "int(128 x -0.5) = -64 dimensions"),
        (edited(text, drop=("--rotary-percent",), add="--rotary-percent nan"), "--rotary-percent nan: a finite"),
        (edited(text, drop=("--rotary-percent",), add="--rotary-percent half"), "--rotary-percent 'half': not a"),
        # without --kv-channels, Megatron's hidden // heads: 4096 // 96 = 42, of which 21 would turn
        (edited(text, drop=("--kv-channels",)), "of kv_channels 42: Megatron-Core rotates int(42 x 0.5) = 21"),
        (edited(text, drop=("--kv-channels", "--hidden-size")), "--rotary-percent needs --kv-channels"),
        (edited(text, add="--multi-latent-attention"), "--rotary-percent 0.5 with --multi-latent-attention"),
    ]
    assert_megatron_refuses(refused)


# ---- torchtitan ----------------------------------------------------------------------------------------------------

def test_torchtitan_note_names_what_its_settings_leave_out() -> None:
    out = export("torchtitan", _inp(AIR, tensor=1, expert=1))
    gap = next(n for n in out.notes if n.startswith("torchtitan: the model has"))
    for words in ("rotary positions on the first 64 of each head's 128 query and key dimensions, the other 64 "
                  "unrotated (rotary_dim)",
                  "biases on the query, key and value projections (qkv_bias)",
                  "beside them a shared expert 1408 wide (shared_expert_ffn_hidden)",
                  "sigmoid scores (router_score)", "a per-expert bias on the scores for the choice only (router_bias)"):
        assert words in gap, words
    # llama3 sizes each head dim // n_heads (42), not GLM's 128; its deepseek_v3 model has only latent attention
    flavor = next(n for n in out.notes if n.startswith("[model] names torchtitan's llama3"))
    assert "llama3 sizes each head dim // n_heads = 42 wide, not the model's 128 (head_dim)" in flavor
    assert any(n.startswith("torchtitan's deepseek_v3 model has DeepSeek's routing but multi-head latent attention "
                            "only") for n in out.notes), out.notes
    # Phi-4-mini's 96 of 128 too; its heads are hidden // heads wide, so no head width is named
    notes = export("torchtitan", _inp(PHI4_MINI, tensor=1)).notes
    gap = next(n for n in notes if n.startswith("torchtitan: the model has"))
    assert "the first 96 of each head's 128 query and key dimensions, the other 32 unrotated (rotary_dim)" in gap
    assert not any("(head_dim)" in n or "deepseek_v3" in n for n in notes), notes
    # every dimension rotated: nothing named
    assert not any(n.startswith("torchtitan: the model has")
                   for n in export("torchtitan", _inp(PHI4_MINI.with_(rotary_dim=None), tensor=1)).notes)


# ---- the API: the tiny GLM-4.5 config uploaded, planned and exported -------------------------------------------------

def test_tiny_glm4_moe_config_through_the_api(client) -> None:  # type: ignore[no-untyped-def]
    """tests/fixtures/tiny-glm4-moe/config.json through POST /profiles/hf-config (profiler.hf_config reads it: 4 heads
    of 16 with 8 of each rotated, 2 key/value heads, Q/K/V biases, query/key norms, 8 experts of 32 top 2 in the best
    1 of 2 groups, sigmoid with the bias, scaled by 2.5, one shared expert, layer 0 dense), planned on two GPUs, the
    fastest candidate exported for Megatron-LM and read back; its torchtitan export names the partial rotary."""
    plan = plan_on_two_gpus(client, upload_fixture(client, "tiny-glm4-moe"), top=3)
    out = megatron_export(client, plan)
    lines = script_lines(out.main.content)
    for line in ("--num-layers 3", "--hidden-size 64", "--num-attention-heads 4", "--num-query-groups 2",
                 "--rotary-percent 0.5", "--qk-layernorm", "--disable-bias-linear", "--add-qkv-bias",
                 "--num-experts 8", "--moe-router-topk 2", "--moe-ffn-hidden-size 32",
                 "--moe-shared-expert-intermediate-size 32", "--moe-layer-freq '([0]+[1]*2)'",
                 "--moe-router-score-function sigmoid", "--moe-router-enable-expert-bias",
                 "--moe-router-num-groups 2", "--moe-router-group-topk 1", "--moe-router-topk-scaling-factor 2.5"):
        assert line in lines, line
    assert "--kv-channels" not in out.main.content  # (4 x 16 = 64)
    back = parse(out)
    assert (back.rotary_dim, back.qk_norm, back.bias, back.qkv_bias, back.shared_expert_ffn_hidden, back.dense_layers,
            back.router_score, back.router_bias, back.router_groups, back.router_group_topk, back.routed_scaling) == (
        8, True, False, True, 32, (0,), "sigmoid", True, 2, 1, 2.5)
    notes = torchtitan_notes(client, plan)
    if notes is not None:  # (None: a candidate with expert parallelism, which torchtitan's export refuses with a 422)
        assert any("(rotary_dim)" in n for n in notes), notes
