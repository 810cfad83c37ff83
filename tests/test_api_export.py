"""GET /plans/{id}/candidates/{rank}/export: a stored candidate as Megatron-LM, torchtitan or DeepSpeed
settings, read back by the formats' parsers; a schedule the framework lacks is a 422 naming the closest
one, its predicted cost and the plan's fastest candidate that it runs."""

from __future__ import annotations

from typing import Any

from api_support import AUTH, as_export, tiny_cluster, tiny_profile, wait_for

from planner.export import FRAMEWORKS, parse
from planner.placement import pipeline_outermost_order
from planner.runspec import RunSpec


def plan_of(c: Any, schedules: list[str]) -> dict[str, Any]:
    p = c.post("/profiles", json=tiny_profile(), headers=AUTH).json()
    cl = c.post("/clusters", json=tiny_cluster(4), headers=AUTH).json()
    r = c.post("/plans", json={"profile_id": p["id"], "cluster_id": cl["id"], "global_batch": 32, "top": 5,
                               "schedules": schedules}, headers=AUTH)
    assert r.status_code in (200, 201, 202), r.text
    plan = r.json()
    if plan["status"] not in ("done", "failed"):
        plan = wait_for(lambda: (lambda j: j if j["status"] in ("done", "failed") else None)(
            c.get(f"/plans/{plan['id']}", headers=AUTH).json()), what="plan done")
    assert plan["status"] == "done" and plan["candidates"], plan
    return plan


def test_export_round_trips_through_the_api(client) -> None:  # type: ignore[no-untyped-def]
    plan = plan_of(client, ["1f1b"])
    pid = plan["id"]
    assert client.get(f"/plans/{pid}/candidates/0/export?format=megatron").status_code == 401
    for rank, cand in enumerate(plan["candidates"]):
        spec = RunSpec.from_document(cand)
        for fmt in FRAMEWORKS:
            r = client.get(f"/plans/{pid}/candidates/{rank}/export", params={"format": fmt}, headers=AUTH)
            assert r.status_code == 200, r.text
            doc = r.json()
            assert doc["label"] == spec.config.label() and doc["files"][0]["content"]
            back = parse(as_export(doc))
            c = spec.config
            if fmt != "megatron":  # torchtitan and DeepSpeed always put the pipeline outermost (planner.placement)
                c = c.model_copy(update={"order": pipeline_outermost_order(c.pipeline, c.data)})
            assert (back.config, back.microbatches) == (c, spec.microbatches), fmt


def test_unsupported_schedule_is_a_422_with_the_switch_cost(client) -> None:  # type: ignore[no-untyped-def]
    plan = plan_of(client, ["chimera", "1f1b"])
    ranks = [i for i, c in enumerate(plan["candidates"]) if c["schedule"] == "chimera"]
    assert ranks, [c["label"] for c in plan["candidates"]]
    r = client.get(f"/plans/{plan['id']}/candidates/{ranks[0]}/export", params={"format": "deepspeed"},
                   headers=AUTH)
    assert r.status_code == 422, r.text
    msg = r.json()["detail"]
    assert "DeepSpeed cannot run schedule 'chimera'" in msg and "closest it has is '1f1b'" in msg
    assert "predicted" in msg and "s per iteration against" in msg and "%" in msg
    ones = [i for i, c in enumerate(plan["candidates"]) if c["schedule"] == "1f1b"]
    if ones:
        # the rank /candidates/{rank} takes (0-based, as candidate_index): it named ones[0] + 1, another candidate
        i = ones[0]
        assert f"DeepSpeed runs is rank {i} (candidate_index {i}, #{i + 1} on the plan page)" in msg
        label = plan["candidates"][ones[0]]["label"]
        assert f"({label}, predicted" in msg, msg
        same = client.get(f"/plans/{plan['id']}/candidates/{ones[0]}/export", params={"format": "deepspeed"},
                          headers=AUTH)
        assert same.status_code == 200 and same.json()["label"] == label, same.text
    bad = client.get(f"/plans/{plan['id']}/candidates/0/export", params={"format": "nope"}, headers=AUTH)
    assert bad.status_code == 422 and "format" in bad.text
    assert client.get(f"/plans/{plan['id']}/candidates/99/export", params={"format": "megatron"},
                      headers=AUTH).status_code == 404
    assert client.get(f"/plans/{plan['id']}/candidates/-1/export", params={"format": "megatron"},
                      headers=AUTH).status_code == 422
    missing = client.get("/plans/999/candidates/0/export", params={"format": "megatron"}, headers=AUTH)
    assert missing.status_code == 404
    schema = client.get("/openapi.json").json()["paths"]["/plans/{plan_id}/candidates/{rank}/export"]["get"]
    fmt = next(p for p in schema["parameters"] if p["name"] == "format")
    assert fmt["required"] and set(fmt["schema"]["enum"]) == {"megatron", "torchtitan", "deepspeed"}


def test_the_refusals_closest_is_one_that_fits() -> None:
    """The API named (and costed) Megatron-LM's first stand-in for GPT-3 175B's Hanayo on 1024 A100s,
    interleaved(chunks=2), out of memory, where pipeplan export names 1F1B on the same t, D, W, which fits: the
    planner process's switch_cost now picks as the CLI does (planner.export.switch.best_closest)."""
    from api.exports import switch_cost
    from planner.analytic import analytic_profile
    from planner.cluster import load_cluster
    from planner.export import UnsupportedSchedule, megatron
    from planner.model import PRESETS
    from planner.request import Config, TrainingRequest

    spec = RunSpec(config=Config(tensor=8, pipeline=16, data=8, micro_batch=1, schedule="hanayo", waves=1),
                   microbatches=192)
    try:
        megatron.check(spec)
    except UnsupportedSchedule as e:
        err = e
    assert err.closest.config.schedule == "interleaved" and [o.config.schedule for o in err.others] == ["1f1b"]
    prof = analytic_profile(PRESETS["gpt3-175b"], "A100-SXM4-80GB").model_dump(mode="json")
    cl = load_cluster("examples/clusters/dgx-a100-80gb.json").model_dump(mode="json")
    out = switch_cost(prof, cl, TrainingRequest(global_batch=1536).model_dump(mode="json"), err.framework,
                      spec.model_dump(mode="json"), err.closest.model_dump(mode="json"), err.reason,
                      [o.model_dump(mode="json") for o in err.others])
    assert RunSpec.model_validate(out["closest"]).config.schedule == "1f1b"
    assert "does not fit" not in out["cost"] and "against 20.7" in out["cost"], out["cost"]
