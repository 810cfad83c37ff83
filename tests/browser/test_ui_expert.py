"""Expert parallelism in the browser: the new-plan page's "Max expert parallel" goes into the request (and a bad
value is refused in the form), the plan page's candidates table shows each row's e after W where some row splits
its experts (sortable, within a 1280 px window), and a dense model's table has no e column. The HTML alone:
tests/test_expert_parallel_surfaces.py."""

from __future__ import annotations

from typing import Any

import pytest
from api_support import LiveServer

from browser.support import Console, needs_browser, new_plan_form, seeded_ids, shot

pytestmark = [needs_browser, pytest.mark.slow]


def _form(server: LiveServer, browser: Any, console: Console) -> tuple[Any, Any]:
    """The new-plan page (as the admin) with a small mixture of experts (tests/test_expert_parallel_surfaces.py's
    MOE) stored and selected on the dgx-h100-80gb cluster, 16 GPUs, B = 32."""
    from test_expert_parallel_surfaces import MOE, _profile

    return new_plan_form(server, browser, console, _profile(MOE), {"global-batch": "32", "gpus": "16", "top": "10"})


def test_max_expert_from_the_form_and_the_e_column(server: LiveServer, browser: Any, console: Console) -> None:
    ctx, page = _form(server, browser, console)
    page.fill("#max-expert", "0")
    page.click("#submit-plan")
    assert "Max expert parallel: “0” is not a whole number from 1 to" in page.inner_text("#plan-form")
    page.fill("#max-expert", "4")
    page.click("#submit-plan")
    page.wait_for_url("**/ui/plans/*", timeout=240_000)
    plan_id = int(page.url.rsplit("/", 1)[1].split("?")[0])
    page.wait_for_selector('body[data-ready="1"]')
    with server.client() as c:
        plan = c.get(f"/plans/{plan_id}").json()
    assert plan["request"]["max_expert"] == 4
    experts = [c["run_spec"]["config"].get("expert", 1) for c in plan["candidates"]]
    assert any(e > 1 for e in experts) and max(experts) <= 4, experts
    assert "max e 4" in page.inner_text("#plan-info")
    th = page.locator('#cands th[data-key="expert"]')
    assert th.is_visible() and th.inner_text() == "e"
    assert th.get_attribute("title") == ("expert-parallel size: the experts split over e of the W replicas (of the t W "
                                         "ranks of a stage where they are whole, etp 1)")
    heads = page.locator("#cands thead th").all_inner_texts()
    column = heads.index("e")
    assert heads[column - 1] == "W"

    def cells() -> list[str]:
        return [r.locator("td").nth(column).inner_text() for r in page.locator("#cands tbody tr").all()]

    assert cells() == [str(e) for e in experts]
    th.click()  # sorts by e
    assert cells() == sorted(cells(), key=int)
    wrap = page.locator(".table-wrap")
    scroll, client = wrap.evaluate("e => [e.scrollWidth, e.clientWidth]")
    assert scroll <= client, f"the table is {scroll} px wide in a {client} px box"
    shot(page, "expert-e-column")
    # a row that splits its experts, selected: its card says what of its compute the all-to-alls are
    rank = next(i for i, e in enumerate(experts) if e > 1)
    page.check(f'input.sel[data-rank="{rank}"]')
    page.click("#compare-btn")
    page.wait_for_selector('#compare[data-drawn="1"]')
    assert "the experts' all-to-alls" in page.locator("#compare article.card").first.inner_text()

    # a dense model's plan: no e column, each row as many cells as the header has visible columns
    pid, cid = seeded_ids(server, "gpt-tiny", "cpu", "local-cpu-4")
    with server.client() as c:
        r = c.post("/plans", json={"profile_id": pid, "cluster_id": cid, "global_batch": 8, "top": 3})
        assert r.status_code in (200, 201, 202), r.text
    page.goto(f"{server.url}/ui/plans/{r.json()['id']}")
    page.wait_for_selector('body[data-ready="1"]', timeout=240_000)
    assert page.locator('#cands th[data-key="expert"]').is_hidden()
    shown = page.locator("#cands thead th:visible").count()
    assert page.locator("#cands tbody tr").first.locator("td").count() == shown
    ctx.close()
