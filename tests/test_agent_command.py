"""The command the agent runs for a claimed job: an emulated job gets the plan's profile and cluster.

A new user's emulated job of an H100 plan (make serve's local agent, the UI ticking "emulate") measured 2-5x its
prediction: the agent passed no cluster, so the run took this machine for the plan's cluster and sent full-size
activations over gloo instead of tokens that take the H100 links' predicted times."""

from __future__ import annotations

import json
from pathlib import Path

from executor.agent import Agent


def _claim(emulate: bool) -> dict:
    job = {"id": 3, "candidate_index": 1, "model": "gpt-tiny", "iterations": 2, "emulate": emulate, "attempts": 1}
    return {"job": job, "plan": {"candidates": []}, "profile": {"name": "p"} if emulate else None,
            "cluster": {"name": "dgx-h100-80gb", "device": "H100-SXM5-80GB"} if emulate else None}


def test_an_emulated_job_runs_with_the_plans_cluster(tmp_path: Path) -> None:
    a = Agent("http://127.0.0.1:9", "t", name="n", workdir=tmp_path, run_command=["run"])
    try:
        cmd = a.command(_claim(True), tmp_path)
        assert cmd[cmd.index("--emulate") + 1] == str(tmp_path / "profile.json")
        path = Path(cmd[cmd.index("--cluster") + 1])
        assert path == tmp_path / "cluster.json" and json.loads(path.read_text())["device"] == "H100-SXM5-80GB"
        bare = _claim(True)
        bare["job"]["model"] = ""  # an emulated job that named no model: the run's default, nothing built
        assert "--model" not in a.command(bare, tmp_path)
        (tmp_path / "r").mkdir()
        real = a.command(_claim(False), tmp_path / "r")
        assert "--emulate" not in real and "--cluster" not in real  # a real run is on this machine's own links
    finally:
        a.client.close()
