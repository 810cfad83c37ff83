// Per-device timelines on a <canvas> (no SVG shape per action: a GPT-3 plan with 384 micro-batches has tens
// of thousands of actions, which Plotly drew in 15-32 s). One row per device (with replicated stages, one row
// per replica, labelled and grouped by stage from the document's row_labels / row_stages), compute on the row and
// communication (sends, all-reduce) on a thin lane under it.
//
// * Aggregated at low zoom: when the actions in view average under AGGREGATE_PX pixels each, every row is cut
//   into 3-pixel columns, written straight into the canvas's pixels, and each column shows the share of its
//   time spent in forward, backward, input- and weight-gradient and other work, stacked (idle time, the
//   bubble, stays blank). Zoomed in, every action is a block with its micro-batch number and a separator;
//   consecutive micro-batches alternate shades, so they never merge into a band. Blocks are batched into one
//   path per colour, so a redraw costs a few fills, not one per action.
// * Time axis in s, ms or µs, chosen from the range in view (a 30 s iteration reads 0-30 s, not "30k ms").
// * Zoom: drag across the chart to zoom to that range, ctrl+wheel (or pinch) zooms around the pointer, shift+
//   wheel pans, the buttons zoom in / out / reset, double-click resets.
// * Highlight: click an action (or type a number) to highlight its micro-batch on every device; the others
//   are dimmed. Timelines drawn with the same `group` share their range and highlight.
//
// The element gets data-drawn="1", data-devices, data-mode ("detail" | "aggregate"), data-x0 / data-x1 (the
// range in view, seconds), data-highlight and data-draw-ms (milliseconds of the last full draw, measured with
// performance.now; window.__timelineDraws collects them for benchmarks/ui_timeline_bench.py).
"use strict";

const TL = (() => {
  const ACTION_RE = /^(?:r(\d+):)?(\d+)?(SEND_F|SEND_B|RECV_F|RECV_B|ALLREDUCE|STEP|OPT|F|B|I|W)(\d+)?(?:-(\d+))?$/;
  const KINDS = ["F", "B", "I", "W", "SEND_F", "SEND_B", "ALLREDUCE", "STEP", "other"];
  const K = Object.fromEntries(KINDS.map((k, i) => [k, i]));
  const COMM = new Set([K.SEND_F, K.SEND_B, K.ALLREDUCE]);
  // two shades per (kind, replica): even and odd micro-batches
  const SHADES = {
    F: [["#1f77b4", "#4f98cc"], ["#08519c", "#3a76b8"], ["#6baed6", "#94c4e2"], ["#084594", "#2f66ad"]],
    B: [["#e6550d", "#f07d3e"], ["#a63603", "#c2581f"], ["#fd8d3c", "#fdae6b"], ["#8c2d04", "#ab4a1c"]],
    I: [["#d62728", "#e35455"], ["#a50f15", "#c23a3f"], ["#ef3b2c", "#f46a5e"], ["#67000d", "#8a2530"]],
    W: [["#756bb1", "#958dc6"], ["#54278f", "#7450a8"], ["#9e9ac8", "#bab7d8"], ["#3f007d", "#5f2a98"]],
  };
  const FLAT = { SEND_F: "#2ca02c", SEND_B: "#98df8a", ALLREDUCE: "#8c564b", STEP: "#7f7f7f", other: "#bbbbbb" };
  const LEGEND = [["F", "forward", "#1f77b4"], ["B", "backward", "#e6550d"], ["I", "input gradient", "#d62728"],
    ["W", "weight gradient", "#756bb1"], ["SEND_F", "send activation", FLAT.SEND_F], ["SEND_B", "send gradient", FLAT.SEND_B],
    ["ALLREDUCE", "all-reduce", FLAT.ALLREDUCE], ["STEP", "optimizer step", FLAT.STEP], ["other", "other", FLAT.other]];
  // aggregate classes (stacked in this order from the bottom of a row)
  const CLASS_OF = [0, 1, 2, 3, 4, 4, 5, 6, 6];
  const CLASS_COLOR = ["#1f77b4", "#e6550d", "#d62728", "#756bb1", "#2ca02c", "#8c564b", "#9a9a9a"];
  const AGGREGATE_PX = 4;
  const BUCKET_PX = 3;  // CSS pixels per column of the aggregated view
  const AXIS_H = 36;

  const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));

  function parseAction(name) {
    const m = ACTION_RE.exec(String(name).trim());
    if (!m) return { kind: "other", replica: 0, stage: null, mb0: -1, mb1: -1 };
    const kind = m[3] === "OPT" ? "STEP" : m[3];
    const mb0 = m[4] == null ? -1 : +m[4];
    return { kind, replica: m[1] ? +m[1] : 0, stage: m[2] == null ? null : +m[2], mb0, mb1: m[5] != null ? +m[5] : mb0 };
  }

  // one lane of one row as columns sorted by start; maxDur bounds the backward walk of range queries
  function lane(events) {
    let sorted = true;
    for (let i = 1; i < events.length && sorted; i++) sorted = events[i - 1][1] <= events[i][1];
    if (!sorted) events.sort((a, b) => a[1] - b[1]);
    const n = events.length;
    const L = { n, s: new Float64Array(n), e: new Float64Array(n), k: new Uint8Array(n), rep: new Uint8Array(n),
      mb0: new Int32Array(n), mb1: new Int32Array(n), name: new Array(n), peer: new Int32Array(n), maxDur: 0 };
    for (let i = 0; i < n; i++) {
      const [name, s, e, peer, a] = events[i];
      L.s[i] = s; L.e[i] = e; L.k[i] = K[a.kind]; L.rep[i] = a.replica; L.mb0[i] = a.mb0; L.mb1[i] = a.mb1;
      L.name[i] = name; L.peer[i] = peer == null ? -1 : peer;
      if (e - s > L.maxDur) L.maxDur = e - s;
    }
    return L;
  }

  function prepare(doc) {
    const rows = [];
    let makespan = 0;
    const kinds = new Set();
    let mbMax = -1;
    for (const row of doc.rows || []) {
      const compute = [], comm = [];
      for (const ev of row) {
        const [name, s, e, peer] = ev;
        if (!(e > s)) continue;
        const a = parseAction(name);
        if (a.kind === "RECV_F" || a.kind === "RECV_B") continue;
        kinds.add(a.kind);
        if (a.mb1 > mbMax) mbMax = a.mb1;
        (COMM.has(K[a.kind]) ? comm : compute).push([name, s, e, peer, a]);
        if (e > makespan) makespan = e;
      }
      rows.push({ compute: lane(compute), comm: lane(comm) });
    }
    return { rows, makespan: doc.makespan || makespan, kinds, mbMax };
  }

  function lowerBound(arr, n, x) {
    let lo = 0, hi = n;
    while (lo < hi) { const m = (lo + hi) >> 1; if (arr[m] < x) lo = m + 1; else hi = m; }
    return lo;
  }

  // ---- axis ---------------------------------------------------------------------------------------------
  function unitFor(span) {
    if (span >= 2) return { div: 1, name: "s" };
    if (span >= 2e-3) return { div: 1e-3, name: "ms" };
    return { div: 1e-6, name: "µs" };
  }
  function niceStep(raw) {
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    const f = raw / p;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 2.5 ? 2.5 : f <= 5 ? 5 : 10) * p;
  }
  // t in the unit of `scale` (default: t's own), four significant digits
  function fmtTime(t, scale) {
    const u = unitFor(scale || Math.abs(t));
    const v = t / u.div;
    const d = v === 0 ? 0 : Math.abs(v) >= 100 ? 1 : Math.abs(v) >= 10 ? 2 : 3;
    return v.toFixed(d) + " " + u.name;
  }

  // rectangles grouped by colour: one path and one fill per colour
  class Batch {
    constructor() { this.paths = new Map(); this.all = []; }
    rect(color, x, y, w, h) {
      let p = this.paths.get(color);
      if (!p) { p = new Path2D(); this.paths.set(color, p); }
      p.rect(x, y, w, h);
      this.all.push(x, y, w, h);
    }
    fill(ctx, alpha) {
      ctx.globalAlpha = alpha;
      for (const [color, p] of this.paths) { ctx.fillStyle = color; ctx.fill(p); }
      ctx.globalAlpha = 1;
    }
    outline(ctx) {
      ctx.strokeStyle = "#111";
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      const a = this.all;
      for (let i = 0; i < a.length; i += 4) ctx.rect(a[i] + 0.75, a[i + 1] + 0.75, Math.max(0.5, a[i + 2] - 1.5), a[i + 3] - 1.5);
      ctx.stroke();
    }
  }

  // ---- the chart ------------------------------------------------------------------------------------------
  class Timeline {
    constructor(el, doc, opts) {
      const t0 = performance.now();
      this.el = el;
      this.opts = opts;
      this.data = prepare(doc);
      // replicated stages (PipeDream's 1f1b-rr / pipedream-rr): the document names each row's replica and its
      // stage (row_labels, row_stages); rows of one stage share a background and a rule separates the stages
      const n = this.data.rows.length;
      const named = Array.isArray(doc.row_labels) && doc.row_labels.length === n;
      this.labels = opts.labels || (named ? doc.row_labels : this.data.rows.map((_, d) => "P" + d));
      this.stages = Array.isArray(doc.row_stages) && doc.row_stages.length === n ? doc.row_stages : null;
      this.shade = this.data.rows.map((_, d) => (this.stages ? this.stages[d] : d) % 2);
      this.full = [0, Math.max(opts.xmax || 0, this.data.makespan) || 1];
      this.x0 = this.full[0];
      this.x1 = this.full[1];
      this.highlight = null;
      this.group = opts.group || null;
      this.build();
      this.draw();
      if (this.group) this.group.add(this);
      el.dataset.drawMs = (performance.now() - t0).toFixed(1);
      (window.__timelineDraws = window.__timelineDraws || []).push({ id: el.id || el.dataset.rank || "", ms: +el.dataset.drawMs,
        devices: this.data.rows.length, actions: this.data.rows.reduce((a, r) => a + r.compute.n + r.comm.n, 0) });
    }

    build() {
      const el = this.el;
      el.classList.add("tl");
      el.innerHTML = `
        <div class="tl-bar">
          <span class="tl-legend">${LEGEND.filter(([k]) => this.data.kinds.has(k) || (k === "STEP" && this.data.kinds.has("OPT")))
            .map(([, label, color]) => `<span class="tl-key"><i style="background:${color}"></i>${esc(label)}</span>`).join("")}</span>
          <span class="tl-tools">
            <button type="button" data-act="out" title="zoom out">−</button>
            <button type="button" data-act="in" title="zoom in">+</button>
            <button type="button" data-act="reset" title="whole iteration (double-click the chart)">reset</button>
            <label title="highlight one micro-batch on every device (or click an action)">micro-batch
              <input type="number" class="tl-mb" min="0" ${this.data.mbMax >= 0 ? `max="${this.data.mbMax}"` : "disabled"} placeholder="–"></label>
          </span>
        </div>
        <div class="tl-status muted"></div>
        <div class="tl-canvas-wrap"><canvas></canvas><div class="tl-tip" hidden></div><div class="tl-brush" hidden></div></div>`;
      this.canvas = el.querySelector("canvas");
      this.canvas.setAttribute("role", "img");
      this.canvas.setAttribute("aria-label", `timeline of ${this.data.rows.length} devices over ${fmtTime(this.full[1])}`);
      this.tip = el.querySelector(".tl-tip");
      this.brush = el.querySelector(".tl-brush");
      this.status = el.querySelector(".tl-status");
      this.mbInput = el.querySelector(".tl-mb");
      const n = this.data.rows.length;
      this.rowH = Math.max(10, Math.min(34, Math.floor(520 / Math.max(1, n))));
      this.height = n * this.rowH + AXIS_H + 4;
      const ctx = this.canvas.getContext("2d");
      ctx.font = "11px system-ui, sans-serif";
      const widest = Math.max(20, ...this.labels.map((l) => ctx.measureText(l).width));
      this.gutter = Math.min(190, Math.ceil(widest) + 10);
      el.querySelector(".tl-bar").addEventListener("click", (ev) => {
        const b = ev.target.closest("button[data-act]");
        if (!b) return;
        const c = (this.x0 + this.x1) / 2, h = (this.x1 - this.x0) / 2;
        if (b.dataset.act === "in") this.setRange(c - h / 2, c + h / 2, true);
        else if (b.dataset.act === "out") this.setRange(c - h * 2, c + h * 2, true);
        else this.setRange(this.full[0], this.full[1], true);
      });
      this.mbInput.addEventListener("input", () => {
        const v = this.mbInput.value.trim();
        this.setHighlight(v === "" || isNaN(+v) ? null : +v, true);
      });
      this.wire();
      // the canvas keeps the width it was drawn at: redraw when the chart's box no longer has that width
      this.resizer = new ResizeObserver(() => { if (this.boxWidth() !== this.cssW) this.draw(); });
      this.resizer.observe(el);
    }

    // the CSS width the chart is drawn at: its box's (at least 200 px; 600 before it is laid out)
    boxWidth() { return Math.max(200, this.el.clientWidth || this.canvas.parentElement.clientWidth || 600); }

    // ---- interaction ----
    xToT(x) { return this.x0 + ((x - this.gutter) / (this.cssW - this.gutter)) * (this.x1 - this.x0); }
    tToX(t) { return this.gutter + ((t - this.x0) / (this.x1 - this.x0)) * (this.cssW - this.gutter); }

    wire() {
      const c = this.canvas;
      let down = null;
      const pos = (ev) => { const r = c.getBoundingClientRect(); return [ev.clientX - r.left, ev.clientY - r.top]; };
      c.addEventListener("mousedown", (ev) => { if (ev.button === 0) { down = pos(ev); ev.preventDefault(); } });
      window.addEventListener("mousemove", (ev) => {
        if (!down) return;
        const [x] = pos(ev);
        const a = Math.max(this.gutter, Math.min(down[0], x)), b = Math.min(this.cssW, Math.max(down[0], x));
        Object.assign(this.brush.style, { left: a + "px", width: (b - a) + "px", height: (this.height - AXIS_H) + "px" });
        this.brush.hidden = b - a < 4;
      });
      window.addEventListener("mouseup", (ev) => {
        if (!down) return;
        const [x, y] = pos(ev);
        const start = down;
        down = null;
        this.brush.hidden = true;
        if (Math.abs(x - start[0]) >= 4) {
          const a = this.xToT(Math.max(this.gutter, Math.min(start[0], x))), b = this.xToT(Math.min(this.cssW, Math.max(start[0], x)));
          this.setRange(a, b, true);
        } else {
          const hit = this.hit(x, y);
          this.setHighlight(hit && hit.lane.mb0[hit.i] >= 0 && !(hit.lane.mb0[hit.i] <= this.highlight && this.highlight <= hit.lane.mb1[hit.i])
            ? hit.lane.mb0[hit.i] : null, true);
        }
      });
      c.addEventListener("dblclick", () => this.setRange(this.full[0], this.full[1], true));
      c.addEventListener("wheel", (ev) => {
        if (!(ev.ctrlKey || ev.metaKey || ev.shiftKey)) return;  // plain wheel scrolls the page
        ev.preventDefault();
        const span = this.x1 - this.x0;
        if (ev.shiftKey && !ev.ctrlKey) {
          const dt = (ev.deltaY || ev.deltaX) / (this.cssW - this.gutter) * span;
          this.setRange(this.x0 + dt, this.x1 + dt, true);
          return;
        }
        const [x] = pos(ev);
        const t = this.xToT(x);
        const f = Math.pow(1.0015, ev.deltaY);
        this.setRange(t - (t - this.x0) * f, t + (this.x1 - t) * f, true);
      }, { passive: false });
      c.addEventListener("mousemove", (ev) => {
        if (down) return;
        const [x, y] = pos(ev);
        const hit = this.hit(x, y);
        if (!hit) { this.tip.hidden = true; return; }
        const L = hit.lane, i = hit.i;
        const to = L.peer[i] >= 0 ? " → P" + L.peer[i] : "";
        this.tip.textContent = `${L.name[i]}${to} on ${this.labels[hit.row]}: ${fmtTime(L.s[i], this.x1)} – ` +
          `${fmtTime(L.e[i], this.x1)} (${fmtTime(L.e[i] - L.s[i])})`;
        this.tip.hidden = false;
        const left = Math.min(x + 12, this.cssW - this.tip.offsetWidth - 4);
        Object.assign(this.tip.style, { left: Math.max(0, left) + "px", top: (y + 14) + "px" });
      });
      c.addEventListener("mouseleave", () => { this.tip.hidden = true; });
    }

    // the action under (x, y): compute on the upper part of a row, communication on its lane
    hit(x, y) {
      if (x < this.gutter || y >= this.data.rows.length * this.rowH) return null;
      const row = Math.floor(y / this.rowH);
      const inRow = y - row * this.rowH;
      const L = inRow > this.rowH * 0.72 ? this.data.rows[row].comm : this.data.rows[row].compute;
      const t = this.xToT(x);
      const slop = 3 * (this.x1 - this.x0) / (this.cssW - this.gutter);  // 3 px
      let i = lowerBound(L.s, L.n, t + slop) - 1;
      for (; i >= 0 && L.s[i] >= t - L.maxDur - slop; i--) {
        if (L.s[i] - slop <= t && t <= L.e[i] + slop) return { row, lane: L, i };
      }
      return null;
    }

    setRange(a, b, propagate) {
      const full = this.full[1] - this.full[0];
      let span = Math.max(b - a, full * 1e-6);
      if (span > full) span = full;
      let x0 = Math.max(this.full[0], Math.min(a, this.full[1] - span));
      this.x0 = x0;
      this.x1 = x0 + span;
      this.draw();
      if (propagate && this.group) this.group.range(this, this.x0, this.x1);
    }

    setHighlight(mb, propagate) {
      this.highlight = mb;
      if (document.activeElement !== this.mbInput) this.mbInput.value = mb == null ? "" : String(mb);
      this.draw();
      if (propagate && this.group) this.group.highlight(this, mb);
    }

    // ---- drawing ----
    draw() {
      const t0 = performance.now();
      const c = this.canvas;
      const dpr = window.devicePixelRatio || 1;
      const cssW = this.boxWidth();
      this.cssW = cssW;
      c.style.width = cssW + "px";
      c.style.height = this.height + "px";
      c.width = Math.round(cssW * dpr);
      c.height = Math.round(this.height * dpr);
      const ctx = c.getContext("2d");
      ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
      ctx.clearRect(0, 0, cssW, this.height);
      ctx.font = "11px system-ui, sans-serif";
      const rows = this.data.rows;
      const plotW = cssW - this.gutter;
      const pxPerS = plotW / (this.x1 - this.x0);
      // mode: aggregate when the compute actions in view average under AGGREGATE_PX pixels
      let visible = 0;
      for (const r of rows) { const [lo, hi] = this.visibleRange(r.compute); visible += hi - lo; }
      const avgPx = visible ? (plotW * rows.length) / visible : Infinity;
      const mode = avgPx < AGGREGATE_PX ? "aggregate" : "detail";
      // rows: alternating backgrounds and labels
      for (let d = 0; d < rows.length; d++) {
        const y = d * this.rowH;
        ctx.fillStyle = this.shade[d] ? "#f0f2f6" : "#ffffff";
        ctx.fillRect(0, y, cssW, this.rowH);
        ctx.fillStyle = "#333";
        ctx.textBaseline = "middle";
        ctx.textAlign = "right";
        ctx.fillText(this.clip(ctx, this.labels[d], this.gutter - 8), this.gutter - 6, y + this.rowH * 0.38);
      }
      ctx.save();
      ctx.beginPath();
      ctx.rect(this.gutter, 0, plotW, rows.length * this.rowH);
      ctx.clip();
      // shapes are collected into one path per colour and filled once each (a fill per shape is what
      // makes tens of thousands of actions slow, on canvas as in SVG)
      const batch = new Batch();
      const lanes = [];
      for (let d = 0; d < rows.length; d++) {
        const y = d * this.rowH;
        const hC = Math.max(4, Math.round(this.rowH * 0.68)), yC = y + 2;
        const hM = Math.max(2, Math.round(this.rowH * 0.2)), yM = y + this.rowH - hM - 1;
        lanes.push([rows[d].compute, yC, hC, true], [rows[d].comm, yM, hM, false]);
      }
      const dim = this.highlight != null;
      if (mode === "aggregate") {
        this.aggregateImage(ctx, lanes, plotW, dpr, pxPerS, dim);
        const hl = new Batch();
        for (const [L, y, h] of lanes) this.highlighted(hl, L, y, h, pxPerS);
        hl.fill(ctx, 1);
        hl.outline(ctx);
      } else {
        const labels = [];
        for (const [L, y, h, withLabels] of lanes) this.detail(batch, L, y, h, pxPerS, withLabels ? labels : null);
        batch.fill(ctx, dim ? 0.22 : 1);
        const hl = new Batch();
        for (const [L, y, h] of lanes) this.highlighted(hl, L, y, h, pxPerS);
        hl.fill(ctx, 1);
        hl.outline(ctx);
        ctx.fillStyle = "#fff";
        ctx.textAlign = "center";
        ctx.textBaseline = "middle";
        for (const [text, x, y] of labels) ctx.fillText(text, x, y);
      }
      ctx.restore();
      if (this.stages) {  // a rule between the stages' groups of replica rows
        ctx.strokeStyle = "#8a94a6";
        ctx.lineWidth = 1;
        ctx.beginPath();
        for (let d = 1; d < rows.length; d++) {
          if (this.stages[d] === this.stages[d - 1]) continue;
          const y = d * this.rowH + 0.5;
          ctx.moveTo(0, y);
          ctx.lineTo(cssW, y);
        }
        ctx.stroke();
      }
      this.drawAxis(ctx, cssW, rows.length * this.rowH);
      const el = this.el;
      el.dataset.devices = String(rows.length);
      el.dataset.rowLabels = this.labels.join("|");
      if (this.stages) el.dataset.rowStages = this.stages.join(",");
      el.dataset.mode = mode;
      el.dataset.x0 = String(this.x0);
      el.dataset.x1 = String(this.x1);
      el.dataset.highlight = this.highlight == null ? "" : String(this.highlight);
      el.dataset.drawn = "1";
      el.dataset.lastDrawMs = (performance.now() - t0).toFixed(1);
      const span = this.x1 - this.x0;
      const zoomed = this.x0 > this.full[0] || this.x1 < this.full[1];
      this.status.textContent = `${fmtTime(this.x0, this.x1)} – ${fmtTime(this.x1, this.x1)}` +
        (zoomed ? ` of ${fmtTime(this.full[1])}` : " (whole iteration)") +
        (mode === "aggregate" ? " · aggregated: each column shows the share of its time per kind; drag across the chart to zoom in" :
          " · drag to zoom, double-click to reset") +
        (this.highlight != null ? ` · micro-batch ${this.highlight} highlighted` : " · click an action to highlight its micro-batch");
    }

    clip(ctx, text, w) {
      if (ctx.measureText(text).width <= w) return text;
      let s = text;
      while (s.length > 1 && ctx.measureText(s + "…").width > w) s = s.slice(0, -1);
      return s + "…";
    }

    visibleRange(L) {
      return [lowerBound(L.s, L.n, this.x0 - L.maxDur), lowerBound(L.s, L.n, this.x1)];
    }

    color(L, i) {
      const kind = KINDS[L.k[i]];
      const sh = SHADES[kind];
      if (!sh) return FLAT[kind] || FLAT.other;
      return sh[L.rep[i] % sh.length][(L.mb0[i] >= 0 ? L.mb0[i] : 0) % 2];
    }

    isHighlighted(L, i) {
      return this.highlight != null && L.mb0[i] <= this.highlight && this.highlight <= L.mb1[i];
    }

    // every action in view as a block; a one-pixel separator after each block wide enough, so neighbours
    // never merge into a band; micro-batch numbers where they fit (collected in `labels`)
    detail(batch, L, y, h, pxPerS, labels) {
      const [lo, hi] = this.visibleRange(L);
      for (let i = lo; i < hi; i++) {
        if (L.e[i] < this.x0) continue;
        const x = this.gutter + (L.s[i] - this.x0) * pxPerS;
        const w = Math.max(0.75, (L.e[i] - L.s[i]) * pxPerS);
        batch.rect(this.color(L, i), x, y, w, h);
        if (w >= 3) batch.rect("#ffffff", Math.round(x + w) - 1, y, 1, h);
        if (labels && L.mb0[i] >= 0 && w > 14 && h >= 10) {
          const text = L.mb1[i] !== L.mb0[i] ? `${L.mb0[i]}-${L.mb1[i]}` : String(L.mb0[i]);
          if (text.length * 6.5 + 4 <= w) labels.push([text, x + w / 2, y + h / 2 + 0.5]);
        }
      }
    }

    // Aggregated view, written pixel by pixel (putImageData): each device-pixel column of a lane shows the
    // share of its time per class, stacked from the bottom of the lane; idle time stays background.
    aggregateImage(ctx, lanes, plotW, dpr, pxPerS, dim) {
      const W = Math.max(1, Math.round(plotW * dpr)), H = Math.max(1, Math.round(this.data.rows.length * this.rowH * dpr));
      const img = ctx.createImageData(W, H);
      const px = new Uint32Array(img.data.buffer);
      const rgba = (r, g, b) => (255 << 24) | (b << 16) | (g << 8) | r;  // little-endian RGBA in one word
      const hex = (c) => [1, 3, 5].map((i) => parseInt(c.slice(i, i + 2), 16));
      const fade = (v) => Math.round(dim ? 255 + (v - 255) * 0.3 : v);
      const colors = CLASS_COLOR.map((c) => rgba(...hex(c).map(fade)));
      const bg = [rgba(255, 255, 255), rgba(240, 242, 246)];
      const rowPx = this.rowH * dpr;
      const last = this.shade.length - 1;
      for (let y = 0; y < H; y++) px.fill(bg[this.shade[Math.min(last, Math.floor(y / rowPx))]], y * W, (y + 1) * W);
      const nc = CLASS_COLOR.length;
      const bw = Math.max(1, Math.round(BUCKET_PX * dpr));  // device pixels per column
      const nb = Math.ceil(W / bw);
      const acc = new Float64Array(nb * nc);
      const colT = bw / (pxPerS * dpr);  // seconds per column
      for (const [L, y, h] of lanes) {
        acc.fill(0);
        const [lo, hi] = this.visibleRange(L);
        for (let i = lo; i < hi; i++) {
          const s = Math.max(L.s[i], this.x0), e = Math.min(L.e[i], this.x1);
          if (e <= s) continue;
          const cls = CLASS_OF[L.k[i]];
          let b = Math.floor((s - this.x0) / colT);
          const bEnd = Math.min(nb - 1, Math.floor((e - this.x0) / colT));
          for (; b <= bEnd; b++) {
            const bs = this.x0 + b * colT;
            acc[b * nc + cls] += Math.min(e, bs + colT) - Math.max(s, bs);
          }
        }
        const top = Math.round(y * dpr), hPx = Math.round(h * dpr), bottom = top + hPx;  // rows [top, bottom)
        for (let b = 0; b < nb; b++) {
          let yy = bottom, share = 0;
          const x0 = b * bw, x1 = Math.min(W, x0 + bw);
          for (let k = 0; k < nc; k++) {
            const v = acc[b * nc + k];
            if (v <= 0) continue;
            share += v / colT;
            const to = Math.max(top, bottom - Math.round(Math.min(1, share) * hPx));
            for (; yy > to; yy--) px.fill(colors[k], (yy - 1) * W + x0, (yy - 1) * W + x1);
          }
        }
      }
      ctx.putImageData(img, Math.round(this.gutter * dpr), 0);
    }

    // the highlighted micro-batch's actions, at least 2 px wide, outlined
    highlighted(batch, L, y, h, pxPerS) {
      if (this.highlight == null) return;
      const [lo, hi] = this.visibleRange(L);
      for (let i = lo; i < hi; i++) {
        if (!this.isHighlighted(L, i) || L.e[i] < this.x0) continue;
        const x = this.gutter + (L.s[i] - this.x0) * pxPerS;
        const w = Math.max(2, (L.e[i] - L.s[i]) * pxPerS);
        batch.rect(this.color(L, i), x, y, w, h);
      }
    }

    drawAxis(ctx, cssW, top) {
      const span = this.x1 - this.x0;
      const u = unitFor(this.x1);  // seconds once the iteration is long, whatever the zoom
      const plotW = cssW - this.gutter;
      const step = niceStep(span / Math.max(2, Math.floor(plotW / 90)));
      ctx.strokeStyle = "#999";
      ctx.lineWidth = 1;
      ctx.beginPath();
      ctx.moveTo(this.gutter, top + 0.5);
      ctx.lineTo(cssW, top + 0.5);
      ctx.stroke();
      ctx.fillStyle = "#444";
      ctx.textAlign = "center";
      ctx.textBaseline = "top";
      const ticks = [];
      for (let t = Math.ceil(this.x0 / step) * step; t <= this.x1 + step * 1e-9; t += step) {
        const x = this.gutter + (t - this.x0) / span * plotW;
        ctx.strokeStyle = "rgba(0,0,0,0.08)";
        ctx.beginPath();
        ctx.moveTo(Math.round(x) + 0.5, 0);
        ctx.lineTo(Math.round(x) + 0.5, top + 4);
        ctx.stroke();
        const label = String(+(t / u.div).toFixed(6));  // 0.25, 12.4, 30: no trailing zeros
        ticks.push(label);
        const tw = ctx.measureText(label).width / 2;
        ctx.fillText(label, Math.min(cssW - tw - 1, Math.max(this.gutter + tw, x)), top + 5);
      }
      ctx.textAlign = "center";
      ctx.fillStyle = "#666";
      ctx.fillText("time (" + u.name + ")", this.gutter + plotW / 2, top + 19);
      this.el.dataset.unit = u.name;
      this.el.dataset.ticks = ticks.join(",");
    }
  }

  // timelines that share range and highlight (the cards of a comparison, a job's predicted and measured)
  function group() {
    const members = new Set();
    return {
      add(t) {  // one gutter for all, so their time axes line up
        members.add(t);
        const g = Math.max(...[...members].map((m) => m.gutter));
        for (const m of members) if (m.gutter !== g) { m.gutter = g; m.draw(); }
      },
      range(src, a, b) { for (const t of members) if (t !== src && t.el.isConnected) t.setRange(a, b, false); },
      highlight(src, mb) { for (const t of members) if (t !== src && t.el.isConnected) t.setHighlight(mb, false); },
    };
  }

  function draw(el, doc, opts = {}) {
    if (el.__timeline) el.__timeline.resizer.disconnect();
    el.__timeline = new Timeline(el, doc, opts);
    return el.__timeline;
  }

  return { draw, group, parseAction, fmtTime, unitFor };
})();
