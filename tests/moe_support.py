"""Mixture-of-experts shapes and the H100 cluster the planner's expert tests share (few layers: fast profiles)."""

from __future__ import annotations

from pathlib import Path

from planner.cluster import Cluster, load_cluster
from planner.device import get_device
from planner.model import ModelSpec
from planner.operators import OperatorOptions

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
H100 = get_device("H100-SXM5-80GB")
FLASH = OperatorOptions(attention="flash", causal=True, dropout=False)
#: Qwen3-30B-A3B's shape with 8 layers: 128 small experts, 8 per token
QWEN3_MOE = ModelSpec(name="qwen3-moe-8l", layers=8, hidden=2048, heads=32, kv_heads=4, head_dim=128, ffn_hidden=6144,
                      expert_ffn_hidden=768, gated_mlp=True, activation="silu", norm="rmsnorm", position="rotary",
                      tied_embeddings=False, bias=False, qk_norm=True, vocab=151936, seq=4096, experts=128,
                      experts_per_token=8)
#: Mixtral's shape with 4 layers and 8 experts
MIXTRAL = ModelSpec(name="mixtral-4l", layers=4, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, gated_mlp=True,
                    activation="silu", norm="rmsnorm", position="rotary", tied_embeddings=False, bias=False,
                    vocab=32000, seq=4096, experts=8, experts_per_token=2)

#: DeepSeek-V3's form, tiny: latent attention with a query latent, sigmoid scores with the choice's bias, top 2 of 8
#: in 2 of 4 groups, renormalised and scaled by 2.5, one shared expert of the experts' width, layer 0 dense
TINY_DEEPSEEK_V3 = ModelSpec(name="tiny-deepseek-v3", layers=3, hidden=64, heads=4, head_dim=24, qk_rope_head_dim=8,
                             v_head_dim=16, kv_lora_rank=32, q_lora_rank=48, ffn_hidden=96, gated_mlp=True,
                             activation="silu", norm="rmsnorm", position="rotary", tied_embeddings=False, bias=False,
                             vocab=128, seq=16, experts=8, experts_per_token=2, expert_ffn_hidden=32,
                             shared_expert_ffn_hidden=32, dense_layers=(0,), router_score="sigmoid", router_groups=4,
                             router_group_topk=2, router_bias=True, routed_scaling=2.5, normalize_topk=True)


def h100_cluster() -> Cluster:
    """The DGX H100 cluster of ``examples/clusters``."""
    return load_cluster(EXAMPLES / "clusters" / "dgx-h100-80gb.json")
