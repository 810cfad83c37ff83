"""Tests of the profiler (CPU): a tiny GPT profile, byte counts vs analytic formulas, links, CLI."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import typer
from typer.testing import CliRunner

from executor.models import get_config
from executor.models.analytic import (
    block_saved_bytes_per_sample,
    gpt_head_saved_bytes_per_sample,
    layer_params,
)
from planner.profile import ModelProfile, load_profile
from profiler.cli import register
from profiler.links import fit_alpha_beta, free_port, spawn_worker
from profiler.run import profile_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny_profile() -> ModelProfile:
    return profile_model("gpt-tiny", [1, 4], repeats=3, warmup=1, recompute=True)


def test_tiny_gpt_profile_validates(tiny_profile: ModelProfile, tmp_path: Path) -> None:
    prof = ModelProfile.model_validate_json(tiny_profile.model_dump_json())
    cfg = get_config("gpt-tiny")
    assert [layer.name for layer in prof.layers] == [
        "embedding",
        "block.0",
        "block.1",
        "block.2",
        "block.3",
        "head",
    ]
    assert [layer.kind for layer in prof.layers] == ["embedding", *["transformer"] * 4, "lm_head"]
    for layer in prof.layers:
        for b in (1, 4):
            assert layer.fwd_time[b] > 0 and layer.bwd_time[b] > 0
            assert layer.recompute_time is not None and layer.recompute_time[b] > 0
    assert prof.layers[2].fwd_time == prof.layers[1].fwd_time  # reused block.0
    assert prof.environment["repeated_blocks"] == "block.1..block.3 reuse block.0"
    assert "only block.0 was measured" in prof.notes
    assert prof.shape is not None and prof.shape.hidden == cfg.hidden
    assert prof.source == "measured" and prof.device == "cpu"


def test_param_bytes_equal_analytic_count(tiny_profile: ModelProfile) -> None:
    cfg = get_config("gpt-tiny")
    assert [layer.params for layer in tiny_profile.layers] == layer_params(cfg)
    assert [layer.param_bytes for layer in tiny_profile.layers] == [4 * n for n in layer_params(cfg)]
    assert tiny_profile.layers[-1].tied_params == cfg.vocab * cfg.hidden


def test_activation_bytes_match_analytic(tiny_profile: ModelProfile) -> None:
    cfg = get_config("gpt-tiny")
    block = tiny_profile.layers[1]
    expected = block_saved_bytes_per_sample(cfg)
    assert abs(block.stashed_bytes_per_sample - expected) <= 0.10 * expected
    head = tiny_profile.layers[-1]
    expected_head = gpt_head_saved_bytes_per_sample(cfg)
    assert abs(head.stashed_bytes_per_sample - expected_head) <= 0.10 * expected_head
    # boundaries: hidden states in fp32; the embedding keeps its int64 ids; the loss layer sends nothing
    assert block.output_bytes_per_sample == block.input_bytes_per_sample == 4 * cfg.seq * cfg.hidden
    assert tiny_profile.layers[0].input_bytes_per_sample == 8 * cfg.seq
    assert head.output_bytes_per_sample == 0


def test_times_grow_with_micro_batch_size() -> None:
    # a block big enough for the work (32x per step) to dominate timer noise on a shared machine
    cfg = get_config("gpt-tiny").with_(hidden=128, seq=64, layers=1, vocab=512, name="gpt-small")
    prof = profile_model(cfg, [1, 32], repeats=5, warmup=1)
    fwd = {b: sum(layer.fwd_time[b] for layer in prof.layers) for b in (1, 32)}
    bwd = {b: sum(layer.bwd_time[b] for layer in prof.layers) for b in (1, 32)}
    assert fwd[32] > 2 * fwd[1]
    assert bwd[32] > 2 * bwd[1]


def test_fit_alpha_beta_recovers_line() -> None:
    sizes = [1024, 4096, 65536, 1 << 20]
    fit = fit_alpha_beta(sizes, [1e-5 + 2e-10 * n for n in sizes])
    assert fit["alpha"] == pytest.approx(1e-5) and fit["beta"] == pytest.approx(2e-10)
    assert fit["residual"] < 1e-12
    with pytest.raises(ValueError, match="two distinct"):
        fit_alpha_beta([10, 10], [1.0, 2.0])


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_links_two_gloo_processes(tmp_path: Path) -> None:
    out = tmp_path / "links.json"
    sizes = [4096, 65536, 1 << 20, 4 << 20]
    args = (2, f"tcp://127.0.0.1:{free_port()}", str(out), sizes, 7, 2, 30.0)
    mp.spawn(spawn_worker, args=args, nprocs=2, join=True)
    result = json.loads(out.read_text())
    assert result["backend"] == "gloo" and result["world_size"] == 2
    for key in ("intra_node", "allreduce"):
        assert result[key]["alpha"] > 0, result
        assert result[key]["beta"] > 0, result
        assert result[key]["residual"] >= 0


def test_cli_profile_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    app = typer.Typer()
    register(app)
    out = tmp_path / "p.json"
    runner = CliRunner()
    args = [
        "profile",
        "--model",
        "gpt-tiny",
        "--micro-batches",
        "1,2",
        "--out",
        str(out),
        "--repeats",
        "1",
        "--warmup",
        "0",
    ]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    prof = load_profile(out)
    assert prof.name == "gpt-tiny" and prof.layers[0].micro_batch_sizes == [1, 2]
    bad = runner.invoke(app, ["profile", "--model", "gpt-huge", "--out", str(out)])
    assert bad.exit_code != 0 and "unknown model" in bad.output
    bad_sizes = runner.invoke(app, ["profile", "--model", "gpt-tiny", "--micro-batches", "1,x"])
    assert bad_sizes.exit_code != 0
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    no_torchrun = runner.invoke(app, ["profile-links", "--out", str(tmp_path / "c.json")])
    assert no_torchrun.exit_code == 2 and "torchrun" in no_torchrun.output
    monkeypatch.setitem(sys.modules, "httpx", None)  # as if httpx were not installed
    no_httpx = runner.invoke(
        app, ["profile", "--model", "gpt-tiny", "--out", str(out), "--upload", "http://localhost:1"]
    )
    assert no_httpx.exit_code == 2 and "httpx" in no_httpx.output


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_cli_profile_links_local_procs(tmp_path: Path) -> None:
    app = typer.Typer()
    register(app)
    out = tmp_path / "cluster.json"
    args = [
        "profile-links",
        "--local-procs",
        "2",
        "--sizes",
        "4096,1048576",
        "--repeats",
        "3",
        "--out",
        str(out),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    cluster = json.loads(out.read_text())
    assert set(cluster) >= {"intra_node", "allreduce", "backend", "world_size"}


def test_transient_from_the_measured_cuda_peak() -> None:
    """A measured CUDA peak of one forward + backward at the largest b, less the parameter gradients and b times
    the stash, output and input gradient, is what the layer held beside them (per sample); none on the CPU
    (no peak) or where nothing is left."""
    from profiler.layers import LayerMeasurement
    from profiler.run import transient_per_sample
    from profiler.timing import Timing

    m = LayerMeasurement(fwd={1: Timing(1.0, 0.0, (1.0,)), 4: Timing(4.0, 0.0, (4.0,))}, stashed_bytes_per_sample=100,
                         output_bytes_per_sample=10, input_bytes_per_sample=10, param_bytes=1000)
    assert transient_per_sample(m) is None  # no peak measured (CPU)
    m.peak_memory_bytes = 1000 + 4 * 120 + 4 * 300  # the head's loss: 300 bytes per sample beside the rest
    assert transient_per_sample(m) == 300
    m.peak_memory_bytes = 1000 + 4 * 120
    assert transient_per_sample(m) is None
