"""Llama 4 (ModelSpec's ``nope_layers``, ``rope_interleaved``, ``qk_l2_norm``, ``attention_chunk``,
``query_temperature``, ``router_weights_on_input``) on the export surfaces: every field is carried or refused naming it,
never dropped. The Megatron-LM export writes ``--no-rope-freq`` (every n-th layer as ``n``, any other pattern as the
list), ``--rotary-interleaved``, ``--qk-l2-norm`` (without layers lacking rotary positions: Megatron-Core norms every
layer) and ``--moe-apply-probs-on-input`` (top 1), and its parser reads them back; it refuses ``qk_l2_norm`` beside
``nope_layers``, chunks shorter than the sequence, a temperature that scales a query of the sequence and weights on the
input at top k > 1, naming each; a chunk or a temperature that acts on no position of the sequence is said in a note.
torchtitan's notes name what its llama3 settings leave out and what its own llama4 model has and lacks; DeepSpeed's
config carries no model, the same with the fields as without. Llama 4 Scout is refused for its query/key norm beside its
NoPE layers, Maverick written; the tiny Llama 4 config goes through the API: uploaded, planned, refused by the
Megatron-LM export with a 422 naming the fields, noted by the torchtitan export."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from api_support import AUTH, export_candidate, plan_on_two_gpus, torchtitan_notes, upload_fixture
from surfaces_support import assert_megatron_refuses, edited, script_flags, script_lines, two_stage_input

from planner.analytic import analytic_profile
from planner.export import ExportError, ExportInput, export, parse
from planner.export.megatron import no_rope_freq
from planner.export.megatron import parse as megatron_parse
from planner.model import ModelSpec
from planner.request import Config
from planner.runspec import RunSpec
from profiler.hf_config import read_hf_config

ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "tiny-llama4"
MODELS = ROOT / "examples" / "models"

#: tests/fixtures/tiny-llama4/config.json as profiler.hf_config reads it
TINY_LLAMA4 = read_hf_config(FIXTURE, seq=16)

#: the same by hand: 4 layers, 4 heads of 16, 2 key/value heads, layers 1 and 3 with 4 experts of 32 top 1 and a shared
#: expert of 32, layers 0 and 2 dense (96), layer 3 without rotary positions, the others turning adjacent pairs in
#: chunks of 8 of the 16 positions, per-head L2 query/key norms, the NoPE layer's queries scaled from position 3 on
BY_HAND = ModelSpec(
    name="tiny-llama4", layers=4, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn_hidden=96, gated_mlp=True,
    activation="silu", norm="rmsnorm", position="rotary", tied_embeddings=False, bias=False, experts=4,
    experts_per_token=1, expert_ffn_hidden=32, shared_expert_ffn_hidden=32, normalize_topk=False,
    router_score="sigmoid", router_weights_on_input=True, dense_layers=(0, 2), nope_layers=(3,), rope_interleaved=True,
    qk_l2_norm=True, attention_chunk=8, query_temperature=(4, 0.1), rope_theta=500000.0, vocab=128, seq=16)

#: what Megatron-LM's arguments compute of it: Maverick's form (no query/key norm), no chunk nor temperature
WRITABLE = TINY_LLAMA4.with_(qk_l2_norm=False, attention_chunk=None, query_temperature=None)

#: Parsed's names of the fields the Megatron export writes and reads back (ModelSpec's)
FIELDS = ("nope_layers", "rope_interleaved", "qk_l2_norm", "router_weights_on_input", "router_score",
          "normalize_topk", "shared_expert_ffn_hidden", "dense_layers")

QK_WORDS = ("qk_l2_norm with nope_layers", "on its layers with rotary positions only, not on layers 3",
            "Megatron-LM's --qk-l2-norm makes L2Norm every layer's q_layernorm and k_layernorm",
            "'if config.qk_l2_norm and not is_nope_layer'")
CHUNK_WORDS = ("attention_chunk 8: the model's layers with rotary positions attend within chunks of 8 positions of "
               "its 16-token sequence", "no argument of Megatron-LM's chunks the attention",
               "--window-size is a sliding window",
               "Llama4SelfAttention (chunkify over attention_chunk_size), on every layer, the ones without rotary "
               "positions included")
TEMPERATURE_WORDS = ("query_temperature (4, 0.1)", "1 + 0.1 ln(1 + floor((m + 1) / 4))",
                     "above 1 from position 3 of its 16-token sequence on")


def _inp(model: ModelSpec, **cfg: object) -> ExportInput:
    return two_stage_input(model, 8, **{"tensor": 2, "order": "tp-dp-pp", **cfg})


def _refusal(model: ModelSpec) -> str:
    with pytest.raises(ExportError, match="^megatron: ") as err:
        export("megatron", _inp(model))
    return str(err.value)


def _same_model(back, model: ModelSpec) -> None:
    assert {f: getattr(back, f) for f in FIELDS} == {f: getattr(model, f) for f in FIELDS}


def megatron_nope(value: str, layers: int) -> list[int]:
    """The layers without rotary positions Megatron-Core runs for ``--no-rope-freq value``: an integer ``n`` becomes
    ``[0]*(n-1)+[1]`` repeated ``layers / n`` times (``TransformerConfig.__post_init__``, asserting the division), a
    list is evaluated as it stands (``no_rope_freq_type``'s ``_eval_pattern``); ``SelfAttention.forward`` drops the
    rotary of 1-based layer ``l`` where ``no_rope_freq[l - 1]``."""
    if re.fullmatch(r"\d+", value):
        n = int(value)
        assert layers % n == 0, "Megatron-Core asserts the division"
        bits = ([0] * (n - 1) + [1]) * (layers // n)
    else:
        assert not re.search(r"[^,\d\[\]()+*]", value)
        bits = eval(value)  # (digits, brackets, + and * only: checked above, as Megatron does)
    assert len(bits) == layers
    return [i for i, bit in enumerate(bits) if bit]


# ---- Megatron-LM: refused, naming the field ----------------------------------------------------------------------

def test_megatron_refuses_tiny_llama4() -> None:
    message = _refusal(TINY_LLAMA4)
    for words in (*QK_WORDS, *CHUNK_WORDS, *TEMPERATURE_WORDS,
                  "Megatron-LM's arguments would train another model than the one planned, so none are written"):
        assert words in message, words
    # at every t, on one stage or two: the same refusal, before anything is written
    for cfg in ({"tensor": 1}, {"pipeline": 1, "data": 4}, {"recompute": True}):
        with pytest.raises(ExportError, match="^megatron: qk_l2_norm with nope_layers"):
            export("megatron", _inp(TINY_LLAMA4, **cfg))


@pytest.mark.parametrize(("update", "named", "not_named"), [
    ({"attention_chunk": None, "query_temperature": None}, QK_WORDS, ("attention_chunk", "query_temperature")),
    ({"qk_l2_norm": False, "query_temperature": None}, CHUNK_WORDS, ("qk_l2_norm", "query_temperature")),
    ({"qk_l2_norm": False, "attention_chunk": None}, TEMPERATURE_WORDS, ("qk_l2_norm", "attention_chunk")),
    # the edges: a chunk one position shorter than the sequence limits it; a floor of the sequence scales its last
    ({"qk_l2_norm": False, "attention_chunk": 15, "query_temperature": None}, ("attention_chunk 15",),
     ("qk_l2_norm", "query_temperature")),
    ({"qk_l2_norm": False, "attention_chunk": None, "query_temperature": (16, 0.1)},
     ("query_temperature (16, 0.1)", "above 1 from position 15"), ("qk_l2_norm", "attention_chunk")),
    # Megatron-Core applies the weights on the input at top 1 only (sigmoid at k > 1: renormalised)
    ({"qk_l2_norm": False, "attention_chunk": None, "query_temperature": None, "experts_per_token": 2,
      "normalize_topk": True}, ("router_weights_on_input with 2 experts per token", "only works with "
                                "`moe_router_topk`=1"), ("qk_l2_norm", "attention_chunk", "query_temperature")),
])
def test_megatron_refuses_each_field_alone(update: dict, named: tuple[str, ...], not_named: tuple[str, ...]) -> None:
    message = _refusal(TINY_LLAMA4.with_(**update))
    for words in named:
        assert words in message, words
    for field in not_named:
        assert field not in message, field


# ---- Megatron-LM: written and read back ----------------------------------------------------------------------------

def test_megatron_round_trip_of_what_it_computes() -> None:
    inp = _inp(WRITABLE)
    out = export("megatron", inp)
    lines = script_lines(out.main.content)
    for line in ("--num-layers 4", "--hidden-size 64", "--num-attention-heads 4", "--group-query-attention",
                 "--num-query-groups 2", "--ffn-hidden-size 96", "--swiglu",
                 "--position-embedding-type rope", "--rotary-base 500000", "--rotary-interleaved", "--no-rope-freq 4",
                 "--num-experts 4", "--moe-router-topk 1", "--moe-ffn-hidden-size 32",
                 "--moe-shared-expert-intermediate-size 32", "--moe-layer-freq '([0]+[1])*2'",
                 "--moe-router-score-function sigmoid", "--moe-apply-probs-on-input", "--disable-bias-linear",
                 "--untie-embeddings-and-output-weights"):
        assert line in lines, line
    flags = script_flags(out.main.content)
    for absent in ("--qk-l2-norm", "--qk-layernorm", "--moe-router-pre-softmax", "--window-size", "--rotary-percent",
                   "--moe-shared-expert-gate", "--no-rope-fusion", "--kv-channels"):  # (4 heads x 16 = 64)
        assert absent not in flags, absent
    # everything the model has is written: no gap named; the fused rotary's TE release is said
    assert not any(n.startswith("megatron: the model has") for n in out.notes), out.notes
    assert any(n.startswith("--rotary-interleaved runs in Transformer Engine's fused rotary kernel from TE 2.3")
               for n in out.notes), out.notes
    back = parse(out)
    assert (back.config, back.microbatches, back.layer_counts) == (inp.config, 8, [2, 2])
    _same_model(back, WRITABLE)
    # Megatron-Core runs the rotary on the model's layers
    assert megatron_nope(flags["--no-rope-freq"], 4) == [i for i in range(4) if not WRITABLE.rotary_layer(i)] == [3]


def test_megatron_writes_qk_l2_norm_where_every_layer_has_rotary_positions() -> None:
    model = TINY_LLAMA4.with_(nope_layers=(), attention_chunk=None, query_temperature=None)
    out = export("megatron", _inp(model))
    flags = script_flags(out.main.content)
    assert "--qk-l2-norm" in flags and "--no-rope-freq" not in flags and "--qk-layernorm" not in flags
    back = parse(out)
    assert (back.qk_l2_norm, back.qk_norm, back.nope_layers) == (True, False, ())
    # each field written only where the model has it
    plain = model.with_(qk_l2_norm=False, rope_interleaved=False, router_weights_on_input=False)
    flags = script_flags(export("megatron", _inp(plain)).main.content)
    for absent in ("--qk-l2-norm", "--rotary-interleaved", "--no-rope-freq", "--moe-apply-probs-on-input"):
        assert absent not in flags, absent
    _same_model(parse(export("megatron", _inp(plain))), plain)


@pytest.mark.parametrize(("layers", "nope", "written"), [
    (4, (3,), "4"), (8, (3, 7), "4"), (4, (1, 3), "2"), (48, tuple(range(3, 48, 4)), "4"),
    # not every n-th from n - 1, or n not dividing the layers: the list
    (4, (0,), "([1]+[0]*3)"), (6, (3,), "([0]*3+[1]+[0]*2)"), (4, (2, 3), "([0]*2+[1]*2)"),
    (6, (1, 3), "([0]+[1]+[0]+[1]+[0]*2)"), (8, (0, 4), "([1]+[0]*3)*2"),
])
def test_megatron_no_rope_freq_is_the_models(layers: int, nope: tuple[int, ...], written: str) -> None:
    """Every pattern of layers without rotary positions is written, as Megatron-Core reads it (:func:`megatron_nope`):
    the integer where it is every n-th from n - 1 and n divides the layers, the list otherwise."""
    assert no_rope_freq(layers, nope) == written
    model = WRITABLE.with_(layers=layers, nope_layers=nope, dense_layers=())
    out = export("megatron", two_stage_input(model, 8, tensor=2, order="tp-dp-pp"))
    value = script_flags(out.main.content)["--no-rope-freq"].strip("'")
    assert value == written
    assert megatron_nope(value, layers) == [i for i in range(layers) if not model.rotary_layer(i)] == list(nope)
    assert parse(out).nope_layers == nope


@pytest.mark.parametrize(("update", "note"), [
    ({"attention_chunk": 16}, "attention_chunk 16 is not shorter than the sequence (16)"),
    ({"attention_chunk": 8192}, "attention_chunk 8192 is not shorter than the sequence (16)"),
    ({"query_temperature": (17, 0.1)}, "query_temperature (17, 0.1) scales no query of the 16-token sequence (it "
                                       "first does at position 16)"),
    ({"query_temperature": (4, 0.0)}, "query_temperature (4, 0) scales no query of the 16-token sequence (a scale of "
                                      "0)"),
])
def test_megatron_says_what_acts_on_no_position(update: dict, note: str) -> None:
    """A chunk at least the sequence is causal attention and a temperature from a position past it scales nothing:
    the model at this sequence is written, and a note names the field."""
    model = WRITABLE.with_(**update)
    out = export("megatron", _inp(model))
    assert any(n.startswith(note) for n in out.notes), out.notes
    assert "--window-size" not in out.main.content
    _same_model(parse(out), model)


def test_megatron_export_of_an_analytical_profile() -> None:
    """The profile's model_spec carries Llama 4's fields to the export; the tiny Llama 4 is refused through it too."""
    run = RunSpec(config=Config(tensor=2, pipeline=2, data=2, micro_batch=1, schedule="1f1b", order="tp-dp-pp"),
                  microbatches=8, partition=[(0, 3), (3, 6)])
    out = export("megatron", ExportInput.from_profile(run, analytic_profile(WRITABLE, "h100-sxm5-80gb")))
    assert "--no-rope-freq 4" in out.main.content and "--moe-apply-probs-on-input" in out.main.content
    _same_model(parse(out), WRITABLE)
    with pytest.raises(ExportError, match="^megatron: qk_l2_norm with nope_layers"):
        export("megatron", ExportInput.from_profile(run, analytic_profile(TINY_LLAMA4, "h100-sxm5-80gb")))


def test_megatron_parse_reads_what_megatron_runs() -> None:
    text = export("megatron", _inp(WRITABLE)).main.content
    assert megatron_parse(edited(text, drop=("--no-rope-freq",))).nope_layers == ()
    listed = edited(text, drop=("--no-rope-freq",), add="--no-rope-freq '([0]*3+[1])'")
    assert megatron_parse(listed).nope_layers == (3,)
    assert megatron_parse(edited(text, drop=("--no-rope-freq",), add="--no-rope-freq 2")).nope_layers == (1, 3)
    # without rope Megatron's rotary arguments do nothing
    norope = megatron_parse(edited(text, drop=("--position-embedding-type",)))
    assert (norope.nope_layers, norope.rope_interleaved) == ((), False)
    assert megatron_parse(edited(text, drop=("--rotary-interleaved",))).rope_interleaved is False
    assert megatron_parse(edited(text, drop=("--moe-apply-probs-on-input",))).router_weights_on_input is False
    # Megatron-Core's layer spec takes --qk-l2-norm's L2Norm in --qk-layernorm's stead
    both = megatron_parse(edited(text, drop=("--no-rope-freq",), add="--qk-l2-norm --qk-layernorm"))
    assert (both.qk_l2_norm, both.qk_norm) == (True, False)
    refused = [
        (edited(text, add="--qk-l2-norm"), "--qk-l2-norm with --no-rope-freq 4: Megatron-Core norms the queries and "
                                          "keys of every layer, those without rotary positions (3) included"),
        (edited(text, drop=("--moe-router-topk",), add="--moe-router-topk 2"),
         "--moe-apply-probs-on-input with --moe-router-topk 2"),
        (edited(text, drop=("--no-rope-freq",), add="--no-rope-freq 3"), "--no-rope-freq 3 does not divide the 4"),
        (edited(text, drop=("--no-rope-freq",), add="--no-rope-freq '[1]*4'"), "every layer without rotary"),
        (edited(text, drop=("--no-rope-freq",), add="--no-rope-freq '[1]*3'"), "lists 3 layers, --num-layers is 4"),
        (edited(text, drop=("--no-rope-freq",), add="--no-rope-freq 0"), "a frequency of 1 or more"),
        (edited(text, drop=("--no-rope-freq",), add="--no-rope-freq 'x'"), "not a list expression"),
        (edited(text, drop=("--no-rope-freq",), add="--qk-l2-norm --multi-latent-attention"),
         "'qk_l2_norm is not supported with MLA'"),
        (edited(text, add="--multi-latent-attention"), "--rotary-interleaved with --multi-latent-attention"),
    ]
    assert_megatron_refuses(refused)


def test_megatron_rotary_and_l2_norm_match_transformers_llama4() -> None:
    """transformers' own Llama 4 rotary (``Llama4TextRotaryEmbedding``, ``apply_rotary_emb``: adjacent pairs as complex
    numbers) on the tiny config equals the interleaved form Megatron-Core computes for ``--rotary-interleaved`` (the
    table ``stack((freqs, freqs), -1)``, ``_rotate_half``'s interleaved branch ``stack((-x[1::2], x[::2]), -1)``), and
    Megatron-Core's L2Norm before the rotary equals transformers' weightless norm after it (a rotation keeps each head's
    mean square)."""
    torch = pytest.importorskip("torch")
    llama4 = pytest.importorskip("transformers.models.llama4.modeling_llama4")
    from transformers import Llama4TextConfig

    data = json.loads((FIXTURE / "config.json").read_text())
    cfg = Llama4TextConfig(**{k: v for k, v in data.items() if k not in ("architectures", "model_type")})
    flags = script_flags(export("megatron", _inp(WRITABLE)).main.content)
    assert "--rotary-interleaved" in flags
    # (Megatron's kv_channels default: hidden_size // num_attention_heads)
    base, d = int(flags["--rotary-base"]), int(flags["--hidden-size"]) // int(flags["--num-attention-heads"])
    positions = torch.arange(16)
    freqs = torch.outer(positions.float(), 1.0 / base ** (torch.arange(0, d, 2).float() / d))
    table = torch.stack((freqs, freqs), dim=-1).reshape(16, d)  # [f0, f0, f1, f1, ...]
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 16, WRITABLE.heads, d, generator=gen)
    k = torch.randn(1, 16, WRITABLE.k, d, generator=gen)

    def rotate(t):  # Megatron-Core's _apply_rotary_pos_emb_bshd with rotary_interleaved
        half = torch.stack((-t[..., 1::2], t[..., ::2]), dim=-1).reshape(t.shape)
        return t * table.cos()[None, :, None] + half * table.sin()[None, :, None]

    def l2(t, eps=1e-5):  # L2Norm: x * rsqrt(mean(x^2) + eps), no weight
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps)

    freqs_cis = llama4.Llama4TextRotaryEmbedding(cfg)(q, positions[None])
    q_hf, k_hf = llama4.apply_rotary_emb(q, k, freqs_cis)
    assert torch.allclose(q_hf, rotate(q), atol=1e-5) and torch.allclose(k_hf, rotate(k), atol=1e-5)
    norm = llama4.Llama4TextL2Norm(cfg.rms_norm_eps)
    assert torch.allclose(norm(q_hf), rotate(l2(q)), atol=1e-5) and torch.allclose(norm(k_hf), rotate(l2(k)), atol=1e-5)
    # rotate-half (Megatron's default) is another function of the same queries
    plain = torch.cat((-q[..., d // 2:], q[..., :d // 2]), dim=-1)
    halves = torch.cat((freqs, freqs), dim=-1)
    assert not torch.allclose(q_hf, q * halves.cos()[None, :, None] + plain * halves.sin()[None, :, None], atol=1e-3)


def test_megatron_of_llama_4_scout_and_maverick() -> None:
    """At a sequence of 4096 Llama 4's chunks of 8192 and its temperature from position 8191 act on no position; Scout
    is refused for its query/key L2 norm beside its NoPE layers alone, Maverick (no such norm) is written as
    Megatron-Bridge's Llama4Experts128ModelProvider sets it: every 4th layer without rotary positions, experts on the
    odd layers ([0, 1] * 24), 128 experts of 8192 top 1 with a shared one of 8192, weights on the input."""
    scout = read_hf_config(MODELS / "llama-4-scout", seq=4096)
    message = _refusal(scout)
    assert message.startswith("megatron: qk_l2_norm with nope_layers")
    assert "not on layers 3, 7, 11, 15, 19, 23, 27, 31, 35, 39, 43, 47" in message
    assert "attention_chunk" not in message and "query_temperature" not in message
    maverick = read_hf_config(MODELS / "llama-4-maverick", seq=4096)
    out = export("megatron", _inp(maverick, tensor=8, expert=2))
    lines = script_lines(out.main.content)
    for line in ("--num-layers 48", "--hidden-size 5120", "--num-attention-heads 40", "--num-query-groups 8",
                 "--ffn-hidden-size 16384", "--rotary-interleaved", "--no-rope-freq 4", "--num-experts 128",
                 "--moe-router-topk 1", "--moe-ffn-hidden-size 8192", "--moe-shared-expert-intermediate-size 8192",
                 "--moe-layer-freq '([0]+[1])*24'", "--moe-router-score-function sigmoid",
                 "--moe-apply-probs-on-input"):
        assert line in lines, line
    assert "--qk-l2-norm" not in out.main.content
    for note in ("attention_chunk 8192 is not shorter than the sequence (4096)",
                 "query_temperature (8192, 0.1) scales no query of the 4096-token sequence (it first does at position "
                 "8191)"):
        assert any(n.startswith(note) for n in out.notes), note
    _same_model(parse(out), maverick)
    # a sequence of 8192 reaches the temperature (not the chunks: 8192 is the sequence); a chunk of 2048 is refused
    message = _refusal(maverick.with_(seq=8192))
    assert "attention_chunk" not in message and "query_temperature (8192, 0.1)" in message
    assert "above 1 from position 8191 of its 8192-token sequence" in message
    assert "attention_chunk 2048" in _refusal(maverick.with_(attention_chunk=2048))


# ---- torchtitan and DeepSpeed ----------------------------------------------------------------------------------------

def test_torchtitan_notes_name_each_field() -> None:
    out = export("torchtitan", _inp(TINY_LLAMA4, tensor=1))
    gap = next(n for n in out.notes if n.startswith("torchtitan: the model has"))
    for words in ("no rotary positions on layers 3 (nope_layers)",
                  "each head's query and key divided by its root mean square, no weight on the layers with rotary "
                  "positions (qk_l2_norm)",
                  "attention within chunks of 8 positions on the layers with rotary positions (attention_chunk)",
                  "multiplied by 1 + 0.1 ln(1 + floor((m + 1) / 4)) from position 3 on (query_temperature)",
                  "each expert's input, not its output, multiplied by its routing weight (router_weights_on_input)",
                  "sigmoid scores (router_score)", "in each MLP but those of layers 0, 2 (dense_layers"):
        assert words in gap, words
    titan = next(n for n in out.notes if n.startswith("torchtitan's llama4 model (torchtitan/models/llama4) has"))
    has, _, lacks = titan.partition("; it lacks ")
    for words in ("rotary positions turning adjacent pairs (view_as_complex: rope_interleaved)",
                  "attention within chunks on the layers with rotary positions (fixed_attn_block_size 8, with flex "
                  "attention only", "sigmoid routing to the top 1", "(score_before_experts, its default: "
                  "router_weights_on_input)", "a shared expert (num_shared_experts)",
                  "experts on every 2nd layer from layer 1 (interleave_moe_layer_step 2)"):
        assert words in has, words
    for words in ("layers without rotary positions, 3 (nope_layers): its every_n_layers_nope n drops them on layers 0, "
                  "n, 2n", "(qk_l2_norm): its Attention has no query/key norm", "(query_temperature): its Attention "
                  "scales no query by its position"):
        assert words in lacks, words
    assert titan.endswith("register a flavor of this model there and name it in [model] instead, adding what it lacks")
    # its routing is Llama 4's, not DeepSeek's: no deepseek_v3 offered
    assert not any("deepseek_v3" in n for n in out.notes), out.notes


def test_torchtitan_notes_of_what_acts_on_no_position_and_of_what_its_llama4_has() -> None:
    model = WRITABLE.with_(nope_layers=(0,), attention_chunk=16, query_temperature=(17, 0.1), dense_layers=())
    notes = export("torchtitan", _inp(model, tensor=1)).notes
    gap = next(n for n in notes if n.startswith("torchtitan: the model has"))
    assert "(attention_chunk)" not in gap and "(query_temperature)" not in gap and "(nope_layers)" in gap
    assert any(n.startswith("attention_chunk 16 is not shorter than the sequence (16)") for n in notes), notes
    assert any(n.startswith("query_temperature (17, 0.1) scales no query") for n in notes), notes
    titan = next(n for n in notes if n.startswith("torchtitan's llama4 model"))
    # layer 0 of 4 is its every_n_layers_nope 4; experts on every layer its interleave_moe_layer_step 1
    assert "no rotary positions on every 4th layer from layer 0 (every_n_layers_nope 4)" in titan
    assert "experts on every layer (interleave_moe_layer_step 1)" in titan
    assert "it lacks" not in titan and titan.endswith("name it in [model] instead")
    # a model without Llama 4's layers: no llama4 model offered
    plain = WRITABLE.with_(nope_layers=(), rope_interleaved=False, router_weights_on_input=False)
    assert not any("torchtitan's llama4" in n for n in export("torchtitan", _inp(plain, tensor=1)).notes)


def test_deepspeed_config_carries_no_model() -> None:
    """DeepSpeed's config has no model section (the model is the user's PipelineModule): the tiny Llama 4's is the
    same as that of the same shapes without Llama 4's fields, and names none of them."""
    plain = TINY_LLAMA4.with_(nope_layers=(), rope_interleaved=False, qk_l2_norm=False, attention_chunk=None,
                              query_temperature=None, router_weights_on_input=False)
    out = export("deepspeed", _inp(TINY_LLAMA4, tensor=1))
    assert out.main.content == export("deepspeed", _inp(plain, tensor=1)).main.content
    assert not any(field in out.main.content for field in ("nope", "interleaved", "l2", "chunk", "temperature"))


# ---- the API: the tiny Llama 4 config uploaded, planned and exported -------------------------------------------------

def test_tiny_llama4_fixture_is_the_spec_by_hand() -> None:
    assert TINY_LLAMA4.model_dump(exclude={"name", "source"}) == BY_HAND.model_dump(exclude={"name", "source"})


def test_tiny_llama4_config_through_the_api(client) -> None:  # type: ignore[no-untyped-def]
    """tests/fixtures/tiny-llama4/config.json through POST /profiles/hf-config, planned on two GPUs: every candidate's
    Megatron-LM export is a 422 naming qk_l2_norm, attention_chunk and query_temperature, its torchtitan export names
    them and points at torchtitan's llama4; the stored profile and plan are left as they were."""
    upload = upload_fixture(client, "tiny-llama4")
    plan = plan_on_two_gpus(client, upload, top=3)
    assert plan["candidates"], plan
    stored = client.get(f"/plans/{plan['id']}", headers=AUTH).json()
    for rank in range(len(plan["candidates"])):
        doc = export_candidate(client, plan, rank, "megatron")
        assert doc.status_code == 422, doc.text
        detail = doc.json()["detail"]
        for words in ("qk_l2_norm with nope_layers", "attention_chunk 8", "query_temperature (4, 0.1)"):
            assert words in detail, words
        notes = torchtitan_notes(client, plan, rank)
        if notes is not None:  # (None: expert parallelism, which torchtitan's export refuses with a 422)
            assert any("(qk_l2_norm)" in n and "(nope_layers)" in n for n in notes), notes
            assert any(n.startswith("torchtitan's llama4 model") for n in notes), notes
    assert client.get(f"/plans/{plan['id']}", headers=AUTH).json() == stored
