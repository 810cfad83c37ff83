"""The plan page shows the model's own peak memory and the reserve apart (newcomer pass: every candidate on the
4 GiB local CPU cluster read "2.00 GiB", the GPU reserve; the CPU default is 320 MiB, planner.reserve), with a
tooltip saying the fits rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from api_support import ADMIN, AUTH, LiveServer, tiny_profile

from browser.support import Console, done_plan, needs_browser, new_plan_form, shot

pytestmark = [needs_browser, pytest.mark.slow]
CLUSTER = Path(__file__).resolve().parents[2] / "examples" / "clusters" / "local-cpu-4.json"


def test_peak_memory_cell_shows_model_plus_reserve(server: LiveServer, browser: Any, console: Console) -> None:
    with server.client() as c:
        p = c.post("/profiles", json=tiny_profile(), headers=AUTH)
        cl = c.post("/clusters", json=json.loads(CLUSTER.read_text()), headers=AUTH)
        assert p.status_code in (200, 201) and cl.status_code in (200, 201), (p.text, cl.text)
    plan = done_plan(server, p.json()["id"], cl.json()["id"], global_batch=8, top=3)
    pid = plan["id"]
    assert plan["candidates"]
    best = plan["candidates"][0]
    assert best["memory_reserve"] == 320 * 2**20 and best["model_peak_memory"] < 0.1 * 2**30
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    ctx.add_init_script(f"localStorage.setItem('pipeplan.token', {json.dumps(ADMIN)})")
    page = console.attach(ctx.new_page())
    page.goto(f"{server.url}/ui/plans/{pid}")
    cell = page.locator('#cands tbody tr[data-rank="0"] td[data-role="memory"]')
    cell.wait_for()
    text = cell.inner_text()
    assert " MiB + 0.31 GiB reserve / 4.00 GiB" in text, text
    assert "reserve" in (cell.get_attribute("title") or "") and "fits when" in (cell.get_attribute("title") or "")
    assert "model + reserve" in page.locator('#cands th[data-key="peak_memory"]').inner_text()
    # the selected candidate's chart: one bar per device standing on the reserve band, which is labelled
    page.goto(f"{server.url}/ui/plans/{pid}?sel=0")
    page.wait_for_selector('#compare[data-drawn="1"]', timeout=180_000)
    chart = page.locator('[data-role="memory"][data-rank="0"]')
    assert chart.locator(".point").count() == best["pipeline"]
    assert "reserve 0.31 GiB" in chart.inner_text()
    # a few MiB against 4 GiB: drawn on their own scale, the capacity named (the bars were invisible before)
    assert "model only" in chart.inner_text() and "capacity 4.0 GiB (off this scale)" in chart.inner_text()
    chart.scroll_into_view_if_needed()
    shot(page, "memory-small-model-own-scale")
    ctx.close()


def test_sharded_optimizer_is_asked_for_and_shown(server: LiveServer, browser: Any, console: Console) -> None:
    """"shard the optimizer state over data parallel (ZeRO-1)" on the new-plan page goes into the request; the
    plan page says so, and every candidate holds 4 + 12/W bytes per parameter (GPT-3 175B on 256 H100s)."""
    from planner.analytic import analytic_profile
    from planner.model import PRESETS

    prof = analytic_profile(PRESETS["gpt3-175b"], "H100-SXM5-80GB", micro_batches=(1,), tensor_sizes=(1, 4, 8),
                            name="gpt3-175b-zero1-ui")
    ctx, page = new_plan_form(server, browser, console, prof,
                               {"global-batch": "512", "gpus": "256", "micro-batches": "1", "top": "5"})
    assert not page.is_checked("#shard-optimizer")  # off by default: the planner's 16 bytes per parameter
    page.check("#shard-optimizer")
    plan = _submitted_plan(server, page)
    assert "optimizer sharded over data parallel (ZeRO-1)" in page.inner_text("#info-optimizer")
    assert plan["request"]["shard_optimizer"] is True and plan["candidates"]
    for cand in plan["candidates"]:
        assert cand["shard_optimizer"] and cand["state_bytes_per_param"] == 4 + 12 / cand["data"]
    ctx.close()


def test_sharding_the_weights_from_the_form(server, browser, console) -> None:  # type: ignore[no-untyped-def]
    """The new-plan page's "shard the weights too (FSDP, ZeRO-3)": the schedules that cannot shard (Chimera, GEMS)
    are unticked and disabled while it is ticked; the plan is made with ``shard_parameters``, the plan page says so,
    and every candidate holds 16/W bytes per parameter in a schedule FSDP can run."""
    from planner.analytic import analytic_profile
    from planner.model import PRESETS

    prof = analytic_profile(PRESETS["gpt2-medium"], "H100-SXM5-80GB", micro_batches=(1, 2), tensor_sizes=(1, 2),
                            name="gpt2-medium-fsdp-ui")
    ctx, page = new_plan_form(server, browser, console, prof, {"global-batch": "64", "gpus": "16", "top": "5"})
    assert not page.is_checked("#shard-parameters")
    # the schedules that cannot shard (Chimera, GEMS, 1F1B-RR) are unticked and disabled while the box is ticked,
    # and come back as they were after
    assert page.is_checked('input[name=schedule][value="chimera"]')
    page.check("#shard-parameters")
    assert not page.is_checked('input[name=schedule][value="chimera"]')
    assert page.is_disabled('input[name=schedule][value="gems"]')
    page.uncheck("#shard-parameters")
    assert page.is_checked('input[name=schedule][value="chimera"]')
    assert page.is_enabled('input[name=schedule][value="gems"]')
    page.check("#shard-parameters")
    plan = _submitted_plan(server, page)
    plan_id = plan["id"]
    assert "weights, gradients and optimizer sharded over data parallel (FSDP)" in page.inner_text("#info-optimizer")
    page.wait_for_selector("#info-assumes:not([hidden])")  # the profile's words, without a data-parallel all-reduce
    assert "pipeline sends" in page.inner_text("#info-assumes")
    assert "data-parallel all-reduce" not in page.inner_text("#info-assumes")
    assert plan["request"]["shard_parameters"] is True and plan["candidates"]
    for cand in plan["candidates"]:
        assert cand["shard_parameters"] and cand["schedule"] not in ("chimera", "gems")
        assert cand["state_bytes_per_param"] == 16 / cand["data"]
    # a candidate without a pipeline: its card says how much of its compute is FSDP's collectives
    rank = next(i for i, c in enumerate(plan["candidates"]) if c["pipeline"] == 1 and c["data"] > 1)
    page.goto(f"{server.url}/ui/plans/{plan_id}?sel={rank}")
    card = f'#compare article[data-rank="{rank}"]'
    page.wait_for_selector(card)
    assert ("added by FSDP's gathers and reduce-scatters: the part not hidden, plus the slowdown of the compute "
            "they overlap" in page.inner_text(card))
    assert "fully sharded data parallel" in page.inner_text(f"{card} header")  # the row's name, as in the table
    page.locator(card).scroll_into_view_if_needed()
    shot(page, "fsdp-candidate-card")
    # a job of it: the job page says pipeplan's executor runs it unsharded
    with server.client() as c:
        job = c.post("/jobs", json={"plan_id": plan_id, "candidate_index": rank, "emulate": True}, headers=AUTH)
        assert job.status_code in (200, 201), job.text
    page.goto(f"{server.url}/ui/jobs/{job.json()['id']}")
    page.wait_for_selector("#comparison-note:not([hidden])")
    assert "executor does not" in page.inner_text("#comparison-note")
    ctx.close()


def _submitted_plan(server: LiveServer, page: Any) -> dict[str, Any]:
    """Submit the new-plan form, wait for the plan page, and return the plan's document from the API."""
    page.click("#submit-plan")
    page.wait_for_url("**/ui/plans/*", timeout=240_000)
    plan_id = int(page.url.rsplit("/", 1)[1].split("?")[0])
    page.wait_for_selector('body[data-ready="1"]')
    with server.client() as c:
        return c.get(f"/plans/{plan_id}").json()
