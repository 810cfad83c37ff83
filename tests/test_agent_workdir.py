"""The agent's work directory is absolute (issue 13: a relative one was looked up again inside the job
directory the run starts in, and every job from ``make serve`` failed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from executor.agent import Agent, default_run_command


def test_default_workdir_is_absolute_under_the_data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PIPEPLAN_DATA_DIR", raising=False)
    a = Agent("http://127.0.0.1:9", "t", name="local-cpu-1")
    assert a.workdir == tmp_path / "data" / "agent" / "local-cpu-1" and a.workdir.is_absolute()
    monkeypatch.setenv("PIPEPLAN_DATA_DIR", "elsewhere")
    b = Agent("http://127.0.0.1:9", "t", name="n", workdir="rel/dir")
    assert b.workdir == tmp_path / "rel" / "dir"
    assert Agent("http://127.0.0.1:9", "t", name="n").workdir == tmp_path / "elsewhere" / "agent" / "n"
    for x in (a, b):
        x.client.close()


def test_default_run_command_is_the_agents_own_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PIPEPLAN_RUN_COMMAND", raising=False)
    assert default_run_command() == [sys.executable, "-m", "pipeplan.cli", "run"]
