// New plan page: POST /plans (after POST /profiles for an uploaded file), poll GET /plans/{id}, then go
// to the comparison page.
"use strict";

PP.start(async () => {
  const [profiles, clusters] = await Promise.all([PP.get("/profiles?limit=1000"), PP.get("/clusters?limit=1000")]);
  const psel = document.getElementById("profile");
  psel.innerHTML = profiles.map((p) =>
    `<option value="${p.id}">${PP.esc(p.name)} on ${PP.esc(p.device)} (${p.num_layers} layers, #${p.id})</option>`).join("");
  const csel = document.getElementById("cluster");
  csel.innerHTML = clusters.map((c) =>
    `<option value="${c.id}" data-device="${PP.esc(c.device)}">${PP.esc(c.name)} (${c.gpus} × ${PP.esc(c.device)}, #${c.id})</option>`).join("");
  // pick the first cluster of the profile's device
  const syncCluster = () => {
    const p = profiles.find((x) => String(x.id) === psel.value);
    const match = p && [...csel.options].find((o) => o.dataset.device === p.device);
    if (match) csel.value = match.value;
  };
  psel.addEventListener("change", syncCluster);
  syncCluster();
  document.getElementById("plan-form").addEventListener("submit", (ev) => { ev.preventDefault(); submit(); });
  document.body.dataset.ready = "1";
});

function intOrNull(id) {
  const v = document.getElementById(id).value.trim();
  return v === "" ? null : parseInt(v, 10);
}

async function submit() {
  const err = document.getElementById("plan-error");
  const progress = document.getElementById("progress");
  const text = document.getElementById("progress-text");
  const button = document.getElementById("submit-plan");
  err.hidden = true;
  button.disabled = true;
  progress.hidden = false;
  const t0 = performance.now();
  try {
    let profileId = parseInt(document.getElementById("profile").value, 10);
    const file = document.getElementById("profile-file").files[0];
    if (file) {
      text.textContent = "uploading the profile…";
      let body;
      try { body = JSON.parse(await file.text()); } catch (e) { throw new Error("the profile file is not JSON: " + e.message); }
      profileId = (await PP.api("POST", "/profiles", body)).data.id;
    }
    const schedules = [...document.querySelectorAll("input[name=schedule]:checked")].map((x) => x.value);
    const mbs = document.getElementById("micro-batches").value.trim();
    const req = {
      profile_id: profileId,
      cluster_id: parseInt(document.getElementById("cluster").value, 10),
      global_batch: intOrNull("global-batch"),
      gpus: intOrNull("gpus"),
      max_tensor: intOrNull("max-tensor"),
      top: intOrNull("top") || 10,
      schedules: schedules.length ? schedules : null,
      allow_async: document.getElementById("allow-async").checked,
      allow_recompute: document.getElementById("allow-recompute").checked,
      micro_batches: mbs ? mbs.split(/[\s,]+/).filter(Boolean).map((x) => parseInt(x, 10)) : null,
    };
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
    err.textContent = e.message || String(e);
    err.hidden = false;
    progress.hidden = true;
    button.disabled = false;
  }
}
