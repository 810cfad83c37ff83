// Job page: GET /jobs/{id}, /jobs/{id}/comparison and /jobs/{id}/timelines; polls until the job ends.
"use strict";

const jobId = parseInt(document.getElementById("job-info").dataset.jobId, 10);
const FIELD_FMT = { iteration_time: PP.fmtTime, throughput: (x) => PP.fmtNum(x) + " /s", bubble_ratio: PP.fmtPct };
let drawnFor = null;
let cluster;  // the cluster version the job's plan was made on (GET /clusters/{id}); null when unknown

PP.start(async () => {
  wireClone();
  for (;;) {
    const [job, cmp] = await Promise.all([PP.get(`/jobs/${jobId}`), PP.get(`/jobs/${jobId}/comparison`)]);
    document.getElementById("clone-form").dataset.planId = String(job.plan_id);
    if (cluster === undefined) cluster = job.cluster_id == null ? null : await PP.get(`/clusters/${job.cluster_id}`).catch(() => null);
    renderJob(job, cmp);
    renderComparison(cmp);
    const key = job.state + ":" + job.has_result;
    if (drawnFor !== key) {
      drawnFor = key;
      await drawTimelines();
    }
    document.body.dataset.state = job.state;
    if (!["queued", "running"].includes(job.state)) break;
    await new Promise((r) => setTimeout(r, 1000));
  }
});

let cloneShown = false;

// where the job runs: the device an agent must have, its node slots (a gang when > 1), why it waits
function placement(job) {
  const dev = job.device_type ? `device ${PP.esc(job.device_type)}${job.emulate ? " (or a CPU agent: emulated)" : ""}` : "any agent";
  const size = job.nodes > 1 ? `${job.nodes} nodes × ${job.procs_per_node} processes (a gang)` :
    (job.procs_per_node ? `one node, ${job.procs_per_node} processes` : "one node");
  const slots = (job.slots || []).map((s) => `node ${s.node_rank}: ${PP.esc(s.state)}` +
    (s.worker_id ? ` (worker ${s.worker_id}${s.endpoint ? ", rendezvous " + PP.esc(s.endpoint) : ""})` : "")).join(" · ");
  return `<div id="job-placement" class="muted">runs on ${dev} · ${size}${slots ? " · " + slots : ""}</div>
    ${job.waiting ? `<div id="job-waiting" class="notice" role="status">Waiting: ${PP.esc(job.waiting)}</div>` : ""}`;
}

function renderJob(job, cmp) {
  const last = (job.history || []).slice(-1)[0];
  const failed = job.state === "failed";
  const detail = failed ? PP.errorLine(job.log_tail) : null;
  document.getElementById("job-info").innerHTML = `
    ${failed ? `<div id="job-error" class="job-error" role="alert"><strong>The run failed:</strong>
      <pre id="error-text">${PP.esc(detail || job.error || "no error text was reported")}</pre>
      ${detail && job.error ? `<div class="muted">${PP.esc(job.error)}${job.log_tail ? " · the whole log tail is below" : ""}</div>` : ""}</div>` :
      (job.error ? `<div class="error">${PP.esc(job.error)}</div>` : "")}
    <div>${PP.stateBadge(job.state)} <a href="/ui/plans/${job.plan_id}?sel=${job.candidate_index}">plan ${job.plan_id}</a>,
      candidate #${job.candidate_index + 1}: <strong>${PP.esc(cmp.label)}</strong>
      ${job.cluster_id != null ? `· planned on <span id="job-cluster">${PP.clusterSized(cluster, job.cluster_id)}</span>` : ""}</div>
    ${PP.versionNote(cluster, "This job's plan", cluster ? `<a id="replan-link" href="/ui/plans/${job.plan_id}#cluster-version">Plan again on v${cluster.newest_version}</a> from plan ${job.plan_id}'s page.` : "")}
    <div class="muted">model ${job.model ? PP.esc(job.model) : "none (emulated: nothing built)"} · ${job.iterations} iterations${job.emulate ? " (emulated profile)" : ""} ·
      attempt ${job.attempts} of ${job.max_attempts} · worker ${job.worker_id ?? "–"} · created ${PP.fmtDate(job.created_at)} ·
      claimed ${PP.fmtDate(job.claimed_at)} · finished ${PP.fmtDate(job.finished_at)}
      ${last ? " · last event: " + PP.esc(last.event) : ""} · <a href="/jobs/${job.id}">JSON</a> ·
      <a href="/jobs/${job.id}/comparison">comparison JSON</a></div>
    ${placement(job)}
    <div class="job-actions">
      ${["queued", "running"].includes(job.state) ? '<button id="cancel-job" type="button">Cancel job</button>' : ""}
      ${["failed", "cancelled", "succeeded"].includes(job.state) ? `<button id="retry-job" type="button" class="${failed ? "primary" : ""}"
        title="dispatch the same candidate again with the same settings">Retry</button>
        <button id="clone-job" type="button" title="dispatch again with other settings">Clone with changes</button>` : ""}
      <span id="action-msg"></span>
    </div>`;
  const btn = document.getElementById("cancel-job");
  if (btn) btn.addEventListener("click", async () => {
    // (the notice, not #action-msg: this part is drawn again at every poll while the job is queued or running)
    if (!PP.token()) { PP.notice(PP.needsToken("Cancelling a job", "Cancel job again"), "error"); return; }
    btn.disabled = true;
    try { await PP.api("POST", `/jobs/${jobId}/cancel`); } catch (e) {
      PP.notice(PP.writeError(e, "Cancelling a job", "Cancel job again"), "error");
      btn.disabled = false;
    }
  });
  const retry = document.getElementById("retry-job");
  if (retry) retry.addEventListener("click", () => dispatchJob({ plan_id: job.plan_id, candidate_index: job.candidate_index,
    model: job.model || null, iterations: job.iterations, emulate: job.emulate }, retry));
  const clone = document.getElementById("clone-job");
  if (clone) clone.addEventListener("click", () => showClone(job));
  if (job.log_tail) {
    const box = document.getElementById("log-box");
    box.hidden = false;
    if (failed) box.open = true;
    document.getElementById("log-tail").textContent = job.log_tail;
  }
}

function showClone(job) {
  const form = document.getElementById("clone-form");
  if (!cloneShown) {
    document.getElementById("clone-candidate").value = String(job.candidate_index + 1);
    document.getElementById("clone-model").value = job.model;
    document.getElementById("clone-iterations").value = String(job.iterations);
    document.getElementById("clone-emulate").checked = job.emulate;
    cloneShown = true;
  }
  form.hidden = false;
  document.getElementById("clone-model").focus();
}

async function dispatchJob(body, button) {
  const msg = document.getElementById(button.id === "clone-submit" ? "clone-msg" : "action-msg");
  const again = `press ${button.textContent.trim()} again`;
  if (!PP.token()) {  // nothing is sent that must fail
    msg.className = "error";
    msg.textContent = PP.needsToken("Dispatching", again);
    return;
  }
  button.disabled = true;
  msg.textContent = "";
  try {
    const job = (await PP.api("POST", "/jobs", body)).data;
    location.href = `/ui/jobs/${job.id}`;
  } catch (e) {
    msg.className = "error";
    msg.textContent = PP.writeError(e, "Dispatching", again);
    button.disabled = false;
  }
}

function wireClone() {
  const form = document.getElementById("clone-form");
  let ranks;  // the plan's ranked candidates (GET /plans/{id}), fetched at the first dispatch
  form.addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const model = document.getElementById("clone-model").value.trim();
    const cand = document.getElementById("clone-candidate").value.trim();
    const it = document.getElementById("clone-iterations").value.trim();
    const msg = document.getElementById("clone-msg");
    msg.className = "error";
    if (!/^\d+$/.test(cand) || +cand < 1) { msg.textContent = `Candidate: “${cand}” is not a rank (1, 2, …)`; return; }
    // at most JobCreate.iterations' bound (the field's data-max)
    const itProblem = PP.iterationsProblem(it, +document.getElementById("clone-iterations").dataset.max);
    if (itProblem) { msg.textContent = itProblem; return; }
    const emulate = document.getElementById("clone-emulate").checked;
    const problem = PP.modelProblem(model, emulate);
    if (problem) { msg.textContent = problem; return; }
    // ranks count from 1 here, the API's candidate_index from 0: say the range in ranks
    if (ranks === undefined) ranks = await PP.get(`/plans/${form.dataset.planId}`).then((p) => p.num_candidates, () => null);
    if (ranks != null && +cand > ranks) {
      msg.textContent = `Candidate: plan ${form.dataset.planId} has ${ranks} ranked candidate${ranks === 1 ? "" : "s"}` +
        (ranks ? ` (ranks 1–${ranks})` : "") + `, got ${cand}`;
      return;
    }
    dispatchJob({ plan_id: +form.dataset.planId, candidate_index: +cand - 1, model: model || null, iterations: +it,
      emulate }, document.getElementById("clone-submit"));
  });
  document.getElementById("clone-cancel").addEventListener("click", () => { form.hidden = true; });
}

// a share (the bubble ratio) is compared in percentage points: 2.1 % predicted against 5.0 % measured read
// "+138.2 %" as a relative error
function errorCell(f) {
  if (f.field.endsWith("_ratio") && PP.num(f.predicted) && PP.num(f.measured)) {
    const pts = 100 * (f.measured - f.predicted);
    return `<span title="measured - predicted, in percentage points">${pts >= 0 ? "+" : ""}${pts.toFixed(1)} pts</span>`;
  }
  return PP.fmtErr(f.relative_error);
}

function renderComparison(cmp) {
  const note = document.getElementById("comparison-note");
  note.hidden = !cmp.note;
  note.textContent = cmp.note ? "Note: " + cmp.note + "." : "";
  document.querySelector("#comparison tbody").innerHTML = cmp.fields.map((f) => {
    const fmt = FIELD_FMT[f.field] || ((x) => PP.fmtNum(x, 4));
    return `<tr data-field="${PP.esc(f.field)}"><td>${PP.esc(f.field.replace("_", " "))}</td><td class="num">${fmt(f.predicted)}</td>
      <td class="num measured">${f.measured == null ? "–" : fmt(f.measured)}</td><td class="num">${errorCell(f)}</td></tr>`;
  }).join("");
  document.querySelector("#devices tbody").innerHTML = cmp.devices.map((d, i) => `<tr>
    <td>P${d.device ?? i}</td><td class="num">${PP.fmtTime(d.busy)}</td><td class="num">${PP.fmtTime(d.idle)}</td>
    <td class="num peak-measured">${d.peak_memory == null && PP.num(d.predicted_peak_memory)
      ? `<span class="muted" title="the run reported no allocator peak: torch.cuda.max_memory_allocated exists on GPUs only (executor/rank.py)">not measured</span>`
      : PP.fmtBytes(d.peak_memory)}</td><td class="num peak-predicted">${PP.fmtBytes(d.predicted_peak_memory)}</td>
    <td class="num">${PP.fmtErr(d.peak_memory_relative_error)}</td></tr>`).join("")
    || `<tr><td colspan="6" class="muted">no measured figures yet</td></tr>`;
}

async function drawTimelines() {
  const tl = await PP.get(`/jobs/${jobId}/timelines`);
  const xmax = Math.max(tl.predicted.makespan, tl.measured ? tl.measured.makespan : 0);
  const group = TL.group();
  await PP.drawTimeline(document.getElementById("tl-predicted"), tl.predicted, { xmax, group });
  const el = document.getElementById("tl-measured");
  const note = document.getElementById("measured-note");
  if (tl.measured) {
    note.textContent = `iteration ${tl.measured.iteration} of the executor's trace, one row per rank`;
    el.hidden = false;
    await PP.drawTimeline(el, tl.measured, { xmax, group, labels: tl.measured.labels });
  } else {
    note.textContent = "No measured timeline: " + tl.measured_note + ".";
    el.hidden = true;
  }
}
