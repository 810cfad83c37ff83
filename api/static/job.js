// Job page: GET /jobs/{id}, /jobs/{id}/comparison and /jobs/{id}/timelines; polls until the job ends.
"use strict";

const jobId = parseInt(document.getElementById("job-info").dataset.jobId, 10);
const FIELD_FMT = { iteration_time: PP.fmtTime, throughput: (x) => PP.fmtNum(x) + " /s", bubble_ratio: PP.fmtPct };
let drawnFor = null;

PP.start(async () => {
  for (;;) {
    const [job, cmp] = await Promise.all([PP.get(`/jobs/${jobId}`), PP.get(`/jobs/${jobId}/comparison`)]);
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

function renderJob(job, cmp) {
  const last = (job.history || []).slice(-1)[0];
  document.getElementById("job-info").innerHTML = `
    <div>${PP.stateBadge(job.state)} <a href="/ui/plans/${job.plan_id}?sel=${job.candidate_index}">plan ${job.plan_id}</a>,
      candidate #${job.candidate_index + 1}: <strong>${PP.esc(cmp.label)}</strong></div>
    <div class="muted">model ${PP.esc(job.model)} · ${job.iterations} iterations${job.emulate ? " (emulated profile)" : ""} ·
      attempt ${job.attempts} of ${job.max_attempts} · worker ${job.worker_id ?? "–"} · created ${PP.fmtDate(job.created_at)} ·
      claimed ${PP.fmtDate(job.claimed_at)} · finished ${PP.fmtDate(job.finished_at)}
      ${last ? " · last event: " + PP.esc(last.event) : ""} · <a href="/jobs/${job.id}">JSON</a> ·
      <a href="/jobs/${job.id}/comparison">comparison JSON</a></div>
    ${job.error ? `<div class="error">${PP.esc(job.error)}</div>` : ""}
    ${["queued", "running"].includes(job.state) ? '<button id="cancel-job" type="button">Cancel job</button>' : ""}`;
  const btn = document.getElementById("cancel-job");
  if (btn) btn.addEventListener("click", async () => {
    btn.disabled = true;
    try { await PP.api("POST", `/jobs/${jobId}/cancel`); } catch (e) { PP.notice(e.message, "error"); }
  });
  if (job.log_tail) {
    document.getElementById("log-box").hidden = false;
    document.getElementById("log-tail").textContent = job.log_tail;
  }
}

function renderComparison(cmp) {
  document.querySelector("#comparison tbody").innerHTML = cmp.fields.map((f) => {
    const fmt = FIELD_FMT[f.field] || ((x) => PP.fmtNum(x, 4));
    return `<tr data-field="${PP.esc(f.field)}"><td>${PP.esc(f.field.replace("_", " "))}</td><td class="num">${fmt(f.predicted)}</td>
      <td class="num measured">${f.measured == null ? "–" : fmt(f.measured)}</td><td class="num">${PP.fmtErr(f.relative_error)}</td></tr>`;
  }).join("");
  document.querySelector("#devices tbody").innerHTML = cmp.devices.map((d, i) => `<tr>
    <td>P${d.device ?? i}</td><td class="num">${PP.fmtTime(d.busy)}</td><td class="num">${PP.fmtTime(d.idle)}</td>
    <td class="num">${PP.fmtGiB(d.peak_memory)}</td><td class="num">${PP.fmtGiB(d.predicted_peak_memory)}</td>
    <td class="num">${PP.fmtErr(d.peak_memory_relative_error)}</td></tr>`).join("")
    || `<tr><td colspan="6" class="muted">no measured figures yet</td></tr>`;
}

async function drawTimelines() {
  const tl = await PP.get(`/jobs/${jobId}/timelines`);
  const xmax = Math.max(tl.predicted.makespan, tl.measured ? tl.measured.makespan : 0);
  await PP.drawTimeline(document.getElementById("tl-predicted"), tl.predicted, { xmax });
  const el = document.getElementById("tl-measured");
  const note = document.getElementById("measured-note");
  if (tl.measured) {
    note.textContent = `iteration ${tl.measured.iteration} of the executor's trace, one row per rank`;
    el.hidden = false;
    await PP.drawTimeline(el, tl.measured, { xmax, labels: tl.measured.labels });
  } else {
    note.textContent = "No measured timeline: " + tl.measured_note + ".";
    el.hidden = true;
  }
}
