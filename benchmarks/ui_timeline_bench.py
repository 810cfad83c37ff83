"""Draw time of the comparison page's timelines for GPT-3 175B on 1024 A100s (B^ = 1536), in headless Chromium.

Starts its own API server (temp SQLite, random port), stores an analytical GPT-3 175B profile, plans it, then
opens each chosen candidate's comparison card (``/ui/plans/{id}?sel=r``) and prints, per candidate, what
the page measured with ``performance.now()`` around the draw (``window.__timelineDraws``: parsing the
timeline document into columns and the first canvas render), the redraw after zooming to 3 % of the
iteration, and the wall time until the card was drawn (which includes the server's first simulation of the
candidate, then stored). Figures, not a test: they vary with the machine's load.

Run: ``python benchmarks/ui_timeline_bench.py [--candidates 4] [--width 1280]`` (needs /usr/bin/chromium and
the playwright package, as the browser tests do).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.live_server import live_server  # noqa: E402

TOKEN = "bench-admin-token"
H = {"Authorization": f"Bearer {TOKEN}"}


def gpt3_plan(url: str, tmp: Path) -> dict:
    prof = tmp / "gpt3.json"
    subprocess.run([sys.executable, "-m", "pipeplan.cli", "profile-analytic", "--preset", "gpt3-175b", "--device",
                    "a100-80gb", "--out", str(prof)], cwd=ROOT, check=True, capture_output=True)
    with httpx.Client(base_url=url, headers=H, timeout=60) as c:
        pid = c.post("/profiles", json=json.loads(prof.read_text())).json()["id"]
        cid = next(x["id"] for x in c.get("/clusters").json() if x["name"] == "dgx-a100-80gb")
        plan = c.post("/plans", json={"profile_id": pid, "cluster_id": cid, "global_batch": 1536, "gpus": 1024,
                                      "top": 20}).json()
        while plan["status"] in ("queued", "running"):
            time.sleep(0.5)
            plan = c.get(f"/plans/{plan['id']}").json()
    if plan["status"] != "done":
        raise SystemExit(f"plan failed: {plan.get('error')}")
    return plan


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--candidates", type=int, default=4, help="how many candidates with N >= 192 to draw")
    ap.add_argument("--width", type=int, default=1280)
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        with live_server(tmp, TOKEN, seed=True) as srv:
            url = srv.url
            plan = gpt3_plan(url, tmp)
            cands = plan["candidates"]
            ranks = [i for i, c in enumerate(cands) if c["microbatches"] >= 192][: args.candidates]
            with sync_playwright() as p:
                b = p.chromium.launch(executable_path="/usr/bin/chromium",
                                      args=["--headless", "--no-sandbox", "--disable-gpu"])
                ctx = b.new_context(viewport={"width": args.width, "height": 800})
                ctx.add_init_script(f"localStorage.setItem('pipeplan.token', {json.dumps(TOKEN)})")
                page = ctx.new_page()
                print(f"GPT-3 175B, 1024 x A100, B^=1536: plan {plan['id']}, {args.width} px wide (headless "
                      "Chromium, software rendering, a loaded 2-core machine)")
                print(f"{'rank':>4} {'label':44} {'N':>4} {'D':>3} {'actions':>7} {'draw ms':>8} {'zoom ms':>8} "
                      f"{'mode':>9} {'to drawn s':>10}")
                for r in ranks:
                    t0 = time.perf_counter()
                    page.goto(f"{url}/ui/plans/{plan['id']}?sel={r}")
                    page.wait_for_selector('#compare[data-drawn="1"]', timeout=300_000)
                    wall = time.perf_counter() - t0
                    draw = page.evaluate("window.__timelineDraws")[-1]
                    tl = page.locator('[data-role="timeline"]').first
                    mode = tl.get_attribute("data-mode")
                    page.evaluate("""() => { const el = document.querySelector('[data-role="timeline"]');
                        const t = el.__timeline; const s = t.full[1];
                        t.setRange(0.40 * s, 0.43 * s, true); }""")
                    zoom = float(tl.get_attribute("data-last-draw-ms"))
                    c = cands[r]
                    print(f"{r:>4} {c['label'][:44]:44} {c['microbatches']:>4} {c['pipeline']:>3} "
                          f"{draw['actions']:>7} {draw['ms']:>8.1f} {zoom:>8.1f} {mode:>9} {wall:>10.2f}")
                b.close()


if __name__ == "__main__":
    main()
