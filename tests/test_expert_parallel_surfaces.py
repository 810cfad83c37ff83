"""Expert parallelism where a user plans: ``pipeplan plan --max-expert`` and its ``e`` column, ``pipeplan predict
--expert`` and its refusals, the API's ``max_expert`` (strict, bounded, stored with the plan; each candidate's
``run_spec`` keeps its ``expert``; a candidate's timeline re-simulates at its e), and the pages' ``e`` column and
"Max expert parallel" field (in Chromium: tests/browser/test_ui_expert.py). The planner's side is
tests/test_expert_parallel_planner.py."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from api_support import AUTH, plan_done, upload_profile_and_cluster
from cli_support import refused, run

from planner.analytic import analytic_profile
from planner.model import ModelSpec

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "examples" / "clusters" / "dgx-h100-80gb.json"
#: Qwen3-30B-A3B's block shape, 4 layers and 64 experts: on 16 H100s at B = 32 some of its best rows split the
#: experts (e > 1), a few seconds' search
MOE = ModelSpec(name="qwen-moe-4l", layers=4, hidden=2048, heads=32, kv_heads=4, head_dim=128, ffn_hidden=6144,
                expert_ffn_hidden=768, gated_mlp=True, activation="silu", norm="rmsnorm", position="rotary",
                tied_embeddings=False, bias=False, qk_norm=True, vocab=151936, seq=4096, experts=64,
                experts_per_token=8)
PLAN = ["--cluster", CLUSTER, "--gpus", "16", "--global-batch", "32"]
#: a configuration of predict: t=1 D=2 W=8, b=2, 1F1B (N = 2)
ONE = ["--cluster", CLUSTER, "--global-batch", "32", "--tensor", "1", "--pipeline", "2", "--data", "8",
       "--micro-batch", "2", "--schedule", "1f1b"]


def _profile(spec: ModelSpec) -> Any:
    return analytic_profile(spec, "H100-SXM5-80GB", micro_batches=(1, 2), tensor_sizes=(1, 2))


@pytest.fixture(scope="module")
def moe() -> Any:
    return _profile(MOE)


@pytest.fixture(scope="module")
def files(moe: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The MoE profile and its dense twin (the same block without experts) as files."""
    here = tmp_path_factory.mktemp("ep")
    out = {"moe": here / "moe.json", "dense": here / "dense.json"}
    out["moe"].write_text(moe.model_dump_json())
    out["dense"].write_text(_profile(MOE.with_(name="dense-4l", experts=None, experts_per_token=None,
                                               expert_ffn_hidden=None)).model_dump_json())
    return out


def _experts(plan: dict[str, Any]) -> list[int]:
    """Each candidate's e, as its run_spec records it (absent at 1)."""
    return [c["run_spec"]["config"].get("expert", 1) for c in plan["candidates"]]


def _header(output: str) -> list[str]:
    """The column names of the table's header row (rich's box: ``┃ # ┃ t ┃ ...``)."""
    row = next(ln for ln in output.splitlines() if ln.startswith("┃") and "#" in ln)
    return [x.strip() for x in row.strip("┃").split("┃")]


# ---- the command line ----------------------------------------------------------------------------------------

def test_plan_shows_e_where_a_row_splits_its_experts(files: dict[str, Path]) -> None:
    r = run(["plan", "--profile", files["moe"], *PLAN, "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    experts = _experts(doc)
    assert any(e > 1 for e in experts), [c["label"] for c in doc["candidates"]]
    for c, e in zip(doc["candidates"], experts, strict=True):
        assert (f" e={e} " in c["label"]) == (e > 1), c["label"]
    r = run(["plan", "--profile", files["moe"], *PLAN])
    assert r.exit_code == 0, r.output
    head = _header(r.output)
    assert head[:6] == ["#", "t", "D", "W", "e", "b"], head
    # each row's e, in the table's rows (the first line of a row: its rank, then t D W e)
    rows = [[x.strip() for x in ln.strip("│").split("│")] for ln in r.output.splitlines()
            if ln.startswith("│") and ln.split("│")[1].strip().isdigit()]
    assert [int(row[4]) for row in rows] == experts


def test_max_expert_1_plans_without_expert_parallelism(files: dict[str, Path]) -> None:
    r = run(["plan", "--profile", files["moe"], *PLAN, "--max-expert", "1", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["candidates"] and _experts(doc) == [1] * len(doc["candidates"])
    assert all(" e=" not in c["label"] for c in doc["candidates"] + doc["infeasible"])
    r = run(["plan", "--profile", files["moe"], *PLAN, "--max-expert", "1"])
    assert r.exit_code == 0 and "e" not in _header(r.output), r.output
    r = run(["plan", "--profile", files["moe"], *PLAN, "--max-expert", "2", "--json"])
    assert r.exit_code == 0 and set(_experts(json.loads(r.stdout))) <= {1, 2}, r.output


def test_max_expert_refusals_and_a_dense_model(files: dict[str, Path]) -> None:
    for bad in ("0", "-2"):
        refused(["plan", "--profile", files["moe"], *PLAN, "--max-expert", bad], "--max-expert: ")
    r = run(["plan", "--profile", files["dense"], *PLAN, "--max-expert", "4", "--top", "2"])
    assert r.exit_code == 0, r.output
    assert "warning: --max-expert 4: profile 'dense-4l' has no mixture of experts" in r.output
    assert "e" not in _header(r.output)


def test_predict_expert(files: dict[str, Path]) -> None:
    r = run(["predict", "--profile", files["moe"], *ONE, "--expert", "2"])
    assert r.exit_code == 0, r.output
    assert "t=1 D=2 W=8 e=2 b=2 1f1b" in r.output
    head = _header(r.output)
    row = next(ln for ln in r.output.splitlines() if ln.startswith("│ 0 "))
    assert dict(zip(head, [x.strip() for x in row.strip("│").split("│")], strict=True))["e"] == "2"
    r = run(["predict", "--profile", files["moe"], *ONE, "--expert", "2", "--json"])
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["fits"] and doc["run_spec"]["config"]["expert"] == 2, r.output
    # the same configuration at e = 1: another prediction (the all-to-alls, the experts' state split in two)
    one = json.loads(run(["predict", "--profile", files["moe"], *ONE, "--json"]).stdout)
    assert "expert" not in one["run_spec"]["config"] and one["iteration_time"] != doc["iteration_time"]
    assert max(one["model_memory"]) > max(doc["model_memory"])


def test_megatron_export_without_the_model_writes_the_experts_split(files: dict[str, Path], tmp_path: Path) -> None:
    """A plan exported without its profile: the model's shape is the user's to add (the note says which flags), but the
    plan's split of its experts is written as t and D are -- left out, the experts would run unsplit (e = 1)."""
    r = run(["predict", "--profile", files["moe"], *ONE, "--expert", "2", "--order", "tp-dp-pp", "--json"])
    assert r.exit_code == 0, r.output
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"candidates": [json.loads(r.stdout)]}))
    r = run(["export", "--plan", plan, "--candidate", "0", "--format", "megatron"])
    assert r.exit_code == 0, r.output
    assert "--expert-model-parallel-size 2" in r.stdout and "    --num-layers" not in r.stdout
    assert "--moe-token-dispatcher-type alltoall" in r.stdout
    assert "--num-experts, --moe-router-topk, --moe-ffn-hidden-size" in r.stderr


def test_predict_expert_refusals(files: dict[str, Path]) -> None:
    w4 = [x if x != "8" else "4" for x in ONE]  # W = 4
    refused(["predict", "--profile", files["moe"], *w4, "--expert", "3"],
            "--expert: the expert-parallel size 3 must divide data (W = 4)")
    refused(["predict", "--profile", files["moe"], *ONE, "--expert", "0"], "--expert: ")
    refused(["predict", "--profile", files["dense"], *ONE, "--expert", "2"],
            "--expert: expert parallelism (2) needs a mixture of experts; profile 'dense-4l' has none")
    refused(["predict", "--profile", files["moe"], *ONE, "--expert", "2", "--shard-parameters"],
            "--expert: expert parallelism with sharded weights")


# ---- the API ---------------------------------------------------------------------------------------------------





def test_api_max_expert_is_strict_and_bounded(client, moe: Any) -> None:  # type: ignore[no-untyped-def]
    pid, cid = upload_profile_and_cluster(client, moe, CLUSTER)
    base = {"profile_id": pid, "cluster_id": cid, "global_batch": 32, "gpus": 16}
    for value in (0, -1, "2", True, 2.0, 10**9):
        r = client.post("/plans", json={**base, "max_expert": value}, headers=AUTH)
        assert r.status_code == 422, (value, r.text)
        assert r.json()["detail"].startswith("max_expert: "), (value, r.json()["detail"])
    assert client.get("/plans", headers=AUTH).json() == []  # nothing made


def test_api_plans_keep_each_candidates_e(client, moe: Any) -> None:  # type: ignore[no-untyped-def]
    pid, cid = upload_profile_and_cluster(client, moe, CLUSTER)
    base = {"profile_id": pid, "cluster_id": cid, "global_batch": 32, "gpus": 16, "top": 10}
    plan = plan_done(client, **base)
    stored = client.get(f"/plans/{plan['id']}", headers=AUTH).json()
    experts = _experts(stored)
    assert any(e > 1 for e in experts), [c["label"] for c in stored["candidates"]]
    rank = next(i for i, e in enumerate(experts) if e > 1)
    cand = stored["candidates"][rank]
    assert f" e={experts[rank]} " in cand["label"]
    # its timeline re-simulates the same configuration (at its e, not at e = 1)
    t = client.get(f"/plans/{plan['id']}/candidates/{rank}/timeline", headers=AUTH)
    assert t.status_code == 200, t.text
    assert t.json()["label"] == cand["label"] and t.json()["matches_stored"] is True, t.json()["label"]
    capped = plan_done(client, **base, max_expert=1)
    assert capped["request"]["max_expert"] == 1
    assert _experts(client.get(f"/plans/{capped['id']}", headers=AUTH).json()) == [1] * len(capped["candidates"])
    two = plan_done(client, **base, max_expert=2)
    assert set(_experts(two)) <= {1, 2}


# ---- the pages (their HTML; tests/browser/test_ui_expert.py drives them in Chromium) -------------------------

def test_pages_have_the_e_column_and_the_max_expert_field(client) -> None:  # type: ignore[no-untyped-def]
    from api.schemas import PlanCreate

    page = client.get("/ui/plans/1").text
    th = re.search(r'<th data-key="expert"[^>]*>e</th>', page)
    assert th and ('title="expert-parallel size: the experts split over e of the W replicas (of the t W ranks of a '
                   'stage where they are whole, etp 1)"') in th.group(0)
    # after W, hidden until the plan has a row with e > 1 (plan.js)
    assert page.index('data-key="data"') < th.start() < page.index('data-key="pipeline"') and " hidden" in th.group(0)
    form = client.get("/").text
    field = re.search(r'<input id="max-expert"[^>]*>', form)
    most = next(m.le for m in PlanCreate.model_fields["max_expert"].metadata if getattr(m, "le", None))
    assert field and f'data-max="{most}"' in field.group(0) and 'data-min="1"' in field.group(0)
    assert form.index('id="max-tensor"') < field.start() < form.index('id="micro-batches"')
