"""SmolLM3 (``smollm3``: transformers' ``SmolLM3Config``, ``SmolLM3ForCausalLM``; HuggingFaceTB/SmolLM3-3B) read,
run, exported and profiled: a Llama with no rotary positions on the layers whose ``no_rope_layers`` entry is 0
(``ModelSpec.nope_layers``) and nothing else of Llama 4's. profiler/hf_config.py's ``_smollm3`` reads the tiny fixture
(tests/fixtures/tiny-smollm3: 4 layers, ``no_rope_layer_interval`` 2, so layers 1 and 3 without rotary positions, the
head tied) field for field and the published SmolLM3-3B config (examples/models/smollm3-3b) with transformers'
parameter count, and refuses what ModelSpec cannot say naming the field; the executor's Llama-family blocks compute
transformers' logits (float64, eager attention), the NoPE layers' missing rotary mattering; the Megatron-LM export
writes ``--no-rope-freq`` and reads it back; the analytical profile has no rotary on the NoPE blocks; and a run at
t = 2 on two stages equals single-process training."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hf_parity import broken_diffs, built, copied, copy_unbiased_attention, logits, randn
from moe_support import FLASH, H100, h100_cluster
from run_support import launched_fixture, plans_of
from surfaces_support import script_flags, two_stage_input
from torch import nn

from executor.models import build_layers, get_config
from executor.models.llama import LlamaBlock
from planner.analytic import analytic_profile
from planner.export import export, parse
from planner.model import ModelSpec
from planner.operators import layer_operators
from planner.request import TrainingRequest
from planner.search import plan
from profiler.hf_config import HFConfigError, read_hf_config, spec_from_hf_dict

torch.set_num_threads(1)
ROOT = Path(__file__).resolve().parent.parent
FIXTURE = ROOT / "tests" / "fixtures" / "tiny-smollm3" / "config.json"
PUBLISHED = ROOT / "examples" / "models" / "smollm3-3b" / "config.json"
#: the fixture's ModelSpec written out: Llama's layer (rotate-half, 2 key/value heads, SwiGLU, RMSNorm 1e-6, tied
#: head) with layers 1 and 3 without rotary positions
SMOLLM3 = ModelSpec(name="tiny-smollm3", layers=4, hidden=64, heads=4, kv_heads=2, ffn_hidden=96, gated_mlp=True,
                    activation="silu", norm="rmsnorm", norm_eps=1e-6, position="rotary", tied_embeddings=True,
                    bias=False, nope_layers=(1, 3), rope_theta=5e6, vocab=128, seq=16)
#: logits' tolerance: transformers' SmolLM3RMSNorm rounds through float32 (hidden_states.to(torch.float32)), as do
#: the rotary's angles (inv_freq in float32)
TOL = 1e-5


def _tiny(**changes: object) -> dict[str, Any]:
    """The fixture's fields (its nulls kept) with ``changes`` (a None value: the field left out)."""
    data = {**json.loads(FIXTURE.read_text()), **changes}
    return {k: v for k, v in data.items() if k not in changes or v is not None}


def _transformers_model(data: dict[str, Any], meta: bool = False, **kw: Any) -> nn.Module:
    """transformers' SmolLM3ForCausalLM of a config.json's fields (on the meta device: no memory)."""
    from transformers import SmolLM3Config, SmolLM3ForCausalLM

    cfg = SmolLM3Config(**{k: v for k, v in data.items() if k != "model_type"}, **kw)
    if meta:
        with torch.device("meta"):
            return SmolLM3ForCausalLM(cfg)
    return SmolLM3ForCausalLM(cfg)


def _count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ---- the reader --------------------------------------------------------------------------------------------------

def test_the_fixture_field_for_field() -> None:
    """The reader's spec of the fixture is the one written out; layers 1 and 3 (no_rope_layer_interval 2) without
    rotary positions, nothing of Llama 4's besides (rotate-half, no query/key norm, no chunks, no temperature), and
    the executor's blocks build exactly that: no rotary (theta None) on 1 and 3, no other Llama 4 piece anywhere."""
    s = read_hf_config(FIXTURE)
    assert s.model_dump(exclude={"source"}) == SMOLLM3.model_dump(exclude={"source"})
    assert (s.layers, s.hidden, s.heads, s.kv_heads, s.d, s.ffn_hidden, s.vocab, s.seq) == (
        4, 64, 4, 2, 16, 96, 128, 16)
    assert (s.gated_mlp, s.activation, s.norm, s.norm_eps, s.position, s.tied_embeddings) == (
        True, "silu", "rmsnorm", 1e-6, "rotary", True)
    assert (s.bias, s.qkv_bias, s.qk_norm, s.rope_theta, s.sliding_window, s.experts) == (
        False, False, False, 5e6, None, None)
    assert (s.nope_layers, s.rope_interleaved, s.qk_l2_norm, s.attention_chunk, s.query_temperature) == (
        (1, 3), False, False, None, None)
    assert [s.rotary_layer(i) for i in range(4)] == [True, False, True, False]
    assert s.source == f"Hugging Face config {FIXTURE}"  # (nothing not modelled to note)
    blocks = build_layers(get_config(s), seed=1)[1:-1]
    assert [b.theta for b in blocks] == [5e6, None, 5e6, None]
    for b in blocks:
        assert (b.interleaved, b.qk_l2_eps, b.chunk, b.temperature, b.window, b.q_norm, b.moe) == (
            False, None, None, None, None, None, None)


def test_parameter_counts_are_transformers() -> None:
    """The fixture's count, whole and per decoder layer, is transformers' SmolLM3ForCausalLM's (131,648: the tied
    head counted once); SmolLM3-3B's published config (examples/models/smollm3-3b) holds 3,075,098,624 parameters, as
    transformers builds it on the meta device, with every fourth layer from layer 3 without rotary positions, as its
    model's ``use_rope`` says."""
    spec, model = read_hf_config(FIXTURE), _transformers_model(_tiny())
    assert spec.total_params() == _count(model) == 131_648
    assert [_count(layer) for layer in model.model.layers] == [spec.block_params(i) for i in range(4)]
    smol = read_hf_config(PUBLISHED)
    big = _transformers_model(json.loads(PUBLISHED.read_text()), meta=True)
    assert smol.total_params() == _count(big) == 3_075_098_624
    assert (smol.name, smol.layers, smol.hidden, smol.heads, smol.kv_heads, smol.f, smol.vocab, smol.seq) == (
        "smollm3-3b", 36, 2048, 16, 4, 11008, 128256, 65536)
    assert smol.nope_layers == tuple(range(3, 36, 4)) and smol.tied_embeddings and smol.rope_theta == 5e6
    assert [not layer.self_attn.use_rope for layer in big.model.layers] == [
        not smol.rotary_layer(i) for i in range(36)]
    # the list derived from no_rope_layer_interval 4 (the published file states both) is the same
    derived = {k: v for k, v in json.loads(PUBLISHED.read_text()).items() if k != "no_rope_layers"}
    assert spec_from_hf_dict(derived, "smollm3-3b").nope_layers == smol.nope_layers


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"no_rope_layers": [1, 0, 1]}, "no_rope_layers", "3 entries for 4 layers (num_hidden_layers): at least one"),
    ({"no_rope_layers": []}, "no_rope_layers", "0 entries for 4 layers"),
    ({"no_rope_layers": [1, 2, 1, 1]}, "no_rope_layers", "1 for rotary positions and 0 for none, got [1, 2, 1, 1]"),
    ({"no_rope_layers": "1011"}, "no_rope_layers", "expected a list"),
    ({"no_rope_layers": [0, 0, 0, 0]}, "no_rope_layers", "every layer is without rotary positions"),
    ({"no_rope_layer_interval": 1}, "no_rope_layers", "every layer is without rotary positions"),
    ({"no_rope_layer_interval": 0}, "no_rope_layer_interval", "a whole number of 1 or more"),
    ({"use_sliding_window": True, "sliding_window": 8}, "use_sliding_window",
     "SmolLM3Config windows the layers without rotary positions (1, ...: no_rope_layers 0) and no other"),
    ({"sliding_window": 8, "layer_types": ["full_attention", "sliding_attention"] * 2}, "layer_types",
     "planned as SmolLM3Config's own reading"),
    ({"attention_bias": True}, "attention_bias", "true without mlp_bias"),
    ({"mlp_bias": True}, "mlp_bias", "true without attention_bias"),
    ({"num_hidden_layers": None}, "num_hidden_layers", "missing"),
])
def test_refusals_name_the_field(changes: dict[str, object], field: str, words: str) -> None:
    with pytest.raises(HFConfigError) as err:
        spec_from_hf_dict(_tiny(**changes))
    assert err.value.field == field and words in err.value.message, str(err.value)


def test_what_transformers_reads_the_same_is_read() -> None:
    """Taken, as transformers builds them: a list longer than the layers (its tail unread: ``SmolLM3Config``'s "at
    least the same length"), a window switched off (``use_sliding_window`` false) or on a model without NoPE layers
    (no layer is "sliding_attention"), Qwen2's ``max_window_layers`` (read by nothing), an interval beside a list
    (unread), and both biases (every linear layer's: the count transformers' model has)."""
    assert spec_from_hf_dict(_tiny(no_rope_layers=[1, 0, 1, 1, 0, 0])).nope_layers == (1,)
    for changes in ({"sliding_window": 8}, {"max_window_layers": 28},
                    {"use_sliding_window": True, "sliding_window": 8, "no_rope_layers": [1, 1, 1, 1]}):
        spec = spec_from_hf_dict(_tiny(**changes))
        assert spec.sliding_window is None and spec.global_every is None, changes
    assert spec_from_hf_dict(_tiny(no_rope_layer_interval=0, no_rope_layers=[1, 1, 0, 1])).nope_layers == (2,)
    both = _tiny(attention_bias=True, mlp_bias=True)
    spec = spec_from_hf_dict(both)
    assert spec.bias and spec.total_params() == _count(_transformers_model(both))


# ---- the executor ------------------------------------------------------------------------------------------------

def test_the_lowered_model_keeps_each_layers_rotary() -> None:
    """``pipeplan profile --hf-config`` builds the first layer of each kind (rotary, NoPE: SmolLM3-3B's layers 0 and 3)
    and its lowered config says which of them has no rotary positions by their new numbers: with the file's 36-entry
    no_rope_layers kept, the NoPE layer 3, built second, would read entry 1 (rotary) and be timed as a rotary one."""
    from profiler.hf_model import built_layers, lowered_config

    data = json.loads((ROOT / "examples" / "models" / "smollm3-3b" / "config.json").read_text())
    spec = spec_from_hf_dict(data, seq=4096)
    chosen = built_layers(spec, 1)
    assert chosen == [0, 3]
    cfg = lowered_config(data, spec, chosen)
    assert (cfg.num_hidden_layers, list(cfg.no_rope_layers)) == (2, [1, 0])


def hf_smollm3() -> nn.Module:
    """transformers' SmolLM3ForCausalLM of the fixture, eager attention."""
    return _transformers_model(_tiny(), attn_implementation="eager")


def copy_block(ours: LlamaBlock, theirs: nn.Module, gen: torch.Generator) -> None:
    """Our block into transformers' SmolLM3DecoderLayer, first moved off its initial values where those would hide a
    piece: q and k scaled up (scores of order one, so positions matter), the norms away from one, the MLP's weights of
    order one."""
    at, mlp = theirs.self_attn, theirs.mlp
    copy_unbiased_attention(ours, at, theirs.input_layernorm, theirs.post_attention_layernorm, gen)
    for lin, std, target in ((ours.gate, 0.3, mlp.gate_proj), (ours.up, 0.3, mlp.up_proj),
                             (ours.down, 0.1, mlp.down_proj)):
        lin.weight.copy_(randn(lin.weight, std, gen))
        target.weight.copy_(lin.weight)


def test_same_logits_as_transformers() -> None:
    """Our weights copied into SmolLM3ForCausalLM (float64, eager attention) give its logits on a batch of 2 x 16
    tokens; and the NoPE layers matter: rotary positions on them, none on a rotary layer, or Llama 4's adjacent pairs
    in place of rotate-half each move the logits by far more than the tolerance."""
    cfg, layers, hf = built(SMOLLM3, hf_smollm3)
    assert hf.lm_head.weight is hf.model.embed_tokens.weight and layers[-1].weight is layers[0].tok.weight
    ids = copied(cfg, layers, hf, copy_block, torch.Generator().manual_seed(0), norm_off_one=True)
    assert ids.shape == (2, 16)
    with torch.no_grad():
        want = hf(ids).logits
        torch.testing.assert_close(logits(layers, ids), want, rtol=TOL, atol=TOL)
        blocks = layers[1:-1]
        broken = {
            "rotary on the NoPE layers": [(blocks[i], "theta", SMOLLM3.rope_theta) for i in (1, 3)],
            "rotary on NoPE layer 3 only": [(blocks[3], "theta", SMOLLM3.rope_theta)],
            "no rotary on layer 0": [(blocks[0], "theta", None)],
            "adjacent pairs, not rotate-half": [(b, "interleaved", True) for b in blocks],
        }
        diffs = broken_diffs(layers, ids, want, broken)
        assert all(diff > 100 * TOL for diff in diffs.values()), diffs
        torch.testing.assert_close(logits(layers, ids), want, rtol=TOL, atol=TOL)


# ---- the planner's surfaces --------------------------------------------------------------------------------------

def test_megatron_export_writes_the_nope_layers() -> None:
    """Megatron-LM's arguments for the fixture: ``--no-rope-freq 2`` (layers 1 and 3: Megatron-Core's
    ``[0]*(n-1)+[1]`` repeated), rotate-half (no ``--rotary-interleaved``), no query/key norm, the head tied (no
    ``--untie-embeddings-and-output-weights``), the norms' 1e-6; read back by the parser; SmolLM3-3B's as
    ``--no-rope-freq 4``."""
    out = export("megatron", two_stage_input(SMOLLM3, 8, tensor=2, order="tp-dp-pp"))
    flags = script_flags(out.main.content)
    assert (flags["--no-rope-freq"], flags["--rotary-base"], flags["--norm-epsilon"]) == ("2", "5000000", "1e-06")
    for absent in ("--rotary-interleaved", "--qk-l2-norm", "--qk-layernorm", "--untie-embeddings-and-output-weights",
                   "--window-size", "--num-experts"):
        assert absent not in flags, absent
    back = parse(out)
    assert (back.nope_layers, back.rope_interleaved, back.qk_l2_norm, back.qk_norm, back.norm_eps) == (
        (1, 3), False, False, False, 1e-6)
    assert (back.layer_counts, back.microbatches) == ([2, 2], 8)
    smol = read_hf_config(PUBLISHED, seq=4096)
    flags = script_flags(export("megatron", two_stage_input(smol, 8, tensor=2)).main.content)
    assert flags["--no-rope-freq"] == "4"


def test_analytic_profile_has_no_rotary_on_the_nope_blocks() -> None:
    """SmolLM3-3B at 4096 tokens: the profile holds transformers' count; the NoPE blocks (3, 7, ...) have no rope
    operator and are the shorter for it, the others alike; the search plans it on 16 H100s."""
    smol = read_hf_config(PUBLISHED, seq=4096)
    for i in (0, 3):
        ops = {op.name for op in layer_operators(smol, 1, 1, FLASH, moe=False, rotary=smol.rotary_layer(i),
                                                 chunk=smol.layer_chunk(i))}
        assert ("rope" in ops) == (i == 0) and "flash_attn" in ops and "q_temperature" not in ops
    prof = analytic_profile(smol, H100, options=FLASH, micro_batches=(1,))
    assert prof.total_params == 3_075_098_624
    fwd = [layer.fwd_time[1] for layer in prof.layers if layer.name.startswith("block")]
    assert len(fwd) == 36 and len({fwd[i] for i in range(36) if i % 4 != 3}) == 1
    assert len({fwd[i] for i in range(3, 36, 4)}) == 1 and fwd[3] < fwd[0]
    res = plan(prof, h100_cluster(), TrainingRequest(global_batch=64, gpus=16))
    assert res.candidates


# ---- a run -------------------------------------------------------------------------------------------------------

RUNS = {"1f1b D=2 t=2": plans_of(SMOLLM3)("1f1b", 2, 4, tensor=2)}
runs = launched_fixture((RUNS, 4))


@pytest.mark.slow
def test_run_equals_single_process(runs) -> None:  # type: ignore[no-untyped-def]
    """A real run (gloo, float64, two processes per stage) with --check: the parameters after two steps equal
    single-process training's, each stage holding one NoPE layer, the tied embedding and head on different stages."""
    check = runs["1f1b D=2 t=2"]["check"]
    assert check["ok"] is True, check["message"]
