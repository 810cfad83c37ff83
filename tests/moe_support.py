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


def h100_cluster() -> Cluster:
    """The DGX H100 cluster of ``examples/clusters``."""
    return load_cluster(EXAMPLES / "clusters" / "dgx-h100-80gb.json")
