"""The rank order where a user plans: ``pipeplan plan --rank-order`` and its ``ranks`` column, ``pipeplan predict
--order`` and the refusals of both, the API's ``rank_order`` (strict, stored with the plan; each candidate's
``order``, ``placement`` and ``run_spec`` keep it, and what rebuilds its configuration -- the timeline, the export,
a dispatched job's claim -- reads it back), and the pages' ``ranks`` column and "Rank order" select (in Chromium:
tests/browser/test_ui_rank_order.py). The planner's side is tests/test_rank_order.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from api_support import AUTH, WAUTH, plan_done, upload_profile_and_cluster
from cli_support import refused, run

from planner.analytic import analytic_profile
from planner.model import PRESETS

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "examples" / "clusters" / "dgx-h100-80gb.json"
#: GPT-2 medium on 16 H100s (two 8-GPU nodes) at B = 32: D > 1, W > 1 and t < 8 rows are planned in both orders and
#: both are among the 10 best (tp-dp-pp's t=1 D=8 W=2 Chimera second); under a second's search
PLAN = ["--cluster", CLUSTER, "--gpus", "16", "--global-batch", "32"]
#: a configuration of predict where the orders differ: t=1 D=8 W=2, b=2, 1F1B (N = 8)
ONE = ["--cluster", CLUSTER, "--global-batch", "32", "--tensor", "1", "--pipeline", "8", "--data", "2",
       "--micro-batch", "2", "--schedule", "1f1b"]
INNER = "ranks: tensor innermost, then pipeline, then data parallel"
OUTER = "ranks: tensor innermost, then data parallel, then pipeline"


def _profile() -> Any:
    return analytic_profile(PRESETS["gpt2-medium"], "H100-SXM5-80GB", micro_batches=(1, 2, 4), tensor_sizes=(1, 2))


@pytest.fixture(scope="module")
def gpt2() -> Any:
    return _profile()


@pytest.fixture(scope="module")
def profile(gpt2: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ranks") / "gpt2m.json"
    path.write_text(gpt2.model_dump_json())
    return path


def _orders(cands: list[dict[str, Any]]) -> list[str]:
    """Each candidate's rank order as its run_spec records it (absent at the default)."""
    return [c["run_spec"]["config"].get("order", "tp-pp-dp") for c in cands]


def _table(output: str) -> list[dict[str, str]]:
    """The rows of rich's table (``┃ # ┃ t ┃ ...`` header, ``│ 0 │ 1 │ ...`` rows) as column -> cell."""
    head = next(ln for ln in output.splitlines() if ln.startswith("┃") and "#" in ln)
    names = [x.strip() for x in head.strip("┃").split("┃")]
    rows = [[x.strip() for x in ln.strip("│").split("│")] for ln in output.splitlines()
            if ln.startswith("│") and ln.split("│")[1].strip().isdigit()]
    return [dict(zip(names, row, strict=True)) for row in rows]


def _header(output: str) -> list[str]:
    head = next(ln for ln in output.splitlines() if ln.startswith("┃") and "#" in ln)
    return [x.strip() for x in head.strip("┃").split("┃")]


# ---- the command line ----------------------------------------------------------------------------------------

def test_plan_shows_ranks_where_a_row_has_the_pipeline_outermost(profile: Path) -> None:
    r = run(["plan", "--profile", profile, *PLAN, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    orders = _orders(doc["candidates"])
    assert set(orders) == {"tp-pp-dp", "tp-dp-pp"}, [c["label"] for c in doc["candidates"]]
    for c, o in zip(doc["candidates"], orders, strict=True):
        assert c["order"] == o and c["label"].endswith(" ranks=tp-dp-pp") == (o == "tp-dp-pp"), c["label"]
        assert c["placement"].startswith(OUTER if o == "tp-dp-pp" else INNER), c["placement"]
    r = run(["plan", "--profile", profile, *PLAN])
    assert r.exit_code == 0, r.output
    head = _header(r.output)
    assert head[head.index("rc") + 1] == "ranks", head  # after rc, before the times
    assert [row["ranks"] for row in _table(r.output)] == orders
    assert f"tp-dp-pp: {OUTER.removeprefix('ranks: ')}" in " ".join(r.output.split())  # what the column's words mean


def test_rank_order_option_plans_one_order(profile: Path) -> None:
    r = run(["plan", "--profile", profile, *PLAN, "--rank-order", "tp-pp-dp", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["candidates"] and _orders(doc["candidates"]) == ["tp-pp-dp"] * len(doc["candidates"])
    assert all("ranks=" not in c["label"] for c in doc["candidates"] + doc["infeasible"])
    r = run(["plan", "--profile", profile, *PLAN, "--rank-order", "tp-pp-dp"])
    assert r.exit_code == 0 and "ranks" not in _header(r.output) and "ranks (innermost" not in r.output, r.output
    r = run(["plan", "--profile", profile, *PLAN, "--rank-order", "tp-dp-pp"])
    assert r.exit_code == 0, r.output
    rows = _table(r.output)
    assert rows and {row["ranks"] for row in rows} == {"tp-dp-pp"}


def test_rank_order_on_one_node_warns(profile: Path) -> None:
    one_node = [x if x != "16" else "8" for x in PLAN]  # 8 GPUs: one node of 8
    r = run(["plan", "--profile", profile, *one_node, "--rank-order", "tp-dp-pp", "--top", "2"])
    assert r.exit_code == 0, r.output
    warning = "warning: --rank-order tp-dp-pp: 8 GPUs fit in one node of 8: both orders place every group alike"
    assert warning in r.output, r.output
    r = run(["plan", "--profile", profile, *PLAN, "--rank-order", "tp-dp-pp", "--top", "2"])
    assert r.exit_code == 0 and "warning: --rank-order" not in r.output, r.output


def test_rank_order_refusals() -> None:
    for bad in ("pp", "TP-DP-PP", "", "tp-pp-dp,tp-dp-pp"):
        # refused before the files are read: the option's words, not the (missing) profile's
        refused(["plan", "--profile", "missing.json", *PLAN, "--rank-order", bad],
                "--rank-order: unknown rank order", "known: tp-pp-dp, tp-dp-pp")
        refused(["predict", "--profile", "missing.json", *ONE, "--order", bad],
                "--order: unknown rank order", "known: tp-pp-dp, tp-dp-pp")


def test_predict_order(profile: Path) -> None:
    r = run(["predict", "--profile", profile, *ONE, "--order", "tp-dp-pp"])
    assert r.exit_code == 0, r.output
    assert "t=1 D=8 W=2 b=2 1f1b ranks=tp-dp-pp" in r.output and OUTER in r.output
    assert _table(r.output)[0]["ranks"] == "tp-dp-pp"
    doc = json.loads(run(["predict", "--profile", profile, *ONE, "--order", "tp-dp-pp", "--json"]).stdout)
    assert doc["order"] == "tp-dp-pp" and doc["run_spec"]["config"]["order"] == "tp-dp-pp"
    assert doc["placement"].startswith(OUTER)
    # the default: another prediction (the pipeline's sends in a node, the gradients' all-reduce across two)
    r = run(["predict", "--profile", profile, *ONE])
    assert r.exit_code == 0 and "ranks" not in _header(r.output) and INNER in r.output, r.output
    one = json.loads(run(["predict", "--profile", profile, *ONE, "--json"]).stdout)
    assert one["order"] == "tp-pp-dp" and "order" not in one["run_spec"]["config"]
    assert one["iteration_time"] != doc["iteration_time"]
    # a row of plan is the same prediction
    planned = json.loads(run(["plan", "--profile", profile, *PLAN, "--schedules", "1f1b", "--top", "50",
                              "--json"]).stdout)
    rows = {c["label"]: c["iteration_time"] for c in planned["candidates"]}
    assert rows["t=1 D=8 W=2 b=2 1f1b ranks=tp-dp-pp"] == pytest.approx(doc["iteration_time"])
    assert rows["t=1 D=8 W=2 b=2 1f1b"] == pytest.approx(one["iteration_time"])


def test_the_commands_print_all_before_they_exit(profile: Path) -> None:
    """plan and predict end by os._exit (pipeplan/cli.py SHORT_LIVED): into a pipe, the whole table and the
    refusal's line come out."""
    env = {**os.environ, "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "pipeplan.cli", "predict", "--profile", str(profile), *map(str, ONE)]
    r = subprocess.run([*cmd, "--order", "tp-dp-pp"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "ranks=tp-dp-pp" in r.stdout and OUTER in r.stdout and "memory reserve:" in r.stdout
    r = subprocess.run([*cmd, "--order", "dp"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1] == (
        "error: --order: unknown rank order 'dp'; known: tp-pp-dp, tp-dp-pp (innermost first)"), r.stderr


# ---- the API ---------------------------------------------------------------------------------------------------





def test_api_rank_order_is_checked(client, gpt2: Any) -> None:  # type: ignore[no-untyped-def]
    pid, cid = upload_profile_and_cluster(client, gpt2, CLUSTER)
    base = {"profile_id": pid, "cluster_id": cid, "global_batch": 32, "gpus": 16}
    for value in ("pp", "TP-DP-PP", "", 1, True, ["tp-dp-pp"], {"order": "tp-dp-pp"}):
        r = client.post("/plans", json={**base, "rank_order": value}, headers=AUTH)
        assert r.status_code == 422, (value, r.text)
        detail = r.json()["detail"]
        assert detail.startswith("rank_order: ") and "'tp-pp-dp'" in detail and "'tp-dp-pp'" in detail, detail
    assert client.get("/plans", headers=AUTH).json() == []  # nothing made
    described = client.get("/openapi.json").json()["components"]["schemas"]["PlanCreate"]["properties"]
    assert "tp-dp-pp" in described["rank_order"]["description"]


def test_api_plans_keep_each_candidates_order(client, gpt2: Any) -> None:  # type: ignore[no-untyped-def]
    pid, cid = upload_profile_and_cluster(client, gpt2, CLUSTER)
    # schedules Megatron-LM runs (the export below): its best rows are interleaved, in both orders
    base = {"profile_id": pid, "cluster_id": cid, "global_batch": 32, "gpus": 16, "top": 10,
            "schedules": ["1f1b", "interleaved"]}
    plan = plan_done(client, **base)
    assert plan["request"]["rank_order"] is None
    stored = client.get(f"/plans/{plan['id']}", headers=AUTH).json()
    orders = _orders(stored["candidates"])
    assert set(orders) == {"tp-pp-dp", "tp-dp-pp"}, [c["label"] for c in stored["candidates"]]
    assert [c["order"] for c in stored["candidates"]] == orders
    assert all(c["placement"].startswith(OUTER if o == "tp-dp-pp" else INNER)
               for c, o in zip(stored["candidates"], orders, strict=True))
    outer = orders.index("tp-dp-pp")
    cand = stored["candidates"][outer]
    assert cand["label"].endswith(" ranks=tp-dp-pp")
    # its timeline re-simulates the same configuration (in its order, not in the default one)
    t = client.get(f"/plans/{plan['id']}/candidates/{outer}/timeline", headers=AUTH)
    assert t.status_code == 200, t.text
    assert t.json()["label"] == cand["label"] and t.json()["matches_stored"] is True, t.json()["label"]
    # its Megatron-LM export keeps Megatron's default order (the pipeline outermost); a tp-pp-dp row asks for its
    # mapping where the orders differ
    inner = next(i for i, c in enumerate(stored["candidates"])
                 if orders[i] == "tp-pp-dp" and c["pipeline"] > 1 and c["data"] > 1)
    for rank, mapped in ((outer, False), (inner, True)):
        e = client.get(f"/plans/{plan['id']}/candidates/{rank}/export?format=megatron", headers=AUTH)
        assert e.status_code == 200, e.text
        assert ("--use-tp-pp-dp-mapping" in json.dumps(e.json())) == mapped, (rank, stored["candidates"][rank]["label"])
    # a dispatched job's claim carries the order to the agent (the executor lays out its ranks by it)
    job = client.post("/jobs", json={"plan_id": plan["id"], "candidate_index": outer, "emulate": True}, headers=AUTH)
    assert job.status_code == 201, job.text
    w = client.post("/workers", json={"name": "ranks-worker", "node": "n1", "device_type": "cpu"}, headers=WAUTH)
    assert w.status_code in (200, 201), w.text
    claim = client.post(f"/workers/{w.json()['id']}/claim",
                        headers={"Authorization": f"Bearer {w.json()['token']}"})
    assert claim.status_code == 200, claim.text
    got = claim.json()
    assert got["job"]["id"] == job.json()["id"] and got["candidate"]["run_spec"]["config"]["order"] == "tp-dp-pp"
    assert got["candidate"]["label"] == cand["label"]

    # one order asked for: every row has it, and the request keeps it (another plan than the default's)
    for order in ("tp-pp-dp", "tp-dp-pp"):
        one = plan_done(client, **base, rank_order=order)
        assert one["id"] != plan["id"] and one["request"]["rank_order"] == order
        got_orders = _orders(client.get(f"/plans/{one['id']}", headers=AUTH).json()["candidates"])
        assert got_orders == [order] * len(one["candidates"]) and got_orders


# ---- the pages (their HTML; tests/browser/test_ui_rank_order.py drives them in Chromium) -------------------------

def test_pages_have_the_ranks_column_and_the_rank_order_select(client) -> None:  # type: ignore[no-untyped-def]
    page = client.get("/ui/plans/1").text
    th = re.search(r'<th data-key="order"[^>]*>ranks</th>', page)
    assert th and " hidden" in th.group(0) and "tp-dp-pp" in th.group(0)
    # after t, before the schedule; hidden until the plan has a tp-dp-pp row (plan.js)
    assert page.index('data-key="tensor"') < th.start() < page.index('data-key="schedule"')
    form = client.get("/").text
    select = re.search(r'<select id="rank-order">(.*?)</select>', form, flags=re.S)
    assert select, "no Rank order select"
    assert re.findall(r'<option value="([^"]*)"', select.group(1)) == ["", "tp-pp-dp", "tp-dp-pp"]
    assert "tp-dp-pp: pipeline outermost (Megatron-LM's default, torchtitan)" in form
    assert form.index('id="max-expert"') < select.start() < form.index('id="micro-batches"')
