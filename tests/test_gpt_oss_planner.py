"""gpt-oss in the planner (``ModelSpec.attention_sinks``, ``activation="quick_gelu"``, ``glu_linear_offset``,
``glu_clamp``, biases on the experts and the router): the spec's rules and counts, the operator model (the sinks'
passes around the unfused softmax, the clamped gate's eager kernels) and a plan."""

from __future__ import annotations

import pytest
from moe_support import H100, h100_cluster
from pydantic import ValidationError

from planner.analytic import analytic_profile
from planner.model import ModelSpec
from planner.operators import OperatorOptions, layer_operators
from planner.request import TrainingRequest
from planner.search import plan

#: gpt-oss-120b's layer (128 experts of 2880, top 4, 64 heads of 64, 8 key/value heads) with 4 layers
GPT_OSS = ModelSpec(name="gpt-oss-4l", layers=4, hidden=2880, heads=64, kv_heads=8, head_dim=64, ffn_hidden=2880,
                    gated_mlp=True, activation="quick_gelu", glu_linear_offset=1.0, glu_clamp=7.0, norm="rmsnorm",
                    position="rotary", tied_embeddings=False, bias=True, attention_sinks=True, sliding_window=128,
                    global_every=2, experts=128, experts_per_token=4, vocab=201088, seq=4096, rope_theta=150000.0)
#: the changes that make GPT_OSS Mixtral's kind of layer (no sinks, SwiGLU, no biases)
PLAIN = {"attention_sinks": False, "activation": "silu", "glu_linear_offset": 0.0, "glu_clamp": None, "bias": False}
EAGER = OperatorOptions(attention="unfused", causal=True, dropout=False, kernels="eager")
FUSED = OperatorOptions(attention="unfused", causal=True, dropout=False)
FLASH_SP = OperatorOptions(attention="flash", causal=True, dropout=False, sequence_parallel=True)


@pytest.mark.parametrize(("changes", "words"), [
    ({"gated_mlp": False, "glu_clamp": None}, "glu_linear_offset: only with a gated MLP"),
    ({"gated_mlp": False, "glu_linear_offset": 0.0}, "glu_clamp: only with a gated MLP"),
    ({"glu_clamp": 0.0}, "glu_clamp"),
    ({"glu_linear_offset": float("inf")}, "glu_linear_offset"),
])
def test_spec_rules_name_the_field(changes: dict, words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        GPT_OSS.with_(**changes)


def test_sinks_not_with_latent_attention() -> None:
    with pytest.raises(ValidationError, match="attention_sinks: not planned with multi-head latent attention"):
        ModelSpec(layers=2, hidden=64, heads=4, head_dim=24, gated_mlp=True, norm="rmsnorm", position="rotary",
                  bias=False, kv_lora_rank=32, qk_rope_head_dim=8, attention_sinks=True, vocab=128, seq=16)


def test_spec_counts_and_record() -> None:
    """Sinks add ``a`` per layer; a gated MLP with biases ``2f + h`` of them (gate, up, down), the router its ``E``;
    the new fields are left out of a record that does not use them (earlier profiles' model_spec unchanged)."""
    s, h, f, E, a = GPT_OSS, 2880, 2880, 128, 64
    plain = s.with_(attention_sinks=False)
    assert s.attention_params() - plain.attention_params() == a
    assert s.expert_params() == 3 * h * f + 2 * f + h
    assert s.mlp_params() == E * (3 * h * f + 2 * f + h) + h * E + E
    assert s.active_mlp_params() == 4 * (3 * h * f + 2 * f + h) + h * E + E
    assert s.with_(bias=False).mlp_params() == E * 3 * h * f + h * E
    assert ModelSpec.model_validate_json(s.model_dump_json()) == s
    dumped = s.with_(**PLAIN).model_dump()
    assert not {"attention_sinks", "glu_linear_offset", "glu_clamp"} & set(dumped)


def _bytes(ops: list, name: str, side: str = "fwd") -> float:
    return sum(k.nbytes for op in ops if op.name == name for k in getattr(op, side))


@pytest.mark.parametrize("t", [1, 2])
def test_sinks_pass_over_the_unfused_scores(t: int) -> None:
    """Unfused, the sinks are one more operator before the softmax, three passes over the ``b a/t s^2`` scores
    forward (copy, maximum, subtraction: 5 ``el`` per score) and two backward (4); the flash kernel takes them
    in-kernel: the same operators with and without them."""
    b, s, a, el = 1, 4096, 64, 2
    scores = b * (a // t) * s * s
    for options in (EAGER, FUSED):
        ops = layer_operators(GPT_OSS, b, t, options, moe=True)
        names = [op.name for op in ops]
        assert names.index("attn_sinks") == names.index("softmax") - 1
        assert _bytes(ops, "attn_sinks") == pytest.approx(5 * el * scores)
        assert _bytes(ops, "attn_sinks", "bwd_i") == pytest.approx(4 * el * scores)
        assert "attn_sinks" not in [op.name for op in layer_operators(GPT_OSS.with_(attention_sinks=False), b, t,
                                                                      options, moe=True)]
    flash = layer_operators(GPT_OSS, b, t, FLASH_SP, moe=True)
    bare = layer_operators(GPT_OSS.with_(attention_sinks=False), b, t, FLASH_SP, moe=True)
    assert [op.name for op in flash] == [op.name for op in bare]
    assert sum(k.nbytes for op in flash for k in op.fwd) == sum(k.nbytes for op in bare for k in op.fwd)


def test_clamped_gate_is_seven_eager_kernels_and_one_fused() -> None:
    """Eager, gpt-oss's gate is transformers' seven kernels forward and nine backward over the experts' ``copies x
    f`` elements (SwiGLU's two and three); fused, one kernel as SwiGLU's (Megatron-Core's
    ``weighted_bias_quick_geglu_impl``)."""
    b = 1
    eager = [op for op in layer_operators(GPT_OSS, b, 1, EAGER, moe=True) if op.name == "experts_act"]
    swiglu = [op for op in layer_operators(GPT_OSS.with_(**PLAIN), b, 1, EAGER, moe=True) if op.name == "experts_act"]
    assert (len(eager[0].fwd), len(eager[0].bwd_i)) == (7, 9)
    assert (len(swiglu[0].fwd), len(swiglu[0].bwd_i)) == (2, 3)
    elements = b * 4096 * 4 * 2880  # the T k copies, f wide (grouped: one launch over the experts)
    assert sum(k.nbytes for k in eager[0].fwd) == pytest.approx(16 * 2 * elements)
    fused = [op for op in layer_operators(GPT_OSS, b, 1, FUSED, moe=True) if op.name == "experts_act"]
    plain = [op for op in layer_operators(GPT_OSS.with_(**PLAIN), b, 1, FUSED, moe=True) if op.name == "experts_act"]
    assert fused[0].fwd == plain[0].fwd and fused[0].bwd_i == plain[0].bwd_i


def test_plan_gpt_oss() -> None:
    """The analytical profile holds the spec's parameters (a sliding and a full block, both with experts) and the
    search plans it with expert parallelism; the eager profile's layers take longer with the clamped gate and the
    sinks than without them."""
    prof = analytic_profile(GPT_OSS, H100, options=FLASH_SP, micro_batches=(1,))
    assert prof.total_params == GPT_OSS.total_params()
    res = plan(prof, h100_cluster(), TrainingRequest(global_batch=64, gpus=16))
    assert res.candidates and {c.config.expert for c in res.candidates} - {1}
    eager = analytic_profile(GPT_OSS, H100, options=EAGER, micro_batches=(1,))
    plain = analytic_profile(GPT_OSS.with_(attention_sinks=False, glu_linear_offset=0.0, glu_clamp=None), H100,
                             options=EAGER, micro_batches=(1,))
    block = [i for i, layer in enumerate(eager.layers) if layer.name.startswith("block")]
    assert block and all(eager.layers[i].fwd_time[1] > plain.layers[i].fwd_time[1] for i in block)
    assert all(eager.layers[i].bwd_time[1] > plain.layers[i].bwd_time[1] for i in block)
