// Cluster page: the newest calibration's factors and warnings and each finished job's prediction error before and
// after calibration (GET /clusters/{id}/calibration: the whole lineage, whichever version's id is asked), the
// cluster's versions (GET /clusters/{id} each); "Calibrate from finished jobs" sends POST /clusters/{id}/calibrate.
"use strict";

const clusterId = parseInt(document.getElementById("cluster-info").dataset.clusterId, 10);
// each factor of planner.cluster.Calibration: what it does and the value it keeps when the jobs do not determine it
const FACTORS = [
  ["compute_scale", "compute times (forward, backward, optimizer step) are multiplied by it", 1],
  ["link_scale", "communication times (p2p, all-reduce, tensor-parallel collectives) are multiplied by it", 1],
  ["action_overhead", "seconds added to every action", 0],
];
let hasJobs = false;

const emulated = () => document.getElementById("include-emulated").checked;
const query = () => (emulated() ? "?include_emulated=true" : "");
const fail = (e) => PP.notice(String(e.message || e), "error");

PP.start(async () => {
  document.getElementById("calibrate").addEventListener("click", calibrate);
  document.getElementById("include-emulated").addEventListener("change", () => load().catch(fail));
  await load();
});

async function load() {
  const errs = await PP.get(`/clusters/${clusterId}/calibration${query()}`);
  const versions = await Promise.all(errs.versions.map((v) => PP.get(`/clusters/${v.id}`)));
  const cluster = versions.find((v) => v.id === clusterId);
  renderInfo(cluster, errs);
  renderWarnings(errs.warnings);
  renderFactors(errs.calibration);
  renderJobs(errs);
  renderVersions(versions);
  document.body.dataset.ready = "1";
}

function renderInfo(c, errs) {
  const body = c.cluster || {};
  const link = (l) => (l && l.beta > 0 ? `${PP.fmtNum(1 / l.beta / 1e9, 0)} GB/s` : "–");
  const newest = errs.newest_id !== c.id;
  document.getElementById("cluster-info").innerHTML = `
    <div><strong id="cluster-label">${PP.esc(c.label || c.name)}</strong> · ${PP.esc(c.device)} ·
      <span id="cluster-size">${PP.devices(c.device, c.gpus)}</span>${body.nodes ? ` (${body.nodes} × ${body.gpus_per_node})` : ""} ·
      version ${c.version} of cluster #${errs.base_id} · <a href="/?cluster=${errs.newest_id}">New plan on it</a> ·
      <a href="/clusters/${c.id}">JSON</a> · <a href="/clusters/${c.id}/calibration${query()}">calibration JSON</a></div>
    <div class="muted">peak ${PP.fmtNum((body.peak_flops || 0) / 1e12, (body.peak_flops || 0) < 1e13 ? 2 : 0)} TFLOP/s and ${PP.fmtGiB(body.memory_bytes)} per device ·
      links: within a node ${link(body.intra)}, between nodes ${link(body.inter)}</div>
    ${newest ? `<div id="newer-version" class="notice version-note" role="status" data-newer="${errs.newest_id}">This is version ${c.version}.
      The newest version is <a href="/ui/clusters/${errs.newest_id}">v${errs.newest_version}</a> (#${errs.newest_id}): plans requested
      now on any version are made on it, and the calibration and errors below are its.</div>` : ""}`;
}

// factors the fit left at a bound of their physical range: the model and the measurements disagree for a reason
// the factors do not describe, which planning on this version would hide
function renderWarnings(warnings) {
  const box = document.getElementById("cal-warnings");
  box.hidden = !(warnings && warnings.length);
  if (box.hidden) { box.innerHTML = ""; return; }
  box.innerHTML = `<strong>The calibration left ${warnings.length === 1 ? "a factor" : warnings.length + " factors"} at a bound of
    its physical range.</strong> The model and the measurements disagree for a reason these factors do not describe: check the
    profile (device, dtype) and the cluster's figures before trusting plans on this version.
    <ul>${warnings.map((w) => `<li>${PP.esc(w)}</li>`).join("")}</ul>`;
}

function factorValue(name, x) {
  if (!PP.num(x)) return "–";
  if (name === "action_overhead") return x === 0 ? "0 s" : PP.fmtTime(x);
  return x.toFixed(3) + "×";
}

// how the fit set a factor: at a bound of its range (and which), determined by the jobs, or kept at its prior
function factorFit(cal, name, prior) {
  const at = (cal.at_bound || {})[name];
  if (PP.num(at)) {
    const side = name === "action_overhead" ? (at === 0 ? "lower" : "upper") : (at >= 1 ? "upper" : "lower");
    return `<span class="badge failed">at its ${side} bound ${PP.esc(factorValue(name, at))}</span>`;
  }
  if ((cal.fitted || []).includes(name)) return '<span class="badge succeeded">fitted</span>';
  return `<span class="badge">kept at prior (${factorValue(name, prior)})</span>`;
}

function renderFactors(cal) {
  const box = document.getElementById("factors-box");
  if (!cal) {
    box.innerHTML = `<p id="no-calibration" class="muted">Not calibrated yet: predictions on this cluster use it as uploaded
      (compute_scale 1, link_scale 1, action_overhead 0).</p>`;
    return;
  }
  const rows = FACTORS.map(([name, what, prior]) => `<tr data-factor="${name}">
    <td data-label="Factor"><code>${name}</code></td><td data-label="Value" class="num value" data-value="${cal[name]}">${factorValue(name, cal[name])}</td>
    <td data-label="Fit" class="fit">${factorFit(cal, name, prior)}</td><td data-label="What it does" class="what">${PP.esc(what)}</td></tr>`).join("");
  const errs = PP.num(cal.error_before) ? ` · median |error| at the fit: ${PP.fmtPct(cal.error_before)} before, ${PP.fmtPct(cal.error_after)} after` : "";
  box.innerHTML = `<div class="table-scroll"><table id="factors" class="data cards">
      <thead><tr><th>Factor</th><th class="num">Value</th><th>Fit</th><th>What it does</th></tr></thead><tbody>${rows}</tbody></table></div>
    <p id="cal-meta" class="muted">${PP.esc(PP.calibratedFrom(cal.jobs))}${errs}${cal.notes ? " · " + PP.esc(cal.notes) : ""}</p>`;
}

function numCell(label, x, fmt, cls) {
  return `<td data-label="${label}" class="num ${cls}" data-value="${PP.num(x) ? x : ""}">${fmt(x)}</td>`;
}

function renderJobs(errs) {
  const head = document.getElementById("after-head");
  head.textContent = errs.newest_version > 1 ? `Predicted after (v${errs.newest_version})` : "Predicted after (not calibrated yet)";
  const L = [...document.querySelectorAll("#cal-jobs thead th")].map((th) => PP.esc(th.textContent.trim()));
  const jobs = errs.jobs || [];
  hasJobs = jobs.length > 0;
  const btn = document.getElementById("calibrate");
  btn.disabled = !hasJobs;
  btn.title = hasJobs ? "POST /clusters/{id}/calibrate: fit the factors to the finished jobs of every version and store them as a new version (needs the admin token)"
    : "no finished job with a measured result to calibrate from yet";
  const empty = document.getElementById("cal-empty");
  empty.hidden = hasJobs;
  document.querySelector("#cal-jobs").closest(".table-scroll").hidden = !hasJobs;
  document.getElementById("cal-summary").hidden = !hasJobs;
  if (!hasJobs) {
    empty.innerHTML = `<strong>No finished job with a measured result yet${emulated() ? "" : " (emulated runs are left out)"}.</strong>
      Dispatch a plan on this cluster: <a href="/?cluster=${errs.newest_id}">make a plan</a>, dispatch a candidate from its page to a
      worker agent, and once the job has succeeded its measured iteration time shows here against the prediction, and the cluster
      can be calibrated from it.${emulated() ? "" : " Emulated runs sleep the profile's times, so they say nothing about the device: tick “list emulated runs” to see them anyway (never fitted)."}`;
    document.querySelector("#cal-jobs tbody").innerHTML = "";
    return;
  }
  const after = errs.newest_version > 1 ? `with v${errs.newest_version}` : "after (not calibrated yet: the same)";
  // an emulated run (api/calibration.py emulated_row) is listed against its own prediction: in no median, never fitted
  const real = jobs.filter((j) => !j.emulated).length;
  const emu = jobs.length - real;
  document.getElementById("cal-summary").innerHTML = `Median |error| over ${real} finished job${real === 1 ? "" : "s"}${emu ? ` (and ${emu} emulated run${emu === 1 ? "" : "s"} listed, not counted: ${PP.esc(jobs.find((j) => j.emulated).note.split(";")[0])})` : ""}:
    <strong id="median-before" data-value="${errs.median_abs_error_before ?? ""}">${PP.fmtPct(errs.median_abs_error_before)}</strong> before calibration,
    <strong id="median-after" data-value="${errs.median_abs_error_after ?? ""}">${PP.fmtPct(errs.median_abs_error_after)}</strong> ${after}.
    Error = (measured − predicted) / predicted: + when the run was slower than predicted.`;
  document.querySelector("#cal-jobs tbody").innerHTML = jobs.map((j) => `<tr data-job-id="${j.job_id ?? ""}">
    <td data-label="${L[0]}">${j.job_id != null ? `<a href="/ui/jobs/${j.job_id}">job ${j.job_id}</a>` : "–"}</td>
    <td data-label="${L[1]}" class="config">${PP.esc(j.label)}${j.emulated ? ` <span class="muted" title="${PP.esc(j.note || "")}">emulated: ${PP.fmtTime(j.predicted_emulation)} by the simulator (${PP.fmtErr(j.relative_error_emulation)}), not fitted</span>` : ""}</td>
    ${numCell(L[2], j.measured, PP.fmtTime, "measured")}
    ${numCell(L[3], j.predicted_before, PP.fmtTime, "predicted-before")}
    ${numCell(L[4], j.relative_error_before, PP.fmtErr, "error-before")}
    ${numCell(L[5], j.predicted_after, PP.fmtTime, "predicted-after")}
    ${numCell(L[6], j.relative_error_after, PP.fmtErr, "error-after")}</tr>`).join("");
}

function renderVersions(versions) {
  const L = [...document.querySelectorAll("#versions thead th")].map((th) => PP.esc(th.textContent.trim()));
  const newest = versions[versions.length - 1];
  document.querySelector("#versions tbody").innerHTML = versions.map((v) => {
    const cal = (v.cluster || {}).calibration;
    const factors = cal ? ` <span class="sub">compute × ${PP.fmtNum(cal.compute_scale, 3)}, links × ${PP.fmtNum(cal.link_scale, 3)},
      ${factorValue("action_overhead", cal.action_overhead)} per action</span>` : "";
    return `<tr data-cluster-id="${v.id}"${v.id === clusterId ? ' class="selected"' : ""}>
      <td data-label="${L[0]}"><a href="/ui/clusters/${v.id}">v${v.version}</a> <span class="muted">#${v.id}${v === newest && versions.length > 1 ? " · newest" : ""}</span></td>
      <td data-label="${L[1]}" class="label">${PP.esc(v.label || v.name)}</td>
      <td data-label="${L[2]}">${v.calibration_jobs != null ? PP.esc(PP.calibratedFrom(v.calibration_jobs)) + factors : "no (as uploaded)"}</td>
      <td data-label="${L[3]}">${PP.fmtDate(v.created_at)}</td></tr>`;
  }).join("");
}

// POST /clusters/{id}/calibrate: a new version (201) or the newest one unchanged (200); the page then shows it. The API's
// refusals (no admin token, no finished job) are shown as they come.
async function calibrate() {
  const btn = document.getElementById("calibrate");
  const msg = document.getElementById("calibrate-msg");
  msg.className = "";
  msg.removeAttribute("data-version");
  if (!PP.token()) {
    msg.className = "error";
    msg.textContent = PP.needsToken("Calibrating", "calibrate again");
    document.getElementById("token").focus();
    return;
  }
  btn.disabled = true;
  msg.textContent = "fitting the factors to the finished jobs…";
  try {
    const a = (await PP.api("POST", `/clusters/${clusterId}/calibrate${query()}`)).data;
    const page = `<a href="/ui/clusters/${a.cluster_id}">${PP.esc(a.label)}</a> (#${a.cluster_id})`;
    const fitted = a.jobs.filter((j) => !j.emulated).length;  // the listed emulated runs are never fitted
    const warned = a.warnings.length ? ` ${a.warnings.length === 1 ? "One factor is" : a.warnings.length + " factors are"} at a bound: see the warning above.` : "";
    msg.innerHTML = (a.unchanged
      ? `Unchanged: no new finished job since version ${a.version}, ${page}; the fit is the same, nothing was stored.`
      : `Stored version ${a.version}: ${page}, fitted to ${fitted} job${fitted === 1 ? "" : "s"}; plans requested from now on are made on it.`) + warned;
    msg.dataset.version = String(a.version);
    msg.dataset.clusterId = String(a.cluster_id);
    msg.dataset.unchanged = a.unchanged ? "1" : "0";
    renderWarnings(a.warnings);
    await load();
  } catch (e) {
    msg.className = "error";
    msg.textContent = `Calibration refused${e.status ? ` (HTTP ${e.status})` : ""}: ${e.message || e}`;
  } finally {
    btn.disabled = !hasJobs;
  }
}
