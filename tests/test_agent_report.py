"""What the agent posts for a run that failed: the exit code and what ``pipeplan run`` said (its ``error:``
line), not the exit code alone ("the run exited with code 2" left the reason in the log tail only); and that a
finished run's result outlasts an API outage."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
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


def test_a_finished_runs_result_is_posted_after_an_outage_longer_than_retry_for(tmp_path: Path) -> None:
    """The API down (503, then refused connections) for longer than the agent's ``retry_for``: other requests
    give up, but a finished run's result is posted once the API is back (it was thrown away: the agent raised,
    exited, and the job ran again from the start)."""
    calls: list[str] = []

    def api(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if len(calls) <= 2:
            return httpx.Response(503, text="restarting")
        if len(calls) <= 4:
            raise httpx.ConnectError("refused", request=request)
        return httpx.Response(201, json={"id": 1})

    agent = Agent("http://api", "t", name="n", workdir=str(tmp_path), retry_for=0.05)
    agent.client = httpx.Client(base_url="http://api", transport=httpx.MockTransport(api))
    agent.worker_id = 3
    out = tmp_path / "result.json"
    out.write_text(json.dumps({"measured": {"iteration_time": 0.5, "devices": []}}))
    try:
        assert agent._report(7, 0, out, tmp_path / "run.log") == "succeeded"
        assert calls == ["/jobs/7/result"] * 5
        calls.clear()
        with pytest.raises(RuntimeError, match="restarting"):  # any other request still gives up
            agent._request("POST", "/jobs/7/lease", json={"worker_id": 3})
        agent.stop.set()  # a stopped agent does not wait for it either
        calls.clear()
        with pytest.raises(RuntimeError):
            agent._request("POST", "/jobs/7/result", json={}, patient=True)
        assert len(calls) == 1
    finally:
        agent.client.close()
