"""gpt-oss in the executor (executor/models/llama.py's causal_attention sinks, glu, quick_gelu and Router bias;
executor/tensor_parallel.py's splits of them; planner/model.py's attention_sinks, glu_linear_offset, glu_clamp,
activation="quick_gelu"): the tiny model of tests/fixtures/tiny-gpt-oss (3 layers, a window of 4 on layers 0 and 2,
biases on every linear layer, 4 experts, top 2) computes what transformers' GptOssForCausalLM does with the same
weights (float64, a batch of 16 tokens, longer than the window), and each of its pieces matters; the attention with
sinks, the router and the gated MLP each alone equal transformers' own functions (eager_attention_forward,
GptOssTopKRouter, GptOssExperts), the dense MLP of a spec with dense layers included; a block at t = 2 (sinks split
with the heads, column-parallel biases with their columns, row-parallel ones added once) equals the whole block; and
real runs at e = 2, t = 2 and with a 2-stage pipeline equal single-process training (gloo, float64)."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch
from hf_parity import broken_diffs, built, copied, logits, randn
from run_support import assert_whole_block, launched_fixture, plans_of, tp_block_errors
from torch import nn

from executor.models import Stage, build_layers, get_config
from executor.models.llama import ACTIVATIONS, LlamaBlock, SparseMoE, causal_attention, glu
from planner.model import ModelSpec
from profiler.hf_config import read_hf_config

torch.set_num_threads(1)
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "tiny-gpt-oss" / "config.json"
#: the fixture as profiler.hf_config reads it
GPT_OSS = read_hf_config(FIXTURE, name="tiny-gpt-oss")
#: the same with transformer layer 1 dense (a gated MLP of 48 with gpt-oss's gate, clamp, offset and biases)
DENSE = GPT_OSS.with_(name="tiny-gpt-oss-dense", dense_layers=(1,), ffn_hidden=48)
#: logits' tolerance: transformers' GptOssRMSNorm rounds through float32 (as in tests/test_mla_executor.py), and our
#: router's softmax runs in float32 (executor.models.llama.route)
TOL = 1e-5


def test_spec_read_from_the_fixture() -> None:
    """The fixture's ModelSpec has every gpt-oss piece the executor builds (what the other tests rely on)."""
    s = GPT_OSS
    assert (s.attention_sinks, s.bias, s.activation, s.glu_linear_offset, s.glu_clamp) == (True, True, "quick_gelu",
                                                                                           1.0, 7.0)
    assert (s.sliding_window, s.global_every, s.normalize_topk, s.experts, s.experts_per_token) == (4, 2, True, 4, 2)
    assert [s.local_layer(i) for i in range(3)] == [True, False, True]
    assert s.seq > s.sliding_window


def hf_gpt_oss(**changes: object):  # type: ignore[no-untyped-def]
    from transformers import GptOssConfig, GptOssForCausalLM

    data = json.loads(FIXTURE.read_text())
    data.pop("model_type")
    data.update(changes)
    return GptOssForCausalLM(GptOssConfig(**data, attn_implementation="eager", experts_implementation="eager"))


def ours_and_theirs():  # type: ignore[no-untyped-def]
    return built(GPT_OSS, hf_gpt_oss)


def copy_experts(experts: list[nn.Module], theirs: nn.Module, gen: torch.Generator) -> None:
    """Our experts, their weights and biases drawn anew (gate and up pre-activations of a few units: the clamp at 7
    bites on some), into transformers' GptOssExperts: ``gate_up_proj[e] (h, 2f)`` the gate's transpose in its even
    columns and up's in its odd ones, ``gate_up_proj_bias[e]`` alike, ``down_proj[e]`` down's transpose."""
    for e, ex in enumerate(experts):
        for lin in (ex.gate, ex.up, ex.down):
            lin.weight.copy_(randn(lin.weight, 0.75, gen))
            lin.bias.copy_(randn(lin.bias, 1.0, gen))
        ex.down.weight.mul_(0.1)
        theirs.gate_up_proj[e][:, ::2].copy_(ex.gate.weight.T)
        theirs.gate_up_proj[e][:, 1::2].copy_(ex.up.weight.T)
        theirs.gate_up_proj_bias[e, ::2].copy_(ex.gate.bias)
        theirs.gate_up_proj_bias[e, 1::2].copy_(ex.up.bias)
        theirs.down_proj[e].copy_(ex.down.weight.T)
        theirs.down_proj_bias[e].copy_(ex.down.bias)


def copy_block(ours: LlamaBlock, theirs: nn.Module, gen: torch.Generator) -> None:
    """Our block into transformers' GptOssDecoderLayer, first moved off its initial values where those would hide a
    piece: the attention's biases and the sinks of order one, the scores (q, k) scaled up, norms away from one, the
    router scaled up with a bias of order one."""
    at = theirs.self_attn
    for a, b in ((ours.q, at.q_proj), (ours.k, at.k_proj), (ours.v, at.v_proj), (ours.o, at.o_proj)):
        if a in (ours.q, ours.k):
            a.weight.mul_(10)
        a.bias.copy_(randn(a.bias, 0.5, gen))
        b.weight.copy_(a.weight)
        b.bias.copy_(a.bias)
    ours.sinks.copy_(randn(ours.sinks, 1.0, gen))
    at.sinks.copy_(ours.sinks)
    for norm, target in ((ours.input_norm, theirs.input_layernorm), (ours.post_norm, theirs.post_attention_layernorm)):
        norm.weight.uniform_(0.5, 1.5, generator=gen)
        target.weight.copy_(norm.weight)
    router = ours.moe.router
    router.weight.mul_(20)
    router.bias.copy_(randn(router.bias, 1.0, gen))
    theirs.mlp.router.weight.copy_(router.weight)
    theirs.mlp.router.bias.copy_(router.bias)
    copy_experts(list(ours.moe.experts), theirs.mlp.experts, gen)


def test_same_logits_as_transformers() -> None:
    """Our weights copied into GptOssForCausalLM (eager attention and experts, float64) give the same logits on a
    batch of 2 x 16 tokens (the window 4); and each gpt-oss piece matters: without the sinks, the offset, the clamp,
    the router's bias, the windows (or a window one longer), or with silu for quick_gelu, they differ by far more
    than the tolerance."""
    cfg, layers, hf = ours_and_theirs()
    ids = copied(cfg, layers, hf, copy_block, torch.Generator().manual_seed(0))
    assert ids.shape == (2, 16)
    with torch.no_grad():
        want = hf(ids).logits
        torch.testing.assert_close(logits(layers, ids), want, rtol=TOL, atol=TOL)
        blocks = layers[1:-1]
        experts = [ex for b in blocks for ex in b.moe.experts]
        broken = {
            "no sinks": [(b, "sinks", None) for b in blocks],
            "no offset": [(ex, "offset", 0.0) for ex in experts],
            "no clamp": [(ex, "clamp", None) for ex in experts],
            "silu gate": [(ex, "act", ACTIVATIONS["silu"]) for ex in experts],
            "no router bias": [(b.moe.router, "bias", None) for b in blocks],
            "no windows": [(b, "window", None) for b in blocks],
            "windows of 5": [(b, "window", 5) for b in blocks if b.window is not None],
        }
        for name, diff in broken_diffs(layers, ids, want, broken).items():
            assert diff > 100 * TOL, (name, diff)
        torch.testing.assert_close(logits(layers, ids), want, rtol=TOL, atol=TOL)


def test_attention_sinks_as_transformers() -> None:
    """causal_attention with sinks, causal and windowed, equals transformers' gpt-oss eager_attention_forward (the
    sink column concatenated, the row's maximum subtracted, softmax, the column dropped) to float64's precision, the
    gradients of the sinks and of q, k, v too; the weights of a row then sum to less than one."""
    from transformers.models.gpt_oss.modeling_gpt_oss import eager_attention_forward

    gen = torch.Generator().manual_seed(4)
    b, a, s, d = 2, 4, 16, 8
    for window in (None, 4):
        q, k, v = (torch.randn(b, a, s, d, dtype=torch.float64, generator=gen) * 3 for _ in range(3))
        sinks = torch.randn(a, dtype=torch.float64, generator=gen)
        ours_in = [t.clone().requires_grad_(True) for t in (q, k, v, sinks)]
        theirs_in = [t.clone().requires_grad_(True) for t in (q, k, v, sinks)]
        i, j = torch.arange(s)[:, None], torch.arange(s)[None]
        seen = (j <= i) & ((j > i - window) if window is not None else True)
        mask = torch.zeros(s, s, dtype=torch.float64).masked_fill(~seen, torch.finfo(torch.float64).min)
        module = types.SimpleNamespace(num_key_value_groups=1, sinks=theirs_in[3], training=False)
        y_theirs = eager_attention_forward(module, *theirs_in[:3], mask[None, None], scaling=d ** -0.5)[0]
        y_ours = causal_attention(*ours_in[:3], window=window, sinks=ours_in[3]).view(b, s, a, d)
        torch.testing.assert_close(y_ours, y_theirs, rtol=1e-12, atol=1e-12)
        probe = torch.randn(y_ours.shape, dtype=torch.float64, generator=gen)
        (y_ours * probe).sum().backward()
        (y_theirs * probe).sum().backward()
        for mine, theirs in zip(ours_in, theirs_in, strict=True):
            torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-12, atol=1e-12)
        assert ours_in[3].grad.abs().min() > 1e-6
        without = causal_attention(q, k, v, window=window).view(b, s, a, d)
        assert (without - y_theirs).abs().max() > 1e-2


def test_router_as_transformers() -> None:
    """Our Router with its bias (softmax over all E, the top k renormalised: normalize_topk) chooses what
    GptOssTopKRouter (top k of the logits, softmax over them) chooses, with the same weights (float32's precision:
    our routing's); without its bias, the choice differs for some tokens."""
    from executor.models.llama import route

    cfg, layers, hf = ours_and_theirs()
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        ours, theirs = layers[1].moe.router, hf.model.layers[0].mlp.router
        ours.weight.mul_(20)
        ours.bias.copy_(randn(ours.bias, 1.0, gen))
        theirs.weight.copy_(ours.weight)
        theirs.bias.copy_(ours.bias)
        x = torch.randn(64, cfg.hidden, dtype=torch.float64, generator=gen)
        weights, index = ours.choose(x, x.dtype)
        _, their_weights, their_index = theirs(x)
        order, their_order = index.argsort(dim=-1), their_index.argsort(dim=-1)
        assert torch.equal(index.gather(1, order), their_index.gather(1, their_order))
        torch.testing.assert_close(weights.gather(1, order), their_weights.gather(1, their_order), rtol=1e-6,
                                   atol=1e-6)
        unbiased = route(x @ ours.weight.T, ours.top_k, ours.normalize, x.dtype)[1]
        assert (unbiased.sort(dim=-1).values != index.sort(dim=-1).values).any(dim=-1).sum() > 3


def test_dense_mlp_as_gpt_oss_experts() -> None:
    """A dense layer of a gpt-oss-like spec (dense_layers) is a gated MLP of gpt-oss's form: the same function as
    transformers' GptOssExperts with one expert of its width and every token routed to it with weight one (the
    clamp biting, the offset and biases in); without the clamp or the offset it differs."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    cfg = get_config(DENSE)
    block = build_layers(cfg, seed=2, start=2, stop=3)[0].double()
    assert block.moe is None and block.gate.weight.shape == (48, cfg.hidden) and block.gate.bias is not None
    data = json.loads(FIXTURE.read_text())
    data.pop("model_type")
    data.update(num_local_experts=1, num_experts_per_tok=1, intermediate_size=48)
    theirs = GptOssExperts(GptOssConfig(**data, experts_implementation="eager")).double()
    gen = torch.Generator().manual_seed(6)
    with torch.no_grad():
        copy_experts([block], theirs, gen)
        x = torch.randn(40, cfg.hidden, dtype=torch.float64, generator=gen)
        want = theirs(x, torch.zeros(40, 1, dtype=torch.long), torch.ones(40, 1, dtype=torch.float64))
        gate, up = block.gate(x), block.up(x)
        assert (gate > 7).any() and (up.abs() > 7).any()
        torch.testing.assert_close(block.mlp(x), want, rtol=1e-12, atol=1e-12)
        for change in ({"clamp": None}, {"offset": 0.0}):
            inner = glu(block.act, gate, up, **{"offset": block.offset, "clamp": block.clamp, **change})
            assert (block.down(inner) - want).abs().max() > 1e-2


def test_parameter_counts() -> None:
    """Every block's parameters are ModelSpec.block_params(i) (its sinks and the router's bias among them), the
    model's ModelSpec.total_params(); the sinks are one per query head."""
    for spec in (GPT_OSS, DENSE):
        layers = build_layers(get_config(spec), seed=1)
        assert [sum(p.numel() for p in m.parameters()) for m in layers[1:-1]] == [
            spec.block_params(i) for i in range(spec.layers)]
        assert sum(p.numel() for p in Stage(layers).parameters()) == spec.total_params()
        for block in layers[1:-1]:
            assert block.sinks.shape == (spec.heads,)
            if block.moe is not None:
                assert isinstance(block.moe, SparseMoE) and block.moe.router.bias.shape == (spec.experts,)
    plain = build_layers(get_config(GPT_OSS.with_(attention_sinks=False, bias=False)), seed=1, start=1, stop=2)[0]
    assert plain.sinks is None and plain.moe.router.bias is None


def test_refusals() -> None:
    """gpt-oss's pieces outside the Llama family (a GPT-2-style model with learned positions) are refused naming the
    field."""
    gpt = ModelSpec(name="g", layers=2, hidden=64, heads=4, vocab=128, seq=16, position="learned")
    for change, field in (({"attention_sinks": True}, "attention_sinks"), ({"activation": "quick_gelu"}, "activation")):
        with pytest.raises(ValueError, match=field):
            get_config(gpt.with_(**change)).family  # noqa: B018


@pytest.mark.slow
def test_tensor_parallel_block_equals_whole_block() -> None:
    """t = 2 (gloo, two processes) against the whole block, float64: the same output, input gradient and parameter
    gradients (the shards' gathered under the whole block's names), for gpt-oss's windowed and full MoE layers, a
    dense layer of its form, one with a single key/value head (replicated k and v), and both kinds with a clamp
    that bites at the probe's small pre-activations. Split: q, k, v with their
    biases by heads, the sinks with the query heads, o by columns with its bias whole (added once after the
    all-reduce), each expert's gate and up with their biases by columns, down by rows with its bias whole; the
    router and its bias whole on both ranks. Collectives: the attention's f and g and the MLP's (dense: T h each;
    experts: the tokens' f and the weights' f, T k)."""
    specs = {"moe windowed": (GPT_OSS.model_dump(), 0), "moe full": (GPT_OSS.model_dump(), 1),
             "dense": (DENSE.model_dump(), 1), "kv replicated": (GPT_OSS.with_(kv_heads=1).model_dump(), 0),
             # (the probe's gate and up pre-activations are of order 0.1: a clamp at 0.05 bites on many)
             "moe clamp 0.05": (GPT_OSS.with_(glu_clamp=0.05).model_dump(), 0),
             "dense clamp 0.05": (DENSE.with_(glu_clamp=0.05).model_dump(), 1)}
    ranks = tp_block_errors(specs)
    T, h, k = 2 * 16, 64, 2
    for errors in ranks:
        for name, e in errors.items():
            assert_whole_block(name, e)
            assert {"sinks", "o.bias", "q.bias"} <= set(e["names"]), (name, e["names"])
            split = set(e["split"])
            assert {"sinks", "q.weight", "q.bias", "o.weight"} <= split, (name, split)
            assert "o.bias" not in split, (name, split)
            if name == "kv replicated":
                assert not {"k.weight", "k.bias", "v.weight", "v.bias"} & split, (name, split)
                continue
            assert {"k.weight", "k.bias", "v.weight", "v.bias"} <= split, (name, split)
            if name.startswith("dense"):
                assert {"gate.bias", "up.bias", "down.weight"} <= split and "down.bias" not in split, (name, split)
                assert sorted(e["all-reduces"]) == [T * h] * 4, (name, e["all-reduces"])
            else:
                assert {"moe.router.weight", "moe.router.bias"} <= set(e["names"]), (name, e["names"])
                assert not {"moe.router.weight", "moe.router.bias"} & split, (name, split)
                assert {f"moe.experts.{j}.{n}" for j in range(4) for n in ("gate.bias", "up.bias")} <= split
                assert not {f"moe.experts.{j}.down.bias" for j in range(4)} & split, (name, split)
                assert e["router grad"] < 1e-12 and e["router grad norm"] > 1e-6, (name, e)
                assert sorted(e["all-reduces"]) == sorted([T * h] * 4 + [T * k]), (name, e["all-reduces"])


P = plans_of(GPT_OSS)


RUNS_2 = {
    "t=2": P("1f1b", 1, 2, tensor=2),
    "t=2 dense layer": P("1f1b", 1, 2, DENSE, tensor=2),
    "zb-h1 D=2 (split backward)": P("zb-h1", 2, 4),
}
RUNS_4 = {
    "1f1b D=2 W=2 e=2": P("1f1b", 2, 2, data=2, expert=2),
    "1f1b D=2 t=2": P("1f1b", 2, 2, tensor=2),
    "t=2 e=2 W=2 recompute": P("1f1b", 1, 2, data=2, expert=2, tensor=2, recompute=True),
}


runs = launched_fixture((RUNS_2, 2), (RUNS_4, 4))


@pytest.mark.slow
@pytest.mark.parametrize("name", [*RUNS_2, *RUNS_4])
def test_run_equals_single_process(runs, name) -> None:  # type: ignore[no-untyped-def]
    """Real runs (gloo, float64) with --check: the parameters after two steps equal single-process training's, the
    sinks (gathered from their head shards at t = 2), the router's bias (whole on every copy) and each expert's biases
    (with its expert under e = 2) included."""
    check = runs[name]["check"]
    assert check["ok"] is True, check["message"]
