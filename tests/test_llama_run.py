"""The executor on a tiny Llama (6 layers, hidden 64, 4 query heads, 2 key/value heads, vocabulary 512, from
tests/fixtures/tiny-llama/config.json): every schedule asked for and tensor parallelism t=2 give, after the
steps, the parameters of single-process training (gloo, float64); so do a tiny Qwen2, Qwen3, Gemma 2, Gemma 3 and
GPT-2 from their HF configs, two mixtures of experts (Mixtral-like, Qwen3-MoE-like), and a user's own model
(``--module examples/custom_model.py:build``). One launch runs the plans in sequence."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from executor.launch import launch
from executor.plan import RunPlan
from pipeplan.cli import app
from profiler.hf_config import read_hf_config

FIXTURES = Path(__file__).resolve().parent / "fixtures"
TINY = FIXTURES / "tiny-llama" / "config.json"
SPEC = read_hf_config(TINY, name="tiny-llama").model_dump()
# the other families of examples/models, tiny: Qwen2 (biases on q, k, v; tied head) and GPT-2
QWEN2 = read_hf_config(FIXTURES / "tiny-qwen2").model_dump()
GPT2 = read_hf_config(FIXTURES / "tiny-gpt2").model_dump()
# Qwen3: per-head query/key RMSNorm (their weights' gradients summed over the tensor group), head_dim 32 > h / a
QWEN3 = read_hf_config(FIXTURES / "tiny-qwen3").model_dump()
# Gemma 2: sandwich norms (replicated on the tensor ranks), soft-capped scores and logits, a tied head
GEMMA2 = read_hf_config(FIXTURES / "tiny-gemma2").model_dump()
# Gemma 3: per-head query/key norms, a window on two layers of three with their own rotary base
GEMMA3 = read_hf_config(FIXTURES / "tiny-gemma3").model_dump()
# mixtures of experts (executor/models/llama.py's SparseMoE): the tiny Llama with 4 experts of width 128, top-2
# (Mixtral's routing), and the tiny Qwen3 with 8 experts of width 32, top-2, not renormalised (Qwen3 MoE's
# norm_topk_prob False); at t = 2 each expert is split as the dense MLP, the router replicated
MOE = read_hf_config(TINY, name="tiny-mixtral").with_(experts=4, experts_per_token=2).model_dump()
QWEN3_MOE = read_hf_config(FIXTURES / "tiny-qwen3", name="tiny-qwen3-moe").with_(
    experts=8, experts_per_token=2, expert_ffn_hidden=32, normalize_topk=False).model_dump()
MODULE = str(FIXTURES.parent.parent / "examples" / "custom_model.py") + ":build"


def U(schedule: str, D: int, N: int, **kw) -> RunPlan:  # type: ignore[no-untyped-def]
    return RunPlan.direct(schedule, D, N, model="custom_model", module=MODULE, iterations=2, **kw)


def P(schedule: str, D: int, N: int, spec: dict | None = None, **kw) -> RunPlan:  # type: ignore[no-untyped-def, type-arg]
    spec = spec or SPEC
    return RunPlan.direct(schedule, D, N, model=spec["name"], model_spec=spec, iterations=2, **kw)


PLANS = {
    "1f1b": P("1f1b", 2, 4),
    "interleaved v=2": P("interleaved", 2, 4, chunks=2),
    "chimera N=D": P("chimera", 2, 2),
    "hanayo W=2": P("hanayo", 2, 4, waves=2),
    "zb-h1": P("zb-h1", 2, 4),
    "tensor t=2 (KV heads sharded)": P("1f1b", 1, 2, tensor=2),
    "tensor t=2 recompute, 1 KV head (replicated)": P("1f1b", 1, 2, tensor=2, recompute=True,
                                                      model_overrides={"kv_heads": 1}),
    "qwen2 1f1b (tied head across stages)": P("1f1b", 2, 2, QWEN2),
    "qwen2 tensor t=2 (q/k/v biases sharded)": P("1f1b", 1, 2, QWEN2, tensor=2),
    "gpt2 (zoo GPT from its HF config) 1f1b": P("1f1b", 2, 2, GPT2),
    "qwen3 1f1b (query/key norms)": P("1f1b", 2, 2, QWEN3),
    "qwen3 tensor t=2 (query/key norms on each rank's heads)": P("1f1b", 1, 2, QWEN3, tensor=2),
    "gemma2 1f1b (tied head across stages)": P("1f1b", 2, 2, GEMMA2),
    "gemma2 tensor t=2 (sandwich norms, soft-capped scores)": P("1f1b", 1, 2, GEMMA2, tensor=2),
    "gemma3 interleaved v=2 (local and global layers)": P("interleaved", 2, 4, GEMMA3, chunks=2),
    "gemma3 tensor t=2 (windows, query/key norms)": P("1f1b", 1, 2, GEMMA3, tensor=2),
    "moe 1f1b (4 experts, top-2)": P("1f1b", 2, 4, MOE),
    "moe interleaved v=2": P("interleaved", 2, 4, MOE, chunks=2),
    "moe tensor t=2 (experts split, router replicated)": P("1f1b", 1, 2, MOE, tensor=2),
    "qwen3-moe tensor t=2 (8 experts, not renormalised)": P("1f1b", 1, 2, QWEN3_MOE, tensor=2),
    "--module 1f1b b=2": U("1f1b", 2, 4, micro_batch=2),
    "--module interleaved v=2": U("interleaved", 2, 4, chunks=2),
    "--module zb-h1 + recompute": U("zb-h1", 2, 4, recompute=True),
    "--module data-parallel W=2": U("gpipe", 1, 2, data=2),
}


@pytest.fixture(scope="module")
def runs():  # type: ignore[no-untyped-def]
    res = launch(list(PLANS.values()), 2, check=True, timeout=120)
    return dict(zip(PLANS, res["runs"], strict=True))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(PLANS))
def test_llama_equals_single_process(runs, name) -> None:  # type: ignore[no-untyped-def]
    check = runs[name]["check"]
    assert check["ok"] is True, check["message"]


@pytest.mark.slow
def test_cli_run_hf_config_check() -> None:
    result = CliRunner().invoke(app, ["run", "--hf-config", str(TINY), "--schedule", "1f1b", "--devices", "2",
                                      "--microbatches", "2", "--tensor", "1", "--check", "--iterations", "1"])
    assert result.exit_code == 0, result.output
    assert "parameters equal single-process training" in result.output
    bad = CliRunner().invoke(app, ["run", "--hf-config", str(TINY.parent / "missing.json"), "-s", "1f1b",
                                   "-D", "2", "-N", "2"])
    assert bad.exit_code == 2 and "cannot read" in bad.output
    tp = CliRunner().invoke(app, ["run", "--module", MODULE, "-s", "1f1b", "-D", "1", "-N", "2", "--tensor", "2"])
    assert tp.exit_code == 2 and "t = 1" in tp.output
