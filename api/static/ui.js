// pipeplan UI: shared helpers (API calls with the bearer token, formatting, plotly loading, charts).
"use strict";

const PP = (() => {
  const TOKEN_KEY = "pipeplan.token";
  const token = () => localStorage.getItem(TOKEN_KEY) || "";
  const openReads = () => document.body.dataset.openReads === "1";

  // fetch a JSON endpoint; throws Error(detail) with .status on non-2xx
  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    const t = token();
    if (t) headers.Authorization = "Bearer " + t;
    const opts = { method, headers };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      opts.body = typeof body === "string" ? body : JSON.stringify(body);
    }
    const r = await fetch(path, opts);
    const text = await r.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (e) { data = { detail: text }; }
    if (!r.ok) {
      const err = new Error((data && data.detail) || r.statusText || ("HTTP " + r.status));
      err.status = r.status;
      throw err;
    }
    return { status: r.status, data };
  }
  const get = (path) => api("GET", path).then((r) => r.data);

  function notice(msg, kind) {
    const el = document.getElementById("notice");
    if (!el) return;
    el.hidden = !msg;
    el.className = "notice " + (kind || "");
    el.textContent = msg || "";
  }

  // run the page's loader only when reads can succeed (no request is sent that must fail with 401)
  function start(fn) {
    const run = () => {
      if (!token() && !openReads()) {
        notice("Enter the API token (top right) to see this page. Reads need no token when the server runs " +
               "with PIPEPLAN_OPEN_READS=1; creating plans and jobs needs the admin token.", "warn");
        return;
      }
      Promise.resolve().then(fn).catch((e) => notice(String(e.message || e), "error"));
    };
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", run);
    else run();
  }

  function initToken() {
    const form = document.getElementById("token-form");
    if (!form) return;
    const input = document.getElementById("token");
    const state = document.getElementById("token-state");
    state.textContent = token() ? "token set" : (openReads() ? "reads open" : "no token");
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const v = input.value.trim();
      if (v) localStorage.setItem(TOKEN_KEY, v); else localStorage.removeItem(TOKEN_KEY);
      location.reload();
    });
  }
  document.addEventListener("DOMContentLoaded", initToken);

  // ---- formatting --------------------------------------------------------------------------------
  const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  const num = (x) => typeof x === "number" && isFinite(x);
  function fmtTime(s) {
    if (!num(s)) return "–";
    if (s >= 1) return s.toPrecision(4) + " s";
    if (s >= 1e-3) return (s * 1e3).toPrecision(4) + " ms";
    return (s * 1e6).toPrecision(4) + " µs";
  }
  const fmtGiB = (b) => (num(b) ? (b / 2 ** 30).toFixed(2) + " GiB" : "–");
  const fmtPct = (x) => (num(x) ? (100 * x).toFixed(1) + " %" : "–");
  const fmtNum = (x, d = 1) => (num(x) ? x.toFixed(d) : "–");
  const fmtErr = (x) => (num(x) ? (x >= 0 ? "+" : "") + (100 * x).toFixed(1) + " %" : "–");
  function fmtDate(s) {
    if (!s) return "–";
    const d = new Date(s);
    return isNaN(d) ? s : d.toLocaleString();
  }
  function ago(s) {
    if (!s) return "–";
    const sec = (Date.now() - new Date(s).getTime()) / 1000;
    if (sec < 60) return Math.max(0, sec).toFixed(0) + " s ago";
    if (sec < 3600) return (sec / 60).toFixed(0) + " min ago";
    return (sec / 3600).toFixed(1) + " h ago";
  }
  function schedText(c) {
    const p = ["chunks", "waves", "pipelines", "concat"].filter((k) => c[k] != null).map((k) => k + "=" + c[k]);
    return c.schedule + (p.length ? " (" + p.join(", ") + ")" : "");
  }
  const stateBadge = (s) => `<span class="badge ${esc(s)}" data-state="${esc(s)}">${esc(s)}</span>`;

  // ---- plotly (served by the API from the plotly package; loaded on first chart) --------------
  let plotlyPromise = null;
  function plotly() {
    if (window.Plotly) return Promise.resolve(window.Plotly);
    if (!plotlyPromise) {
      plotlyPromise = new Promise((resolve, reject) => {
        const s = document.createElement("script");
        s.src = "/ui/vendor/plotly.min.js";
        s.onload = () => resolve(window.Plotly);
        s.onerror = () => reject(new Error("could not load /ui/vendor/plotly.min.js"));
        document.head.appendChild(s);
      });
    }
    return plotlyPromise;
  }
  const PLOT_CONFIG = { displaylogo: false, responsive: true, modeBarButtonsToRemove: ["lasso2d", "select2d"] };

  // ---- timelines ----------------------------------------------------------------------------------
  const ACTION_RE = /^(?:r(\d+):)?(\d+)?(SEND_F|SEND_B|RECV_F|RECV_B|ALLREDUCE|STEP|OPT|F|B|I|W)(\d+)?(?:-(\d+))?$/;
  const PALETTE = {
    F: ["#1f77b4", "#6baed6", "#08519c", "#9ecae1", "#3182bd", "#c6dbef", "#084594", "#4292c6"],
    B: ["#e6550d", "#fdae6b", "#a63603", "#fdd0a2", "#f16913", "#fee6ce", "#8c2d04", "#fd8d3c"],
    I: ["#d62728", "#ff9896", "#a50f15", "#fcbba1", "#ef3b2c", "#fee0d2", "#67000d", "#fb6a4a"],
    W: ["#756bb1", "#bcbddc", "#54278f", "#dadaeb", "#807dba", "#efedf5", "#3f007d", "#9e9ac8"],
  };
  const OTHER = { SEND_F: "#2ca02c", SEND_B: "#98df8a", ALLREDUCE: "#8c564b", STEP: "#7f7f7f", OPT: "#7f7f7f", other: "#bbbbbb" };

  function parseAction(name) {
    const m = ACTION_RE.exec(String(name).trim());
    if (!m) return { kind: "other", replica: 0, mb: "" };
    const mb = m[4] == null ? "" : (m[5] != null ? m[4] + "-" + m[5] : m[4]);
    return { kind: m[3], replica: m[1] ? +m[1] : 0, stage: m[2] == null ? null : +m[2], mb };
  }

  // doc: {rows: [[[action, start, end(, peer)], ...] per device], labels?: [...]}; one row per device,
  // compute blocks coloured by kind and replica (direction / wave) with their micro-batch numbers,
  // communication (sends, all-reduce) on a thin lane under each row.
  async function drawTimeline(el, doc, opts = {}) {
    const P = await plotly();
    const rows = doc.rows || [];
    const n = rows.length;
    const groups = new Map();
    const comm = new Set(["SEND_F", "SEND_B", "ALLREDUCE"]);
    rows.forEach((row, d) => {
      for (const ev of row) {
        const [name, s, e, peer] = ev;
        if (!(e > s)) continue;
        const a = parseAction(name);
        const compute = PALETTE[a.kind] !== undefined;
        const key = compute ? a.kind + (a.replica ? " r" + a.replica : "") : a.kind;
        let g = groups.get(key);
        if (!g) {
          const color = compute ? PALETTE[a.kind][a.replica % 8] : (OTHER[a.kind] || OTHER.other);
          g = { key, compute, lane: comm.has(a.kind) ? "comm" : "compute", color, y: [], base: [], x: [], text: [], hover: [] };
          groups.set(key, g);
        }
        g.y.push(d);
        g.base.push(s * 1e3);
        g.x.push((e - s) * 1e3);
        g.text.push(compute ? a.mb : "");
        const to = peer != null && peer >= 0 ? " → P" + peer : "";
        g.hover.push(`${esc(name)}${to} on ${opts.labels ? esc(opts.labels[d]) : "P" + d}: ${(s * 1e3).toFixed(3)}–${(e * 1e3).toFixed(3)} ms`);
      }
    });
    const order = ["F", "B", "I", "W"];
    const sorted = [...groups.values()].sort((a, b) => {
      const ka = order.indexOf(a.key[0]) >= 0 && a.compute ? order.indexOf(a.key[0]) : 9;
      const kb = order.indexOf(b.key[0]) >= 0 && b.compute ? order.indexOf(b.key[0]) : 9;
      return ka - kb || a.key.localeCompare(b.key);
    });
    const traces = sorted.map((g) => ({
      type: "bar", orientation: "h", name: g.key, y: g.y, base: g.base, x: g.x, text: g.text,
      customdata: g.hover, hovertemplate: "%{customdata}<extra></extra>",
      marker: { color: g.color, line: { color: "rgba(0,0,0,0.35)", width: g.compute ? 0.5 : 0 } },
      width: g.lane === "comm" ? 0.18 : 0.62, offset: g.lane === "comm" ? 0.24 : -0.42,
      textposition: "inside", insidetextanchor: "middle", textfont: { size: 10, color: "#111" },
      cliponaxis: true,
    }));
    const labels = opts.labels || rows.map((_, d) => "P" + d);
    const height = Math.max(150, 70 + 34 * n);
    const layout = {
      barmode: "overlay", height, margin: { l: opts.labels ? 185 : 40, r: 10, t: 24, b: 40 },
      uniformtext: { mode: "hide", minsize: 8 },
      xaxis: { title: { text: "time (ms)", standoff: 4 }, zeroline: false, rangemode: "tozero" },
      yaxis: { tickvals: rows.map((_, d) => d), ticktext: labels, autorange: "reversed", range: [n - 0.5, -0.5], fixedrange: true },
      legend: { orientation: "h", y: 1.02, yanchor: "bottom", x: 0, font: { size: 10 } },
      showlegend: true,
    };
    if (opts.xmax) layout.xaxis.range = [0, opts.xmax * 1e3];
    el.dataset.devices = String(n);
    await P.react(el, traces, layout, PLOT_CONFIG);
    el.dataset.drawn = "1";
  }

  async function drawMemory(el, cand) {
    const P = await plotly();
    const mem = cand.memory || [];
    const cap = cand.memory_capacity;
    const gib = (b) => b / 2 ** 30;
    const traces = [{
      type: "bar", x: mem.map((_, d) => "P" + d), y: mem.map(gib), name: "peak memory",
      marker: { color: mem.map((m) => (cap && m > cap ? "#d62728" : "#4c9a2a")) },
      hovertemplate: "%{x}: %{y:.2f} GiB<extra></extra>",
    }];
    const layout = {
      height: 190, margin: { l: 50, r: 10, t: 10, b: 30 }, showlegend: false,
      yaxis: { title: { text: "GiB" }, rangemode: "tozero", range: [0, Math.max(gib(cap || 0), ...mem.map(gib)) * 1.08] },
      shapes: cap ? [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: gib(cap), y1: gib(cap), line: { color: "#d62728", dash: "dash", width: 1.5 } }] : [],
      annotations: cap ? [{ xref: "paper", x: 1, xanchor: "right", y: gib(cap), yanchor: "bottom", text: "capacity " + gib(cap).toFixed(0) + " GiB", showarrow: false, font: { size: 10, color: "#d62728" } }] : [],
    };
    await P.react(el, traces, layout, PLOT_CONFIG);
  }

  async function drawBreakdown(el, cands) {
    const P = await plotly();
    const parts = [["compute", "#1f77b4"], ["bubble", "#c7c7c7"], ["allreduce_exposed", "#8c564b"], ["step", "#7f7f7f"]];
    const names = cands.map((c) => "rank " + (c.rank + 1));
    const traces = parts.map(([k, color]) => ({
      type: "bar", orientation: "h", name: k.replace("_", " "), y: names,
      x: cands.map((c) => ((c.breakdown || {})[k] || 0) * 1e3), marker: { color },
      hovertemplate: k + ": %{x:.4f} ms<extra>%{y}</extra>",
    }));
    const layout = {
      barmode: "stack", height: 80 + 40 * cands.length, margin: { l: 70, r: 10, t: 10, b: 40 },
      xaxis: { title: { text: "ms" } }, yaxis: { autorange: "reversed" },
      legend: { orientation: "h", y: -0.35 },
    };
    await P.react(el, traces, layout, PLOT_CONFIG);
  }

  return { api, get, notice, start, token, esc, num, fmtTime, fmtGiB, fmtPct, fmtNum, fmtErr, fmtDate, ago,
           schedText, stateBadge, plotly, drawTimeline, drawMemory, drawBreakdown, parseAction };
})();
