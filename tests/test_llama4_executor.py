"""Llama 4 in the executor (executor/models/llama.py's attention with rotary on adjacent pairs, l2_norm,
temperature_scales and the chunked causal_attention, mix with on_input; executor/tensor_parallel.py's and
executor/expert_parallel.py's routing weights on the experts' inputs; planner/model.py's nope_layers, rope_interleaved,
qk_l2_norm, attention_chunk, query_temperature, router_weights_on_input): the tiny model of tests/fixtures/tiny-llama4
(4 layers, dense layers 0 and 2, 4 experts top 1 with a shared expert on layers 1 and 3, layer 3 without rotary
positions, chunks of 8 over a sequence of 16) computes what transformers' Llama4ForCausalLM does with the same weights
(float64), and each of its pieces matters; the rotary and the mixture of experts each alone equal transformers' own
(apply_rotary_emb, Llama4TextMoe); a block at t = 2 equals the whole block; and real runs at t = 2, e = 2 and with a
2-stage pipeline equal single-process training (gloo, float64)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hf_parity import broken_diffs, built, copied, copy_unbiased_attention, logits, randn
from run_support import assert_whole_block, launched_fixture, plans_of, tp_block_errors
from torch import nn

from executor.models import Stage, build_layers, get_config
from executor.models.llama import LlamaBlock, SparseMoE, apply_rotary, apply_rotary_pairs, rotary_cos_sin
from executor.models.mla import rotary_cos_sin_pairs
from planner.model import ModelSpec

torch.set_num_threads(1)
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "tiny-llama4" / "config.json"
#: the fixture's ModelSpec, written out (profiler.hf_config's reading of it is compared in test_reader_reads_the_spec)
LLAMA4 = ModelSpec(name="tiny-llama4", layers=4, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn_hidden=96,
                   gated_mlp=True, activation="silu", norm="rmsnorm", position="rotary", tied_embeddings=False,
                   bias=False, experts=4, experts_per_token=1, expert_ffn_hidden=32, shared_expert_ffn_hidden=32,
                   normalize_topk=False, router_score="sigmoid", router_weights_on_input=True, dense_layers=(0, 2),
                   nope_layers=(3,), rope_interleaved=True, qk_l2_norm=True, attention_chunk=8,
                   query_temperature=(4, 0.1), rope_theta=500000.0, vocab=128, seq=16)
#: logits' tolerance: transformers' Llama4TextRMSNorm, Llama4TextWeightlessRMSNorm and apply_rotary_emb round through
#: float32 (x.float(); the rotary's angles too), and both routers take the sigmoid in float32 (measured: 2.2e-7)
TOL = 1e-6


def test_spec_of_the_fixture() -> None:
    """The spec has every Llama 4 piece the executor builds, per layer as the blocks build them: rotary (theta),
    L2-normed queries and keys and chunks of 8 on layers 0-2, none of them and the query temperature on layer 3; a
    mixture of experts on layers 1 and 3 (weights on the inputs, a shared expert of 32 without a gate), the dense MLP
    of 96 on 0 and 2; every block's parameters ModelSpec.block_params(i), the model's total_params()."""
    blocks = build_layers(get_config(LLAMA4), seed=1)[1:-1]
    assert [b.theta for b in blocks] == [5e5, 5e5, 5e5, None]
    assert [b.qk_l2_eps for b in blocks] == [1e-5, 1e-5, 1e-5, None]
    assert [b.chunk for b in blocks] == [8, 8, 8, None]
    assert [b.temperature for b in blocks] == [None, None, None, (4, 0.1)]
    assert all(b.interleaved for b in blocks)
    assert [b.moe is not None for b in blocks] == [False, True, False, True]
    for b in blocks:
        if b.moe is None:
            assert b.gate.weight.shape == (96, 64)
        else:
            assert b.moe.on_input and b.moe.shared_expert.up.weight.shape == (32, 64)
            assert b.moe.shared_expert_gate is None and b.moe.router.score == "sigmoid" and not b.moe.normalize
    assert [sum(p.numel() for p in b.parameters()) for b in blocks] == [LLAMA4.block_params(i) for i in range(4)]
    layers = build_layers(get_config(LLAMA4), seed=1)
    assert sum(p.numel() for p in Stage(layers).parameters()) == LLAMA4.total_params()


def test_reader_reads_the_spec() -> None:
    """profiler.hf_config reads the fixture as the spec written out here (what the pipeplan run --hf-config runs
    build)."""
    from profiler.hf_config import read_hf_config

    read = read_hf_config(FIXTURE, name="tiny-llama4")
    assert read.model_dump(exclude={"source"}) == LLAMA4.model_dump(exclude={"source"})


def hf_llama4():  # type: ignore[no-untyped-def]
    """transformers' Llama4ForCausalLM of the fixture (Llama4TextConfig, eager attention)."""
    from transformers import Llama4ForCausalLM, Llama4TextConfig

    data = json.loads(FIXTURE.read_text())
    data.pop("model_type")
    return Llama4ForCausalLM(Llama4TextConfig(**data, attn_implementation="eager"))


def _mlp_weights(ours: nn.Module, gen: torch.Generator) -> None:
    """Our gated MLP's (a dense block's, an expert's, the shared expert's) weights drawn anew: activations of order
    one, where an expert's input scaled by a weight below one computes something else than its output scaled."""
    for lin, std in ((ours.gate, 0.3), (ours.up, 0.3), (ours.down, 0.1)):
        lin.weight.copy_(randn(lin.weight, std, gen))


def copy_block(ours: LlamaBlock, theirs: nn.Module, gen: torch.Generator) -> None:
    """Our block into transformers' Llama4TextDecoderLayer, first moved off its initial values where those would hide
    a piece: q and k scaled up (the scores of order one and more: the NoPE layer's are not normed), the norms away
    from one, the MLPs' weights of order one, the router scaled up. Llama4TextExperts: ``gate_up_proj[e] (h, 2f)`` the
    gate's transpose then up's (its ``chunk(2, dim=-1)``), ``down_proj[e] (f, h)`` down's transpose."""
    at = theirs.self_attn
    copy_unbiased_attention(ours, at, theirs.input_layernorm, theirs.post_attention_layernorm, gen)
    ff = theirs.feed_forward
    if ours.moe is None:
        _mlp_weights(ours, gen)
        for a, b in ((ours.gate, ff.gate_proj), (ours.up, ff.up_proj), (ours.down, ff.down_proj)):
            b.weight.copy_(a.weight)
        return
    ours.moe.router.weight.mul_(20)
    ff.router.weight.copy_(ours.moe.router.weight)
    for e, ex in enumerate(ours.moe.experts):
        _mlp_weights(ex, gen)
        ff.experts.gate_up_proj[e].copy_(torch.cat([ex.gate.weight.T, ex.up.weight.T], dim=-1))
        ff.experts.down_proj[e].copy_(ex.down.weight.T)
    shared = ours.moe.shared_expert
    _mlp_weights(shared, gen)
    for a, b in ((shared.gate, ff.shared_expert.gate_proj), (shared.up, ff.shared_expert.up_proj),
                 (shared.down, ff.shared_expert.down_proj)):
        b.weight.copy_(a.weight)


def test_same_logits_as_transformers() -> None:
    """Our weights copied into Llama4ForCausalLM (Llama4TextConfig, eager attention, float64) give the same logits on
    a batch of 2 x 16 tokens (two chunks of 8); and each Llama 4 piece matters: the rotary in rotate-half's layout, no
    L2 norm of the queries and keys, no chunks, no temperature, the routing weights on the experts' outputs, rotary
    positions on the NoPE layer, the L2 norm or the chunks there too: each differs by far more than the tolerance."""
    cfg, layers, hf = built(LLAMA4, hf_llama4)
    ids = copied(cfg, layers, hf, copy_block, torch.Generator().manual_seed(0), norm_off_one=True)
    assert ids.shape == (2, 16)
    with torch.no_grad():
        want = hf(ids).logits
        blocks = layers[1:-1]
        routers = [b.moe.router for b in blocks if b.moe is not None]
        seen: list[torch.Tensor] = []
        hooks = [r.register_forward_hook(lambda m, i, out: seen.append(out.topk(2, dim=-1).values)) for r in routers]
        got = logits(layers, ids)
        for hook in hooks:
            hook.remove()
        torch.testing.assert_close(got, want, rtol=TOL, atol=TOL)
        top2 = torch.cat(seen)  # (every MoE token's two largest router logits)
        assert (top2[:, 0] - top2[:, 1]).min() > 1e-3  # (no near tie: float32 rounding flips no choice)
        assert torch.sigmoid(top2[:, 0]).min() < 0.5  # (weights well below one: on the inputs is not on the outputs)
        rotary, nope = blocks[:3], blocks[3]
        broken = {
            "rotate-half, not pairs": [(b, "interleaved", False) for b in blocks],
            "no q/k L2 norm": [(b, "qk_l2_eps", None) for b in blocks],
            "no chunks": [(b, "chunk", None) for b in blocks],
            "no temperature": [(nope, "temperature", None)],
            "weights on the outputs": [(b.moe, "on_input", False) for b in blocks if b.moe is not None],
            "rotary on the NoPE layer": [(nope, "theta", LLAMA4.rope_theta)],
            "q/k L2 norm on the NoPE layer": [(nope, "qk_l2_eps", LLAMA4.norm_eps)],
            "chunks on the NoPE layer": [(nope, "chunk", 8)],
            "temperature on every layer": [(b, "temperature", (4, 0.1)) for b in rotary],
        }
        diffs = broken_diffs(layers, ids, want, broken)
        assert all(diff > 100 * TOL for diff in diffs.values()), diffs
        torch.testing.assert_close(logits(layers, ids), want, rtol=TOL, atol=TOL)


def test_rotary_as_transformers() -> None:
    """Our rotary on adjacent pairs (apply_rotary_pairs) is transformers' llama4 apply_rotary_emb, its output
    left in pairs, with the angles of its Llama4TextRotaryEmbedding (float32's precision: it computes in float32); the
    rotate-half layout, or the pairs laid out evens then odds (DeepSeek's), is another tensor."""
    from transformers import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextRotaryEmbedding, apply_rotary_emb

    data = json.loads(FIXTURE.read_text())
    data.pop("model_type")
    rope = Llama4TextRotaryEmbedding(Llama4TextConfig(**data))
    gen = torch.Generator().manual_seed(4)
    b, s, a, d = 2, 16, 4, 16
    q, k = (torch.randn(b, s, a, d, dtype=torch.float64, generator=gen) for _ in range(2))
    freqs = rope(q, torch.arange(s)[None])
    want_q, want_k = apply_rotary_emb(q, k, freqs)
    cos, sin = rotary_cos_sin_pairs(s, d, LLAMA4.rope_theta, q.device, q.dtype)
    got_q, got_k = (apply_rotary_pairs(x.transpose(1, 2), cos, sin).transpose(1, 2) for x in (q, k))
    torch.testing.assert_close(got_q, want_q, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_k, want_k, rtol=1e-6, atol=1e-6)
    half = apply_rotary(q.transpose(1, 2), *rotary_cos_sin(s, d, LLAMA4.rope_theta, q.device, q.dtype))
    assert (half.transpose(1, 2) - want_q).abs().max() > 0.1
    evens_odds = torch.cat([got_q[..., 0::2], got_q[..., 1::2]], dim=-1)
    assert (evens_odds - want_q).abs().max() > 0.1


@pytest.mark.parametrize("top_k", [1, 2])
def test_moe_as_transformers(top_k: int) -> None:
    """Our SparseMoE with the weights on the inputs (each expert run on its routed tokens only) is transformers'
    Llama4TextMoe (every expert on every token, the others' inputs scaled by zero), top 1 and top 2, to float64's
    precision; the routing weights are the top k logits' sigmoids, not renormalised."""
    from transformers import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4TextMoe

    spec = LLAMA4.with_(experts_per_token=top_k)
    data = json.loads(FIXTURE.read_text())
    data.pop("model_type")
    data["num_experts_per_tok"] = top_k
    theirs = Llama4TextMoe(Llama4TextConfig(**data)).double()
    ours = build_layers(get_config(spec), seed=2, start=2, stop=3)[0].moe.double()
    assert isinstance(ours, SparseMoE) and ours.on_input
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        ours.router.weight.mul_(20)
        theirs.router.weight.copy_(ours.router.weight)
        for e, ex in enumerate(ours.experts):
            _mlp_weights(ex, gen)
            theirs.experts.gate_up_proj[e].copy_(torch.cat([ex.gate.weight.T, ex.up.weight.T], dim=-1))
            theirs.experts.down_proj[e].copy_(ex.down.weight.T)
        se = ours.shared_expert
        _mlp_weights(se, gen)
        for a, b in ((se.gate, theirs.shared_expert.gate_proj), (se.up, theirs.shared_expert.up_proj),
                     (se.down, theirs.shared_expert.down_proj)):
            b.weight.copy_(a.weight)
        x = torch.randn(2, 16, 64, dtype=torch.float64, generator=gen)
        want, _ = theirs(x)
        torch.testing.assert_close(ours(x), want.view(x.shape), rtol=1e-12, atol=1e-12)
        weights, index = ours.router.choose(x.view(-1, 64), x.dtype)
        top = torch.topk(x.view(-1, 64) @ ours.router.weight.T, top_k, dim=-1)
        assert torch.equal(index, top.indices)
        torch.testing.assert_close(weights, torch.sigmoid(top.values.float()).double(), rtol=1e-15, atol=1e-15)
        ours.on_input = False
        assert (ours(x) - want.view(x.shape)).abs().max() > 1e-2


def test_refusals() -> None:
    """Llama 4's pieces outside the Llama-family decoder are refused naming the field: its routing weights on a
    GPT-2-style model with experts (learned positions), its rotary pieces on a BERT-style encoder."""
    gpt = ModelSpec(name="g", layers=2, hidden=64, heads=4, vocab=128, seq=16, position="learned", experts=4,
                    experts_per_token=1, router_weights_on_input=True)
    with pytest.raises(ValueError, match="router_weights_on_input"):
        get_config(gpt).family  # noqa: B018
    bert = ModelSpec(name="b", architecture="encoder", layers=2, hidden=64, heads=4, vocab=128, seq=16,
                     position="rotary")
    for change, field in (({"nope_layers": (1,)}, "nope_layers"), ({"rope_interleaved": True}, "rope_interleaved"),
                          ({"qk_l2_norm": True}, "qk_l2_norm"), ({"attention_chunk": 8}, "attention_chunk"),
                          ({"nope_layers": (1,), "query_temperature": (4, 0.1)}, "query_temperature")):
        with pytest.raises(ValueError, match=field):
            get_config(bert.with_(**change)).family  # noqa: B018


#: the tensor-parallel probe's layers: a rotary chunked MoE layer, the NoPE MoE layer, a rotary dense layer with one
#: key/value head (k and v replicated)
PROBED = {"rotary chunked moe": (LLAMA4, 1), "nope moe": (LLAMA4, 3), "rotary dense kv replicated":
          (LLAMA4.with_(kv_heads=1), 0)}


@pytest.mark.slow
def test_tensor_parallel_block_equals_whole_block() -> None:
    """t = 2 (gloo, two processes) against the whole block, float64 (tests/tp_block_probe.py): the same output, input
    gradient and parameter gradients (the shards' gathered under the whole block's names) for a rotary chunked layer
    with experts (pairs rotated, queries and keys L2-normed, chunks of 8: per head and per position, on each rank's
    whole heads), the NoPE layer with experts (the queries' temperature) and a rotary dense layer with its one
    key/value head replicated. The experts' inputs scaled by the routing weights, through f with the tokens: the
    router's gradient whole on both ranks; the collectives those of a block without Llama 4's pieces (the attention's
    f and g, the MLP's; experts: the tokens' f, the weights' f of T k, the shared expert's own f and g)."""
    ranks = tp_block_errors({name: (spec.model_dump(), layer) for name, (spec, layer) in PROBED.items()})
    T, h, k = 2 * 16, 64, 1
    for errors in ranks:
        assert set(errors) == set(PROBED)
        for name, e in errors.items():
            assert_whole_block(name, e)
            split = set(e["split"])
            assert {"q.weight", "o.weight"} <= split, (name, split)
            if name.endswith("kv replicated"):
                assert not {"k.weight", "v.weight"} & split, (name, split)
                assert {"gate.weight", "up.weight", "down.weight"} <= split, (name, split)
                continue
            assert {"k.weight", "v.weight", "moe.shared_expert.up.weight"} <= split, (name, split)
            assert e["router grad"] < 1e-12 and e["router grad norm"] > 1e-6, (name, e)
            assert sorted(e["all-reduces"]) == sorted([T * h] * 6 + [T * k]), (name, e["all-reduces"])


P = plans_of(LLAMA4)
RUNS = {
    "1f1b t=2": P("1f1b", 1, 2, tensor=2),
    "1f1b W=2 e=2": P("1f1b", 1, 2, data=2, expert=2),
    "1f1b D=2": P("1f1b", 2, 4),
}
runs = launched_fixture((RUNS, 2))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(RUNS))
def test_run_equals_single_process(runs, name) -> None:  # type: ignore[no-untyped-def]
    """Real runs (gloo, float64) with --check: the parameters after two steps equal single-process training's, with
    the experts' inputs scaled by the routing weights on the tensor-parallel shards (t = 2), before the dispatch to the
    expert-parallel peer (e = 2), and the NoPE layer on the second pipeline stage (D = 2)."""
    check = runs[name]["check"]
    assert check["ok"] is True, check["message"]
