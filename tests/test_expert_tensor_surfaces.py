"""Whole experts (expert tensor parallelism 1) where a user plans: ``pipeplan plan``'s ``etp`` column (only where
some row holds its experts whole) and the line saying what it is, ``pipeplan predict --expert-tensor 1`` and its
refusals; the API, which asks nothing new (the search tries them at t > 1 for a profile made with sequence
parallelism): POST /plans' candidates with ``"expert_tensor": 1`` among them, their run_spec keeping it, their
timeline, their Megatron export (``--expert-tensor-parallel-size 1``) and a job for one refused with a 4xx naming
expert_tensor; and the plan page's ``etp`` column (in Chromium: tests/browser/test_ui_expert_tensor.py). The
planner's side is tests/test_expert_tensor.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from api_support import AUTH, WAUTH, post_plan, upload_profile_and_cluster
from cli_support import refused, run
from moe_support import EXAMPLES, FLASH, H100, QWEN3_MOE

from planner.analytic import analytic_profile
from planner.model import ModelSpec
from planner.operators import OperatorOptions

CLUSTER = EXAMPLES / "clusters" / "dgx-h100-80gb.json"
#: Qwen3-30B-A3B's block shape with 4 layers: 128 small experts, 8 per token (tests/test_expert_tensor.py's QWEN)
QWEN = QWEN3_MOE.with_(name="qwen3-moe-4l", layers=4)
SP = OperatorOptions(attention="flash", causal=True, dropout=False, sequence_parallel=True)
NO_SP = FLASH
#: one node of 8 H100s at B = 16: the 10 best rows mix whole experts (t=2 W=4 e=8 etp=1, t=4 W=2 e=8 etp=1) and
#: split ones (t=1 W=8 e=8, a t=1 D=2 Chimera), about a second's search
PLAN = ["--cluster", CLUSTER, "--gpus", "8", "--global-batch", "16"]
#: a configuration of predict: the 8-GPU recipe's layout, t=4 D=1 W=2 e=8, b=2, 1F1B (N = 4)
ONE = ["--cluster", CLUSTER, "--global-batch", "16", "--tensor", "4", "--pipeline", "1", "--data", "2",
       "--expert", "8", "--micro-batch", "2", "--schedule", "1f1b"]
LEGEND = "etp 1: each rank holds its experts whole, e over a stage's t W ranks"


def profile(spec: ModelSpec = QWEN, options: OperatorOptions = SP) -> Any:
    """An analytical profile of ``spec`` on the H100 at t = 1, 2, 4 (b = 1, 2)."""
    return analytic_profile(spec, H100, micro_batches=(1, 2), tensor_sizes=(1, 2, 4), options=options)


@pytest.fixture(scope="module")
def qwen() -> Any:
    return profile()


@pytest.fixture(scope="module")
def files(qwen: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The profile made with sequence parallelism, the same without it, and its dense twin (with it), as files."""
    here = tmp_path_factory.mktemp("etp")
    out = {"sp": here / "sp.json", "nosp": here / "nosp.json", "dense": here / "dense.json"}
    out["sp"].write_text(qwen.model_dump_json())
    out["nosp"].write_text(profile(options=NO_SP).model_dump_json())
    out["dense"].write_text(profile(QWEN.with_(name="dense-4l", experts=None, experts_per_token=None,
                                               expert_ffn_hidden=None)).model_dump_json())
    return out


def _whole(cands: list[dict[str, Any]]) -> list[int | None]:
    """Each candidate's expert_tensor as its run_spec records it (absent: None, the experts split over t)."""
    return [c["run_spec"]["config"].get("expert_tensor") for c in cands]


def _header(output: str) -> list[str]:
    """The column names of rich's table (``┃ # ┃ t ┃ ...``)."""
    head = next(ln for ln in output.splitlines() if ln.startswith("┃") and "#" in ln)
    return [x.strip() for x in head.strip("┃").split("┃")]


def _table(output: str) -> list[dict[str, str]]:
    """The rows of rich's table (the first line of each: ``│ 0 │ 2 │ ...``) as column -> cell."""
    names = _header(output)
    rows = [[x.strip() for x in ln.strip("│").split("│")] for ln in output.splitlines()
            if ln.startswith("│") and ln.split("│")[1].strip().isdigit()]
    return [dict(zip(names, row, strict=True)) for row in rows]


# ---- the command line ----------------------------------------------------------------------------------------

def test_plan_shows_etp_where_a_row_holds_its_experts_whole(files: dict[str, Path]) -> None:
    r = run(["plan", "--profile", files["sp"], *PLAN, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    whole = _whole(doc["candidates"])
    assert set(whole) == {1, None}, [c["label"] for c in doc["candidates"]]  # both kinds among the 10 best
    for c, w in zip(doc["candidates"], whole, strict=True):
        assert c.get("expert_tensor") == w and (" etp=1 " in c["label"]) == (w == 1), c["label"]
        if w:
            assert c["tensor"] > 1 and "expert_tensor" in c["executor_refusal"], c
    r = run(["plan", "--profile", files["sp"], *PLAN])
    assert r.exit_code == 0, r.output
    head = _header(r.output)
    assert head[head.index("e") + 1] == "etp", head  # right after e
    assert [row["etp"] for row in _table(r.output)] == ["1" if w else "" for w in whole]
    assert LEGEND in " ".join(r.output.split())  # what the column's 1 means


def test_plans_without_whole_experts_have_no_etp_column(files: dict[str, Path]) -> None:
    """Without sequence parallelism the search tries none; at t = 1 there are none (the experts are whole already)."""
    for profile_file, extra in ((files["nosp"], []), (files["sp"], ["--max-tensor", "1"])):
        r = run(["plan", "--profile", profile_file, *PLAN, *extra, "--json"])
        assert r.exit_code == 0, r.output
        doc = json.loads(r.stdout)
        assert doc["candidates"] and not any(_whole(doc["candidates"] + doc["infeasible"])), extra
        assert all("etp" not in c["label"] for c in doc["candidates"])
        r = run(["plan", "--profile", profile_file, *PLAN, *extra])
        assert r.exit_code == 0 and "etp" not in _header(r.output) and LEGEND not in r.output, r.output


def test_predict_expert_tensor(files: dict[str, Path]) -> None:
    r = run(["predict", "--profile", files["sp"], *ONE, "--expert-tensor", "1"])
    assert r.exit_code == 0, r.output
    assert "t=4 D=1 W=2 e=8 etp=1 b=2 1f1b" in r.output and LEGEND in " ".join(r.output.split())
    row = _table(r.output)[0]
    assert row["e"] == "8" and row["etp"] == "1", row
    doc = json.loads(run(["predict", "--profile", files["sp"], *ONE, "--expert-tensor", "1", "--json"]).stdout)
    assert doc["fits"] and doc["expert_tensor"] == 1 and doc["run_spec"]["config"]["expert_tensor"] == 1, doc
    assert "expert_tensor" in doc["executor_refusal"]
    # the default splits the experts over t: at t = 4 W = 2 that is e dividing W, another prediction
    split = json.loads(run(["predict", "--profile", files["sp"], *[x if x != "8" else "2" for x in ONE],
                            "--json"]).stdout)
    assert "expert_tensor" not in split and "expert_tensor" not in split["run_spec"]["config"]
    assert split["iteration_time"] != doc["iteration_time"]
    r = run(["predict", "--profile", files["sp"], *[x if x != "8" else "2" for x in ONE]])
    assert r.exit_code == 0 and "etp" not in _header(r.output) and LEGEND not in r.output, r.output
    # a row of plan is the same prediction
    planned = json.loads(run(["plan", "--profile", files["sp"], *PLAN, "--schedules", "1f1b", "--top", "60",
                              "--json"]).stdout)
    rows = {c["label"]: c["iteration_time"] for c in planned["candidates"]}
    assert rows["t=4 D=1 W=2 e=8 etp=1 b=2 1f1b"] == pytest.approx(doc["iteration_time"])


def test_predict_expert_tensor_refusals(files: dict[str, Path]) -> None:
    for bad in ("2", "0", "-1", "4"):  # the configuration's rule, naming the option
        refused(["predict", "--profile", files["sp"], *ONE, "--expert-tensor", bad],
                "--expert-tensor: 1 (the experts whole on each rank) or absent (split over t as the dense MLP), "
                f"got {bad}")
    t1 = [*ONE[:ONE.index("--tensor")], "--tensor", "1", "--pipeline", "1", "--data", "8", "--expert", "8",
          "--micro-batch", "2", "--schedule", "1f1b"]
    refused(["predict", "--profile", files["sp"], *t1, "--expert-tensor", "1"],
            "--expert-tensor: 1 only with t > 1")
    refused(["predict", "--profile", files["nosp"], *ONE, "--expert-tensor", "1"],
            "--expert-tensor: experts whole on each rank need sequence parallelism", "made without it")
    dense = [x for x in ONE if x not in ("--expert", "8")]
    refused(["predict", "--profile", files["dense"], *dense, "--expert-tensor", "1"],
            "--expert-tensor: whole experts need a mixture of experts; profile 'dense-4l' has none")
    # e over t W = 8: 16 does not divide it
    refused(["predict", "--profile", files["sp"], *[x if x != "8" else "16" for x in ONE], "--expert-tensor", "1"],
            "--expert: the expert-parallel size 16 must divide t W = 8")


def test_predict_refusal_comes_out_before_the_exit(files: dict[str, Path]) -> None:
    """predict ends by os._exit (pipeplan/cli.py SHORT_LIVED): into a pipe, the refusal's line comes out whole."""
    env = {**os.environ, "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "pipeplan.cli", "predict", "--profile", str(files["sp"]), *map(str, ONE)]
    r = subprocess.run([*cmd, "--expert-tensor", "2"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
        "error: --expert-tensor: 1 (the experts whole on each rank) or absent (split over t as the dense MLP), "
        "got 2"), r.stderr


# ---- the API ---------------------------------------------------------------------------------------------------



def test_api_plans_keep_whole_experts(client, qwen: Any) -> None:  # type: ignore[no-untyped-def]
    pid, cid = upload_profile_and_cluster(client, qwen, CLUSTER)
    plan = post_plan(client, {"profile_id": pid, "cluster_id": cid, "global_batch": 16, "gpus": 8, "top": 10})
    assert plan["status"] == "done", plan
    stored = client.get(f"/plans/{plan['id']}", headers=AUTH).json()
    cands = stored["candidates"]
    whole = _whole(cands)
    assert set(whole) == {1, None}, [c["label"] for c in cands]
    assert [c.get("expert_tensor") for c in cands] == whole  # the flat key beside run_spec, only where set
    rank = whole.index(1)
    cand = cands[rank]
    assert " etp=1 " in cand["label"] and cand["tensor"] > 1 and "expert_tensor" in cand["executor_refusal"]
    # its timeline re-simulates the same configuration (whole experts, not split over t)
    t = client.get(f"/plans/{plan['id']}/candidates/{rank}/timeline", headers=AUTH)
    assert t.status_code == 200, t.text
    assert t.json()["label"] == cand["label"] and t.json()["matches_stored"] is True, t.json()["label"]
    # Megatron-LM writes it; torchtitan and DeepSpeed refuse it (a 4xx saying so, not a 5xx)
    e = client.get(f"/plans/{plan['id']}/candidates/{rank}/export?format=megatron", headers=AUTH)
    assert e.status_code == 200, e.text
    script = json.dumps(e.json())
    assert "--expert-tensor-parallel-size 1" in script and f"--expert-model-parallel-size {cand['expert']}" in script
    split = whole.index(None)
    e = client.get(f"/plans/{plan['id']}/candidates/{split}/export?format=megatron", headers=AUTH)
    assert e.status_code == 200 and "--expert-tensor-parallel-size 1" not in json.dumps(e.json()), e.text
    for fmt in ("torchtitan", "deepspeed"):
        e = client.get(f"/plans/{plan['id']}/candidates/{rank}/export?format={fmt}", headers=AUTH)
        assert 400 <= e.status_code < 500 and "megatron" in e.text.lower(), (fmt, e.status_code, e.text)
    # a job of it is refused before it is queued, naming expert_tensor (pipeplan's executor splits experts over t)
    for how in ({"emulate": True}, {"emulate": False, "model": "gpt-tiny"}):  # (gpt-tiny: the profile's 6 layers)
        job = client.post("/jobs", json={"plan_id": plan["id"], "candidate_index": rank, **how}, headers=AUTH)
        assert 400 <= job.status_code < 500, (how, job.status_code, job.text)
        detail = job.json()["detail"]
        assert detail.startswith("candidate_index: ") and "expert_tensor" in detail, detail
    assert client.get("/jobs", headers=AUTH).json() == []  # nothing queued
    # a row that splits its experts is dispatched, and its claim carries no expert_tensor
    ok = client.post("/jobs", json={"plan_id": plan["id"], "candidate_index": split, "emulate": True}, headers=AUTH)
    assert ok.status_code == 201, ok.text
    w = client.post("/workers", json={"name": "etp-worker", "node": "n1", "device_type": "cpu"}, headers=WAUTH)
    assert w.status_code in (200, 201), w.text
    claim = client.post(f"/workers/{w.json()['id']}/claim", headers={"Authorization": f"Bearer {w.json()['token']}"})
    assert claim.status_code == 200 and claim.json()["job"]["id"] == ok.json()["id"], claim.text
    assert "expert_tensor" not in claim.json()["candidate"]["run_spec"]["config"]


def test_api_without_sequence_parallelism_plans_no_whole_experts(client) -> None:  # type: ignore[no-untyped-def]
    pid, cid = upload_profile_and_cluster(client, profile(options=NO_SP), CLUSTER)
    plan = post_plan(client, {"profile_id": pid, "cluster_id": cid, "global_batch": 16, "gpus": 8, "top": 10})
    assert plan["status"] == "done" and plan["candidates"], plan
    assert not any(_whole(plan["candidates"])) and all("expert_tensor" not in c for c in plan["candidates"])


# ---- the pages (their HTML; tests/browser/test_ui_expert_tensor.py drives them in Chromium) -------------------

def test_pages_have_the_etp_column(client) -> None:  # type: ignore[no-untyped-def]
    page = client.get("/ui/plans/1").text
    th = re.search(r'<th data-key="expert_tensor"[^>]*>etp</th>', page)
    assert th and " hidden" in th.group(0) and "--expert-tensor-parallel-size 1" in th.group(0)
    # right after e, before D; hidden until the plan has a row with its experts whole (plan.js)
    assert page.index('data-key="expert"') < th.start() < page.index('data-key="pipeline"')
    form = client.get("/").text
    sp = re.search(r'<label class="check" title="([^"]*)"><input type="checkbox" id="hf-sp">', form)
    assert sp and "expert tensor parallelism 1" in sp.group(1)
