// Comparison page: GET /plans/{id} as a sortable, filterable table; 1-4 selected candidates side by side
// (GET /plans/{id}/candidates/{rank}/timeline); POST /jobs to dispatch one. Selection and sort live in the
// URL (?sel=0,3&sort=throughput:desc) so the link can be shared.
"use strict";

const planId = parseInt(document.getElementById("plan-info").dataset.planId, 10);
const MAX_SELECTED = 4;  // candidates side by side
const S = { askedSel: [], plan: null, cluster: null, device: null, rows: [], sortKey: "rank", sortDir: 1, selected: new Set(), timelines: {}, experts: false, wholeExperts: false, orders: false };

// a candidate's expert-parallel size e (its run_spec's configuration holds it where e > 1: planner.request.Config)
const expertOf = (c) => c.expert ?? (c.run_spec && c.run_spec.config && c.run_spec.config.expert) ?? 1;
// 1 where it holds its experts whole (expert tensor parallelism 1: its run_spec's configuration's expert_tensor),
// null where they split over t as the dense MLP; the etp column shows the 1 and leaves the others empty, as rc
// marks its "yes": the Config.etp of every row would read 1 on t = 1 rows too and repeat t on the others
const expertTensorOf = (c) => c.expert_tensor ?? (c.run_spec && c.run_spec.config && c.run_spec.config.expert_tensor) ?? null;
// its rank order (planner.placement; its run_spec's configuration holds it where not the default, tp-pp-dp)
const DEFAULT_ORDER = "tp-pp-dp";
const orderOf = (c) => c.order ?? (c.run_spec && c.run_spec.config && c.run_spec.config.order) ?? DEFAULT_ORDER;

// a row the planner did not simulate (one that does not fit, its memory counted from the schedule): the API gives
// its throughput as 0 and its bubble_ratio as 1, placeholders beside its null iteration time; shown as "–" as
// that is, and sorted last
const simulated = (c) => PP.num(c.iteration_time);

const SORTERS = {
  rank: (c) => c.rank, micro_batch: (c) => c.micro_batch, microbatches: (c) => c.microbatches, data: (c) => c.data,
  pipeline: (c) => c.pipeline, tensor: (c) => c.tensor, expert: expertOf, expert_tensor: (c) => expertTensorOf(c) ?? 0, order: orderOf, schedule: (c) => PP.schedText(c), recompute: (c) => (c.recompute ? 1 : 0),
  iteration_time: (c) => (PP.num(c.iteration_time) ? c.iteration_time : Infinity), throughput: (c) => (simulated(c) && c.throughput) || 0,
  bubble_ratio: (c) => (simulated(c) && PP.num(c.bubble_ratio) ? c.bubble_ratio : Infinity), peak_memory: (c) => c.peak_memory || 0,
  reason: (c) => (c.fits ? "" : c.reason || "~"),
};

function readUrl() {
  const q = new URLSearchParams(location.search);
  const sort = (q.get("sort") || "").split(":");
  if (SORTERS[sort[0]]) { S.sortKey = sort[0]; S.sortDir = sort[1] === "desc" ? -1 : 1; }
  S.askedSel = (q.get("sel") || "").split(",").filter((x) => x !== "");  // checked once the rows are known
  if (q.get("filter")) document.getElementById("filter").value = q.get("filter");
  if (q.get("infeasible") === "1") document.getElementById("show-infeasible").checked = true;
}

function writeUrl() {
  const q = new URLSearchParams();
  if (S.sortKey !== "rank" || S.sortDir !== 1) q.set("sort", S.sortKey + ":" + (S.sortDir < 0 ? "desc" : "asc"));
  if (S.selected.size) q.set("sel", [...S.selected].sort((a, b) => a - b).join(","));
  const f = document.getElementById("filter").value.trim();
  if (f) q.set("filter", f);
  if (document.getElementById("show-infeasible").checked) q.set("infeasible", "1");
  const s = q.toString();
  history.replaceState(null, "", location.pathname + (s ? "?" + s : ""));
}

PP.start(async () => {
  readUrl();
  let plan = await PP.get(`/plans/${planId}`);
  // the cluster version the plan used (its label, whether a newer one exists); its device names the budget:
  // GPUs, or CPU processes on a CPU cluster
  try { S.cluster = await PP.get(`/clusters/${plan.cluster_id}`); } catch (e) { S.cluster = null; }
  S.device = S.cluster ? S.cluster.device : null;
  document.getElementById("plan-info").addEventListener("click", (ev) => {
    if (ev.target && ev.target.id === "replan") replan(ev.target);
  });
  while (plan.status === "queued" || plan.status === "running") {
    renderInfo(plan);
    await new Promise((r) => setTimeout(r, 700));
    plan = await PP.get(`/plans/${planId}`);
  }
  S.plan = plan;
  S.rows = plan.candidates.map((c, i) => ({ ...c, rank: i, feasible: true }))
    .concat((plan.infeasible || []).map((c, i) => ({ ...c, rank: plan.candidates.length + i, feasible: false })));
  // the e column only where some row splits its experts (expert parallelism): a dense model's table is as before
  S.experts = S.rows.some((c) => expertOf(c) > 1);
  document.querySelector('#cands th[data-key="expert"]').hidden = !S.experts;
  // the etp column only where some row holds its experts whole (expert tensor parallelism 1)
  S.wholeExperts = S.rows.some((c) => expertTensorOf(c) != null);
  document.querySelector('#cands th[data-key="expert_tensor"]').hidden = !S.wholeExperts;
  // the ranks column only where some row has the pipeline outermost (tp-dp-pp): otherwise every row is tp-pp-dp
  S.orders = S.rows.some((c) => orderOf(c) !== DEFAULT_ORDER);
  document.querySelector('#cands th[data-key="order"]').hidden = !S.orders;
  // ?sel= as typed into the URL: only ranked candidates' indices (a row that does not fit has nothing to compare),
  // at most MAX_SELECTED of them, in the order given; the URL then says what is selected
  const valid = S.askedSel.filter((x) => /^\d+$/.test(x.trim())).map(Number).filter((r) => r < plan.candidates.length);
  S.selected = new Set([...new Set(valid)].slice(0, MAX_SELECTED));
  if ([...S.selected].join(",") !== S.askedSel.join(",")) writeUrl();
  renderInfo(plan);
  renderWhyEmpty(plan);
  if (!S.rows.length) {  // nothing to list: the message above says why
    document.querySelector("section.toolbar").hidden = true;
    document.querySelector(".table-wrap").hidden = true;
  }
  const scheds = [...new Set(S.rows.map((c) => c.schedule))].sort();
  document.getElementById("schedule-filter").innerHTML += scheds.map((s) => `<option>${PP.esc(s)}</option>`).join("");
  wire();
  renderTable();
  window.__tableRenderedAt = performance.now();
  document.body.dataset.ready = "1";
  if (S.selected.size >= 1) compare();
  loadNames(plan);  // a failed plan names its profile too
});

async function loadNames(plan) {
  const profiles = await PP.get("/profiles?limit=1000");
  const p = profiles.find((x) => x.id === plan.profile_id);
  const c = S.cluster;
  if (p) {
    document.getElementById("info-profile").textContent = `${p.name} on ${p.device} (#${p.id})`;
    let words = [];
    // sharded weights have no data-parallel all-reduce to name (planner.profile.runtime_words' sharded_weights)
    const sharded = plan.request && plan.request.shard_parameters ? "?sharded_weights=true" : "";
    try { words = (await PP.get(`/profiles/${p.id}/assumes${sharded}`)).assumes || []; } catch (e) { words = []; }
    const assumes = document.getElementById("info-assumes");
    assumes.textContent = words.length ? `The profile's times assume ${words.join(", ")}.` : "";
    assumes.hidden = !words.length;
    const model = document.getElementById("job-model");
    const known = [...document.querySelectorAll("#model-presets option")].map((o) => o.value);
    if (!model.value && known.includes(p.name)) model.value = p.name;
  }
  if (c) await preferEmulation(c.device);
}

// Jobs go only to agents of the plan's cluster device (a CPU agent takes emulated jobs): with no such agent
// alive, emulation is preselected and the form says why.
async function preferEmulation(device) {
  if (!device || PP.isCpu(device)) return;
  let workers = [];
  try { workers = await PP.get("/workers?limit=1000"); } catch (e) { return; }
  if (workers.some((w) => w.alive && w.device_type.toLowerCase() === device.toLowerCase())) return;
  const box = document.getElementById("job-emulate");
  box.checked = true;
  showRefusals();
  box.parentElement.title = `no agent with device ${device} is registered: the job runs emulated on a CPU agent`;
  const note = document.getElementById("job-emulate-note");
  if (note) note.textContent = `(no ${device} agent registered: emulated on a CPU agent)`;
}

function renderInfo(plan) {
  const r = plan.request || {};
  const rej = Object.entries(plan.rejected || {}).sort((a, b) => b[1] - a[1]).slice(0, 6)
    .map(([k, v]) => `${PP.esc(k)}: ${v}`).join("; ");
  document.getElementById("plan-info").innerHTML = `
    <div>${PP.stateBadge(plan.status)} <span id="info-profile">profile #${plan.profile_id}</span> ·
      <span id="info-cluster">${PP.clusterSized(S.cluster, plan.cluster_id)}</span> · global batch ${r.global_batch} ·
      <span id="info-budget">${r.gpus != null ? PP.devices(S.device, r.gpus) : "all " + PP.deviceNoun(S.device)}</span> · max t ${r.max_tensor ?? `= ${PP.deviceNoun(S.device)} per node`}${r.max_expert != null ? ` · max e ${r.max_expert}` : ""}${r.rank_order ? ` · ranks ${PP.esc(r.rank_order)}` : ""}${Array.isArray(r.micro_batches) && r.micro_batches.length ? ` · <span id="info-micro-batches">micro-batch sizes ${PP.esc(r.micro_batches.join(", "))}</span>` : ""}${r.top != null ? ` · <span id="info-top">candidates to keep ${PP.esc(r.top)}</span>` : ""} · schedules ${PP.esc((r.schedules || ["all"]).join(", "))}
      ${r.allow_async ? "+ async" : ""} · recompute ${r.allow_recompute ? "allowed" : "off"}<span id="info-optimizer">${r.shard_parameters ? " · weights, gradients and optimizer sharded over data parallel (FSDP)" : r.shard_optimizer ? " · optimizer sharded over data parallel (ZeRO-1)" : ""}</span></div>
    <div id="info-assumes" class="muted" hidden></div>
    <div class="muted">${plan.evaluated == null ? (plan.status === "failed" ? "no configurations ranked" : "searching")
        : `${plan.num_candidates} ranked candidates of ${plan.evaluated} configurations
      (${plan.simulated ?? 0} simulated) · ${(plan.infeasible || []).length} that do not fit (tick “show candidates that do not fit”)`}
      ${rej ? " · rejected: " + rej : ""} · <a href="/plans/${plan.id}">JSON</a>
      ${plan.error ? `<div class="error">${PP.esc(plan.error)}</div>` : ""}</div>
    ${versionNote()}
    ${renderWarnings(plan.warnings)}`;
}

// which version of the cluster the plan used and whether a newer one exists, with an offer to plan again on it
function versionNote() {
  const c = S.cluster;
  return PP.versionNote(c, "This plan", c ? `<button id="replan" type="button" title="POST /plans: the same request on the newest version">Plan again on v${c.newest_version}</button>
      <span id="replan-msg"></span>` : "");
}

// the same request again on the cluster's newest version (the server plans on the newest one of any version)
async function replan(btn) {
  const plan = S.plan;
  if (!plan || !S.cluster) return;
  const body = { profile_id: plan.profile_id, cluster_id: S.cluster.newest_id };
  for (const [k, v] of Object.entries(plan.request || {})) if (v != null) body[k] = v;
  const msg = document.getElementById("replan-msg");
  const say = (text) => { if (msg) { msg.className = "error"; msg.textContent = text; } };
  const again = `press “Plan again on v${S.cluster.newest_version}” again`;
  if (!PP.token()) { say(PP.needsToken("Planning", again)); return; }  // nothing is sent that must fail
  btn.disabled = true;
  try {
    const r = await PP.api("POST", "/plans", body);
    location.href = `/ui/plans/${r.data.id}`;
  } catch (e) {
    say(PP.writeError(e, "Planning", again));
    btn.disabled = false;
  }
}

// the planner's warnings (e.g. the profile was measured on another device than the cluster's): prominent
function renderWarnings(warnings) {
  if (!Array.isArray(warnings) || !warnings.length) return "";
  return `<div id="plan-warnings" class="warning-box" role="alert"><strong>${warnings.length === 1 ? "Warning" : "Warnings"}:</strong>
    ${warnings.length === 1 ? " " + PP.esc(warnings[0]) : `<ul>${warnings.map((w) => `<li>${PP.esc(w)}</li>`).join("")}</ul>`}</div>`;
}

// reasons the planner gave for rejecting configurations, most frequent first ("bound: cannot reach the top k"
// is no reason a configuration cannot run, so it is left out)
function rejectionReasons(plan) {
  return Object.entries(plan.rejected || {}).filter(([k]) => !k.startsWith("bound:")).sort((a, b) => b[1] - a[1]);
}

// a done plan without candidates: why, as the page's main message
function renderWhyEmpty(plan) {
  const box = document.getElementById("why-empty");
  if (plan.status !== "done" || plan.candidates.length) { box.hidden = true; return; }
  const r = plan.request || {};
  const gpus = r.gpus != null ? PP.devices(S.device, r.gpus) : "the whole cluster";
  const reasons = rejectionReasons(plan);
  const plural = (n) => `${n} configuration${n === 1 ? "" : "s"}`;
  const head = reasons.length ? `${reasons[0][0]} on ${gpus}: ${plural(reasons[0][1])}` :
    `no configuration of ${gpus} matches this request (global batch ${r.global_batch})`;
  const closest = (plan.infeasible || [])[0];
  box.innerHTML = `<h2>No configuration fits</h2>
    <p class="why-main"><strong>${PP.esc(head)}</strong>${plan.evaluated != null ? ` (of ${plural(plan.evaluated)} tried)` : ""}.</p>
    ${reasons.length > 1 ? `<ul class="why-reasons">${reasons.slice(1).map(([k, v]) => `<li>${PP.esc(k)}: ${plural(v)}</li>`).join("")}</ul>` : ""}
    ${closest ? `<p>Closest: ${PP.esc(closest.label)}: ${PP.esc(closest.reason)} (tick “show candidates that do not fit”).</p>` : ""}
    <p class="muted why-hint">${PP.esc(emptyHint(plan, reasons))}: <a href="/">new plan</a>.</p>`;
  box.hidden = false;
}

// what may help, from the reasons: the weights, gradients and optimizer state alone not fitting is helped only
// by more devices (more stages or tensor parallelism), not by recomputation or smaller micro-batches
function emptyHint(plan, reasons) {
  const r = plan.request || {};
  const noun = PP.deviceNoun(S.device);
  const has = (s) => reasons.some(([k]) => k.includes(s));
  const staticMem = has("weights, gradients and optimizer state");
  const hints = [];
  // every candidate uses the whole budget (t * D * W = it): too many stages for the layers, or a W the global
  // batch does not divide, is helped by fewer devices, not more (a QA walk: only "another global batch" was said)
  const layout = has("more pipeline stages than layers") || has("not divisible by W");
  const memory = staticMem || has("out of memory");
  if (memory) hints.push(r.gpus != null ? `a larger budget of ${noun}` : `a cluster with more ${noun} or more memory per device`);
  else if (r.gpus != null && !layout) hints.push(`a larger budget of ${noun}`);
  if (layout) hints.push(`a smaller budget of ${noun} (every candidate uses all of them: t × D × W = the budget)`);
  if (staticMem && r.max_tensor != null) hints.push("a higher max tensor parallel");
  if (staticMem && r.max_expert != null) hints.push("a higher max expert parallel (a mixture of experts)");
  if (staticMem && !r.shard_optimizer && !r.shard_parameters) hints.push("sharding the optimizer state over data parallel (ZeRO-1)");
  if (staticMem && !r.shard_parameters) hints.push("sharding the weights too (FSDP)");
  if (has("out of memory")) {
    if (!r.allow_recompute) hints.push("activation recomputation");
    hints.push("smaller micro-batches");
  }
  if (!reasons.length || has("global batch") || has("divisible")) hints.push("another global batch");
  const tryThis = "Try " + (hints.length ? hints.join(", ") : "other settings");
  return staticMem && !has("out of memory")
    ? `The model's weights, gradients and optimizer state alone exceed each device's memory, so recomputation or smaller micro-batches would not help. ${tryThis}`
    : tryThis;
}

function wire() {
  document.querySelectorAll("#cands th[data-key]").forEach((th) => th.addEventListener("click", () => {
    const k = th.dataset.key;
    if (S.sortKey === k) S.sortDir = -S.sortDir;
    else { S.sortKey = k; S.sortDir = ["throughput"].includes(k) ? -1 : 1; }
    renderTable();
    writeUrl();
  }));
  document.getElementById("job-emulate").addEventListener("change", showRefusals);
  document.getElementById("job-iterations").addEventListener("input", () => showIterationsProblem(null));
  for (const id of ["filter", "schedule-filter", "show-infeasible"]) {
    document.getElementById(id).addEventListener("input", () => { renderTable(); writeUrl(); });
  }
  document.querySelector("#cands tbody").addEventListener("change", (ev) => {
    const box = ev.target.closest("input.sel");
    if (!box) return;
    const r = +box.dataset.rank;
    if (box.checked) {
      if (S.selected.size >= MAX_SELECTED) { box.checked = false; PP.notice(`at most ${MAX_SELECTED} candidates side by side`, "warn"); return; }
      S.selected.add(r);
    } else S.selected.delete(r);
    box.closest("tr").classList.toggle("selected", box.checked);
    updateCompareButton();
    writeUrl();
  });
  document.getElementById("compare-btn").addEventListener("click", compare);
  updateCompareButton();
  document.querySelector("#cands tbody").addEventListener("click", (ev) => {
    const b = ev.target.closest("button.export-btn");
    if (b) openExport(+b.dataset.rank);
  });
  document.getElementById("export-format").addEventListener("change", () => loadExport());
  document.getElementById("export-close").addEventListener("click", () => document.getElementById("export-dialog").close());
}

// ---- export of one candidate to a training framework (GET /plans/{id}/candidates/{rank}/export) ----------
const EX = { rank: null, urls: [] };

function openExport(rank) {
  EX.rank = rank;
  const c = S.rows[rank];
  document.getElementById("export-title").textContent = `Export #${rank + 1} ${c.label}`;
  const dlg = document.getElementById("export-dialog");
  if (!dlg.open) dlg.showModal();
  loadExport();
}

async function loadExport() {
  const fmt = document.getElementById("export-format").value;
  const rank = EX.rank;
  const msg = document.getElementById("export-msg");
  const files = document.getElementById("export-files");
  const notes = document.getElementById("export-notes");
  EX.urls.forEach((u) => URL.revokeObjectURL(u));
  EX.urls = [];
  msg.className = "muted";
  msg.textContent = "exporting…";
  document.getElementById("export-dialog").dataset.state = "loading";
  files.innerHTML = "";
  notes.innerHTML = "";
  let doc;
  try {
    doc = await PP.get(`/plans/${planId}/candidates/${rank}/export?format=${encodeURIComponent(fmt)}`);
  } catch (e) {
    if (EX.rank !== rank || document.getElementById("export-format").value !== fmt) return;
    msg.className = "error";
    msg.textContent = e.message;
    document.getElementById("export-dialog").dataset.state = "refused";
    return;
  }
  if (EX.rank !== rank || document.getElementById("export-format").value !== fmt) return;  // a newer request won
  msg.textContent = `${doc.files.length} file${doc.files.length === 1 ? "" : "s"} for ${doc.label}`;
  notes.innerHTML = doc.notes.map((n) => `<li>${PP.esc(n)}</li>`).join("");
  files.innerHTML = doc.files.map((f, i) => {
    const url = URL.createObjectURL(new Blob([f.content], { type: f.media_type }));
    EX.urls.push(url);
    return `<section class="export-file" data-name="${PP.esc(f.name)}">
      <div><strong>${PP.esc(f.name)}</strong> <a class="download" href="${url}" download="${PP.esc(f.name)}">Download</a></div>
      <pre class="export-text" data-index="${i}">${PP.esc(f.content)}</pre></section>`;
  }).join("");
  document.getElementById("export-dialog").dataset.state = "shown";
}

function updateCompareButton() {
  const n = S.selected.size;
  const b = document.getElementById("compare-btn");
  b.disabled = n < 1 || n > MAX_SELECTED;
  b.textContent = n === 1 ? "Show selected (1)" : `Compare selected (${n})`;
}

function visibleRows() {
  const f = document.getElementById("filter").value.trim().toLowerCase();
  const sched = document.getElementById("schedule-filter").value;
  const inf = document.getElementById("show-infeasible").checked;
  const terms = f ? f.split(/\s+/) : [];
  const key = SORTERS[S.sortKey];
  return S.rows.filter((c) => (inf || c.feasible) && (!sched || c.schedule === sched) &&
    terms.every((t) => [c.label, c.name, c.reason, ...(c.alternatives || [])].join(" ").toLowerCase().includes(t)))
    .sort((a, b) => {
      const x = key(a), y = key(b);
      return (x < y ? -1 : x > y ? 1 : a.rank - b.rank) * (x === y ? 1 : S.sortDir);
    });
}

// the row's name when the planner gives one that is not the schedule (e.g. "data parallel" for D = 1), or ""
function rowName(c) {
  const sched = PP.schedText(c);
  const compact = sched.replace(/ \((.*)\)$/, "($1)").replace(/, /g, ",");
  return c.name && c.name !== c.label && c.name !== compact && c.name !== sched ? c.name : "";
}

// the schedule cell: the row's name (rowName) or its schedule, and the identical configurations it collapsed
// into this row (candidate field `alternatives`), if any
function schedCell(c) {
  const sched = PP.schedText(c);
  const named = rowName(c);
  const alt = Array.isArray(c.alternatives) ? c.alternatives : [];
  const notes = [named ? `runs as ${sched}` : "", alt.length ? `same as: ${alt.join(", ")}` : ""].filter(Boolean);
  return PP.esc(named || sched) + (notes.length ?
    `<span class="same-as" title="identical configurations are collapsed into one row">${PP.esc(notes.join(" · "))}</span>` : "");
}

// the fullest device's peak: "model + reserve" where the plan says them apart (PP.memorySplit)
function memoryCell(c) {
  const m = PP.memorySplit(c);
  return m ? `${PP.fmtBytes(m.model)} + ${PP.fmtGiB(m.reserve)} reserve` : PP.fmtGiB(c.peak_memory);
}

function renderTable() {
  const rows = visibleRows();
  const html = [];
  for (const c of rows) {
    const sel = S.selected.has(c.rank);
    const cap = c.memory_capacity;
    const over = cap && c.peak_memory > cap;
    html.push(`<tr data-rank="${c.rank}" class="${c.feasible ? "" : "infeasible"}${sel ? " selected" : ""}">` +
      `<td><input type="checkbox" class="sel" data-rank="${c.rank}"${sel ? " checked" : ""}${c.feasible ? "" : " disabled title=\"does not fit: nothing to compare\""}></td>` +
      `<td>${c.feasible ? c.rank + 1 : "–"}</td><td>${c.micro_batch}</td><td>${c.microbatches}</td><td>${c.data}</td>` +
      (S.experts ? `<td>${expertOf(c)}</td>` : "") +
      (S.wholeExperts ? `<td>${expertTensorOf(c) ?? ""}</td>` : "") +
      `<td>${c.pipeline}</td><td>${c.tensor}</td>` + (S.orders ? `<td>${PP.esc(orderOf(c))}</td>` : "") +
      `<td class="sched">${schedCell(c)}</td><td>${c.recompute ? "yes" : ""}</td>` +
      `<td class="num" data-v="${c.iteration_time ?? ""}">${PP.fmtTime(c.iteration_time)}</td>` +
      `<td class="num" data-role="throughput" data-v="${simulated(c) ? c.throughput ?? "" : ""}">${simulated(c) ? PP.fmtNum(c.throughput) : "–"}</td>` +
      `<td class="num" data-role="idle">${simulated(c) ? PP.fmtPct(c.bubble_ratio) : "–"}</td>` +
      `<td class="num${over ? " over" : ""}" data-role="memory" title="${PP.esc(PP.MEMORY_TITLE)}">${memoryCell(c)} / ${PP.fmtGiB(cap)}</td>` +
      `<td class="reason">${c.fits ? "fits" : PP.esc(c.reason)}</td>` +
      `<td>${c.feasible ? `<button type="button" class="export-btn" data-rank="${c.rank}" title="as Megatron-LM, torchtitan or DeepSpeed settings">Export</button>` : ""}</td></tr>`);
  }
  document.querySelector("#cands tbody").innerHTML = html.join("");
  document.querySelectorAll("#cands th[data-key]").forEach((th) => {
    th.classList.toggle("sorted", th.dataset.key === S.sortKey);
    th.dataset.dir = th.dataset.key === S.sortKey ? (S.sortDir < 0 ? "desc" : "asc") : "";
  });
  document.getElementById("row-count").textContent = `${rows.length} of ${S.rows.length} rows`;
}

async function timeline(rank) {
  if (!S.timelines[rank]) S.timelines[rank] = PP.get(`/plans/${planId}/candidates/${rank}/timeline`);
  return S.timelines[rank];
}

async function compare() {
  const ranks = [...S.selected].filter((r) => r < S.plan.candidates.length).sort((a, b) => a - b);
  if (ranks.length < 1) return;
  const section = document.getElementById("compare-section");
  document.getElementById("compare-title").textContent = ranks.length === 1 ? "Selected candidate" : "Comparison";
  section.hidden = false;
  const box = document.getElementById("compare");
  box.dataset.count = String(ranks.length);
  box.innerHTML = ranks.map((r) => {
    const c = S.rows[r];
    const b = c.breakdown || {};
    return `<article class="card" data-rank="${r}">
      <header><strong>#${r + 1}</strong> ${PP.esc(c.label)}${rowName(c) ? ` · ${PP.esc(rowName(c))}` : ""}</header>
      <div class="figures">iteration <b>${PP.fmtTime(c.iteration_time)}</b> · throughput <b>${PP.fmtNum(c.throughput)}</b>/s ·
        <span title="the devices' idle share: bubble and exposed communication">idle <b>${PP.fmtPct(c.bubble_ratio)}</b></span> · N=${c.microbatches} · <span title="${PP.esc(PP.MEMORY_TITLE)}">peak ${memoryCell(c)} of ${PP.fmtGiB(c.memory_capacity)}</span><br>
        <span class="muted">compute ${PP.fmtTime(b.compute)}${b.fsdp_in_compute != null ? ` (of it ${PP.fmtTime(b.fsdp_in_compute)} added by FSDP's gathers and reduce-scatters: the part not hidden, plus the slowdown of the compute they overlap; ${PP.fmtTime(b.fsdp_comm_busy)} on the link)` : ""}${b.alltoall_in_compute != null ? ` (of it ${PP.fmtTime(b.alltoall_in_compute)} the experts' all-to-alls)` : ""} · bubble ${PP.fmtTime(b.bubble)} · ${c.shard_parameters ? "exposed reduce-scatter + all-gather (FSDP)" : "exposed all-reduce"} ${PP.fmtTime(b.allreduce_exposed)} ·
        step ${PP.fmtTime(b.step)} · <span title="the busy time of the communication streams${b.fsdp_comm_busy != null ? ", FSDP's gathers and reduce-scatters included" : ""}">comm busy ${PP.fmtTime((b.comm_busy || 0) + (b.fsdp_comm_busy || 0))}</span>${c.held_rate != null ? ` · <span title="the matrix-engine rate this step's busy share lets the GPU hold under its power limit, of the burst rate (planner/power.py)">clock ${PP.fmtPct(c.held_rate)}</span>` : ""}</span></div>
      ${expertTensorOf(c) != null ? `<div class="whole-experts muted" title="Megatron-Core's --expert-tensor-parallel-size 1 (the Megatron-LM export writes it); pipeplan's executor splits the experts over t only">experts whole on each rank (expert tensor parallelism 1): e = ${expertOf(c)} over the stage's t×W = ${c.tensor * c.data} ranks</div>` : ""}
      ${c.placement ? `<div class="placement muted" title="rank order ${PP.esc(orderOf(c))} (planner/placement.py)">${PP.esc(c.placement)}</div>` : ""}
      <div class="chart timeline" data-role="timeline" data-rank="${r}"><span class="muted">simulating…</span></div>
      <div class="tl-note muted"></div>
      <div class="chart memory" data-role="memory" data-rank="${r}"></div>
      <div class="replica-memory muted" hidden></div>
      <button type="button" class="dispatch" data-rank="${r}">Dispatch #${r + 1} to workers</button>
      <span class="dispatch-msg"></span>
    </article>`;
  }).join("");
  box.querySelectorAll("button.dispatch").forEach((b) => b.addEventListener("click", () => dispatch(+b.dataset.rank, b)));
  showRefusals();
  section.scrollIntoView({ behavior: "instant", block: "start" });
  const cands = ranks.map((r) => S.rows[r]);
  await PP.drawBreakdown(document.getElementById("breakdown-chart"), cands);
  const docs = await Promise.all(ranks.map((r) => timeline(r)));
  const xmax = Math.max(...docs.map((d) => d.makespan));
  const group = TL.group();
  for (let i = 0; i < ranks.length; i++) {
    const card = box.querySelector(`article[data-rank="${ranks[i]}"]`);
    const el = card.querySelector("[data-role=timeline]");
    el.innerHTML = "";
    await PP.drawTimeline(el, docs[i], { xmax, group });
    const d = docs[i];
    card.querySelector(".tl-note").textContent = `${d.devices} device${d.devices === 1 ? "" : "s"} of one pipeline; ` +
      `${d.cached ? "stored" : "simulated now and stored"} ${PP.fmtDate(d.computed_at)}` +
      (d.matches_stored ? "" : " — re-simulation differs from the stored prediction");
    const c = S.rows[ranks[i]];
    await PP.drawMemory(card.querySelector("[data-role=memory]"), c, d.row_labels);
    if (d.row_labels && (c.memory || []).length === d.row_labels.length) {  // replicated stages: per replica
      const box = card.querySelector(".replica-memory");
      box.hidden = false;
      box.innerHTML = "<strong>Memory per replica</strong> " + d.row_labels.map((l, j) =>
        `<span class="replica" data-stage="${d.row_stages[j]}">${PP.esc(l)}: ${PP.fmtGiB(c.memory[j])}</span>`).join(" · ");
    }
  }
  box.dataset.drawn = "1";
}

// Why POST /jobs would refuse a card's candidate, or null: one the executor does not run (executor_refusal), or
// more processes on one node than the server places there (PIPEPLAN_MAX_NODE_PROCESSES, api/crud.py _node_holds;
// the placement is api/gang.py's: an emulated job on one node, a real one on the cluster's nodes).
// [reason, what to do instead]
function dispatchRefusal(c) {
  // whole experts run under Megatron-Core only (torchtitan's and DeepSpeed's exports refuse them too)
  if (c.executor_refusal) return [c.executor_refusal, `not run by pipeplan's executor (${c.executor_refusal}): export it to ${expertTensorOf(c) != null ? "Megatron-LM (its row's Export button)" : "a framework that runs it"}`];
  const max = +document.getElementById("plan-info").dataset.maxNodeProcesses;
  const world = c.tensor * c.pipeline * c.data;
  const emulate = document.getElementById("job-emulate").checked;
  const perNode = (S.cluster && S.cluster.cluster && S.cluster.cluster.gpus_per_node) || world;
  let nodes = emulate ? 1 : Math.ceil(world / perNode);
  while (world % nodes) nodes++;  // api/gang.py node_layout: the same number on every node
  const procs = world / nodes;
  if (!max || !(procs > max)) return null;
  const why = `${emulate ? "emulated, " : ""}its t×D×W = ${world} processes run ${procs} on one node; this server places at most ${max} on one node (PIPEPLAN_MAX_NODE_PROCESSES)`;
  return [why, `${why}: ${emulate ? "dispatch it unemulated, or " : ""}give POST /jobs a gpus_per_node of at most ${max}`];
}

// the cards' dispatch buttons disabled, with the reason, where POST /jobs would refuse (the emulate box changes it)
function showRefusals() {
  document.querySelectorAll("#compare button.dispatch").forEach((b) => {
    const refusal = dispatchRefusal(S.rows[+b.dataset.rank]);
    b.disabled = refusal !== null;
    if (refusal) b.title = refusal[0]; else b.removeAttribute("title");
    const msg = b.nextElementSibling;
    msg.className = "dispatch-msg";
    msg.textContent = refusal ? refusal[1] : "";
  });
}

function showIterationsProblem(problem) {
  const under = document.getElementById("job-iterations-error");
  document.getElementById("job-iterations").classList.toggle("invalid", !!problem);
  under.textContent = problem || "";
  under.hidden = !problem;
}

async function dispatch(rank, button) {
  const msg = button.nextElementSibling;
  const model = document.getElementById("job-model").value.trim();
  const iterations = document.getElementById("job-iterations").value.trim();
  const emulate = document.getElementById("job-emulate").checked;
  msg.className = "dispatch-msg error";
  const problem = PP.modelProblem(model, emulate);
  if (problem) { msg.textContent = problem; return; }
  // at most JobCreate.iterations' bound (the field's data-max), as the job page's clone form: said under the field
  // and on the card (the API's 422 came back as its raw text)
  const itEl = document.getElementById("job-iterations");
  const itProblem = PP.iterationsProblem(iterations, +itEl.dataset.max);
  showIterationsProblem(itProblem);
  if (itProblem) { msg.textContent = itProblem; itEl.focus(); return; }
  const again = `press Dispatch #${rank + 1} again`;
  if (!PP.token()) { msg.textContent = PP.needsToken("Dispatching", again); return; }  // nothing is sent that must fail
  msg.className = "dispatch-msg";
  button.disabled = true;
  try {
    const job = (await PP.api("POST", "/jobs", {
      plan_id: planId, candidate_index: rank, model: model || null,
      iterations: +iterations, emulate,
    })).data;
    msg.innerHTML = `<a href="/ui/jobs/${job.id}">job ${job.id}</a> queued`;
    location.href = `/ui/jobs/${job.id}`;
  } catch (e) {
    msg.className = "dispatch-msg error";
    msg.textContent = PP.writeError(e, "Dispatching", again);
    button.disabled = false;
  }
}
