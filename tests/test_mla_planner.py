"""Multi-head latent attention and DeepSeek's routing in the planner (``ModelSpec.kv_lora_rank`` etc.,
:mod:`planner.mla`): the spec's rules, the operators' FLOPs, the analytical profile's parameters, and the
tensor-parallel collectives of latent attention (its input side moves the latents, not the hidden states)."""

from __future__ import annotations

import pytest
from moe_support import FLASH, H100, h100_cluster
from pydantic import ValidationError

from planner.analytic import analytic_profile
from planner.model import ModelSpec
from planner.operators import OperatorOptions, layer_operators
from planner.request import Config, TrainingRequest
from planner.search import Planner, plan

#: DeepSeek-V3's layer (c' 1536, c 512, 128 heads of 192 / 128, 256 experts of 2048, 1 shared, top 8 in 4 of 8
#: groups) with 4 layers, the first dense, and a smaller vocabulary
V3 = ModelSpec(name="dsv3-4l", layers=4, hidden=7168, heads=128, head_dim=192, ffn_hidden=18432, gated_mlp=True,
               activation="silu", norm="rmsnorm", position="rotary", tied_embeddings=False, bias=False, vocab=32768,
               seq=4096, experts=256, experts_per_token=8, expert_ffn_hidden=2048, shared_expert_ffn_hidden=2048,
               dense_layers=(0,), router_score="sigmoid", router_groups=8, router_group_topk=4, router_bias=True,
               routed_scaling=2.5, kv_lora_rank=512, q_lora_rank=1536, qk_rope_head_dim=64, v_head_dim=128)
SP = OperatorOptions(attention="flash", causal=True, dropout=False, sequence_parallel=True)


@pytest.mark.parametrize(("changes", "words"), [
    ({"qk_rope_head_dim": None}, "qk_rope_head_dim: multi-head latent attention"),
    ({"qk_rope_head_dim": 192}, "qk_rope_head_dim: 192 must be less than head_dim (192)"),
    ({"kv_heads": 8}, "kv_heads: multi-head latent attention gives every head"),
    ({"qkv_bias": True}, "bias, qkv_bias"),
    ({"kv_lora_rank": None}, "q_lora_rank, qk_rope_head_dim, v_head_dim: only with kv_lora_rank"),
    ({"router_group_topk": None}, "router_groups and router_group_topk: give both"),
    ({"router_groups": 3}, "router_groups: 3 does not divide the 256 experts"),
    ({"router_group_topk": 9}, "router_group_topk: 9 is more than the 8 groups"),
    ({"experts_per_token": 160, "router_group_topk": 4}, "hold fewer than the 160"),
    ({"router_score": "softmax"}, "router_bias: only with router_score sigmoid"),
    ({"routed_scaling": 0.0}, "routed_scaling"),
    ({"qk_norm": True}, "qk_norm: multi-head latent attention normalises its latents"),
    ({"qk_rope_head_dim": 63}, "qk_rope_head_dim: 63 must be even"),
])
def test_rules_name_the_field(changes: dict, words: str) -> None:
    with pytest.raises(ValidationError, match=words.replace("(", r"\(").replace(")", r"\)")):
        V3.with_(**changes)


def test_latent_attention_parameters_and_widths() -> None:
    """DeepSeek-V2 eq. 9-19: ``h c' + c' + c' a d`` for the queries, ``h (c + r) + c + c a (d - r + v)`` for keys
    and values, ``a v h`` out; the value width defaults to head_dim; standard attention has no latent width."""
    h, a, d, r, c, cq, v = 7168, 128, 192, 64, 512, 1536, 128
    assert V3.attention_params() == (h * cq + cq + cq * a * d) + (h * (c + r) + c + c * a * (d - r + v)) + a * v * h
    assert (V3.o_dim, V3.v_d, V3.latent_width) == (a * v, v, cq + c + r)
    no_q = V3.with_(q_lora_rank=None)
    assert no_q.attention_params() == h * a * d + (h * (c + r) + c + c * a * (d - r + v)) + a * v * h
    assert no_q.latent_width == h + c + r
    assert V3.with_(v_head_dim=None).v_d == d
    plain = V3.with_(kv_lora_rank=None, q_lora_rank=None, qk_rope_head_dim=None, v_head_dim=None)
    assert plain.latent_width is None and plain.o_dim == a * d
    assert not {"kv_lora_rank", "router_score", "routed_scaling"} & set(plain.with_(
        router_score="softmax", router_bias=False, routed_scaling=1.0, router_groups=None,
        router_group_topk=None).model_dump())


def _fwd_flops(ops: list, names: tuple[str, ...]) -> float:
    return sum(k.flops for op in ops if op.name in names for k in op.fwd)


@pytest.mark.parametrize("t", [1, 2, 8])
def test_latent_attention_operators(t: int) -> None:
    """The down-projections whole on every tensor rank, the up-projections and the output split by heads; the flash
    kernel's FLOPs (causal half); no Q, K, V projections."""
    b, T = 1, 4096
    h, a, d, r, c, cq, v = 7168, 128, 192, 64, 512, 1536, 128
    ops = layer_operators(V3, b, t, FLASH, moe=False)
    names = [op.name for op in ops]
    assert "qkv" not in names and names[:7] == ["norm1", "q_down", "q_norm", "q_up", "kv_down", "kv_norm", "kv_up"]
    assert _fwd_flops(ops, ("q_down", "kv_down")) == pytest.approx(2 * T * h * (cq + c + r))
    assert _fwd_flops(ops, ("q_up", "kv_up")) == pytest.approx(2 * T * (cq * a * d + c * a * (d - r + v)) / t)
    assert _fwd_flops(ops, ("proj",)) == pytest.approx(2 * T * a * v * h / t)
    # (FlashAttention-2, FLASH's kernel, pads V to d: test_flash_kernel_with_a_narrower_value)
    assert _fwd_flops(ops, ("flash_attn",)) == pytest.approx(0.5 * 2 * b * (a // t) * 4096 ** 2 * (d + d))
    direct = [op.name for op in layer_operators(V3.with_(q_lora_rank=None), b, t, FLASH, moe=False)]
    assert direct[:5] == ["norm1", "q_proj", "kv_down", "kv_norm", "kv_up"]
    # eager PyTorch: the latent norms and the rotary as separate ops, more kernels, more bytes; the GEMMs the same
    eager = {op.name: op for op in layer_operators(V3, b, t, OperatorOptions(attention="flash", causal=True,
                                                                           dropout=False, kernels="eager"),
                                                   moe=False)}
    fused = {op.name: op for op in ops}
    assert "mla_grad_sum" in eager and "mla_grad_sum" not in fused
    for name in ("q_norm", "kv_norm", "rope"):
        assert len(eager[name].fwd) > 1 == len(fused[name].fwd)
        assert sum(k.nbytes for k in eager[name].fwd) > sum(k.nbytes for k in fused[name].fwd)


def test_routing_variants_cost_a_little_more() -> None:
    """Group-limited choice and the choice's bias are passes over the fp32 scores: the routing operator moves more
    bytes with them, and nothing else changes."""
    plain = V3.with_(router_score="softmax", router_bias=False, router_groups=None, router_group_topk=None)
    ops, base = layer_operators(V3, 1, 1, FLASH), layer_operators(plain, 1, 1, FLASH)
    routing = {op.name: op for op in ops}["routing"]
    plain_routing = {op.name: op for op in base}["routing"]
    assert routing.fwd[0].nbytes > plain_routing.fwd[0].nbytes
    assert [op for op in ops if op.name != "routing"] == [op for op in base if op.name != "routing"]


def test_analytic_profile_counts_the_model() -> None:
    prof = analytic_profile(V3, H100, options=FLASH, micro_batches=(1,), tensor_sizes=(1, 8))
    assert sum(lay.params - lay.tied_params for lay in prof.layers) == V3.total_params()
    assert prof.shape is not None and prof.shape.latent_width == 1536 + 512 + 64
    blocks = [lay for lay in prof.layers if lay.kind == "transformer"]
    assert blocks[0].expert_params == 0 and blocks[1].expert_params == 256 * V3.expert_params()


def _costs(profile, config: Config):  # type: ignore[no-untyped-def]
    gpus = config.tensor * config.pipeline * config.data
    cand, costs = Planner(profile, h100_cluster(), TrainingRequest(global_batch=64, gpus=gpus)).prepare(config)
    assert costs is not None, cand.reason
    return costs


@pytest.mark.parametrize("options", [FLASH, SP])
def test_latent_attention_moves_the_latents_over_the_tensor_group(options: OperatorOptions) -> None:
    """Per layer and pass, half of the attention's collective at the hidden width and half at the latent width
    (Megatron-Core's MLASelfAttention gathers the compressed latents): less than standard attention's; with
    sequence parallelism the backward re-gathers the latents' shard, not the hidden states'."""
    prof = analytic_profile(V3, H100, options=options, micro_batches=(1,), tensor_sizes=(1, 8))
    assert prof.shape is not None
    standard = prof.model_copy(update={"shape": prof.shape.model_copy(update={"latent_width": None})})
    cfg = Config(tensor=8, pipeline=1, data=1, micro_batch=1, schedule="1f1b")
    mla, std = _costs(prof, cfg), _costs(standard, cfg)
    layers = mla.stages[0].transformer_layers
    width = 1536 + 512 + 64
    assert mla._tp_comm(0, 1) - std._tp_comm(0, 1) == pytest.approx(layers * (mla._tp_one(1, width)
                                                                              - mla._tp_one(1)) / 2)
    assert mla._tp_comm(0, 1) < std._tp_comm(0, 1)
    if options.sequence_parallel:
        el = 2
        gap = layers * (mla._tp_all_gather(4096 * width * el) - mla._tp_all_gather(4096 * 7168 * el))
        assert mla._sp_regather(0, 1) - std._sp_regather(0, 1) == pytest.approx(gap) and gap < 0
    else:
        assert mla._sp_regather(0, 1) == std._sp_regather(0, 1) == 0.0


def test_plan_a_deepseek_v3_shape() -> None:
    """The search plans the 4-layer V3 shape on 64 H100s: rows that split the experts, predicted with the latent
    attention's operators."""
    prof = analytic_profile(V3, H100, options=SP, micro_batches=(1, 2))
    res = plan(prof, h100_cluster(), TrainingRequest(global_batch=128, gpus=64, top=3))
    assert res.candidates and all(c.fits for c in res.candidates)
    assert all(c.config.expert > 1 for c in res.candidates), [c.config.label() for c in res.candidates]


def test_latent_down_projections_are_whole_on_every_tensor_rank() -> None:
    """Megatron-Core duplicates latent attention's down-projections and latent norms on every tensor rank: the
    layer records them (``replicated_params``), and the planner's view at t counts them whole, so a rank's model state
    and its gradient all-reduce hold them whole beside 1/t of the rest (V3 at t = 8: 15.1M per layer; counted 1/8
    before, 0.81B parameters short per rank over 61 layers)."""
    h, c, r, cq = 7168, 512, 64, 1536
    rep = V3.replicated_attention_params()
    assert rep == h * cq + cq + h * (c + r) + c and V3.with_(q_lora_rank=None).replicated_attention_params() == (
        h * (c + r) + c)
    prof = analytic_profile(V3, H100, options=FLASH, micro_batches=(1,), tensor_sizes=(1, 8))
    assert [lay.replicated_params for lay in prof.layers if lay.kind == "transformer"] == [rep] * 4
    bare = prof.model_copy(update={"layers": [lay.model_copy(update={"replicated_params": 0})
                                              for lay in prof.layers]})
    cfg = Config(tensor=8, pipeline=1, data=1, micro_batch=1, schedule="1f1b")
    mla, split = _costs(prof, cfg), _costs(bare, cfg)
    per_param = TrainingRequest(global_batch=64, gpus=8).state_bytes_per_param(1)
    view = Planner(prof, h100_cluster(), TrainingRequest(global_batch=64, gpus=8)).view_of(cfg)
    state, state_split = view.memory.stage_state(mla), Planner(bare, h100_cluster(), TrainingRequest(
        global_batch=64, gpus=8)).view_of(cfg).memory.stage_state(split)
    assert state[0] - state_split[0] == pytest.approx(4 * rep * (1 - 1 / 8) * per_param)
    assert mla.stages[0].param_bytes / 8 - split.stages[0].param_bytes / 8 == pytest.approx(4 * rep * 7 / 8 * 2)
    at_one = Planner(prof, h100_cluster(), TrainingRequest(global_batch=64, gpus=8)).view_of(
        cfg.model_copy(update={"tensor": 1, "data": 8}))
    assert at_one.profile is prof  # (t = 1: nothing to count twice)


def test_sequence_parallel_latents_run_on_the_ranks_rows() -> None:
    """With sequence parallelism the down-projections and latent norms run on the rank's T/t rows and each
    up-projection stashes its latent's shard (Megatron-Core's MLASelfAttention: "q_compressed: [s / TP, b,
    q_lora_rank]"), 1/t of the down-projections' FLOPs and of those stashes without it."""
    t, T, h, c, cq, el = 8, 4096, 7168, 512, 1536, 2
    plain = {op.name: op for op in layer_operators(V3, 1, t, FLASH, moe=False)}
    sp = {op.name: op for op in layer_operators(V3, 1, t, SP, moe=False)}
    for name in ("q_down", "kv_down", "q_norm", "kv_norm"):
        assert _fwd_flops([sp[name]], (name,)) == pytest.approx(_fwd_flops([plain[name]], (name,)) / t)
    assert _fwd_flops([sp["q_down"]], ("q_down",)) == pytest.approx(2 * T / t * h * cq)
    assert (sp["q_up"].saved_bytes, sp["kv_up"].saved_bytes) == (el * T / t * cq, el * T / t * c)
    assert (plain["q_up"].saved_bytes, plain["kv_up"].saved_bytes) == (el * T * cq, el * T * c)
    assert _fwd_flops([sp["q_up"]], ("q_up",)) == _fwd_flops([plain["q_up"]], ("q_up",))  # (on the gathered rows)
    assert sp["q_down"].saved_bytes == el * T / t * h and sp["kv_down"].saved_bytes == 0.0


def test_flash_kernel_with_a_narrower_value() -> None:
    """The fused kernel's backward at query/key width d and value width v: ``2 s^2 (3 d + 2 v)`` per head (S again,
    dQ and dK over d; dP and dV over v), 2.6 times the forward's ``2 s^2 (d + v)`` at 192 / 128; FlashAttention-2
    takes one head size for Q, K and V (V padded to d), FlashAttention-3 runs 192 / 128 as it is."""
    b, a, s, d, v = 1, 128, 4096, 192, 128
    for impl, dv in (("flash3", v), ("flash2", d)):
        opts = OperatorOptions(attention="flash", causal=True, dropout=False, attention_impl=impl)
        op = {o.name: o for o in layer_operators(V3, b, 1, opts, moe=False)}["flash_attn"]
        assert op.fwd[0].flops == pytest.approx(0.5 * 2 * b * a * s * s * (d + dv))
        assert op.bwd_i[0].flops == pytest.approx(0.5 * 2 * b * a * s * s * (3 * d + 2 * dv))


def test_the_shared_expert_stashes_no_second_copy_of_its_input() -> None:
    """The router, the shared expert's first GEMM and its gate read one tensor (the norm's output, or its T/t
    shard with sequence parallelism): stashed once, by the router."""
    from test_shared_experts_planner import QWEN2_MOE

    for opts in (FLASH, SP):
        ops = {op.name: op for op in layer_operators(QWEN2_MOE, 1, 2, opts)}
        assert ops["router"].saved_bytes > 0
        assert ops["shared_up_gate"].saved_bytes == 0.0 and ops["shared_gate"].saved_bytes == 0.0
