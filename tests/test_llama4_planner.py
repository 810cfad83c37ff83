"""Llama 4 in the planner (``ModelSpec.nope_layers``, ``rope_interleaved``, ``qk_l2_norm``, ``attention_chunk``,
``query_temperature``, ``router_weights_on_input``): the spec's rules and counts, the operator model (no rotary and a
query temperature on the NoPE layers, the weightless per-head norm on the others, the flash kernel over the chunks'
pairs only) and a plan."""

from __future__ import annotations

import pytest
from moe_support import H100, h100_cluster
from pydantic import ValidationError

from planner.analytic import analytic_profile
from planner.model import ModelSpec
from planner.operators import OperatorOptions, chunk_share, eager_rms_norm, layer_operators
from planner.request import TrainingRequest
from planner.search import plan

#: Llama 4 Scout's language model (transformers' Llama4TextConfig of meta-llama/Llama-4-Scout-17B-16E) with 8 of its
#: 48 layers: layers 3 and 7 NoPE, 16 experts of 8192 and a shared one, top 1, at a sequence of twice its chunk
SCOUT_8L = ModelSpec(name="scout-8l", layers=8, hidden=5120, heads=40, kv_heads=8, head_dim=128, ffn_hidden=16384,
                     gated_mlp=True, activation="silu", norm="rmsnorm", position="rotary", tied_embeddings=False,
                     bias=False, experts=16, experts_per_token=1, expert_ffn_hidden=8192,
                     shared_expert_ffn_hidden=8192, normalize_topk=False, router_score="sigmoid",
                     router_weights_on_input=True, nope_layers=(3, 7), rope_interleaved=True, qk_l2_norm=True,
                     attention_chunk=8192, query_temperature=(8192, 0.1), rope_theta=500000.0, vocab=202048,
                     seq=16384)
LLAMA4_FIELDS = ("nope_layers", "rope_interleaved", "qk_l2_norm", "attention_chunk", "query_temperature",
                 "router_weights_on_input")
FLASH = OperatorOptions(attention="flash", causal=True, dropout=False)
EAGER = OperatorOptions(attention="flash", causal=True, dropout=False, kernels="eager")


@pytest.mark.parametrize(("changes", "words"), [
    ({"nope_layers": (8,)}, "nope_layers: 8 is not a transformer layer"),
    ({"nope_layers": (3, 3)}, "nope_layers: a layer is listed twice"),
    ({"nope_layers": tuple(range(8)), "query_temperature": None}, "nope_layers: every layer"),
    ({"nope_layers": (), "query_temperature": (8192, 0.1)}, "query_temperature: only with nope_layers"),
    ({"query_temperature": (0, 0.1)}, "query_temperature"),
    ({"query_temperature": (8192, float("nan"))}, "query_temperature"),
    ({"qk_norm": True}, "qk_l2_norm: not with qk_norm"),
    ({"sliding_window": 4096}, "attention_chunk: not with a sliding_window"),
    ({"experts": None, "experts_per_token": None, "expert_ffn_hidden": None, "shared_expert_ffn_hidden": None,
      "router_score": "softmax", "normalize_topk": True}, "router_weights_on_input: only with experts"),
])
def test_spec_rules_name_the_field(changes: dict, words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        SCOUT_8L.with_(**changes)


@pytest.mark.parametrize("field", ["nope_layers", "rope_interleaved", "qk_l2_norm", "attention_chunk"])
def test_rotary_fields_need_rotary_positions(field: str) -> None:
    with pytest.raises(ValidationError, match=f"{field}.*only with rotary positions"):
        ModelSpec(layers=4, hidden=64, heads=4, vocab=128, seq=16, position="learned",
                  **{field: {"nope_layers": (1,), "attention_chunk": 8}.get(field, True)})


def test_spec_counts_and_record() -> None:
    """None of the fields has parameters; a layer's kind follows them (rotary or not, its chunk where shorter than the
    sequence); they are left out of a record that does not use them (earlier profiles' model_spec unchanged), and
    kept by one that does."""
    s = SCOUT_8L
    plain = s.with_(nope_layers=(), query_temperature=None, rope_interleaved=False, qk_l2_norm=False,
                    attention_chunk=None, router_weights_on_input=False)
    assert s.total_params() == plain.total_params()
    assert [s.rotary_layer(i) for i in range(8)] == [True, True, True, False] * 2
    assert [s.layer_chunk(i) for i in range(8)] == [8192, 8192, 8192, None] * 2
    assert s.with_(seq=8192).layer_chunk(0) is None  # (a chunk as long as the sequence limits nothing)
    assert ModelSpec.model_validate_json(s.model_dump_json()) == s
    assert not set(LLAMA4_FIELDS) & set(plain.model_dump())
    assert set(LLAMA4_FIELDS) <= set(s.model_dump())


def test_chunk_share() -> None:
    """The causal pairs within chunks: two whole chunks of 4 and one of 2 over 10 positions, (2 * 10 + 3) / 100; a
    chunk as long as the sequence is the causal half; chunks of half the sequence about halve it."""
    assert chunk_share(10, 4) == pytest.approx(0.23)
    assert chunk_share(8192, 8192) == chunk_share(8192, 10**6) == 0.5
    assert chunk_share(16384, 8192) == pytest.approx(0.25, rel=1e-3)


def _ops(spec: ModelSpec, i: int, options: OperatorOptions = FLASH) -> dict:
    return {op.name: op for op in layer_operators(spec, 1, 1, options, moe=spec.moe_layer(i),
                                                  rotary=spec.rotary_layer(i), chunk=spec.layer_chunk(i))}


@pytest.mark.parametrize("options", [FLASH, EAGER], ids=["fused", "eager"])
def test_nope_layer_has_no_rotary_and_scales_its_queries(options: OperatorOptions) -> None:
    rotary, nope = _ops(SCOUT_8L, 0, options), _ops(SCOUT_8L, 3, options)
    assert {"rope", "qk_l2_norm"} <= set(rotary) and "q_temperature" not in rotary
    assert "q_temperature" in nope and not {"rope", "qk_l2_norm"} & set(nope)
    assert "q_temperature" not in _ops(SCOUT_8L.with_(query_temperature=None), 3, options)
    assert "qk_l2_norm" not in _ops(SCOUT_8L.with_(qk_l2_norm=False), 0, options)
    # the temperature scales the queries only: a d elements of a token, read and written once
    q_el = SCOUT_8L.seq * SCOUT_8L.q_dim
    if options is FLASH:
        kernel = nope["q_temperature"].fwd[0]
        assert kernel.nbytes == pytest.approx(2 * 2 * q_el)


def test_weightless_eager_norm_drops_the_weight_kernels() -> None:
    with_w, without = eager_rms_norm("n", 100, 128, 2), eager_rms_norm("n", 100, 128, 2, weight=False)
    assert len(with_w.fwd) - len(without.fwd) == 1 and len(with_w.bwd_i) - len(without.bwd_i) == 3
    assert sum(k.nbytes for k in without.fwd) < sum(k.nbytes for k in with_w.fwd)


def test_flash_attention_over_the_chunks_pairs() -> None:
    """At a sequence of two chunks the chunked layer's flash kernel computes about half the causal layer's FLOPs
    (chunk_share), timed at the rate of a sequence of one chunk; at a sequence of one chunk the two are equal."""
    chunked, whole = _ops(SCOUT_8L, 0)["flash_attn"], _ops(SCOUT_8L, 3)["flash_attn"]
    ratio = chunk_share(16384, 8192) / 0.5
    assert chunked.fwd[0].flops == pytest.approx(ratio * whole.fwd[0].flops)
    assert chunked.bwd_i[0].flops == pytest.approx(ratio * whole.bwd_i[0].flops)
    assert chunked.fwd[0].gemm[0] == 8192 and whole.fwd[0].gemm[0] == 16384
    short = SCOUT_8L.with_(seq=8192)
    assert _ops(short, 0)["flash_attn"].fwd[0].flops == _ops(short, 3)["flash_attn"].fwd[0].flops


def test_plan_llama4() -> None:
    """The analytical profile holds the spec's parameters and one block per kind (dense or not, rotary and chunked or
    NoPE): the chunked layers' forward is shorter than the NoPE layers' at a sequence of two chunks; the search plans it
    with expert parallelism."""
    spec = SCOUT_8L.with_(dense_layers=(0, 4))  # (Maverick's kind: dense layers between the experts')
    prof = analytic_profile(spec, H100, options=FLASH, micro_batches=(1,))
    assert prof.total_params == spec.total_params()
    blocks = [layer for layer in prof.layers if layer.name.startswith("block")]
    fwd = [layer.fwd_time[1] for layer in blocks]
    assert fwd[1] == fwd[2] and fwd[5] == fwd[6]  # (rotary chunked MoE layers alike)
    assert fwd[3] > fwd[1] and fwd[7] > fwd[5]  # (NoPE: the whole causal square, no rotary)
    assert fwd[0] != fwd[1]  # (dense)
    res = plan(prof, h100_cluster(), TrainingRequest(global_batch=64, gpus=16))
    assert res.candidates and {c.config.expert for c in res.candidates} - {1}


def test_weights_on_the_input_save_no_expert_outputs() -> None:
    """Llama 4's routing weights scale the experts' input (a pass over the T k copies) and the combine sums unweighted:
    the experts' outputs (T k h elements) are no longer saved for the weights' gradient."""
    on, off = _ops(SCOUT_8L, 0), _ops(SCOUT_8L.with_(router_weights_on_input=False), 0)
    assert "weight_input" in on and "weight_input" not in off
    copies_h = SCOUT_8L.seq * 1 * SCOUT_8L.hidden
    assert off["combine"].saved_bytes == pytest.approx(2 * copies_h) and on["combine"].saved_bytes == 0.0
    assert sum(op.saved_bytes for op in on.values()) == pytest.approx(sum(op.saved_bytes for op in off.values())
                                                                        - 2 * copies_h)
