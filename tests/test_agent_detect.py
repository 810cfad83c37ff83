"""``pipeplan agent`` on a GPU node declares the node's GPUs by default (``--device-type auto``): a newcomer who
starts it without ``--device-type`` no longer gets a CPU agent that is never offered the node's real jobs.

``nvidia-smi`` is faked by a script first on ``PATH`` (this machine has no GPU)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from api.cli import agent_device
from api.gang import canonical_device
from executor.agent import detect_gpus


def fake_smi(tmp_path: Path, lines: list[str], code: int = 0) -> dict[str, str]:
    """An environment whose ``nvidia-smi`` prints ``lines`` and exits ``code``."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    script = bindir / "nvidia-smi"
    body = "".join(f"echo '{line}'\n" for line in lines)
    script.write_text(f"#!/bin/sh\n{body}exit {code}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
    return {**env, "PATH": f"{bindir}{os.pathsep}{env.get('PATH', '')}"}


def test_the_gpus_nvidia_smi_lists_are_declared(tmp_path: Path) -> None:
    env = fake_smi(tmp_path, ["NVIDIA H200"] * 8)
    got = detect_gpus(env)
    assert (got.device_type, got.gpus) == ("NVIDIA H200", 8) and "8 x NVIDIA H200" in got.note
    assert canonical_device(got.device_type) == "H200-SXM-141GB"  # what the API stores and matches jobs by
    assert detect_gpus({**env, "CUDA_VISIBLE_DEVICES": "0,1"}).gpus == 2
    hidden = detect_gpus({**env, "CUDA_VISIBLE_DEVICES": ""})
    assert (hidden.device_type, hidden.gpus) == ("cpu", 0)
    mixed = detect_gpus(fake_smi(tmp_path, ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"]))
    assert mixed.device_type == "NVIDIA H100 80GB HBM3" and "mixes" in mixed.note


@pytest.mark.parametrize(("lines", "code"), [([], 0), (["NVIDIA-SMI has failed"], 9)])
def test_no_gpu_listed_is_a_cpu_agent(tmp_path: Path, lines: list[str], code: int) -> None:
    got = detect_gpus(fake_smi(tmp_path, lines, code))
    assert (got.device_type, got.gpus) == ("cpu", 0) and "no GPU" in got.note


def test_without_nvidia_smi_it_is_a_cpu_agent(tmp_path: Path) -> None:
    got = detect_gpus({"PATH": str(tmp_path)})
    assert (got.device_type, got.gpus) == ("cpu", 0) and "no GPU" in got.note


def test_what_the_agent_declares(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``auto`` takes the GPUs found and their count unless ``--gpus`` says otherwise; a device type given is
    kept; with the Slurm launcher (a login node) ``auto`` is ``cpu``, as the default was."""
    monkeypatch.setenv("PATH", fake_smi(tmp_path, ["NVIDIA H200"] * 4)["PATH"])
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert agent_device("auto", None, "local") == ("NVIDIA H200", 4)
    assert agent_device("auto", 2, "local") == ("NVIDIA H200", 2)
    assert agent_device("cpu", None, "local") == ("cpu", 0)
    assert agent_device("A100-SXM4-80GB", 8, "local") == ("A100-SXM4-80GB", 8)
    assert agent_device("auto", None, "slurm") == ("cpu", 0)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert agent_device("auto", None, "local") == ("cpu", 0)


def test_the_agent_goes_by_the_name_the_api_stored(tmp_path: Path) -> None:
    """Registered as ``NVIDIA H200``, the agent logs and heartbeats the name the API stored and matches jobs by
    (``H200-SXM-141GB``), not its own spelling."""
    import json

    import httpx

    from executor.agent import Agent

    seen: list[dict] = []

    def api(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        return httpx.Response(201, json={"id": 7, "token": "pw_x", **body,
                                         "device_type": canonical_device(body["device_type"])})

    a = Agent("http://api", "t", name="n", workdir=tmp_path, gpus=8, device_type="NVIDIA H200")
    a.client = httpx.Client(base_url="http://api", transport=httpx.MockTransport(api))
    try:
        assert a.register() == 7
        assert seen[0]["device_type"] == "NVIDIA H200"
        assert a.device_type == "H200-SXM-141GB" and "device H200-SXM-141GB" in a.declaration()
    finally:
        a.client.close()
