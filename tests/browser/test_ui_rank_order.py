"""The rank order in the browser: the new-plan page's "Rank order" select goes into the request, the plan page's
candidates table shows each row's order (``ranks``, after t) where some row has the pipeline outermost (sortable,
within a 1280 px window), a selected candidate's card states its placement, and a plan of one order asked for
(tp-pp-dp) has no ranks column. The HTML alone: tests/test_rank_order_surfaces.py."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import pytest
from api_support import LiveServer

from browser.support import Console, needs_browser, new_plan_form, shot

pytestmark = [needs_browser, pytest.mark.slow]

OUTER = "ranks: tensor innermost, then data parallel, then pipeline"


def _plan_page(page: Any, server: LiveServer) -> dict[str, Any]:
    """Submit the form; the plan (GET /plans/{id}) once its page is drawn."""
    page.click("#submit-plan")
    page.wait_for_url("**/ui/plans/*", timeout=240_000)
    page.wait_for_selector('body[data-ready="1"]', timeout=240_000)
    plan_id = int(page.url.rsplit("/", 1)[1].split("?")[0])
    with server.client() as c:
        return c.get(f"/plans/{plan_id}").json()


def test_rank_order_from_the_form_the_ranks_column_and_the_card(server: LiveServer, browser: Any,
                                                                  console: Console) -> None:
    from test_rank_order_surfaces import _profile

    # GPT-2 medium on 16 H100s (two 8-GPU nodes), B = 32: both orders among the 10 best rows
    ctx, page = new_plan_form(server, browser, console, _profile(), {"global-batch": "32", "gpus": "16", "top": "10"})
    hint = page.locator("#rank-order + .field-hint")
    assert hint.is_visible() and hint.inner_text() == "tp-dp-pp: pipeline outermost (Megatron-LM's default, torchtitan)"
    assert page.input_value("#rank-order") == ""  # both, by default
    plan = _plan_page(page, server)
    assert plan["request"]["rank_order"] is None
    orders = [c["run_spec"]["config"].get("order", "tp-pp-dp") for c in plan["candidates"]]
    assert set(orders) == {"tp-pp-dp", "tp-dp-pp"}, [c["label"] for c in plan["candidates"]]
    th = page.locator('#cands th[data-key="order"]')
    assert th.is_visible() and th.inner_text() == "ranks"
    heads = page.locator("#cands thead th:visible").all_inner_texts()  # (a dense model's e column is hidden)
    column = heads.index("ranks")
    assert heads[column - 1] == "t" and heads[column + 1] == "Schedule", heads

    def cells() -> list[str]:
        return [r.locator("td").nth(column).inner_text() for r in page.locator("#cands tbody tr").all()]

    assert cells() == orders
    th.click()  # sorts by the order
    assert cells() == sorted(orders) and "sort=order:asc" in unquote(page.url)
    th.click()
    assert cells() == sorted(orders, reverse=True) and "sort=order:desc" in unquote(page.url)
    wrap = page.locator(".table-wrap")
    scroll, client = wrap.evaluate("e => [e.scrollWidth, e.clientWidth]")
    assert scroll <= client, f"the table is {scroll} px wide in a {client} px box"
    assert page.locator("#cands tbody tr").first.locator("td").count() == len(heads)
    shot(page, "rank-order-column")
    # a tp-dp-pp row, selected: its card states its placement
    rank = orders.index("tp-dp-pp")
    page.check(f'input.sel[data-rank="{rank}"]')
    page.click("#compare-btn")
    page.wait_for_selector('#compare[data-drawn="1"]')
    card = page.locator("#compare article.card").first
    assert card.locator("header").inner_text().endswith("ranks=tp-dp-pp")
    assert card.locator(".placement").inner_text() == plan["candidates"][rank]["placement"]
    assert card.locator(".placement").inner_text().startswith(OUTER)
    shot(page, "rank-order-card")

    # one order asked for: the request has it, the summary says it, and no row needs the column
    page.goto(server.url + "/")
    page.wait_for_selector('body[data-ready="1"]')
    page.select_option("#profile", str(plan["profile_id"]))
    page.select_option("#cluster", str(plan["cluster_id"]))
    for key, value in {"global-batch": "32", "gpus": "16", "top": "10"}.items():
        page.fill(f"#{key}", value)
    page.select_option("#rank-order", "tp-pp-dp")
    one = _plan_page(page, server)
    assert one["request"]["rank_order"] == "tp-pp-dp"
    assert "ranks tp-pp-dp" in page.inner_text("#plan-info")
    assert page.locator('#cands th[data-key="order"]').is_hidden()
    shown = page.locator("#cands thead th:visible").count()
    assert page.locator("#cands tbody tr").first.locator("td").count() == shown
    ctx.close()
