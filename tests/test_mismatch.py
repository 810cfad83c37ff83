"""A profile timed on another device than the cluster's is flagged: planner, CLI and API (issue 13)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from api_support import AUTH, tiny_cluster, tiny_profile
from typer.testing import CliRunner

from pipeplan.cli import app
from planner.analytic import transformer_profile
from planner.cluster import load_cluster
from planner.mismatch import device_warnings
from planner.profile import save_profile
from planner.request import TrainingRequest
from planner.search import plan

EX = Path(__file__).resolve().parent.parent / "examples" / "clusters"


def _profile(device: str):  # type: ignore[no-untyped-def]
    return transformer_profile("gpt-tiny", 4, 256, 4, 128, 1024, 312e12, device)


def test_warning_only_when_devices_differ() -> None:
    cpu = load_cluster(EX / "local-cpu-4.json")
    a100 = load_cluster(EX / "dgx-a100-80gb.json")
    assert device_warnings(_profile("cpu"), cpu) == []
    assert device_warnings(_profile("A100-SXM4-80GB"), a100) == []
    assert device_warnings(_profile("a100 sxm4 80gb"), a100) == []  # spelling, not device
    (w,) = device_warnings(_profile("A100-SXM4-80GB"), cpu)
    assert "A100-SXM4-80GB" in w and "'cpu'" in w and "local-cpu-4" in w
    res = plan(_profile("A100-SXM4-80GB"), cpu, TrainingRequest(global_batch=8, top=3))
    assert res.warnings == [w] and res.to_dict()["warnings"] == [w]
    assert plan(_profile("cpu"), cpu, TrainingRequest(global_batch=8, top=3)).to_dict()["warnings"] == []


@pytest.mark.parametrize(("measured_on", "cluster", "warned"), [
    ("NVIDIA H100 80GB HBM3", "dgx-h100-80gb", False), ("NVIDIA A100-SXM4-80GB", "dgx-a100-80gb", False),
    ("NVIDIA H200", "dgx-h200-141gb", False), ("Tesla V100-SXM2-32GB", "dgx1-v100-32gb", False),
    ("NVIDIA H200", "dgx-h100-80gb", True), ("NVIDIA A100-SXM4-40GB", "dgx-a100-80gb", True),
    ("NVIDIA H100 80GB HBM3", "local-cpu-4", True)])
def test_a_gpus_own_name_is_its_clusters_device(measured_on: str, cluster: str, warned: bool) -> None:
    """A profile measured on a GPU carries torch's name for it (profiler.run.device_name); the example cluster
    of that GPU names the shipped description: no warning (before, every measured GPU profile was warned
    about on its own cluster). Another GPU -- an H200 for H100s, the 40 GB A100 for the 80 GB one -- still is."""
    got = device_warnings(_profile(measured_on), load_cluster(EX / f"{cluster}.json"))
    assert bool(got) is warned, got


def test_cli_plan_and_predict_print_it(tmp_path: Path) -> None:
    prof = tmp_path / "p.json"
    save_profile(_profile("A100-SXM4-80GB"), prof)
    cluster = str(EX / "local-cpu-4.json")
    r = CliRunner().invoke(app, ["plan", "--profile", str(prof), "--cluster", cluster, "--global-batch", "8"])
    assert r.exit_code == 0, r.output
    assert "warning: profile 'gpt-tiny' was timed on 'A100-SXM4-80GB'" in " ".join(r.output.split())
    r = CliRunner().invoke(app, ["plan", "--profile", str(prof), "--cluster", cluster, "--global-batch", "8",
                                 "--json"])
    assert json.loads(r.stdout)["warnings"]
    r = CliRunner().invoke(app, ["predict", "--profile", str(prof), "--cluster", cluster, "--global-batch", "8",
                                 "--tensor", "1", "--pipeline", "2", "--data", "2", "--micro-batch", "2",
                                 "--schedule", "1f1b"])
    assert r.exit_code == 0, r.output
    assert "warning: profile 'gpt-tiny'" in r.output


@pytest.mark.slow  # database
def test_api_plan_document_carries_it(client) -> None:  # type: ignore[no-untyped-def]
    from api_support import wait_for

    pid = client.post("/profiles", json=tiny_profile(), headers=AUTH).json()["id"]
    cpu = {**tiny_cluster(), "name": "cpu-box", "device": "cpu"}
    cid = client.post("/clusters", json=cpu, headers=AUTH).json()["id"]
    r = client.post("/plans", json={"profile_id": pid, "cluster_id": cid, "global_batch": 8, "top": 3}, headers=AUTH)
    assert r.status_code in (200, 201, 202), r.text
    doc = wait_for(lambda: (lambda j: j if j["status"] in ("done", "failed") else None)(
        client.get(f"/plans/{r.json()['id']}", headers=AUTH).json()), what="plan done")
    assert doc["status"] == "done", doc
    assert len(doc["warnings"]) == 1 and "'cpu'" in doc["warnings"][0]


def test_micro_batch_sizes_beyond_the_profile_are_named() -> None:
    """A plan whose candidates run a micro-batch size the profile has no times for says so, with the sizes to
    profile; sizes between two the profile has are interpolated and not named."""
    from planner.mismatch import size_warnings

    cpu = load_cluster(EX / "local-cpu-4.json")
    prof = _profile("cpu")
    have = sorted(prof.layers[0].fwd_time)
    narrow = prof.model_copy(update={"layers": [layer.model_copy(update={
        "fwd_time": {b: t for b, t in layer.fwd_time.items() if b <= 2},
        "bwd_time": {b: t for b, t in layer.bwd_time.items() if b <= 2},
        "recompute_time": None}) for layer in prof.layers]})
    assert size_warnings(prof, [have[0], have[-1]]) == []
    (w,) = size_warnings(narrow, [1, 2, 4, 8, 4])
    assert "micro-batch size 4, 8 are timed outside" in w and "(1, 2)" in w and "--micro-batches 1,2,4,8" in w
    res = plan(narrow, cpu, TrainingRequest(global_batch=16, top=5))
    used = sorted({c.config.micro_batch for c in res.candidates if c.fits})
    assert any(b > 2 for b in used)
    assert res.warnings == size_warnings(narrow, used) and "outside the sizes" in res.warnings[0]
    assert plan(narrow, cpu, TrainingRequest(global_batch=16, top=5, micro_batches=[1, 2])).warnings == []
