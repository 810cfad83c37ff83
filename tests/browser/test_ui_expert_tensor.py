"""Whole experts (expert tensor parallelism 1) in the browser: the plan page's candidates table shows an ``etp``
column right after e where some row holds its experts whole (1 there, empty where they split over t; sortable,
within a 1280 px window, the Export column in view), a selected such row's card says so and its dispatch button is
disabled with the executor's refusal (export it to Megatron-LM), and its Export dialog writes
``--expert-tensor-parallel-size 1`` for Megatron-LM and shows torchtitan's refusal. The HTML alone and the API:
tests/test_expert_tensor_surfaces.py."""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

import pytest
from api_support import LiveServer

from browser.support import Console, expected_refusals, needs_browser, new_plan_form, shot

pytestmark = [needs_browser, pytest.mark.slow]

CARD = "experts whole on each rank (expert tensor parallelism 1)"


def test_the_etp_column_the_card_and_the_refusals(server: LiveServer, browser: Any, console: Console) -> None:
    from test_expert_tensor_surfaces import profile

    # Qwen3-30B-A3B's block shape, 4 layers, made with sequence parallelism, on one node of 8 H100s at B = 16:
    # whole-expert rows and split ones among the 10 best
    ctx, page = new_plan_form(server, browser, console, profile(), {"global-batch": "16", "gpus": "8", "top": "10"})
    page.click("#submit-plan")
    page.wait_for_url("**/ui/plans/*", timeout=240_000)
    page.wait_for_selector('body[data-ready="1"]', timeout=240_000)
    plan_id = int(page.url.rsplit("/", 1)[1].split("?")[0])
    with server.client() as c:
        plan = c.get(f"/plans/{plan_id}").json()
    whole = [c["run_spec"]["config"].get("expert_tensor") for c in plan["candidates"]]
    assert set(whole) == {1, None}, [c["label"] for c in plan["candidates"]]

    th = page.locator('#cands th[data-key="expert_tensor"]')
    assert th.is_visible() and th.inner_text() == "etp"
    assert "--expert-tensor-parallel-size 1" in (th.get_attribute("title") or "")
    heads = page.locator("#cands thead th:visible").all_inner_texts()
    column = heads.index("etp")
    assert heads[column - 1] == "e" and heads[column + 1] == "D", heads
    assert page.locator("#cands tbody tr").first.locator("td").count() == len(heads)

    def cells() -> list[str]:
        return [r.locator("td").nth(column).inner_text() for r in page.locator("#cands tbody tr").all()]

    assert cells() == ["1" if w else "" for w in whole]
    th.click()  # sorts by etp: the split rows (empty) first
    assert cells() == sorted(cells()) and "sort=expert_tensor:asc" in unquote(page.url)
    th.click()
    assert cells() == sorted(cells(), reverse=True) and cells()[0] == "1"
    assert "sort=expert_tensor:desc" in unquote(page.url)
    wrap = page.locator(".table-wrap")
    scroll, client = wrap.evaluate("e => [e.scrollWidth, e.clientWidth]")
    assert scroll <= client, f"the table is {scroll} px wide in a {client} px box"
    export_th = page.locator("#cands thead th").last
    assert export_th.inner_text() == "Export"
    box = export_th.bounding_box()
    assert box is not None and box["x"] + box["width"] <= 1280, box
    shot(page, "expert-tensor-column")

    # a whole-experts row and a split one, side by side: the first card says its experts are whole, and its
    # dispatch button is off with the executor's refusal (Megatron-LM runs it: the row's Export)
    rank, split = whole.index(1), whole.index(None)
    page.check(f'input.sel[data-rank="{rank}"]')
    page.check(f'input.sel[data-rank="{split}"]')
    page.click("#compare-btn")
    page.wait_for_selector('#compare[data-drawn="1"]')
    card = page.locator(f'#compare article.card[data-rank="{rank}"]')
    assert CARD in card.inner_text()
    assert CARD not in page.locator(f'#compare article.card[data-rank="{split}"]').inner_text()
    button = card.locator("button.dispatch")
    assert button.is_disabled()
    refusal = plan["candidates"][rank]["executor_refusal"]
    assert refusal.startswith("expert_tensor: ") and button.get_attribute("title") == refusal
    msg = card.locator(".dispatch-msg").inner_text()
    assert refusal in msg and "export it to Megatron-LM" in msg, msg
    shot(page, "expert-tensor-card")

    # its Export: Megatron-LM's launch script holds the experts whole; torchtitan refuses (the API's 4xx, shown)
    page.click(f'button.export-btn[data-rank="{rank}"]')
    page.wait_for_selector('#export-dialog[data-state="shown"]')
    assert "--expert-tensor-parallel-size 1" in page.locator("pre.export-text").first.inner_text()
    page.select_option("#export-format", "torchtitan")
    page.wait_for_selector('#export-dialog[data-state="refused"]')
    assert "megatron" in page.inner_text("#export-msg").lower()
    assert page.locator("#export-files section").count() == 0
    shot(page, "expert-tensor-export-refused")
    expected_refusals(page, console, 1)  # Chromium's own log line of that response, and no other error
    ctx.close()
