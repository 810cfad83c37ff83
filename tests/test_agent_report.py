"""What the agent posts for a run that failed: the exit code and what ``pipeplan run`` said (its ``error:``
line), not the exit code alone ("the run exited with code 2" left the reason in the log tail only)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from executor.agent import Agent


@pytest.mark.parametrize(("log", "error"), [
    ("launching 4 processes\nerror: pipedream: recomputation with weight stashing is not supported\n",
     "the run exited with code 2: pipedream: recomputation with weight stashing is not supported"),
    ("error: first\nerror: rank 2 failed: RuntimeError: boom\n", "the run exited with code 1: rank 2 failed: "
                                                                  "RuntimeError: boom"),
    ("Traceback (most recent call last):\nSegmentation fault\n", "the run exited with code 139"),
])
def test_a_failed_run_posts_what_it_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log: str,
                                         error: str) -> None:
    agent = Agent("http://127.0.0.1:9", "t", name="n", workdir=str(tmp_path))
    sent: list[tuple[str, Any]] = []
    monkeypatch.setattr(agent, "_request", lambda method, url, **kw: sent.append((url, kw["json"])) or
                        SimpleNamespace(status_code=200))
    logfile = tmp_path / "run.log"
    logfile.write_text(log)
    code = int(error.split("code ")[1].split(":")[0])
    assert agent._report(7, code, tmp_path / "result.json", logfile) == "failed"
    ((url, body),) = sent
    assert url == "/jobs/7/fail" and body["error"] == error and body["log_tail"] == log
