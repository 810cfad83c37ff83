"""gpt-oss (ModelSpec's ``attention_sinks``, ``activation`` quick_gelu with ``glu_linear_offset`` and ``glu_clamp``,
``bias``, a window on every other layer) on the export surfaces: the Megatron-LM export writes Megatron-LM's own
arguments for them (``--softmax-type learnable``, ``--window-size w-1,0``, ``--window-attn-skip-freq``,
``--quick-geglu``, ``--glu-linear-offset``, ``--activation-func-clamp-value``; biases are Megatron's default) and its
parser reads them back; what Megatron-Core cannot compute is refused, naming the field; torchtitan's note names what
its settings leave out; and the tiny gpt-oss config goes through the API: uploaded, planned, exported, read back."""

from __future__ import annotations

import pytest
from api_support import megatron_export, plan_on_two_gpus, torchtitan_notes, upload_fixture
from surfaces_support import assert_megatron_refuses, edited, script_lines, two_stage_input

from planner.analytic import analytic_profile
from planner.export import ExportError, ExportInput, export, parse
from planner.export.megatron import parse as megatron_parse
from planner.model import ModelSpec
from planner.request import Config
from planner.runspec import RunSpec

#: gpt-oss-120b as the brief gives it, by hand (the model card's Table 1: 36 layers, h 2880, 64 heads of 64, 8
#: key/value heads, 128 experts of 2880, top 4; every linear layer biased; sinks; a 128-token window on every other
#: layer from the first)
GPT_OSS = ModelSpec(name="gpt-oss-120b", layers=36, hidden=2880, heads=64, kv_heads=8, head_dim=64, ffn_hidden=2880,
                    gated_mlp=True, activation="quick_gelu", glu_linear_offset=1.0, glu_clamp=7.0, norm="rmsnorm",
                    position="rotary", tied_embeddings=False, bias=True, attention_sinks=True, sliding_window=128,
                    global_every=2, experts=128, experts_per_token=4, vocab=201088, seq=4096)

#: the fields the Megatron export writes and its parser reads back (Parsed's names: ModelSpec's)
FIELDS = ("attention_sinks", "sliding_window", "global_every", "activation", "glu_linear_offset", "glu_clamp", "bias",
          "qkv_bias", "normalize_topk", "router_score")


def _inp(model: ModelSpec, **cfg: object) -> ExportInput:
    return two_stage_input(model, 8, **{"tensor": 4, "expert": 2, "order": "tp-dp-pp", **cfg})


def _model_fields(model: ModelSpec) -> dict[str, object]:
    """What the parser should read back of ``model``: its fields; the gated MLP's activation (silu or quick_gelu,
    None without a gate); biases on Q, K, V alone only where the layers have no others (``--add-qkv-bias``)."""
    want = {f: getattr(model, f) for f in FIELDS}
    want["activation"] = model.activation if model.gated_mlp else None
    want["qkv_bias"] = model.qkv_bias and not model.bias
    return want


def _same_model(back, model: ModelSpec) -> None:
    assert {f: getattr(back, f) for f in FIELDS} == _model_fields(model)


# ---- Megatron-LM ----------------------------------------------------------------------------------------------------

def test_megatron_round_trip_of_gpt_oss() -> None:
    inp = _inp(GPT_OSS)
    out = export("megatron", inp)
    lines = script_lines(out.main.content)
    for line in ("--quick-geglu", "--glu-linear-offset 1.0", "--activation-func-clamp-value 7.0",
                 "--softmax-type learnable", "--window-size 127,0", "--window-attn-skip-freq 2",
                 "--untie-embeddings-and-output-weights", "--normalization RMSNorm", "--group-query-attention",
                 "--num-query-groups 8", "--kv-channels 64", "--num-experts 128", "--moe-router-topk 4",
                 "--moe-ffn-hidden-size 2880", "--expert-model-parallel-size 2"):
        assert line in lines, line
    text = out.main.content
    # quick_gelu's gate is not SwiGLU; the biases are Megatron's default; the experts' GLU is fused (no dense MLP);
    # gpt-oss's softmax over the top-k logits is Megatron's default routing
    for absent in ("--swiglu", "--disable-bias-linear", "--add-qkv-bias", "--no-bias-gelu-fusion",
                   "--moe-router-pre-softmax", "--moe-router-score-function"):
        assert absent not in text, absent
    # everything the model has is written: no gap named; the sinks' attention backend is said
    assert not any(n.startswith("megatron: the model has") for n in out.notes), out.notes
    assert any(n.startswith("--softmax-type learnable") and "never in flash-attn" in n for n in out.notes), out.notes
    back = parse(out)
    assert (back.config, back.microbatches, back.layer_counts) == (inp.config, 8, [18, 18])
    _same_model(back, GPT_OSS)


def test_megatron_window_is_the_models() -> None:
    """The written window, applied as Megatron-Core applies it (utils.py: ``get_sliding_window_causal_mask`` keeps
    the keys ``i - left`` to ``i + right``; ``is_layer_window_attention`` windows the 1-based layer ``l`` unless
    ``l % freq == 0``), is the model's: 128 keys, the query's own included, on the layers ModelSpec.local_layer
    names (0, 2, 4, ...)."""
    flags = dict(ln.split(" ", 1) for ln in script_lines(export("megatron", _inp(GPT_OSS)).main.content)
                 if ln.startswith("--window"))
    left, right = (int(x) for x in flags["--window-size"].split(","))
    freq = int(flags["--window-attn-skip-freq"])
    i = 1000  # a query far from the start
    keys = [j for j in range(i + 1) if i - left <= j <= i + right]
    assert len(keys) == GPT_OSS.sliding_window and keys[-1] == i
    windowed = [n - 1 for n in range(1, GPT_OSS.layers + 1) if n % freq != 0]  # (n: 1-based)
    assert windowed == [i for i in range(GPT_OSS.layers) if GPT_OSS.local_layer(i)] == list(range(0, 36, 2))


@pytest.mark.parametrize(("update", "written", "not_written"), [
    # Mistral's window on every layer: no skip frequency
    ({"global_every": None, "sliding_window": 4096}, ["--window-size 4095,0"], ["--window-attn-skip-freq"]),
    # Gemma 3's five local layers to a global one
    ({"global_every": 6}, ["--window-size 127,0", "--window-attn-skip-freq 6"], []),
    # no window, no sinks: neither flag
    ({"sliding_window": None, "global_every": None, "attention_sinks": False}, [],
     ["--window-size", "--window-attn-skip-freq", "--softmax-type"]),
    # a dense quick_gelu MLP: Megatron-Core's fused dense-MLP activation takes gelu and SwiGLU only
    ({"experts": None, "experts_per_token": None}, ["--quick-geglu", "--no-bias-gelu-fusion"], ["--num-experts"]),
    # the offset and the clamp are written only where the model has them
    ({"glu_linear_offset": 0.0, "glu_clamp": None}, ["--quick-geglu"],
     ["--glu-linear-offset", "--activation-func-clamp-value"]),
    # Qwen2's biases on Q, K and V only; SwiGLU
    ({"bias": False, "qkv_bias": True, "activation": "silu", "glu_linear_offset": 0.0, "glu_clamp": None},
     ["--disable-bias-linear", "--add-qkv-bias", "--swiglu"], ["--quick-geglu"]),
])
def test_megatron_round_trip_of_variants(update: dict, written: list[str], not_written: list[str]) -> None:
    model = GPT_OSS.with_(**update)
    out = export("megatron", _inp(model))
    lines = script_lines(out.main.content)
    for line in written:
        assert line in lines, line
    for flag in not_written:
        assert not any(ln.split(" ")[0] == flag for ln in lines), flag
    _same_model(parse(out), model)


@pytest.mark.parametrize(("update", "words"), [
    # Megatron-LM's quick_gelu is --quick-geglu: a gate's
    ({"gated_mlp": False, "glu_linear_offset": 0.0, "glu_clamp": None}, "activation quick_gelu without gated_mlp"),
    # the offset and the clamp with another activation than quick_gelu: the fused SwiGLU takes neither
    ({"activation": "silu"}, "glu_linear_offset and glu_clamp with activation silu"),
    ({"activation": "silu", "glu_linear_offset": 0.0}, "glu_clamp with activation silu"),
    ({"activation": "gelu", "glu_clamp": None}, "glu_linear_offset with activation gelu"),
    # Megatron-Core's shared expert has no biases; gpt-oss's layers have them
    ({"shared_expert_ffn_hidden": 2880}, "shared_expert_ffn_hidden (2880) with bias"),
])
def test_megatron_refuses_what_megatron_core_cannot_compute(update: dict, words: str) -> None:
    model = GPT_OSS.with_(**update)  # (a valid model: with_ validates)
    with pytest.raises(ExportError, match="megatron: ") as err:
        export("megatron", _inp(model))
    assert words in str(err.value), str(err.value)


def test_megatron_rotary_base_is_an_integer() -> None:
    """Megatron-LM's ``--rotary-base`` is ``type=int``: gpt-oss's 150000 and Qwen's 1e6 are written whole (%g wrote
    1e+06, which its parser refuses); a base that is not whole is refused, naming rope_theta."""
    for theta, written in ((150000.0, "--rotary-base 150000"), (1e6, "--rotary-base 1000000")):
        assert written in script_lines(export("megatron", _inp(GPT_OSS.with_(rope_theta=theta))).main.content)
    with pytest.raises(ExportError, match=r"megatron: rope_theta 10000\.5: Megatron-LM's --rotary-base is an integer"):
        export("megatron", _inp(GPT_OSS.with_(rope_theta=10000.5)))


def test_megatron_parse_reads_what_megatron_runs() -> None:
    text = export("megatron", _inp(GPT_OSS)).main.content
    # a skip frequency as a list (1: windowed, 0: global) of that period; every layer global or windowed
    alternate = edited(text, drop=("--window-attn-skip-freq",), add="--window-attn-skip-freq '([1]+[0])*18'")
    assert (megatron_parse(alternate).sliding_window, megatron_parse(alternate).global_every) == (128, 2)
    every = edited(text, drop=("--window-attn-skip-freq",), add="--window-attn-skip-freq '[1]*36'")
    assert (megatron_parse(every).sliding_window, megatron_parse(every).global_every) == (128, None)
    for none in (edited(text, drop=("--window-attn-skip-freq",), add="--window-attn-skip-freq 1"),
                 edited(text, drop=("--window-size",), add="--window-size -1,0"),
                 edited(text, drop=("--window-size",))):
        assert (megatron_parse(none).sliding_window, megatron_parse(none).global_every) == (None, None)
    # the biases: Megatron's default unless --disable-bias-linear
    assert megatron_parse(edited(text, add="--disable-bias-linear")).bias is False
    refused = [
        (edited(text, drop=("--softmax-type",), add="--softmax-type off-by-one"), "--softmax-type 'off-by-one'"),
        (edited(text, drop=("--window-size",), add="--window-size 127,5"), "the 5 tokens after it"),
        (edited(text, drop=("--window-attn-skip-freq",), add="--window-attn-skip-freq '[1]+[0]+[1]*34'"),
         "not every n-th"),
        (edited(text, drop=("--window-attn-skip-freq",), add="--window-attn-skip-freq '[1]*4'"),
         "lists 4 layers, --num-layers is 36"),
        (edited(text, add="--swiglu"), "--swiglu and --quick-geglu"),
        (edited(text, drop=("--quick-geglu",), add="--swiglu"), "--glu-linear-offset without --quick-geglu"),
        (edited(text, drop=("--quick-geglu", "--glu-linear-offset")),
         "--activation-func-clamp-value without --quick-geglu"),
    ]
    assert_megatron_refuses(refused)


def test_megatron_export_of_an_analytical_profile() -> None:
    """The profile's model_spec carries gpt-oss's fields to the export."""
    prof = analytic_profile(GPT_OSS, "h100-sxm5-80gb")
    run = RunSpec(config=Config(tensor=4, pipeline=2, data=2, micro_batch=1, schedule="1f1b", expert=2,
                                order="tp-dp-pp"), microbatches=8, partition=[(0, 19), (19, 38)])
    out = export("megatron", ExportInput.from_profile(run, prof))
    assert "--softmax-type learnable" in out.main.content and "--quick-geglu" in out.main.content
    _same_model(parse(out), GPT_OSS)


# ---- torchtitan ----------------------------------------------------------------------------------------------------

def test_torchtitan_note_names_what_its_settings_leave_out() -> None:
    out = export("torchtitan", _inp(GPT_OSS, tensor=1, expert=1))
    gap = next(n for n in out.notes if n.startswith("torchtitan: the model has"))
    for words in ("a learned sink logit per head in every attention softmax (attention_sinks)",
                  "biases on every linear layer, the experts' and the router's included (bias)",
                  "the gate clamped to at most 7 and the up projection to [-7, 7] (glu_clamp)",
                  "the up projection plus 1 before the gate's product (glu_linear_offset)",
                  "a gated MLP with quick_gelu (GeGLU)",
                  "attention within a window of 128 tokens on all but every 2th layer (sliding_window, global_every)"):
        assert words in gap, words
    assert any(n.startswith("torchtitan's gpt_oss model has") for n in out.notes), out.notes
    # a model without them: none named, no gpt_oss model offered
    plain = GPT_OSS.with_(**{"attention_sinks": False, "bias": False, "glu_linear_offset": 0.0, "glu_clamp": None,
                             "activation": "silu"})
    notes = export("torchtitan", _inp(plain, tensor=1, expert=1)).notes
    gap = next(n for n in notes if n.startswith("torchtitan: the model has"))
    assert "sink" not in gap and "(bias)" not in gap and "glu_" not in gap and "GeGLU" not in gap
    assert not any("gpt_oss" in n for n in notes)


# ---- the API: the tiny gpt-oss config uploaded, planned and exported -------------------------------------------------

def test_tiny_gpt_oss_config_through_the_api(client) -> None:  # type: ignore[no-untyped-def]
    """tests/fixtures/tiny-gpt-oss/config.json through POST /profiles/hf-config (profiler.hf_config reads it: sinks,
    a window of 4 on every other layer, quick_gelu clamped at 7 with the offset 1, biases, 4 experts top 2), planned
    on two GPUs, the fastest candidate exported for Megatron-LM and read back; its torchtitan export names the
    sinks."""
    plan = plan_on_two_gpus(client, upload_fixture(client, "tiny-gpt-oss"), top=3)
    out = megatron_export(client, plan)
    lines = script_lines(out.main.content)
    for line in ("--quick-geglu", "--glu-linear-offset 1.0", "--activation-func-clamp-value 7.0",
                 "--softmax-type learnable", "--window-size 3,0", "--window-attn-skip-freq 2", "--num-experts 4",
                 "--moe-router-topk 2", "--num-layers 3"):
        assert line in lines, line
    assert "--disable-bias-linear" not in out.main.content
    back = parse(out)
    assert (back.attention_sinks, back.sliding_window, back.global_every, back.activation, back.glu_linear_offset,
            back.glu_clamp, back.bias) == (True, 4, 2, "quick_gelu", 1.0, 7.0, True)
    notes = torchtitan_notes(client, plan)
    if notes is not None:  # (None: a candidate with expert parallelism, which torchtitan's export refuses with a 422)
        assert any("(attention_sinks)" in n for n in notes), notes
