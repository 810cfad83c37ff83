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

  // run the page's loader only when reads can succeed (no request is sent that must fail with 401); without
  // a token it waits, and saving one runs it then (the page is never reloaded: what is typed in stays)
  let pending = null;
  // a page's loader failed: say why; where the page's own thing does not exist (/ui/plans/999999) its empty
  // frame (tables, forms) goes too
  function loadFailed(e) {
    notice(String(e.message || e), "error");
    if (e && e.status === 404) {
      for (const el of document.querySelectorAll("main > *")) {
        if (el.tagName !== "H1" && el.id !== "notice") el.hidden = true;
      }
      document.body.dataset.missing = "1";
    }
  }
  function start(fn) {
    const run = () => {
      if (!token() && !openReads()) {
        notice("Enter the API token (top right) to see this page. Reads need no token when the server runs " +
               "with PIPEPLAN_OPEN_READS=1; creating plans and jobs needs the admin token.", "warn");
        pending = fn;
        return;
      }
      Promise.resolve().then(fn).catch(loadFailed);
    };
    if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", run);
    else run();
  }

  function initToken() {
    const form = document.getElementById("token-form");
    if (!form) return;
    const input = document.getElementById("token");
    const state = document.getElementById("token-state");
    // the token's role from GET /whoami: a mistyped token says so here, not as the next page's 401
    let asked = 0;  // the latest question: an answer about a token replaced meanwhile is dropped
    const show = async () => {
      const mine = ++asked;
      state.classList.remove("error");
      state.title = "";
      if (!token()) { state.textContent = openReads() ? "reads open" : "no token"; return; }
      state.textContent = "token set";
      try {
        const who = (await api("GET", "/whoami")).data;
        if (mine !== asked) return;
        state.textContent = { admin: "admin token", registrar: "registration token", worker: "worker credential" }[who.role] || "token set";
        state.title = who.may || "";
      } catch (e) {
        if (mine === asked && e.status === 401) { state.textContent = "invalid token"; state.classList.add("error"); state.title = String(e.message || e); }
      }
    };
    show();
    form.addEventListener("submit", (ev) => {
      ev.preventDefault();
      const v = input.value.trim();
      if (v) localStorage.setItem(TOKEN_KEY, v); else localStorage.removeItem(TOKEN_KEY);
      input.value = "";
      show();
      document.dispatchEvent(new CustomEvent("pp-token", { detail: { set: !!v } }));
      if (pending && token()) {
        const fn = pending;
        pending = null;
        notice("");
        Promise.resolve().then(fn).catch(loadFailed);
      }
    });
  }
  document.addEventListener("DOMContentLoaded", initToken);

  // ---- formatting --------------------------------------------------------------------------------
  const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
  const num = (x) => typeof x === "number" && isFinite(x);
  function fmtTime(s) {
    if (!num(s)) return "–";
    if (s === 0) return "0 s";  // no bubble, nothing exposed: not "0.000 µs"
    if (s >= 1) return s.toPrecision(4) + " s";
    if (s >= 1e-3) return (s * 1e3).toPrecision(4) + " ms";
    return (s * 1e6).toPrecision(4) + " µs";
  }
  const fmtGiB = (b) => (num(b) ? (b / 2 ** 30).toFixed(2) + " GiB" : "–");
  // bytes in MiB below 1 GiB (a small model's own memory would read "0.00 GiB")
  const fmtBytes = (b) => (!num(b) ? "–" : b >= 2 ** 30 ? fmtGiB(b) : (b / 2 ** 20).toFixed(b >= 10 * 2 ** 20 ? 0 : 1) + " MiB");
  // a candidate's peak split: the model's own (weights, gradients, optimizer state, activations) and the reserve
  // set aside per device for the framework and workspace (the request's memory_reserve_bytes); plans stored
  // before the split have only the total
  const memorySplit = (c) => (num(c.memory_reserve) && num(c.model_peak_memory)
    ? { model: c.model_peak_memory, reserve: c.memory_reserve } : null);
  const MEMORY_TITLE = "the fullest device's peak: the model's own memory (weights, gradients, optimizer state, " +
    "activations) + the reserve set aside per device for the framework and workspace (the request's " +
    "memory_reserve_bytes; by default 2 GiB on GPUs, 320 MiB on CPU processes) / the device's capacity; a candidate fits when model + reserve is at most the capacity";
  // the dispatch forms' model field (the plan page's and the job page's "dispatch again"): what is wrong with it,
  // or null. A real-compute job builds a model of the page's presets list; an emulated one builds none
  function modelProblem(model, emulate) {
    const known = [...document.querySelectorAll("#model-presets option")].map((o) => o.value);
    if (!model && !emulate) return "Model: give the model the executor builds (an emulated job needs none)";
    if (model && known.length && !known.includes(model)) return `Model: unknown model “${model}”; known: ${known.join(", ")}`;
    return null;
  }
  // the dispatch forms' iterations field (the plan page's and the job page's clone form): what is wrong with it, or
  // null; ``max``: JobCreate.iterations' bound (the field's data-max, api/routers/ui.py max_iterations)
  function iterationsProblem(it, max) {
    if (!/^\d+$/.test(it) || +it < 1) return `Iterations: “${it}” is not a whole number ≥ 1`;
    if (max && +it > max) return `Iterations: at most ${max}, got ${it}`;
    return null;
  }
  // what a write button says where the admin token is missing ("Dispatching needs the admin token: paste it …"),
  // before anything is sent; ``again``: what to do after saving it
  const needsToken = (what, again) => `${what} needs the admin token: paste it into “API token” at the top right ` +
    `and press Save${again ? ", then " + again : ""}.`;
  // the message for a write the API refused (``e`` from api()): a refusal for want of the admin token in the
  // words of needsToken (not the API's "missing bearer token: send 'Authorization: Bearer <token>'"); otherwise
  // the API's text
  function writeError(e, what, again) {
    if (e && e.status === 401 && !token()) return needsToken(what, again);
    if (e && (e.status === 401 || e.status === 403)) return `${what} needs the admin token (top right): ${e.message}`;
    return String((e && e.message) || e);
  }
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
  // the line of a failed run's log that says what went wrong: a Python exception's last line, or the last line
  // that reads as an error ("error: ...", "RuntimeError: ...", "... failed ..."); null when none does
  function errorLine(log) {
    const lines = String(log || "").split("\n").map((x) => x.trim()).filter(Boolean);
    const strong = /^(?:[\w.]*(?:Error|Exception|Interrupt)\b|error\b|fatal\b)/i;
    const weak = /\b(?:error|exception|failed|fatal|out of memory|killed)\b/i;
    for (const re of [strong, weak]) {
      for (let i = lines.length - 1; i >= 0; i--) if (re.test(lines[i]) && !/^Traceback\b/.test(lines[i])) return lines[i];
    }
    return null;
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

  // ---- timelines: canvas (api/static/timeline.js) ------------------------------------------------------
  async function drawTimeline(el, doc, opts = {}) {
    return TL.draw(el, doc, opts);
  }

  // peak memory per device; `labels` name the rows (with replicated stages, each replica: "S0 r1 · P1")
  async function drawMemory(el, cand, labels = null) {
    const P = await plotly();
    const mem = cand.memory || [];
    const cap = cand.memory_capacity;
    const gib = (b) => b / 2 ** 30;
    const names = labels && labels.length === mem.length ? labels : mem.map((_, d) => "P" + d);
    const reserve = num(cand.memory_reserve) ? cand.memory_reserve : 0;
    const own = mem.map((m) => Math.max(m - reserve, 0));
    if (cap && own.length && Math.max(...own) < 0.1 * cap) {
      // the model's own memory far below the capacity (a small model on a CPU process): on a 0-to-capacity axis
      // its bars were invisible; drawn alone on its own scale, the reserve and the capacity named
      const top = Math.max(...own);
      const [div, unit] = top < 2 ** 30 ? [2 ** 20, "MiB"] : [2 ** 30, "GiB"];
      const traces = [{ type: "bar", x: names, y: own.map((m) => m / div), name: "model", marker: { color: "#4c9a2a" },
        customdata: mem.map(gib),
        hovertemplate: `%{x}: model %{y:.3f} ${unit} + reserve ${gib(reserve).toFixed(2)} GiB = %{customdata:.2f} GiB<extra></extra>` }];
      const note = `model only; + reserve ${gib(reserve).toFixed(2)} GiB per device; capacity ${gib(cap).toFixed(gib(cap) < 10 ? 1 : 0)} GiB (off this scale)`;
      await P.react(el, traces, {
        height: 190, margin: { l: 50, r: 10, t: 18, b: 30 }, showlegend: false,
        yaxis: { title: { text: unit }, rangemode: "tozero", range: [0, (top / div) * 1.2 || 1] },
        annotations: [{ xref: "paper", x: 1, xanchor: "right", yref: "paper", y: 1, yanchor: "bottom", text: note,
          showarrow: false, font: { size: 10, color: "#555" } }],
      }, PLOT_CONFIG);
      return;
    }
    // one bar per device: the model's own memory standing on the reserve (a grey band from 0), since the fit
    // rule counts both against the capacity
    const traces = [{
      type: "bar", x: names, y: mem.map((m) => gib(Math.max(m - reserve, 0))), base: mem.map(() => gib(reserve)),
      name: "model", marker: { color: mem.map((m) => (cap && m > cap ? "#d62728" : "#4c9a2a")) },
      customdata: mem.map(gib),
      hovertemplate: `%{x}: model %{y:.3f} GiB + reserve ${gib(reserve).toFixed(2)} GiB = %{customdata:.2f} GiB<extra></extra>`,
    }];
    const band = reserve > 0 ? [{ type: "rect", xref: "paper", x0: 0, x1: 1, y0: 0, y1: gib(reserve), layer: "below",
      fillcolor: "#d9d9d9", opacity: 0.6, line: { width: 0 } }] : [];
    // the label stands on the band (below it, a thin band's label ran over the device names under the axis)
    const bandNote = reserve > 0 ? [{ xref: "paper", x: 0, xanchor: "left", y: gib(reserve), yanchor: "bottom",
      text: "reserve " + gib(reserve).toFixed(2) + " GiB", showarrow: false, font: { size: 10, color: "#555" },
      bgcolor: "rgba(255, 255, 255, 0.85)" }] : [];
    const layout = {
      height: 190, margin: { l: 50, r: 10, t: 10, b: 30 }, showlegend: false,
      yaxis: { title: { text: "GiB" }, rangemode: "tozero", range: [0, Math.max(gib(cap || 0), ...mem.map(gib)) * 1.08] },
      shapes: band.concat(cap ? [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: gib(cap), y1: gib(cap), line: { color: "#d62728", dash: "dash", width: 1.5 } }] : []),
      annotations: bandNote.concat(cap ? [{ xref: "paper", x: 1, xanchor: "right", y: gib(cap), yanchor: "bottom", text: "capacity " + gib(cap).toFixed(0) + " GiB", showarrow: false, font: { size: 10, color: "#d62728" } }] : []),
    };
    await P.react(el, traces, layout, PLOT_CONFIG);
  }

  async function drawBreakdown(el, cands) {
    const P = await plotly();
    const parts = [["compute", "#1f77b4"], ["bubble", "#c7c7c7"], ["allreduce_exposed", "#8c564b"], ["step", "#7f7f7f"]];
    const words = { allreduce_exposed: "exposed all-reduce", step: "optimizer step" };  // as the cards say them
    const names = cands.map((c) => "#" + (c.rank + 1));
    const longest = Math.max(0, ...cands.map((c) => parts.reduce((a, [k]) => a + ((c.breakdown || {})[k] || 0), 0)));
    const u = TL.unitFor(longest);  // seconds for long iterations (not "30k ms")
    const traces = parts.map(([k, color]) => ({
      type: "bar", orientation: "h", name: words[k] || k, y: names,
      x: cands.map((c) => ((c.breakdown || {})[k] || 0) / u.div), marker: { color },
      hovertemplate: k + ": %{x:.4g} " + u.name + "<extra>%{y}</extra>",
    }));
    const layout = {
      barmode: "stack", height: 100 + 40 * cands.length, margin: { l: 70, r: 10, t: 30, b: 40 },
      xaxis: { title: { text: u.name } }, yaxis: { autorange: "reversed" },
      legend: { orientation: "h", x: 0, y: 1.02, yanchor: "bottom" },
    };
    await P.react(el, traces, layout, PLOT_CONFIG);
  }

  // a cluster's devices in words: GPUs, or CPU processes where the device is a CPU (the local cluster's
  // "devices" are gloo processes sharing the host's cores); the twin of planner/units.py
  const isCpu = (device) => String(device || "").trim().toLowerCase().startsWith("cpu");
  const deviceNoun = (device, n = 2) => (isCpu(device) ? (n === 1 ? "CPU process" : "CPU processes") : (n === 1 ? "GPU" : "GPUs"));
  const devices = (device, n) => `${n} ${deviceNoun(device, n)}`;

  // a cluster version as what it is (GET /clusters gives its label: "dgx-a100-80gb v2, calibrated from 3
  // jobs"), linked to that version's page (/ui/clusters/{id}); the title says whose version it is and whether a
  // newer one exists
  function clusterLink(c, id) {
    if (!c) return `<a href="/ui/clusters/${id}">cluster #${id}</a>`;
    const whose = c.base_id != null ? `version ${c.version} of cluster #${c.base_id}` : `cluster #${c.id}, version ${c.version}`;
    const newer = c.newest_id != null && c.newest_id !== c.id ? `; newer: ${c.newest_label} (#${c.newest_id})` : "";
    return `<a class="cluster-version" href="/ui/clusters/${c.id}" title="${esc(whose + newer)}">${esc(c.label || c.name)}</a>`;
  }
  // the same with the cluster's size and id: "dgx-a100-80gb v2, calibrated from 3 jobs, 8 GPUs (#7)"
  const clusterSized = (c, id) => clusterLink(c, id) + (c ? `, ${devices(c.device, c.gpus)} (#${c.id})` : "");
  // which version of a cluster a plan used and whether a newer (calibrated) one exists: a calibration stores a new
  // version (POST /clusters/{id}/calibrate) and later plans on any version are made on the newest. ``subject``
  // starts the sentence ("This plan", "This job's plan"); ``extra``: HTML after the newer-version sentence (an
  // offer to plan again on it). Nothing for a cluster never calibrated: there is nothing to tell apart
  function versionNote(c, subject, extra = "") {
    if (!c) return "";
    const whose = `version ${c.version} of cluster #${c.base_id ?? c.id}`;
    const link = (id, text) => `<a href="/ui/clusters/${id}">${esc(text)}</a>`;
    if (c.newest_id != null && c.newest_id !== c.id) {
      return `<div id="cluster-version" class="warning-box version-note" role="status" data-newer="${c.newest_id}">
        ${subject} used ${link(c.id, c.label)} (#${c.id}, ${whose}). A newer version exists:
        ${link(c.newest_id, c.newest_label || "#" + c.newest_id)} (#${c.newest_id}); plans requested now are made on it.
        ${extra}</div>`;
    }
    if (c.version <= 1 && c.calibration_jobs == null) return "";
    return `<div id="cluster-version" class="muted version-note" data-newer="">${subject} used ${link(c.id, c.label)}
      (#${c.id}, ${whose}), the newest version of the cluster.</div>`;
  }
  // how a cluster version names its calibration: "calibrated from 3 jobs", or "calibrated" when the number of jobs
  // is not known (0); the twin of planner.cluster.calibrated_from
  const calibratedFrom = (jobs) => (jobs ? `calibrated from ${jobs} job${jobs === 1 ? "" : "s"}` : "calibrated");
  // measured / predicted as a factor (1.25×: the run took 25 % longer than predicted)
  const fmtRatio = (x) => (num(x) ? x.toFixed(x >= 10 ? 1 : 2) + "×" : "–");

  return { api, get, notice, start, token, esc, modelProblem, iterationsProblem, needsToken, writeError, isCpu, deviceNoun, devices, num, fmtTime, fmtGiB, fmtBytes, memorySplit, MEMORY_TITLE, fmtPct, fmtNum, fmtErr, fmtDate, ago,
           schedText, stateBadge, errorLine, plotly, drawTimeline, drawMemory, drawBreakdown, clusterLink, clusterSized, versionNote, calibratedFrom, fmtRatio };
})();
