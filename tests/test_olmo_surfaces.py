"""OLMo 2, OLMo 3 and OLMoE (``ModelSpec.qk_norm_scope`` projection: one RMSNorm over the whole query projection and one
over the whole key projection; ``post_norm``: each branch's output normed, not its input) on the export surfaces: no
argument of Megatron-LM's computes either -- ``--qk-layernorm`` norms each head, ``--apply-residual-connection-post-
layernorm`` keeps the input norms -- so the Megatron-LM export refuses the model naming the field, and writes no flag in
its stead; the same models without those layers (Qwen3-shaped) are written and read back; torchtitan's notes name both
fields and say that the qwen3 named in ``[model]`` is not the model; the tiny OLMoE config goes through the API:
uploaded, planned, refused by the Megatron export with a 422 naming the field, noted by the torchtitan export, and the
stored profile and plan left as they were."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from api_support import AUTH, export_candidate, plan_on_two_gpus, torchtitan_notes, upload_fixture
from surfaces_support import script_flags, two_stage_input

from planner.export import ExportError, ExportInput, export, parse
from planner.export.megatron import arguments, model_refusal
from planner.model import ModelSpec
from profiler.hf_config import read_hf_config, spec_from_hf_dict

ROOT = Path(__file__).resolve().parent.parent
MODELS, FIXTURES = ROOT / "examples" / "models", ROOT / "tests" / "fixtures"

#: OLMo 2 7B (32 layers, hidden 4096, 32 heads of 128, no GQA): both norms over the whole projections, 4096 wide, and
#: each branch's output normed
OLMO2 = read_hf_config(MODELS / "olmo-2-7b", seq=4096)
#: OLMoE-1B-7B (16 layers, hidden 2048, 16 heads of 128, 64 experts of 1024, top 8, not renormalised): the projection
#: norms, 2048 wide, and the usual input norms (OlmoeDecoderLayer's input_layernorm)
OLMOE = read_hf_config(MODELS / "olmoe-1b-7b", seq=4096)
#: a tiny OLMo 3 (4 layers, hidden 64, 4 heads of 16, 2 key/value heads, a window of 4 on layers 0-2): OLMo 2's layers
OLMO3 = read_hf_config(FIXTURES / "tiny-olmo3", seq=16)
QWEN3 = read_hf_config(MODELS / "qwen3-8b", seq=4096)

#: the fields the Megatron export writes and its parser reads back (Parsed's names: ModelSpec's)
FIELDS = ("qk_norm", "bias", "qkv_bias", "sliding_window", "global_every", "normalize_topk", "router_score")

#: what Megatron-LM has in the fields' stead, which is another model's: never written for these models
WRONG_FLAGS = ("--apply-residual-connection-post-layernorm", "--qk-l2-norm", "--qk-layernorm-hidden-dim", "--spec")


def _inp(model: ModelSpec, **cfg: object) -> ExportInput:
    return two_stage_input(model, 8, **{"tensor": 2, "expert": 2 if model.moe else 1, "order": "tp-dp-pp", **cfg})


def _refusal(model: ModelSpec, **cfg: object) -> str:
    with pytest.raises(ExportError, match="^megatron: ") as err:
        export("megatron", _inp(model, **cfg))
    return str(err.value)


def _per_head(model: ModelSpec) -> ModelSpec:
    """``model`` with Qwen3's layers: per-head query/key norms on each branch's input (what Megatron-LM computes)."""
    return model.with_(qk_norm_scope="head", post_norm=False)


SCOPE_WORDS = ("qk_norm_scope projection: the model norms the whole query projection",
               "--qk-layernorm, is an RMSNorm over each head's",
               "SelfAttention builds q_layernorm and k_layernorm hidden_size_per_attention_head wide",
               "no argument norms the whole projection", "olmoe_layer_spec's OLMoESelfAttention",
               "its OLMo 2 layer spec keeps Megatron-Core's per-head q_layernorm")
POST_WORDS = ("post_norm: each branch's output is normed before its residual add and its input is not",
              "x + norm(attention(x))", "Megatron-Core's layers norm each branch's input (input_layernorm, "
              "pre_mlp_layernorm)", "--apply-residual-connection-post-layernorm keeps the input norm",
              "norm(x) + attention(norm(x))", "olmo2_layer_spec: IdentityOp input norms")


# ---- Megatron-LM: refused, naming the field --------------------------------------------------------------------------

def test_megatron_refuses_olmo_2_7b() -> None:
    assert (OLMO2.qk_norm, OLMO2.qk_norm_scope, OLMO2.post_norm, OLMO2.q_dim, OLMO2.kv_dim) == (
        True, "projection", True, 4096, 4096)
    message = _refusal(OLMO2)
    for words in (*SCOPE_WORDS, *POST_WORDS, "(32 heads x 128 = 4096 wide)", "(32 x 128 = 4096)",
                  "each head's 128", "Megatron-LM's arguments would train another model than the one planned"):
        assert words in message, words
    # at every t, on one stage or two, with and without recomputation: the same refusal, before anything is written
    for cfg in ({"tensor": 1}, {"tensor": 4, "data": 1}, {"recompute": True}):
        assert _refusal(OLMO2, **cfg) == message
    with pytest.raises(ExportError, match="^megatron: qk_norm_scope projection"):
        arguments(_inp(OLMO2))
    with pytest.raises(ExportError, match="^megatron: qk_norm_scope projection"):
        model_refusal(OLMO2)


def test_megatron_refuses_olmoe_1b_7b() -> None:
    """OLMoE norms each branch's input, as Megatron-Core does: only the projection norms are refused."""
    assert (OLMOE.qk_norm_scope, OLMOE.post_norm, OLMOE.experts, OLMOE.normalize_topk) == ("projection", False, 64,
                                                                                           False)
    message = _refusal(OLMOE)
    for words in (*SCOPE_WORDS, "(16 heads x 128 = 2048 wide)", "(16 x 128 = 2048)"):
        assert words in message, words
    assert "post_norm" not in message and "--apply-residual-connection-post-layernorm" not in message


def test_megatron_refuses_tiny_olmo3() -> None:
    """Grouped-query attention: the key projection's norm is 2 heads x 16 = 32 wide, the query's 64; the window on
    layers 0-2 is Megatron-LM's (--window-size), not why it is refused."""
    assert (OLMO3.sliding_window, OLMO3.global_every, OLMO3.k) == (4, 4, 2)
    message = _refusal(OLMO3, tensor=1)
    for words in (*SCOPE_WORDS, *POST_WORDS, "(4 heads x 16 = 64 wide)", "(2 x 16 = 32)"):
        assert words in message, words
    assert "window" not in message


@pytest.mark.parametrize(("model", "named", "not_named"), [
    (OLMO2.with_(qk_norm_scope="head"), "megatron: post_norm: ", "qk_norm_scope"),
    (OLMO2.with_(post_norm=False), "megatron: qk_norm_scope projection: ", "post_norm"),
    (OLMO3.with_(qk_norm_scope="head"), "megatron: post_norm: ", "qk_norm_scope"),
    (OLMOE.with_(post_norm=True), "megatron: qk_norm_scope projection: ", None),
])
def test_megatron_refuses_each_field_alone(model: ModelSpec, named: str, not_named: str | None) -> None:
    message = _refusal(model, tensor=1)
    assert message.startswith(named), message
    if not_named is not None:
        assert not_named not in message, message
    else:  # both
        assert "; and post_norm: " in message


@pytest.mark.parametrize("model", [_per_head(OLMO2), _per_head(OLMOE), _per_head(OLMO3)],
                         ids=["olmo-2-7b", "olmoe-1b-7b", "tiny-olmo3"])
def test_megatron_round_trip_without_olmo_layers(model: ModelSpec) -> None:
    """The same models with Qwen3's layers (per-head norms, on each branch's input), which Megatron-LM computes: written
    with --qk-layernorm and read back; no other norm flag written, nothing named as a gap."""
    inp = _inp(model, tensor=1 if model.k == 2 else 2)
    out = export("megatron", inp)
    flags = script_flags(out.main.content)
    assert "--qk-layernorm" in flags and "--normalization" in flags and flags["--normalization"] == "RMSNorm"
    for wrong in WRONG_FLAGS:
        assert wrong not in flags, wrong
    assert not any(n.startswith("megatron: the model has") for n in out.notes), out.notes
    back = parse(out)
    assert (back.config, back.microbatches) == (inp.config, 8)
    assert {f: getattr(back, f) for f in FIELDS} == {f: getattr(model, f) for f in FIELDS}
    if model.moe:  # OLMoE's softmax over all 64, not renormalised: Megatron-Bridge's moe_router_pre_softmax = True too
        assert {"--num-experts", "--moe-router-topk", "--moe-router-pre-softmax"} <= set(flags)
        assert (flags["--num-experts"], flags["--moe-router-topk"], flags["--moe-ffn-hidden-size"]) == ("64", "8",
                                                                                                         "1024")
    if model.sliding_window is not None:  # OLMo 3: 4 keys on 1-based layers 1-3, layer 4 global
        assert (flags["--window-size"], flags["--window-attn-skip-freq"]) == ("3,0", "4")


def test_megatron_refusal_widths_are_transformers() -> None:
    """The widths the refusal names are transformers' own q_norm and k_norm (Olmo2Attention, Olmo3Attention,
    OlmoeAttention on the tiny fixtures), and the per-head norm --qk-layernorm computes is another function of the same
    queries; OLMo 2's and 3's layers have no input norm (post_norm), OLMoE's has."""
    torch = pytest.importorskip("torch")
    from transformers import AutoConfig
    from transformers.models.olmo2 import modeling_olmo2
    from transformers.models.olmo3 import modeling_olmo3
    from transformers.models.olmoe import modeling_olmoe

    for name, module, prefix in (("tiny-olmo2", modeling_olmo2, "Olmo2"), ("tiny-olmo3", modeling_olmo3, "Olmo3"),
                                 ("tiny-olmoe", modeling_olmoe, "Olmoe")):
        data = json.loads((FIXTURES / name / "config.json").read_text())
        spec = spec_from_hf_dict(data, name=name, seq=16)
        cfg = AutoConfig.for_model(**data)
        attention = getattr(module, f"{prefix}Attention")(cfg, layer_idx=0)
        message = _refusal(spec, tensor=1)
        q, k = (int(x) for x in re.search(r"= (\d+) wide\) and the whole key projection \(\d+ x \d+ = (\d+)\)",
                                          message).groups())
        assert (attention.q_norm.weight.numel(), attention.k_norm.weight.numel()) == (q, k) == (64, 32), name
        gen = torch.Generator().manual_seed(0)
        with torch.no_grad():
            attention.q_norm.weight.copy_(1 + 0.1 * torch.randn(q, generator=gen))
            x = torch.randn(3, q, generator=gen) * torch.linspace(0.2, 3.0, q)  # heads of unequal scale
            theirs = attention.q_norm(x)
            heads = x.view(3, spec.heads, spec.d)  # Megatron's q_layernorm: over each head's d, one weight of d
            ours = heads * torch.rsqrt(heads.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps)
            ours = ours.reshape(3, q) * attention.q_norm.weight
        assert (theirs - ours).abs().max() > 0.1, name  # not the same function
        layer = getattr(module, f"{prefix}DecoderLayer")(cfg, layer_idx=0)
        assert hasattr(layer, "input_layernorm") == (not spec.post_norm), name
        assert ("post_norm: " in message) == spec.post_norm, name


# ---- torchtitan: the notes name the fields; qwen3 is not the model ---------------------------------------------------

@pytest.mark.parametrize(("model", "gaps", "absent"), [
    (OLMO2, ["norms on the attention's and the MLP's outputs before each residual add and none on their inputs "
             "(post_norm)", "one RMSNorm over the whole query projection (4096 wide) and one over the whole key "
             "projection (4096 wide), not over each head's 128 (qk_norm_scope projection)"], []),
    (OLMOE, ["one RMSNorm over the whole query projection (2048 wide) and one over the whole key projection (2048 "
             "wide), not over each head's 128 (qk_norm_scope projection)", "a mixture of 64 experts (8 per token)"],
     ["(post_norm)"]),
    (OLMO3, ["(post_norm)", "one RMSNorm over the whole query projection (64 wide) and one over the whole key "
             "projection (32 wide), not over each head's 16 (qk_norm_scope projection)",
             "attention within a window of 4 tokens on all but every 4th layer (sliding_window, global_every)"], []),
], ids=["olmo-2-7b", "olmoe-1b-7b", "tiny-olmo3"])
def test_torchtitan_notes_name_olmo_layers(model: ModelSpec, gaps: list[str], absent: list[str]) -> None:
    out = export("torchtitan", _inp(model, tensor=1, expert=1))
    assert 'name = "qwen3"' in out.main.content
    gap = next(n for n in out.notes if n.startswith("torchtitan: the model has"))
    for words in gaps:
        assert words in gap, words
    for words in absent:
        assert words not in gap, words
    family = next(n for n in out.notes if n.startswith("torchtitan's qwen3 is not this model: "))
    assert ("torchtitan has no model with these norms (OLMo 2/3's, OLMoE's, MiniMax-M2's), so register a model of "
            "your own and name it in [model]") in family
    assert ("its query and key norms are nn.RMSNorm(head_dim) over each head, the model's one over the whole query "
            f"projection ({model.q_dim}) and one over the whole key projection ({model.kv_dim})") in family
    assert ("its blocks norm each branch's input (x + attention(attention_norm(x))), the model each branch's output "
            "(x + norm(attention(x)), post_norm)" in family) == model.post_norm
    assert all(f"# note: {n}" in out.main.content for n in (gap, family))  # (in the file too)


def test_torchtitan_names_nothing_of_the_kind_for_qwen3() -> None:
    """Qwen3's per-head norms on each branch's input are torchtitan's qwen3: no such note (nor for the OLMo models
    with Qwen3's layers)."""
    for model in (QWEN3, _per_head(OLMO2), _per_head(OLMO3)):
        notes = export("torchtitan", _inp(model, tensor=1)).notes
        assert not any("is not this model" in n or "qk_norm_scope" in n or "post_norm" in n for n in notes), notes


# ---- the API: the tiny OLMoE config uploaded, planned and exported ---------------------------------------------------

def test_tiny_olmoe_config_through_the_api(client) -> None:  # type: ignore[no-untyped-def]
    """tests/fixtures/tiny-olmoe/config.json through POST /profiles/hf-config (its model_spec keeps qk_norm_scope
    projection), planned on two GPUs; every candidate's Megatron-LM export is a 422 naming qk_norm_scope (never a 5xx,
    never a script), the torchtitan export of one it runs names it in a note, and the stored profile and plan read the
    same after as before."""
    upload = upload_fixture(client, "tiny-olmoe")
    pid = upload.profile_id
    profile = client.get(f"/profiles/{pid}", headers=AUTH).json()
    stored = ModelSpec.model_validate_json(profile["profile"]["environment"]["model_spec"])
    assert (stored.qk_norm, stored.qk_norm_scope, stored.post_norm, stored.experts) == (True, "projection", False, 4)
    plan = plan_on_two_gpus(client, upload, top=5)
    assert plan["candidates"], plan
    noted = 0
    for rank in range(len(plan["candidates"])):
        doc = export_candidate(client, plan, rank, "megatron")
        assert doc.status_code == 422, doc.text
        detail = doc.json()["detail"]
        assert detail.startswith("megatron: qk_norm_scope projection: the model norms the whole query projection (4 "
                                 "heads x 16 = 64 wide) and the whole key projection (2 x 16 = 32)"), detail
        assert "post_norm" not in detail
        notes = torchtitan_notes(client, plan, rank)
        if notes is not None:  # (None: expert parallelism, which torchtitan's export does not write: a 422 naming it)
            assert any("(qk_norm_scope projection)" in n for n in notes), notes
            assert any(n.startswith("torchtitan's qwen3 is not this model") for n in notes), notes
            noted += 1
    assert noted, "no candidate torchtitan's export runs"
    # nothing stored changed: the same profile (uploading it again finds it), the same plan
    assert client.get(f"/profiles/{pid}", headers=AUTH).json() == profile
    again = client.post("/profiles/hf-config", json=upload.body, headers=AUTH)
    assert (again.status_code, again.json()["id"]) == (200, pid), again.text
    assert client.get(f"/plans/{plan['id']}", headers=AUTH).json() == plan
