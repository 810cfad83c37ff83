"""Issue 17 item 4: the UI draws PipeDream's uneven replication -- a replicated candidate's timeline has one row per
replica, labelled and grouped by stage, and its detail lists the memory of each replica (headless Chromium against
the real server; tests/pipedream_front.py's setting, where 2-1-1 wins)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from api_support import ADMIN, AUTH, LiveServer

from browser.support import Console, done_plan, needs_browser, shot

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pipedream_front import front_heavy_profile, request, small_memory_cluster  # noqa: E402

pytestmark = [needs_browser, pytest.mark.slow]


def _replicated_plan(srv: LiveServer) -> dict[str, Any]:
    with srv.client() as c:
        p = c.post("/profiles", json=front_heavy_profile().model_dump(mode="json"), headers=AUTH)
        assert p.status_code in (200, 201), p.text
        cl = c.post("/clusters", json=small_memory_cluster().model_dump(mode="json"), headers=AUTH)
        assert cl.status_code in (200, 201), cl.text
    req = request().model_dump(mode="json", exclude_none=True)
    return done_plan(srv, p.json()["id"], cl.json()["id"], **{**req, "allow_async": True})


def test_replicated_candidate_shows_rows_per_replica(server: LiveServer, browser: Any, console: Console) -> None:
    plan = _replicated_plan(server)
    cands = plan["candidates"]
    ranks = [i for i, c in enumerate(cands) if c.get("replication") == "2,1,1"]
    uniform = next(i for i, c in enumerate(cands) if not c.get("replication"))
    assert len(ranks) == 2  # 1f1b-rr and, under allow_async, pipedream-rr
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    ctx.add_init_script(f"localStorage.setItem('pipeplan.token', {json.dumps(ADMIN)})")
    page = console.attach(ctx.new_page())
    page.set_default_timeout(60_000)
    sel = ",".join(map(str, [*ranks, uniform]))
    page.goto(f"{server.url}/ui/plans/{plan['id']}?sel={sel}")
    page.wait_for_selector('#compare[data-drawn="1"]', timeout=180_000)
    for r in ranks:
        card = page.locator(f'article.card[data-rank="{r}"]')
        tl = card.locator('[data-role="timeline"]')
        assert tl.get_attribute("data-devices") == "4"
        assert tl.get_attribute("data-row-labels") == "S0 r0 · P0|S0 r1 · P1|S1 · P2|S2 · P3"
        assert tl.get_attribute("data-row-stages") == "0,0,1,2"
        mem = card.locator(".replica-memory")
        assert mem.is_visible()
        text = mem.inner_text()
        assert "Memory per replica" in text and "S0 r1 · P1:" in text and text.count("GiB") == 4
        assert card.locator('[data-role="memory"]').inner_text().count("S0 r") >= 2  # the chart's axis
    # the asynchronous variant's row explains its stashed versions
    labels = [cands[r]["label"] for r in ranks]
    assert any("weight stashing (2,2,1 versions per stage)" in x for x in labels)
    # a uniform candidate keeps one row per device, named by device
    tl = page.locator(f'article.card[data-rank="{uniform}"] [data-role="timeline"]')
    assert tl.get_attribute("data-row-stages") is None
    assert tl.get_attribute("data-row-labels").startswith("P0|P1")  # type: ignore[union-attr]
    assert not page.locator(f'article.card[data-rank="{uniform}"] .replica-memory').is_visible()
    shot(page, "replicated-rows")
    ctx.close()
