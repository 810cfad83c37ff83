// New plan page: POST /plans (after POST /profiles for an uploaded file), poll GET /plans/{id}, then go
// to the comparison page. "Make profile" sends a Hugging Face config.json to POST /profiles/hf-config for the
// selected cluster and selects the profile it returns.
"use strict";

// what GET /profiles and GET /clusters gave (profiles made from a Hugging Face config are added to the list)
let profiles = [];
let clusters = [];

PP.start(async () => {
  [profiles, clusters] = await Promise.all([PP.get("/profiles?limit=1000"), PP.get("/clusters?limit=1000")]);
  // a cluster's versions together (in the order the clusters were stored), its newest first: the one selected
  // for a profile of its device (syncCluster picks the first), the one plans are made on anyway
  clusters.sort((a, b) => (a.base_id ?? a.id) - (b.base_id ?? b.id) || (b.version ?? 1) - (a.version ?? 1) || b.id - a.id);
  renderProfiles();
  const csel = document.getElementById("cluster");
  // a calibrated cluster is a new version under the same name (POST /clusters/{id}/calibrate): its label says
  // which ("dgx-a100-80gb v2, calibrated from 3 jobs"); a plan on an older version is made on the newest
  csel.innerHTML = clusters.map((c) =>
    `<option value="${c.id}" data-device="${PP.esc(c.device)}"${c.newest_id != null && c.newest_id !== c.id ? ` title="plans are made on the newest version, #${c.newest_id}"` : ""}>${PP.esc(c.label || c.name)} (${PP.isCpu(c.device) ? PP.devices(c.device, c.gpus) : `${c.gpus} × ${PP.esc(c.device)}`}, #${c.id})</option>`).join("");
  // a profile picked in the list, a profile JSON file, a config.json: choosing one drops the others
  document.getElementById("profile").addEventListener("change", () => {
    clearHF(); syncCluster(); deviceNote(); profileAssumes();
  });
  csel.addEventListener("change", () => { deviceNote(); budgetWords(); clusterPage(); });
  document.getElementById("profile-file").addEventListener("change", () => { clearHF(); profileFile(); });
  document.getElementById("hf-file").addEventListener("change", () => {
    document.getElementById("profile-file").value = "";
    profileFile();
  });
  syncCluster();
  askedCluster();
  deviceNote();
  budgetWords();
  clusterPage();
  document.body.dataset.ready = "1";
});

// ?cluster=ID (the cluster page's "New plan on it"): that cluster, and a profile of its device unless the selected
// one is
function askedCluster() {
  const asked = new URLSearchParams(location.search).get("cluster");
  const c = clusters.find((x) => String(x.id) === asked);
  if (!c) return;
  document.getElementById("cluster").value = String(c.id);
  const psel = document.getElementById("profile");
  const p = profiles.find((x) => String(x.id) === psel.value);
  const same = profiles.find((x) => x.device === c.device);
  if ((!p || p.device !== c.device) && same) {
    psel.value = String(same.id);
    profileAssumes();
  }
}

// the selected cluster's page: its versions, its jobs' prediction errors, calibration
function clusterPage() {
  const id = document.getElementById("cluster").value;
  document.getElementById("cluster-page").href = id ? `/ui/clusters/${id}` : "/ui/clusters";
}

// the budget is of the selected cluster's devices: GPUs, or CPU processes on a CPU cluster
function budgetWords() {
  const c = clusters.find((x) => String(x.id) === document.getElementById("cluster").value);
  const noun = PP.deviceNoun(c && c.device);
  const label = `${noun.startsWith("CPU") ? "CPU process" : "GPU"} budget`;
  document.getElementById("budget-label").textContent = label;
  // enumeration.py: t D W = P for every configuration, so a smaller job is another plan with a smaller budget
  document.getElementById("budget-label").parentElement.title = `Every candidate uses exactly this many ` +
    `${noun} (tensor × pipeline × data parallel = budget); for smaller jobs plan again with a smaller budget`;
  document.getElementById("gpus").dataset.label = label;
  document.getElementById("max-tensor").placeholder = `${noun} per node`;
}

function renderProfiles() {
  document.getElementById("profile").innerHTML = profiles.map((p) =>
    `<option value="${p.id}">${PP.esc(p.name)} on ${PP.esc(p.device)} (${p.num_layers} layers, #${p.id})</option>`).join("");
  profileAssumes();
}

// under the list, what the selected profile's times assume (GET /profiles/{id}'s "assumes"): two profiles of one
// model made for different kernels or runtimes differ there
let assumesAsked = 0;
async function profileAssumes() {
  const el = document.getElementById("profile-assumes");
  const id = parseInt(document.getElementById("profile").value, 10);
  const ask = ++assumesAsked;
  el.hidden = true;
  if (!id) return;
  let words = [];
  try { words = (await PP.get(`/profiles/${id}/assumes`)).assumes || []; } catch (e) { return; }
  if (ask !== assumesAsked) return;  // another profile was selected meanwhile
  el.textContent = words.length ? `its times assume ${words.join(", ")}` : "";
  el.hidden = !words.length;
}

// pick the first cluster of the profile's device
function syncCluster() {
  const psel = document.getElementById("profile");
  const csel = document.getElementById("cluster");
  const p = profiles.find((x) => String(x.id) === psel.value);
  const match = p && [...csel.options].find((o) => o.dataset.device === p.device);
  if (match) csel.value = match.value;
  if (document.getElementById("budget-label")) budgetWords();
}

// A chosen profile JSON file is what Plan uses (stored first, POST /profiles), not the profile in the list: the
// list is disabled, and a note names the file's model and device (its cluster is picked) with a way back.
let fileProfile = null;  // {name, device, layers} of the chosen file, once read; {bad, why} where it is no profile
async function profileFile() {
  const el = document.getElementById("profile-file");
  const note = document.getElementById("profile-file-note");
  const file = el.files[0];
  fileProfile = null;
  document.getElementById("profile").disabled = !!file;
  note.hidden = true;  // shown once it says what the file is (reading it is asynchronous: no empty note meanwhile)
  note.classList.remove("error");
  if (file) {
    try {
      const body = JSON.parse(await file.text());
      const hf = body && typeof body === "object" && !Array.isArray(body) && !("layers" in body) &&
        ("model_type" in body || "architectures" in body);
      const shapeless = !body || typeof body !== "object" || Array.isArray(body) || !Array.isArray(body.layers);
      if (hf || shapeless) {  // said now, not as pydantic's field list when Plan is pressed
        note.classList.add("error");
        note.innerHTML = "<span>" + (hf ? `${PP.esc(file.name)} is a Hugging Face config.json, not a profile: make a ` +
          `profile from it below: its <strong>config.json</strong> file, then <strong>Make profile</strong>.`
          : `${PP.esc(file.name)} is not a profile (no list of layers): choose a profile JSON (e.g. from ` +
          `<code>pipeplan profile-analytic</code>).`) + `</span> <button type="button" id="profile-file-clear">use the list instead</button>`;
        document.getElementById("profile-file-clear").addEventListener("click", () => { el.value = ""; profileFile(); });
        note.hidden = false;
        fileProfile = { bad: true, name: "?", device: "?", layers: "?", why: hf ? `${file.name} is a Hugging Face ` +
          "config.json, not a profile (make a profile from it below)" : `${file.name} is not a profile (no list of layers)` };
        deviceNote();
        return;
      }
      fileProfile = { name: String(body.name ?? "?"), device: String(body.device ?? "?"),
        layers: Array.isArray(body.layers) ? body.layers.length : "?" };
      note.innerHTML = `Plan uses <strong>${PP.esc(file.name)}</strong> (${PP.esc(fileProfile.name)} on ` +
        `${PP.esc(fileProfile.device)}, ${fileProfile.layers} layers), not the profile in the list; it is stored ` +
        `when you press Plan. <button type="button" id="profile-file-clear">use the list instead</button>`;
      const match = [...document.getElementById("cluster").options].find((o) => o.dataset.device === fileProfile.device);
      if (match) { document.getElementById("cluster").value = match.value; budgetWords(); }
    } catch (e) {
      fileProfile = { bad: true, name: "?", device: "?", layers: "?", why: `${file.name} is not JSON` };
      note.classList.add("error");
      note.innerHTML = `${PP.esc(file.name)} is not JSON (${PP.esc(e.message)}): choose a profile JSON ` +
        `(e.g. from <code>pipeplan profile-analytic</code>). <button type="button" id="profile-file-clear">use the list instead</button>`;
    }
    document.getElementById("profile-file-clear").addEventListener("click", () => { el.value = ""; profileFile(); });
    note.hidden = false;
  }
  deviceNote();
}

// a profile measured on another device than the cluster's predicts that device's times: say so up front
function deviceNote() {
  const listed = profiles.find((x) => String(x.id) === document.getElementById("profile").value);
  const p = document.getElementById("profile-file").files.length ? fileProfile : listed;
  const c = clusters.find((x) => String(x.id) === document.getElementById("cluster").value);
  const note = document.getElementById("device-note");
  const norm = (d) => String(d).toLowerCase().replace(/[^a-z0-9]/g, "");  // as planner/mismatch.py compares
  const fromFile = document.getElementById("hf-file").files.length && hfKey() !== hfMade.key;  // not the selected profile
  const differ = p && !p.bad && c && norm(p.device) !== norm(c.device) && !fromFile;  // (no device: not a profile)
  note.textContent = differ ? `The profile was measured on ${p.device}, the cluster's devices are ${c.device}: ` +
    `the plan will predict ${p.device} times.` : "";
  note.hidden = !differ;
}

// wired at once, token or not: Plan never submits the form natively (a reload would lose what was typed)
document.getElementById("plan-form").addEventListener("submit", (ev) => { ev.preventDefault(); submit(); });
// sharded weights leave out the schedules that keep two copies or versions of a stage (planner.fsdp; the page marks
// them data-unsharded): their boxes are unticked and disabled while the box is ticked, and given back after
document.getElementById("shard-parameters").addEventListener("change", (ev) => {
  for (const box of document.querySelectorAll("input[name=schedule][data-unsharded]")) {
    if (ev.target.checked) {
      box.dataset.was = box.checked ? "1" : "";
      box.checked = false;
      box.disabled = true;
      box.parentElement.title = "its weights cannot be sharded: it keeps two copies or versions of a stage";
    } else {
      box.disabled = false;
      box.checked = box.dataset.was === "1";
      box.parentElement.title = "";
    }
  }
});
document.getElementById("hf-make").addEventListener("click", makeHFProfile);
document.addEventListener("pp-token", authNote);
authNote();

// ---- form checks: nothing is silently replaced by a default -----------------------------------------------
// A whole number in [data-min, data-max]; empty gives null (the server's default) unless the field is required.
function wholeNumber(id, errors) {
  const el = document.getElementById(id);
  const v = el.value.trim();
  const { label, min, max } = { label: el.dataset.label, min: +el.dataset.min, max: +el.dataset.max };
  if (v === "") {
    if (el.required) errors.push([el, `${label}: required (a whole number from ${min} to ${max})`]);
    return null;
  }
  if (!/^\d+$/.test(v) || +v < min || +v > max) {
    errors.push([el, `${label}: “${v}” is not a whole number from ${min} to ${max}`]);
    return null;
  }
  return +v;
}

function readForm() {
  const errors = [];
  const req = {
    cluster_id: parseInt(document.getElementById("cluster").value, 10),
    global_batch: wholeNumber("global-batch", errors),
    gpus: wholeNumber("gpus", errors),
    max_tensor: wholeNumber("max-tensor", errors),
    max_expert: wholeNumber("max-expert", errors),
    rank_order: document.getElementById("rank-order").value || null,  // "": both orders, where they differ
    top: wholeNumber("top", errors),
    allow_async: document.getElementById("allow-async").checked,
    allow_recompute: document.getElementById("allow-recompute").checked,
    shard_optimizer: document.getElementById("shard-optimizer").checked,
    shard_parameters: document.getElementById("shard-parameters").checked,
    micro_batches: null,
    schedules: null,
  };
  // a budget past the selected cluster's size is refused here, in the form's words (the API's 422 named its field
  // "gpus" and logged a failed request in the console)
  const c = clusters.find((x) => x.id === req.cluster_id);
  const gpusEl = document.getElementById("gpus");
  if (req.gpus != null && c && Number.isInteger(c.gpus) && req.gpus > c.gpus) {
    errors.push([gpusEl, `${gpusEl.dataset.label}: “${req.gpus}” is more than the cluster's ${PP.devices(c.device, c.gpus)}`]);
  }
  const boxes = [...document.querySelectorAll("input[name=schedule]")];
  const checked = boxes.filter((x) => x.checked);
  const checks = document.getElementById("schedules");
  if (!checked.length) {
    errors.push([checks, "Schedules: none is checked; check at least one (planning does not fall back to all of them)"]);
  } else if (!req.allow_async && checked.every((x) => x.dataset.async)) {
    errors.push([checks, "Schedules: only asynchronous ones are checked; tick “allow asynchronous schedules” too"]);
  } else {
    // every schedule the request allows anyway: leave the field out (the plan then reads "schedules all")
    const allowed = boxes.filter((x) => req.allow_async || !x.dataset.async);
    const all = allowed.every((x) => x.checked) && checked.every((x) => allowed.includes(x));
    req.schedules = all ? null : checked.map((x) => x.value);
  }
  // a chosen file the page flagged (no profile, a config.json, not JSON) is not sent: Plan says so under the field
  // (it was stored first, and pydantic's field list came back: "layers: Field required; id: Extra inputs ...")
  const fileEl = document.getElementById("profile-file");
  if (fileEl.files.length && fileProfile && fileProfile.bad) {
    errors.push([fileEl, `Profile file: ${fileProfile.why}: choose a profile JSON, or “use the list instead”`]);
  }
  const mbEl = document.getElementById("micro-batches");
  const mbs = mbEl.value.trim();
  if (mbs) {
    const parts = mbs.split(/[\s,]+/).filter(Boolean);
    const bad = parts.filter((x) => !/^\d+$/.test(x) || +x < 1);
    const big = parts.filter((x) => /^\d+$/.test(x) && +x > req.global_batch && Number.isInteger(req.global_batch));
    if (bad.length) errors.push([mbEl, `Micro-batch sizes: “${bad.join(", ")}” ${bad.length === 1 ? "is" : "are"} not a positive whole number`]);
    // a micro-batch holds at most the global batch (the API caps sizes at its largest global batch, 65536)
    else if (big.length) errors.push([mbEl, `Micro-batch sizes: “${big.join(", ")}” ${big.length === 1 ? "is" : "are"} more than the global batch (${req.global_batch})`]);
    // each size once, in the order typed ("2,2,2" is [2]; the API refuses a size named twice)
    else req.micro_batches = [...new Set(parts.map(Number))];
  }
  return { req, errors };
}

function showErrors(errors) {
  document.querySelectorAll("#plan-form .invalid").forEach((x) => x.classList.remove("invalid"));
  document.querySelectorAll("#plan-form .field-error").forEach((x) => x.remove());
  for (const [el, msg] of errors) {
    el.classList.add("invalid");
    const span = document.createElement("span");
    span.className = "field-error";
    span.textContent = msg;
    el.insertAdjacentElement("afterend", span);
  }
  const err = document.getElementById("plan-error");
  err.textContent = errors.map((e) => e[1]).join("\n");
  err.hidden = !errors.length;
  if (errors.length) errors[0][0].focus?.();
}

function authNote() {
  document.getElementById("auth-note").hidden = !!PP.token();
}

async function submit() {
  const err = document.getElementById("plan-error");
  const progress = document.getElementById("progress");
  const text = document.getElementById("progress-text");
  const button = document.getElementById("submit-plan");
  const { req: fields, errors } = readForm();
  showErrors(errors);
  if (errors.length) return;
  if (!PP.token()) {
    err.textContent = PP.needsToken("Planning", "Plan again (the form stays as it is)");
    err.hidden = false;
    document.getElementById("token").focus();
    return;
  }
  button.disabled = true;
  progress.hidden = false;
  const t0 = performance.now();
  try {
    let profileId = parseInt(document.getElementById("profile").value, 10);
    const file = document.getElementById("profile-file").files[0];
    if (!file && document.getElementById("hf-file").files.length && hfKey() !== hfMade.key) {
      // a config.json chosen but not made into a profile yet (or with other settings): make it first
      text.textContent = "making the profile from config.json…";
      const id = await makeHFProfile();
      if (!id) { progress.hidden = true; button.disabled = false; return; }
      profileId = id;
    }
    if (file) {
      text.textContent = "uploading the profile…";
      let body;
      try { body = JSON.parse(await file.text()); } catch (e) { throw new Error("the profile file is not JSON: " + e.message); }
      profileId = (await PP.api("POST", "/profiles", body)).data.id;
    }
    const req = { profile_id: profileId, ...fields };
    text.textContent = "submitting…";
    let plan = (await PP.api("POST", "/plans", req)).data;
    while (plan.status === "queued" || plan.status === "running") {
      text.textContent = `plan ${plan.id} ${plan.status}… ${((performance.now() - t0) / 1000).toFixed(1)} s`;
      await new Promise((r) => setTimeout(r, 500));
      plan = await PP.get(`/plans/${plan.id}`);
    }
    if (plan.status === "failed") throw new Error(`plan ${plan.id} failed: ${plan.error}`);
    text.textContent = `plan ${plan.id} done: ${plan.num_candidates} candidates`;
    location.href = `/ui/plans/${plan.id}`;
  } catch (e) {
    err.textContent = PP.writeError(e, "Planning", "Plan again (the form stays as it is)");
    err.hidden = false;
    progress.hidden = true;
    button.disabled = false;
  }
}

// ---- a profile from a Hugging Face config.json (POST /profiles/hf-config) ---------------------------------
// The API's 422 names the field ("config.num_key_value_heads: ...", "seq: ..."): shown under the control, and
// the input it is about is outlined.
function hfFieldFor(detail) {
  const field = String(detail).split(/[:.,\s]/, 1)[0];
  return { seq: "hf-seq", name: "hf-name", cluster_id: "cluster", attention: "hf-attention",
    attention_impl: "hf-attention", sequence_parallel: "hf-sp", recompute_granularity: "hf-recompute", kernels: "hf-kernels", expert_gemm: "hf-experts",
    p2p: "hf-p2p", dp_allreduce: "hf-dp", p2p_scatter_gather: "hf-sg", dtype: "hf-dtype",
    gemm_efficiency: "hf-dtype" }[field] || "hf-file";
}

// "Kernels and runtime": what the run will use (POST /profiles/hf-config's attention, attention_impl,
// sequence_parallel, recompute_granularity, kernels, expert_gemm, p2p, dp_allreduce, p2p_scatter_gather, dtype); the defaults are
// pipeplan's executor
const HF_RUNTIME = ["hf-attention", "hf-recompute", "hf-kernels", "hf-experts", "hf-p2p", "hf-dp", "hf-dtype", "hf-sp", "hf-sg"];
function hfRuntime() {
  const v = (id) => document.getElementById(id).value;
  const attention = v("hf-attention");
  const body = {
    attention: attention === "unfused" ? "unfused" : "flash",
    sequence_parallel: document.getElementById("hf-sp").checked,
    recompute_granularity: v("hf-recompute"), kernels: v("hf-kernels"), expert_gemm: v("hf-experts"), p2p: v("hf-p2p"),
    dp_allreduce: v("hf-dp"),
    p2p_scatter_gather: document.getElementById("hf-sg").checked,
  };
  if (attention !== "unfused") body.attention_impl = attention;
  if (v("hf-dtype")) body.dtype = v("hf-dtype");
  return body;
}

// the choices that differ from pipeplan's executor, in words (the summary line and the status after Make)
function hfRuntimeWords() {
  const r = hfRuntime();
  const impl = { flash2: "FlashAttention-2", flash3: "FlashAttention-3", cudnn: "cuDNN fused attention" };
  const words = [
    r.attention_impl ? impl[r.attention_impl] : "",
    r.sequence_parallel ? "sequence parallel" : "",
    r.recompute_granularity === "selective" ? "selective recomputation" : "",
    r.recompute_granularity === "op" ? "op checkpointing" : "",
    r.kernels === "eager" ? "eager PyTorch kernels" : "",
    r.expert_gemm === "sequential" ? "experts one at a time" : "",
    r.p2p === "blocking" ? "blocking pipeline sends" : "",
    r.p2p_scatter_gather ? "scatter/gather sends" : "",
    r.dp_allreduce === "overlapped" ? "all-reduce overlapped with the backward" : "",
    r.dtype || "",
  ].filter(Boolean);
  return words.join(", ");
}

function showRuntimeWords() {
  document.getElementById("hf-runtime-words").textContent = hfRuntimeWords() || "pipeplan's executor";
}
HF_RUNTIME.forEach((id) => document.getElementById(id).addEventListener("change", showRuntimeWords));

// what the selected profile was made from (file, sequence, name, cluster), so Plan makes it only once
let hfMade = { key: null, id: null };
function hfKey() {
  const f = document.getElementById("hf-file").files[0];
  const v = (id) => document.getElementById(id).value.trim();
  return f ? JSON.stringify([f.name, f.size, f.lastModified, v("hf-seq"), v("hf-name"), v("cluster"),
    hfRuntime()]) : null;
}

function clearHF() {
  document.getElementById("hf-file").value = "";
  document.getElementById("hf-status").textContent = "";
  document.getElementById("hf-error").hidden = true;
  hfMade = { key: null, id: null };
}

// returns the id of the profile made (and selected), or undefined when it was not made
async function makeHFProfile() {
  const errEl = document.getElementById("hf-error");
  const status = document.getElementById("hf-status");
  const button = document.getElementById("hf-make");
  const fileEl = document.getElementById("hf-file");
  const ids = ["hf-file", "hf-seq", "hf-name", "cluster", ...HF_RUNTIME];
  ids.forEach((id) => document.getElementById(id).classList.remove("invalid"));
  errEl.hidden = true;
  status.textContent = "";
  const fail = (id, msg) => {
    if (id) document.getElementById(id).classList.add("invalid");
    if (HF_RUNTIME.includes(id)) document.getElementById("hf-runtime").open = true;  // show the control meant
    errEl.textContent = msg;
    errEl.hidden = false;
    status.textContent = "";
  };
  const file = fileEl.files[0];
  if (!file) return fail("hf-file", "config.json: choose a file first (e.g. examples/models/llama-3.1-8b/config.json)");
  const errors = [];
  const seq = wholeNumber("hf-seq", errors);
  if (errors.length) return fail("hf-seq", errors[0][1]);
  if (!PP.token()) {
    fail(null, PP.needsToken("Making a profile", "Make profile again"));
    document.getElementById("token").focus();
    return;
  }
  const clusterId = parseInt(document.getElementById("cluster").value, 10);
  if (!clusterId) return fail("cluster", "Cluster: none is selected (the profile is made for the cluster's device)");
  let config;
  try { config = JSON.parse(await file.text()); } catch (e) {
    return fail("hf-file", `config.json: ${file.name} is not JSON (${e.message})`);
  }
  const key = hfKey();
  const body = { config, cluster_id: clusterId, ...hfRuntime() };
  if (seq !== null) body.seq = seq;
  const name = document.getElementById("hf-name").value.trim();
  if (name) body.name = name;
  button.disabled = true;
  status.textContent = "making the profile…";
  try {
    const r = await PP.api("POST", "/profiles/hf-config", body);
    const p = r.data;
    profiles = [p, ...profiles.filter((x) => x.id !== p.id)];
    renderProfiles();
    document.getElementById("profile").value = String(p.id);
    profileAssumes();
    document.getElementById("profile-file").value = "";  // the plan uses the selected profile, not a JSON file
    profileFile();
    const runtime = hfRuntimeWords();
    status.textContent = `${r.status === 201 ? "made" : "already stored:"} profile #${p.id} ${p.name} on ${p.device} ` +
      `(${p.num_layers} layers${runtime ? `; ${runtime}` : ""}), selected above` +
      ((p.caveats || []).length ? `. Note: ${p.caveats.join("; ")}` : "");
    hfMade = { key, id: p.id };
    return p.id;
  } catch (e) {
    if (e.status === 401 || e.status === 403) fail(null, PP.writeError(e, "Making a profile", "Make profile again"));
    else fail(hfFieldFor(e.message), e.message || String(e));
  } finally {
    button.disabled = false;
  }
}
