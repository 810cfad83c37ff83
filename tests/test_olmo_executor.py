"""OLMo 2, OLMo 3 and OLMoE in the executor (executor/models/llama.py's LlamaBlock.projection_norms and the
reordered norm, sandwich_forward; executor/tensor_parallel.py's split_rms_norm; planner/model.py's qk_norm_scope and
post_norm, profiler/hf_config.py's olmo2, olmo3, olmoe): the tiny models of tests/fixtures/tiny-olmo2 (3 layers),
tiny-olmo3 (4 layers, a window of 4 on layers 0-2) and tiny-olmoe (2 layers, 4 experts, top 2, not renormalised)
compute what transformers' Olmo2ForCausalLM, Olmo3ForCausalLM and OlmoeForCausalLM do with the same weights
(float64), and each of their pieces matters (the query/key norms over the whole projections, not over each head; the
norms on the branches' outputs, not their inputs; the windows; the routing's weights not renormalised); their
parameters are ModelSpec's; the projection-wide norm split over t ranks moves one all-reduce of the rows' sums forward
and one backward, float32 sums for bfloat16 rows; a block at t = 2 (key/value heads split and not) equals the whole
block; and real runs (t = 2, e = 2, zb-h1, recomputation) equal single-process training (gloo, float64)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from hf_parity import broken_diffs, built, copied, logits, randn
from run_support import assert_whole_block, direct, launched_fixture, tp_block_errors
from torch import nn

from executor.models import Stage, build_layers, get_config
from executor.models.llama import LlamaBlock, apply_rotary, causal_attention, rotary_cos_sin
from executor.plan import RunPlan
from executor.tensor_parallel import TensorParallelLlamaBlock, split_rms_norm
from planner.model import ModelSpec
from profiler.hf_config import read_hf_config

torch.set_num_threads(1)
FIXTURES = Path(__file__).resolve().parent / "fixtures"
#: the fixtures' config.json by name, and their ModelSpecs as profiler.hf_config reads them
FIXTURE = {name: FIXTURES / f"tiny-{name}" / "config.json" for name in ("olmo2", "olmo3", "olmoe")}
SPEC = {name: read_hf_config(path, name=f"tiny-{name}") for name, path in FIXTURE.items()}
OLMO2, OLMO3, OLMOE = SPEC["olmo2"], SPEC["olmo3"], SPEC["olmoe"]
#: logits' tolerance: transformers' Olmo2RMSNorm and OlmoeRMSNorm round through float32 (as Glm4MoeRMSNorm in
#: tests/test_glm4_moe_executor.py), as do the rotary's angles (inv_freq in float32) and OLMoE's routing
TOL = 1e-5


def test_specs_read_from_the_fixtures() -> None:
    """The fixtures' ModelSpecs have every OLMo piece the executor builds (what the other tests rely on), and the
    blocks build them: q_norm over a d = 64 and k_norm over k d = 32 (not d = 16), OLMo 2's and 3's norms on the
    branches' outputs with none on their inputs, OLMoE's on the inputs."""
    for s in SPEC.values():
        assert (s.qk_norm, s.qk_norm_scope, s.q_dim, s.kv_dim, s.d) == (True, "projection", 64, 32, 16)
    assert OLMO2.post_norm and OLMO3.post_norm and not OLMOE.post_norm
    assert [OLMO3.local_layer(i) for i in range(4)] == [True, True, True, False] and OLMO3.sliding_window == 4
    assert OLMO3.seq > OLMO3.sliding_window and OLMO2.sliding_window is None
    assert (OLMOE.experts, OLMOE.experts_per_token, OLMOE.normalize_topk, OLMOE.router_score) == (4, 2, False,
                                                                                                 "softmax")
    for name, s in SPEC.items():
        for b in build_layers(get_config(s), seed=1)[1:-1]:
            assert b.projection_norms and b.q_norm.weight.shape == (64,) and b.k_norm.weight.shape == (32,)
            if name == "olmoe":
                assert b.input_norm is not None and b.post_norm is not None and b.attn_out_norm is None
                assert b.moe is not None and b.mlp_out_norm is None
            else:
                assert b.input_norm is None and b.post_norm is None and b.moe is None
                assert b.attn_out_norm is not None and b.mlp_out_norm is not None
    assert [b.window for b in build_layers(get_config(OLMO3), seed=1)[1:-1]] == [4, 4, 4, None]


def test_parameter_counts() -> None:
    """Every block's parameters are ModelSpec.block_params(i) (the query and key norms' a d + k d, two norms of h),
    the model's ModelSpec.total_params() (tiny-olmo2: 109,280; the executor built 109,088 before it built the
    projection-wide norms)."""
    for spec in SPEC.values():
        layers = build_layers(get_config(spec), seed=1)
        assert [sum(p.numel() for p in m.parameters()) for m in layers[1:-1]] == [
            spec.block_params(i) for i in range(spec.layers)]
        assert sum(p.numel() for p in Stage(layers).parameters()) == spec.total_params()
    assert OLMO2.total_params() == 109_280


def hf_model(name: str):  # type: ignore[no-untyped-def]
    """transformers' model of the fixture ``name`` (eager attention and experts) as published, its ``rms_norm_eps``
    too (OLMo 2's and 3's 1e-6, OLMoE's 1e-5: the spec's ``norm_eps``). OLMo 3's rope_theta is
    given for both layer types (``rope_parameters``): transformers 5's Olmo3Config, handed a flat ``rope_theta``, gives
    it to the full-attention layers only and its default 500000 to the sliding ones (``convert_rope_params_to_dict``
    pops ``rope_theta`` twice), which OLMo 3's published configs (500000 everywhere) never show; OLMo-core and vLLM's
    Olmo3 rotate every layer with the one ``rope_theta``, as profiler.hf_config reads it."""
    import transformers

    data = json.loads(FIXTURE[name].read_text())
    data.pop("model_type")
    if name == "olmo3":
        theta = float(data.pop("rope_theta"))
        data["rope_parameters"] = {t: {"rope_type": "default", "rope_theta": theta}
                                   for t in ("sliding_attention", "full_attention")}
    kind = {"olmo2": "Olmo2", "olmo3": "Olmo3", "olmoe": "Olmoe"}[name]
    config = getattr(transformers, f"{kind}Config")(**data, attn_implementation="eager",
                                                    experts_implementation="eager")
    return getattr(transformers, f"{kind}ForCausalLM")(config)


def _mlp_weights(ours: nn.Module, gen: torch.Generator) -> None:
    """Our gated MLP's (a dense block's or an expert's) weights drawn anew: activations of order one."""
    for lin, std in ((ours.gate, 0.25), (ours.up, 0.25), (ours.down, 0.05)):
        lin.weight.copy_(randn(lin.weight, std, gen))


def copy_block(ours: LlamaBlock, theirs: nn.Module, gen: torch.Generator) -> None:
    """Our block into transformers' Olmo2/Olmo3/OlmoeDecoderLayer, first moved off its initial values where those
    would hide a piece: every norm's weight (the query and key norms' a d and k d too) away from one, the MLPs' and
    experts' weights of order one, the router scaled up."""
    at = theirs.self_attn
    for a, b in ((ours.q, at.q_proj), (ours.k, at.k_proj), (ours.v, at.v_proj), (ours.o, at.o_proj)):
        b.weight.copy_(a.weight)
        assert a.bias is None and b.bias is None
    norms = [(ours.q_norm, at.q_norm), (ours.k_norm, at.k_norm)]
    if ours.moe is None:  # OLMo 2 and 3: the branches' outputs normed
        norms += [(ours.attn_out_norm, theirs.post_attention_layernorm),
                  (ours.mlp_out_norm, theirs.post_feedforward_layernorm)]
    else:  # OLMoE: pre-norm
        norms += [(ours.input_norm, theirs.input_layernorm), (ours.post_norm, theirs.post_attention_layernorm)]
    for norm, target in norms:
        assert norm.weight.shape == target.weight.shape
        norm.weight.uniform_(0.5, 1.5, generator=gen)
        target.weight.copy_(norm.weight)
    if ours.moe is None:
        _mlp_weights(ours, gen)
        mlp = theirs.mlp
        for a, b in ((ours.gate, mlp.gate_proj), (ours.up, mlp.up_proj), (ours.down, mlp.down_proj)):
            b.weight.copy_(a.weight)
        return
    router = ours.moe.router
    router.weight.mul_(20)
    theirs.mlp.gate.weight.copy_(router.weight)
    experts = theirs.mlp.experts
    for e, ex in enumerate(ours.moe.experts):
        _mlp_weights(ex, gen)
        experts.gate_up_proj[e].copy_(torch.cat([ex.gate.weight, ex.up.weight]))  # (gate then up: its chunk(2))
        experts.down_proj[e].copy_(ex.down.weight)


def ours_and_theirs(name: str):  # type: ignore[no-untyped-def]
    """Our layers of the fixture ``name`` (float64), transformers' model with our weights copied in (moved off their
    initial values: :func:`copy_block`), and a batch of 2 x 16 tokens; the same parameter count, ModelSpec's."""
    cfg, layers, hf = built(SPEC[name], lambda: hf_model(name))
    ids = copied(cfg, layers, hf, copy_block, torch.Generator().manual_seed(0), norm_off_one=True)
    assert ids.shape == (2, 16)
    return layers, hf, ids


class _PerHead(nn.Module):
    """A wrong scope: the projection-wide norm's weights applied with each head's row normed alone (Qwen3's scope)."""

    def __init__(self, norm: nn.Module, d: int) -> None:
        super().__init__()
        self.norm, self.d = norm, d

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        heads = x.unflatten(-1, (-1, self.d))
        return (F.rms_norm(heads, (self.d,), None, self.norm.eps).flatten(-2)) * self.norm.weight


def norms_then_rotary(block: LlamaBlock, after: bool):  # type: ignore[no-untyped-def]
    """The block's attention written out with its projection-wide query and key norms before the rotary (as the block
    computes it: a control) or, ``after``, after it (a wrong order: the rotated queries and keys normed)."""
    d = block.head_dim

    def norms(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, a, s, _ = q.shape
        q = block.q_norm(q.transpose(1, 2).reshape(b, s, -1)).view(b, s, a, d).transpose(1, 2)
        k = block.k_norm(k.transpose(1, 2).reshape(b, s, -1)).view(b, s, -1, d).transpose(1, 2)
        return q, k

    def attend(x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (lin(x).view(b, s, -1, d).transpose(1, 2) for lin in (block.q, block.k, block.v))
        if not after:
            q, k = norms(q, k)
        cos, sin = rotary_cos_sin(s, d, block.theta, x.device, x.dtype)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if after:
            q, k = norms(q, k)
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return block.o(causal_attention(q, k, v, window=block.window))

    return attend


@pytest.mark.parametrize("name", ["olmo2", "olmo3", "olmoe"])
def test_same_logits_as_transformers(name: str) -> None:
    """Our weights copied into Olmo2ForCausalLM, Olmo3ForCausalLM and OlmoeForCausalLM (eager attention and experts,
    float64; every norm's weight off one) give the same logits on a batch of 2 x 16 tokens; and each OLMo piece
    matters: the query/key norms over each head instead of the whole projections, after the rotary, or none; OLMo 2's
    and 3's norms on the branches' inputs instead of their outputs, or none; OLMoE's on the outputs instead of the
    inputs; OLMo 3's windows none or one longer; OLMoE's weights renormalised over the top 2: each differs by far more
    than the tolerance."""
    layers, hf, ids = ours_and_theirs(name)
    with torch.no_grad():
        want = hf(ids).logits
        got = logits(layers, ids)
        torch.testing.assert_close(got, want, rtol=TOL, atol=TOL)
        blocks = layers[1:-1]
        d = SPEC[name].d
        broken: dict[str, list[tuple[object, str, object]]] = {
            "q/k norms over each head": [(b, n, _PerHead(getattr(b, n), d)) for b in blocks
                                         for n in ("q_norm", "k_norm")],
            "q/k norms after the rotary": [(b, "attend", norms_then_rotary(b, after=True)) for b in blocks],
            "no q/k norms": [(b, n, None) for b in blocks for n in ("q_norm", "k_norm")],
        }
        if name == "olmoe":
            broken |= {
                "norms on the outputs": [(b, a, getattr(b, c)) for b in blocks for a, c in (
                    ("attn_out_norm", "input_norm"), ("mlp_out_norm", "post_norm"), ("input_norm", "attn_out_norm"),
                    ("post_norm", "mlp_out_norm"))],
                "top 2 renormalised": [(b.moe.router, "normalize", True) for b in blocks],
            }
        else:
            broken |= {
                "norms on the inputs (pre-norm)": [(b, a, getattr(b, c)) for b in blocks for a, c in (
                    ("input_norm", "attn_out_norm"), ("post_norm", "mlp_out_norm"), ("attn_out_norm", "input_norm"),
                    ("mlp_out_norm", "post_norm"))],
                "no output norms": [(b, n, None) for b in blocks for n in ("attn_out_norm", "mlp_out_norm")],
            }
        if name == "olmo3":
            broken |= {"no windows": [(b, "window", None) for b in blocks],
                       "windows of 5": [(b, "window", 5) for b in blocks if b.window is not None]}
        diffs = broken_diffs(layers, ids, want, broken)
        assert all(diff > 100 * TOL for diff in diffs.values()), diffs
        # (the control: the written-out attention with the norms before the rotary is the block's)
        control = broken_diffs(layers, ids, want, {"control": [(b, "attend", norms_then_rotary(b, after=False))
                                                               for b in blocks]})
        assert control["control"] < TOL, control
        for b in blocks:
            del b.attend  # (broken_diffs set the bound method back on the instance)
        torch.testing.assert_close(logits(layers, ids), want, rtol=TOL, atol=TOL)



def test_norms_take_the_specs_epsilon() -> None:
    """Every norm takes the spec's ``norm_eps``, here tiny-olmo2's published ``rms_norm_eps`` 1e-6 (OLMo 2's): the
    query and key norms over the projections, the branches' output norms and the final norm of our layers, and the
    split query/key norms of a block at t = 2 (rank 0 of 2, built without a group); a run's plan carries it. Our
    logits equal Olmo2ForCausalLM's at 1e-6, while with every norm's epsilon at 1e-5 (the executor's former constant)
    they differ by far more than the tolerance (about 0.65)."""
    assert json.loads(FIXTURE["olmo2"].read_text())["rms_norm_eps"] == OLMO2.norm_eps == 1e-6
    layers, hf, ids = ours_and_theirs("olmo2")
    norms = [m for layer in layers for m in layer.modules() if isinstance(m, (nn.RMSNorm, nn.LayerNorm))]
    assert len(norms) == 4 * OLMO2.layers + 1 and {m.eps for m in norms} == {1e-6}
    split = TensorParallelLlamaBlock(layers[1], 0, 2, None)
    assert split.q_norm.width == 64 and split.k_norm.width == 32  # (split with their columns: split_rms_norm's)
    assert [n.eps for n in (split.q_norm, split.k_norm, split.attn_out_norm, split.mlp_out_norm)] == [1e-6] * 4
    plan = RUNS_2["olmo2 t=2"]  # (a run's plan, as the ranks read it back, keeps it)
    assert RunPlan.from_dict(json.loads(json.dumps(plan.to_dict()))).model_config.norm_eps == 1e-6
    with torch.no_grad():
        want = hf(ids).logits
        torch.testing.assert_close(logits(layers, ids), want, rtol=TOL, atol=TOL)
        diffs = broken_diffs(layers, ids, want, {"every norm at 1e-5": [(m, "eps", 1e-5) for m in norms]})
        assert diffs["every norm at 1e-5"] > 100 * TOL, diffs


def test_split_rms_norm_moves_one_sum_per_row_each_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """split_rms_norm on a whole row (one rank: the all-reduce the identity) is F.rms_norm (float64 to 1e-15, its
    gradients too; bfloat16 to bfloat16's rounding), and it moves exactly one all-reduce of the b s rows' sums forward
    and one backward: float32 sums for bfloat16 rows (the planner's 4 bytes a row), float64 ones for float64 rows."""
    calls: list[tuple[tuple[int, ...], torch.dtype]] = []

    def fake_all_reduce(t, *a, **k):  # type: ignore[no-untyped-def]
        calls.append((tuple(t.shape), t.dtype))

    monkeypatch.setattr(dist, "all_reduce", fake_all_reduce)
    gen = torch.Generator().manual_seed(8)
    for dtype, sums, tol in ((torch.float64, torch.float64, 1e-15), (torch.bfloat16, torch.float32, 1e-2)):
        calls.clear()
        x = torch.randn(2, 16, 64, generator=gen, dtype=torch.float64).to(dtype)
        w = (torch.rand(64, generator=gen, dtype=torch.float64) + 0.5).to(dtype)
        x1, w1, x2, w2 = (t.clone().requires_grad_(True) for t in (x, w, x, w))
        y1 = split_rms_norm(x1, w1, OLMO2.norm_eps, 64, None)
        y2 = F.rms_norm(x2, (64,), w2, OLMO2.norm_eps)
        assert y1.dtype == dtype
        torch.testing.assert_close(y1, y2, rtol=tol, atol=tol)
        assert calls == [((2, 16, 1), sums)], calls
        probe = torch.randn(y1.shape, generator=gen, dtype=torch.float64).to(dtype)
        (y1 * probe).sum().backward()
        (y2 * probe).sum().backward()
        assert calls == [((2, 16, 1), sums)] * 2, calls
        torch.testing.assert_close(x1.grad, x2.grad, rtol=tol, atol=tol)
        torch.testing.assert_close(w1.grad, w2.grad, rtol=tol, atol=tol * 10)


def test_refusals() -> None:
    """OLMo's pieces outside the Llama family (a GPT-2-style model with learned positions, which the zoo's GPT blocks
    would build without them) are refused naming the field."""
    gpt = ModelSpec(name="g", layers=2, hidden=64, heads=4, vocab=128, seq=16, position="learned")
    for change, field in (({"post_norm": True}, "post_norm"), ({"qk_norm": True}, "qk_norm"),
                          ({"qk_norm": True, "qk_norm_scope": "projection"}, "qk_norm")):
        with pytest.raises(ValueError, match=field):
            get_config(gpt.with_(**change)).family  # noqa: B018


#: the tensor-parallel probe's layers: OLMo 2's (key/value heads split, then one, replicated), OLMo 3's windowed and
#: full ones, OLMoE's (split, then replicated)
PROBED = {"olmo2": (OLMO2, 0), "olmo2 kv replicated": (OLMO2.with_(kv_heads=1), 1), "olmo3 windowed": (OLMO3, 0),
          "olmo3 full": (OLMO3, 3), "olmoe": (OLMOE, 0), "olmoe kv replicated": (OLMOE.with_(kv_heads=1), 1)}


@pytest.mark.slow
def test_tensor_parallel_block_equals_whole_block() -> None:
    """t = 2 (gloo, two processes) against the whole block, float64 (tests/tp_block_probe.py: every norm's weight off
    one): the same output, input gradient and parameter gradients (the shards' gathered under the whole block's names),
    for OLMo 2's, OLMo 3's (windowed and full) and OLMoE's blocks, with the key/value heads split and with one
    key/value head (replicated). Split: q, k, v by heads, o by columns, the query norm's a d weights with q's columns,
    the key norm's k d with k's where k is split (whole where it is replicated), the MLP or each expert as before; the
    output norms (OLMo 2) or the input norms (OLMoE) and the router whole. Collectives, exactly: each split norm one
    all-reduce of the T = 32 rows' sums forward and one backward (the planner's split_norms), the attention's f and g
    and the MLP's (T h each; experts: and the routing weights' f, T k); with k replicated, the key norm moves no row's
    sum, its weight's f (k d) and k's and v's weights' (k d h) instead."""
    ranks = tp_block_errors({name: (spec.model_dump(), layer) for name, (spec, layer) in PROBED.items()})
    T, h, k = 2 * 16, 64, 2
    for errors in ranks:
        assert set(errors) == set(PROBED)
        for name, e in errors.items():
            assert_whole_block(name, e)
            names, split = set(e["names"]), set(e["split"])
            assert {"q_norm.weight", "k_norm.weight", "q.weight", "o.weight"} <= names
            assert {"q_norm.weight", "q.weight", "o.weight"} <= split, (name, split)
            replicated = name.endswith("kv replicated")
            kv = {"k_norm.weight", "k.weight", "v.weight"}
            assert (not kv & split) if replicated else kv <= split, (name, split)
            kd = PROBED[name][0].kv_dim
            norms = [T] * 2 + ([kd, kd * h, kd * h] if replicated else [T] * 2)
            if name.startswith("olmoe"):
                assert {"input_norm.weight", "post_norm.weight"} <= names and "attn_out_norm.weight" not in names
                assert e["router grad"] < 1e-12 and e["router grad norm"] > 1e-6, (name, e)
                assert "moe.router.weight" not in split, (name, split)
                others = [T * h] * 4 + [T * k]
            else:
                assert {"attn_out_norm.weight", "mlp_out_norm.weight"} <= names and "input_norm.weight" not in names
                assert {"gate.weight", "up.weight", "down.weight"} <= split, (name, split)
                others = [T * h] * 4
            assert not {n for n in split if "out_norm" in n or "input_norm" in n or "post_norm" in n}, (name, split)
            assert sorted(e["all-reduces"]) == sorted(norms + others), (name, e["all-reduces"])


def P(spec: ModelSpec, schedule: str, D: int, N: int, **kw) -> RunPlan:  # type: ignore[no-untyped-def]
    return direct(spec, schedule, D, N, **kw)


RUNS_2 = {
    "olmo2 t=2": P(OLMO2, "1f1b", 1, 2, tensor=2),
    "olmo2 t=2 kv replicated": P(OLMO2.with_(name="tiny-olmo2-kv1", kv_heads=1), "1f1b", 1, 2, tensor=2),
    "olmo3 zb-h1 D=2 (split backward)": P(OLMO3, "zb-h1", 2, 4),
}
RUNS_4 = {
    "olmo2 1f1b D=2 t=2": P(OLMO2, "1f1b", 2, 2, tensor=2),
    "olmo3 1f1b D=2 t=2 recompute": P(OLMO3, "1f1b", 2, 2, tensor=2, recompute=True),
    "olmoe 1f1b D=2 W=2 e=2": P(OLMOE, "1f1b", 2, 2, data=2, expert=2),
    "olmoe t=2 e=2 W=2": P(OLMOE, "1f1b", 1, 2, data=2, expert=2, tensor=2),
}


runs = launched_fixture((RUNS_2, 2), (RUNS_4, 4))


@pytest.mark.slow
@pytest.mark.parametrize("name", [*RUNS_2, *RUNS_4])
def test_run_equals_single_process(runs, name) -> None:  # type: ignore[no-untyped-def]
    """Real runs (gloo, float64) with --check: the parameters after two steps equal single-process training's, the
    query and key norms' weights gathered from their column shards at t = 2 (the key norm's whole with one key/value
    head), the output norms (OLMo 2, 3) and the experts under e = 2 (OLMoE)."""
    check = runs[name]["check"]
    assert check["ok"] is True, check["message"]
