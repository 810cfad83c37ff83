"""The reserve apart from the model's own memory (newcomer pass: every candidate on the 4 GiB local CPU cluster
read "2.00 GiB", the request's default reserve, whatever its model): the candidate document, the CLI table and
the fits rule (model + reserve <= capacity)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeplan.cli import app
from planner.analytic import transformer_profile
from planner.cluster import load_cluster
from planner.request import TrainingRequest
from planner.search import plan

EX = Path(__file__).resolve().parent.parent / "examples" / "clusters"
GiB = 2**30


@pytest.fixture(scope="module")
def local():
    cl = load_cluster(EX / "local-cpu-4.json")
    return cl, transformer_profile("gpt-tiny", 4, 256, 4, 128, 1024, cl.peak_flops, cl.device)


def test_the_2_gib_is_the_reserve_and_the_model_peak_is_shown_apart(local) -> None:  # type: ignore[no-untyped-def]
    cl, prof = local
    res = plan(prof, cl, TrainingRequest(global_batch=8, top=10))
    for c in res.candidates:
        doc = c.to_dict()
        assert doc["memory_reserve"] == 2 * GiB  # the request's default (planner.request)
        assert doc["model_memory"] == pytest.approx([m - 2 * GiB for m in doc["memory"]])
        assert doc["model_peak_memory"] == pytest.approx(doc["peak_memory"] - 2 * GiB)
        # gpt-tiny: weights, gradients, Adam state and activations are megabytes, not gigabytes
        assert 0 < doc["model_peak_memory"] < 0.1 * GiB


@pytest.mark.parametrize("reserve", [0.0, 3.9 * GiB, 4 * GiB - 30 * 2**20])
def test_fits_iff_model_plus_reserve_within_capacity(local, reserve: float) -> None:  # type: ignore[no-untyped-def]
    cl, prof = local
    res = plan(prof, cl, TrainingRequest(global_batch=8, top=50, memory_reserve_bytes=reserve))
    for c in res.candidates + res.infeasible:
        assert c.memory_reserve == reserve
        if c.memory:
            assert c.fits == (max(c.model_memory) + reserve <= cl.memory_bytes), (c.config.label(), c.reason)
    if reserve > 3.95 * GiB:  # 30 MiB left: the larger micro-batches no longer fit
        assert res.infeasible and all(not c.fits for c in res.infeasible)


def test_cli_table_shows_model_plus_reserve(tmp_path: Path) -> None:
    prof = tmp_path / "tiny.json"
    runner = CliRunner()
    assert runner.invoke(app, ["profile-analytic", "--preset", "gpt-tiny", "--out", str(prof)]).exit_code == 0
    args = ["plan", "--profile", str(prof), "--cluster", str(EX / "local-cpu-4.json"), "--global-batch", "8",
            "--top", "3"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "model + reserve" in r.output and " + 2.00" in r.output, r.output
    r = CliRunner().invoke(app, [*args, "--memory-reserve", "0.5"])
    assert r.exit_code == 0 and " + 0.50" in r.output and " + 2.00" not in r.output, r.output
