"""The command line: simulate, show, and a measured profile going through the planner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeplan.cli import app

runner = CliRunner()
EX = Path(__file__).resolve().parent.parent / "examples" / "clusters"


def test_simulate_json_keys():
    r = runner.invoke(app, ["simulate", "--schedule", "chimera", "--devices", "4", "--microbatches", "4",
                            "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["makespan"] == 16 and data["bubble_ratio"] == pytest.approx(0.25)
    assert len(data["devices"]) == 4
    for d in data["devices"]:
        assert {"busy", "idle", "peak_activations"} <= d.keys()


def test_simulate_text_and_options():
    r = runner.invoke(app, ["simulate", "-s", "hanayo", "-D", "4", "-N", "8", "--waves", "2", "--comm", "0.1"])
    assert r.exit_code == 0 and "makespan" in r.output and "bubble ratio" in r.output
    r = runner.invoke(app, ["simulate", "-s", "interleaved", "-D", "4", "-N", "6", "--chunks", "2"])
    assert r.exit_code == 2 and "multiple" in r.output


def test_show_draws_one_row_per_device():
    r = runner.invoke(app, ["show", "-s", "chimera", "-D", "4", "-N", "4", "--no-color"])
    assert r.exit_code == 0, r.output
    rows = [line for line in r.output.splitlines() if line.startswith("P")]
    assert len(rows) == 4
    assert rows[0].split()[1:3] == ["F0", "F1"]  # down pipeline: upper case
    assert "f2" in rows[3] and "b2" in rows[3]  # up pipeline: lower case
    assert "makespan 16" in r.output


def test_bad_option_for_schedule():
    r = runner.invoke(app, ["simulate", "-s", "1f1b", "-D", "4", "-N", "4", "--waves", "2"])
    assert r.exit_code == 2 and "--waves does not apply" in r.output


@pytest.mark.slow
def test_measured_tiny_profile_is_accepted_by_the_planner(tmp_path):
    """Issue 4: a tiny GPT profile from the profiler goes through `pipeplan plan` as it is."""
    prof = tmp_path / "tiny.json"
    r = runner.invoke(app, ["profile", "--model", "gpt-tiny", "--micro-batches", "1,2,4", "--repeats", "3",
                            "--warmup", "1", "--threads", "1", "--out", str(prof)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["plan", "--profile", str(prof), "--cluster", str(EX / "piz-daint-p100-16gb.json"),
                            "--global-batch", "16", "--gpus", "4", "--top", "3", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["candidates"] and data["candidates"][0]["fits"]
