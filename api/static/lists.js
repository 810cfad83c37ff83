// Plans, jobs and workers lists (GET /plans, /jobs, /workers), refreshed while the page is open.
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
  const cn = Object.fromEntries(clusters.map((c) => [c.id, c.name]));
  const dev = Object.fromEntries(clusters.map((c) => [c.id, c.device]));
  plans.sort((a, b) => b.id - a.id);
  document.querySelector("#plans tbody").innerHTML = plans.map((p) => `<tr>
    <td><a href="/ui/plans/${p.id}">plan ${p.id}</a></td><td>${PP.stateBadge(p.status)}</td>
    <td>${PP.esc(pn[p.profile_id] || p.profile_id)}</td><td>${PP.esc(cn[p.cluster_id] || p.cluster_id)}</td>
    <td>${p.request.global_batch}</td><td>${p.request.gpus != null ? PP.devices(dev[p.cluster_id], p.request.gpus) : "all"}</td><td>${p.num_candidates}</td>
    <td>${PP.fmtDate(p.created_at)}</td></tr>`).join("") || `<tr><td colspan="8" class="muted">no plans yet: <a href="/">make one</a></td></tr>`;
}

async function loadJobs() {
  const state = document.getElementById("state-filter").value;
  const jobs = await PP.get("/jobs?limit=1000" + (state ? "&state=" + state : ""));
  jobs.sort((a, b) => b.id - a.id);
  document.querySelector("#jobs tbody").innerHTML = jobs.map((j) => `<tr data-job-id="${j.id}">
    <td><a href="/ui/jobs/${j.id}">job ${j.id}</a></td><td title="${PP.esc(j.waiting || "")}">${PP.stateBadge(j.state)}${j.nodes > 1 ? ` <span class="muted">${j.nodes} nodes</span>` : ""}${j.waiting ? ` <span class="muted">${PP.esc(j.waiting)}</span>` : ""}</td>
    <td><a href="/ui/plans/${j.plan_id}">plan ${j.plan_id}</a></td><td>#${j.candidate_index + 1}</td>
    <td>${PP.esc(j.model)}</td><td>${j.iterations}${j.emulate ? " (emulated)" : ""}</td>
    <td>${j.worker_id != null ? `<a href="/ui/workers">worker ${j.worker_id}</a>` : "–"}</td>
    <td>${j.attempts}/${j.max_attempts}</td><td>${PP.fmtDate(j.created_at)}</td><td>${PP.fmtDate(j.finished_at)}</td>
    <td class="result">${j.has_result ? "measured" :
      (PP.esc(((j.state === "failed" && PP.errorLine(j.log_tail)) || j.error || "").slice(0, 200)) || "–")}</td></tr>`).join("")
    || `<tr><td colspan="11" class="muted">no jobs: dispatch a candidate from a plan's comparison page</td></tr>`;
}

async function loadWorkers() {
  const [workers, running] = await Promise.all([PP.get("/workers?limit=1000"), PP.get("/jobs?state=running&limit=1000")]);
  const current = {};
  for (const j of running) if (j.worker_id != null) current[j.worker_id] = j.id;
  document.querySelector("#workers tbody").innerHTML = workers.map((w) => `<tr data-worker-id="${w.id}">
    <td>worker ${w.id}</td><td>${PP.esc(w.name)}</td><td>${PP.esc(w.node)}${w.host ? " (" + PP.esc(w.host) + ")" : ""}</td><td>${w.gpus ? PP.devices(w.device_type, w.gpus) : "not declared (one-node jobs)"}</td>
    <td>${PP.esc(w.device_type)}</td><td>${w.alive ? '<span class="badge succeeded">alive</span>' : '<span class="badge failed">silent</span>'}</td>
    <td title="${PP.esc(w.last_heartbeat)}">${PP.ago(w.last_heartbeat)}</td>
    <td>${current[w.id] ? `<a href="/ui/jobs/${current[w.id]}">job ${current[w.id]}</a>` : "idle"}</td>
    <td>${PP.fmtDate(w.registered_at)}</td></tr>`).join("")
    || `<tr><td colspan="9" class="muted">no workers: start one with <code>pipeplan agent --api URL --token T</code></td></tr>`;
}

PP.start(() => {
  if (document.getElementById("plans")) every(5000, loadPlans);
  if (document.getElementById("jobs")) {
    every(2000, loadJobs);
    document.getElementById("state-filter").addEventListener("change", () => loadJobs().catch(() => {}));
  }
  if (document.getElementById("workers")) every(3000, loadWorkers);
});
