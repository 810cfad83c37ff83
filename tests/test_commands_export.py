"""``pipeplan export`` on a fresh Typer application."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from pipeplan.commands_export import register
from planner.schedules import build
from planner.schedules.ir import Schedule
from planner.schedules.torch_csv import export_torch_csv, import_torch_csv


@pytest.fixture
def app():
    app = typer.Typer()

    @app.callback()
    def main() -> None:  # a group, so that "export" is a subcommand as in the real CLI
        pass

    register(app)
    return app


def run(app, *args):
    return CliRunner().invoke(app, ["export", *args])


def test_torch_csv_to_stdout(app):
    res = run(app, "--schedule", "interleaved", "--devices", "4", "--microbatches", "8", "--chunks", "2",
              "--format", "torch-csv")
    assert res.exit_code == 0, res.output
    assert res.stdout == export_torch_csv(build("interleaved", 4, 8, chunks=2))
    assert import_torch_csv(res.stdout).actions == build("interleaved", 4, 8, chunks=2).actions


def test_json_to_file(app, tmp_path):
    out = tmp_path / "s.json"
    res = run(app, "--schedule", "chimera", "--devices", "4", "--microbatches", "8", "--pipelines", "1",
              "--concat", "forward-doubling", "--format", "json", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert res.stdout == ""
    s = Schedule.from_json(out.read_text())
    assert s.actions == build("chimera", 4, 8, pipelines=1, concat="forward-doubling").actions
    assert json.loads(out.read_text())["params"]["concat"] == "forward-doubling"


def test_text(app):
    res = run(app, "--schedule", "hanayo", "--devices", "2", "--microbatches", "2", "--waves", "1",
              "--format", "text")
    assert res.exit_code == 0, res.output
    assert res.stdout == build("hanayo", 2, 2, waves=1).to_text() + "\n"


@pytest.mark.parametrize("name", ["chimera", "gems", "pipedream", "pipedream-2bw"])
def test_torch_cannot_express(app, name):
    res = run(app, "--schedule", name, "--devices", "4", "--microbatches", "4", "--format", "torch-csv")
    assert res.exit_code == 2
    assert "cannot express" in res.stderr and res.stdout == ""


@pytest.mark.parametrize("args,msg", [
    (["--schedule", "nope", "--devices", "4", "--microbatches", "4"], "unknown schedule"),
    (["--schedule", "1f1b", "--devices", "4", "--microbatches", "4", "--chunks", "2"], "--chunks does not apply"),
    (["--schedule", "interleaved", "--devices", "4", "--microbatches", "6", "--chunks", "2"],
     "multiple of devices"),
])
def test_errors_exit_2(app, args, msg):
    res = run(app, *args)
    assert res.exit_code == 2
    assert msg in res.stderr
