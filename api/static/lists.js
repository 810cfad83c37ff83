// Plans, jobs, workers and clusters lists (GET /plans, /jobs, /workers, /clusters), refreshed while the page is open.
"use strict";

function every(ms, fn) {
  let busy = false;
  const tick = async () => {
    if (busy || document.hidden) return;
    busy = true;
    try { await fn(); PP.notice(""); } catch (e) { PP.notice(String(e.message || e), "error"); } finally { busy = false; }
  };
  tick();
  setInterval(tick, ms);
}

async function loadPlans() {
  const [plans, profiles, clusters] = await Promise.all([
    PP.get("/plans?limit=1000"), PP.get("/profiles?limit=1000"), PP.get("/clusters?limit=1000")]);
  const pn = Object.fromEntries(profiles.map((p) => [p.id, `${p.name} on ${p.device}`]));
  const cl = Object.fromEntries(clusters.map((c) => [c.id, c]));
  const dev = Object.fromEntries(clusters.map((c) => [c.id, c.device]));
  plans.sort((a, b) => b.id - a.id);
  const L = labels("plans");
  document.querySelector("#plans tbody").innerHTML = plans.map((p) => `<tr data-plan-id="${p.id}">
    <td${L[0]}><a href="/ui/plans/${p.id}">plan ${p.id}</a></td><td${L[1]}>${PP.stateBadge(p.status)}</td>
    <td${L[2]}>${PP.esc(pn[p.profile_id] || p.profile_id)}</td><td${L[3]} class="cluster">${PP.clusterLink(cl[p.cluster_id], p.cluster_id)}</td>
    <td${L[4]}>${p.request.global_batch}</td><td${L[5]}>${p.request.gpus != null ? PP.devices(dev[p.cluster_id], p.request.gpus) : "all"}</td><td${L[6]}>${p.num_candidates}</td>
    <td${L[7]}>${shortDate(p.created_at)}</td></tr>`).join("") || `<tr><td colspan="${L.length}" class="muted">no plans yet: <a href="/">make one</a></td></tr>`;
}

// each cell's column name (its header's text), which the list shows as the cell's label below 600 px wide, where
// a row is a card of labelled lines (ui.css, table.cards) and the table stays within the page
function labels(id) {
  return [...document.querySelectorAll(`#${id} thead th`)].map((th) => ` data-label="${PP.esc(th.textContent.trim())}"`);
}

// a date compactly: the time alone when it is today, else month, day and time (the full date in the title)
function shortDate(s) {
  if (!s) return "–";
  const d = new Date(s);
  if (isNaN(d)) return PP.esc(s);
  const today = d.toDateString() === new Date().toDateString();
  const text = today ? d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: "2-digit" })
    : d.toLocaleString([], { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit" });
  return `<span title="${PP.esc(d.toLocaleString())}">${PP.esc(text)}</span>`;
}

// measured / predicted of a finished job, as on the job page (its error there: (measured - predicted) / predicted);
// outside 0.5-2 (issue 13's bound for a meaningful first comparison) it is marked
function ratioCell(j, attrs) {
  const r = j.measured_over_predicted;
  if (!PP.num(r)) return `<td${attrs} class="num ratio">–</td>`;
  const far = r > 2 || r < 0.5;
  return `<td${attrs} class="num ratio${far ? " far" : ""}" title="measured ${PP.fmtTime(j.measured_iteration_time)} / predicted ` +
    `${PP.fmtTime(j.predicted_iteration_time)}: error ${PP.fmtErr(r - 1)}">${PP.fmtRatio(r)}</td>`;
}

// what went wrong (a failed run's real error line) or why a queued job waits
function note(j) {
  const text = ((j.state === "failed" && PP.errorLine(j.log_tail)) || j.error || j.waiting || "").slice(0, 200);
  return text ? `<span class="clamp" title="${PP.esc(text)}">${PP.esc(text)}</span>` : "–";
}

// The jobs table: one line of figures per job (measured, predicted, their ratio), compact enough for 800 px; below
// 600 px each row is a card of labelled lines (ui.css), so the table stays within the page.

async function loadJobs() {
  const state = document.getElementById("state-filter").value;
  const jobs = await PP.get("/jobs?limit=1000" + (state ? "&state=" + encodeURIComponent(state) : ""));
  jobs.sort((a, b) => b.id - a.id);
  const L = labels("jobs");
  document.querySelector("#jobs tbody").innerHTML = jobs.map((j) => `<tr data-job-id="${j.id}">
    <td${L[0]}><a href="/ui/jobs/${j.id}">job ${j.id}</a></td>
    <td${L[1]} title="${PP.esc(j.waiting || "")}">${PP.stateBadge(j.state)}${j.nodes > 1 ? ` <span class="muted">${j.nodes} nodes</span>` : ""}</td>
    <td${L[2]}><a href="/ui/plans/${j.plan_id}?sel=${j.candidate_index}" title="plan ${j.plan_id}, candidate ranked ${j.candidate_index + 1}">plan ${j.plan_id} #${j.candidate_index + 1}</a></td>
    <td${L[3]}>${PP.esc(j.model)}<span class="sub">${j.iterations} it.${j.emulate ? ", emulated" : ""}</span></td>
    <td${L[4]}>${j.worker_id != null ? `<a href="/ui/workers">worker ${j.worker_id}</a>` : "–"}<span class="sub" title="attempts">attempt ${j.attempts}/${j.max_attempts}</span></td>
    <td${L[5]}>${shortDate(j.created_at)}<span class="sub">${j.finished_at ? shortDate(j.finished_at) : "–"}</span></td>
    <td${L[6]} class="num predicted">${PP.fmtTime(j.predicted_iteration_time)}</td>
    <td${L[7]} class="num measured">${PP.fmtTime(j.measured_iteration_time)}</td>
    ${ratioCell(j, L[8])}
    <td${L[9]} class="result">${note(j)}</td></tr>`).join("")
    || `<tr><td colspan="${L.length}" class="muted">no jobs: dispatch a candidate from a plan's comparison page</td></tr>`;
}

async function loadWorkers() {
  const [workers, running] = await Promise.all([PP.get("/workers?limit=1000"), PP.get("/jobs?state=running&limit=1000")]);
  const current = {};
  for (const j of running) if (j.worker_id != null) current[j.worker_id] = j.id;
  const L = labels("workers");
  document.querySelector("#workers tbody").innerHTML = workers.map((w) => `<tr data-worker-id="${w.id}">
    <td${L[0]}>worker ${w.id}</td><td${L[1]}>${PP.esc(w.name)}</td><td${L[2]}>${PP.esc(w.node)}${w.host ? " (" + PP.esc(w.host) + ")" : ""}</td><td${L[3]}>${w.gpus ? PP.devices(w.device_type, w.gpus) : "not declared (one-node jobs)"}</td>
    <td${L[4]}>${PP.esc(w.device_type)}</td><td${L[5]}>${w.alive ? '<span class="badge succeeded">alive</span>' : '<span class="badge failed">silent</span>'}</td>
    <td${L[6]} title="${PP.esc(w.last_heartbeat)}">${PP.ago(w.last_heartbeat)}</td>
    <td${L[7]}>${current[w.id] ? `<a href="/ui/jobs/${current[w.id]}">job ${current[w.id]}</a>` : "idle"}</td>
    <td${L[8]}>${shortDate(w.registered_at)}</td></tr>`).join("")
    || `<tr><td colspan="${L.length}" class="muted">no workers: start one with <code>pipeplan agent --api URL --token T</code></td></tr>`;
}

// The clusters list: one row per cluster as uploaded, with every version of it (a calibration stores a new one,
// POST /clusters/{id}/calibrate), each linked to its page; the name links to the newest version's page.
async function loadClusters() {
  const clusters = await PP.get("/clusters?limit=1000");
  const lineages = new Map();
  for (const c of clusters.sort((a, b) => a.version - b.version || a.id - b.id)) {
    const key = c.base_id ?? c.id;
    if (!lineages.has(key)) lineages.set(key, []);
    lineages.get(key).push(c);
  }
  const L = labels("clusters");
  document.querySelector("#clusters tbody").innerHTML = [...lineages.entries()].sort((a, b) => a[0] - b[0]).map(([key, vs]) => {
    const newest = vs[vs.length - 1];
    const versions = vs.map((v) => `<span class="version-line" data-version="${v.version}"><a href="/ui/clusters/${v.id}" title="${PP.esc(v.label)} (#${v.id})">v${v.version}</a>
      ${v.calibration_jobs != null ? PP.calibratedFrom(v.calibration_jobs) : "as uploaded"}${vs.length > 1 && v === newest ? ' <span class="muted">· newest</span>' : ""}</span>`).join("");
    return `<tr data-cluster-id="${key}">
      <td${L[0]}><a class="cluster-name" href="/ui/clusters/${newest.id}">${PP.esc(newest.name)}</a><span class="sub">#${key}</span></td>
      <td${L[1]}>${PP.esc(newest.device)}</td><td${L[2]}>${PP.devices(newest.device, newest.gpus)}</td>
      <td${L[3]} class="versions">${versions}</td>
      <td${L[4]} class="calibrated">${newest.calibration_jobs != null ? "yes, " + PP.calibratedFrom(newest.calibration_jobs) : "no"}</td>
      <td${L[5]}>${shortDate(vs[0].created_at)}</td></tr>`;
  }).join("") || `<tr><td colspan="${L.length}" class="muted">no clusters: upload one with <code>POST /clusters</code> (examples/clusters/*.json)</td></tr>`;
}

PP.start(() => {
  if (document.getElementById("plans")) every(5000, loadPlans);
  if (document.getElementById("jobs")) {
    // the filter is the address's ?state=: a link to /ui/jobs?state=failed opens filtered, a choice is kept in
    // the address (back, reload and a copied link keep it)
    const filter = document.getElementById("state-filter");
    const wanted = new URLSearchParams(location.search).get("state");
    if (wanted && [...filter.options].some((o) => o.value === wanted)) filter.value = wanted;
    every(2000, loadJobs);
    filter.addEventListener("change", () => {
      const url = new URL(location.href);
      if (filter.value) url.searchParams.set("state", filter.value); else url.searchParams.delete("state");
      history.replaceState(null, "", url);
      loadJobs().catch(() => {});
    });
  }
  if (document.getElementById("workers")) every(3000, loadWorkers);
  if (document.getElementById("clusters")) every(10000, loadClusters);
});
