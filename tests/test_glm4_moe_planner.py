"""Partial rotary positions (``ModelSpec.rotary_dim``: GLM-4.5, Phi-4-mini) and GLM-4.5's layer in the planner: the
rules, the operator model's rotary cost and a plan of GLM-4.5-Air."""

from __future__ import annotations

from pathlib import Path

import pytest
from moe_support import H100, h100_cluster
from pydantic import ValidationError

from planner.analytic import analytic_profile
from planner.model import ModelSpec
from planner.operators import OperatorOptions, layer_operators
from planner.request import TrainingRequest
from planner.search import plan

ROOT = Path(__file__).resolve().parent.parent
LLAMA = ModelSpec(layers=2, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, gated_mlp=True, activation="silu",
                  norm="rmsnorm", position="rotary", bias=False, vocab=32000, seq=4096)
EAGER = OperatorOptions(attention="flash", causal=True, dropout=False, kernels="eager")
FUSED = OperatorOptions(attention="flash", causal=True, dropout=False)


@pytest.mark.parametrize(("changes", "words"), [
    ({"rotary_dim": 130}, "rotary_dim: 130 must be even and at most head_dim \\(128\\)"),
    ({"rotary_dim": 63}, "rotary_dim: 63 must be even"),
    ({"rotary_dim": 64, "position": "learned"}, "rotary_dim: only with rotary positions"),
])
def test_rules_name_the_field(changes: dict, words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        LLAMA.with_(**changes)


def _rope(ops: list, name: str = "rope") -> tuple[float, float, int]:
    op = next(op for op in ops if op.name == name)
    return sum(k.flops for k in op.fwd), sum(k.nbytes for k in op.fwd), len(op.fwd)


@pytest.mark.parametrize("t", [1, 2])
def test_rotary_cost_of_the_rotated_part(t: int) -> None:
    """Eager, the rotary kernels run over the rotated part (half at rotary_dim 64 of 128) and transformers' cat joins
    the rest back (read and write every query and key element); fused, one kernel reads and writes all of them
    (the unrotated part copied through), its FLOPs over the rotated part. Whole heads: no cat."""
    half = LLAMA.with_(rotary_dim=64)
    assert half.rot_d == 64 and LLAMA.rot_d == 128 and LLAMA.with_(position="learned").rot_d == 0
    whole_e, half_e = layer_operators(LLAMA, 1, t, EAGER), layer_operators(half, 1, t, EAGER)
    assert _rope(half_e)[1] == pytest.approx(_rope(whole_e)[1] / 2)
    qk = 4096 * (32 + 8) // t * 128  # the rank's query and key elements
    assert _rope(half_e, "rope_cat")[1] == pytest.approx(2 * 2 * qk)
    assert "rope_cat" not in [op.name for op in whole_e]
    whole_f, half_f = _rope(layer_operators(LLAMA, 1, t, FUSED)), _rope(layer_operators(half, 1, t, FUSED))
    assert half_f[1] == whole_f[1] and half_f[0] == pytest.approx(whole_f[0] / 2)


def test_plan_glm_4_5_air() -> None:
    """GLM-4.5-Air's analytical profile (46 layers, the first dense) holds its parameters, and the search plans it
    on 64 H100s with expert parallelism."""
    from profiler.hf_config import read_hf_config

    spec = read_hf_config(ROOT / "examples" / "models" / "glm-4.5-air", seq=4096)
    prof = analytic_profile(spec, H100, options=OperatorOptions(attention="flash", causal=True, dropout=False,
                                                                sequence_parallel=True), micro_batches=(1,))
    assert prof.total_params == spec.total_params() == 106_852_245_504
    res = plan(prof, h100_cluster(), TrainingRequest(global_batch=256, gpus=64, top=3))
    assert res.candidates and res.candidates[0].config.expert > 1
