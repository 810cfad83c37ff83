"""What a simulated candidate's time is made of: the breakdown of the device that finishes last and the
papers' closed forms (Chimera eq. 1, Megatron-LM 2.2) for comparison."""

from __future__ import annotations

from planner.cost import ConfigCosts, chimera_eq1, megatron_closed_form
from planner.simulate import SimResult


def breakdown(res: SimResult, costs: ConfigCosts | None = None) -> dict[str, float]:
    """Where the time of the device that finishes last goes: its compute, its exposed all-reduce
    (between its last computation and its optimizer step), the step, and bubble (the rest:
    waiting for inputs, exposed p2p included). ``comm_busy`` is the busy time of its communication
    streams (sends and all-reduces), mostly overlapped. Where every micro-batch gathers its sharded weights
    (:mod:`planner.fsdp`, no pipeline), ``fsdp_in_compute``: the part of ``compute`` that is those
    collectives beyond what the layers' compute hides, and what the hidden ones take from that compute
    (:meth:`ConfigCosts.fsdp_extra`, :mod:`planner.contention`), and ``fsdp_comm_busy``
    the time they keep the link busy, hidden or not (:meth:`ConfigCosts.fsdp_link`). With expert parallelism,
    ``alltoall_in_compute``: the part of ``compute`` that is the experts' all-to-alls (:meth:`ConfigCosts.ep_in`)."""
    d = max(range(len(res.devices)), key=lambda i: res.devices[i].step[1])
    st = res.devices[d]
    step_start, step_end = st.step
    compute = st.busy - (step_end - step_start)
    exposed_ar = max(0.0, step_start - st.compute_end)
    bubble = res.makespan - compute - exposed_ar - (step_end - step_start)
    # a device that never waits leaves the rounding of the sum above (the UI showed "bubble 6.939e-12 µs")
    bubble = bubble if bubble > 1e-9 * res.makespan else 0.0
    out = {"compute": compute, "allreduce_exposed": exposed_ar, "step": step_end - step_start,
           "bubble": bubble, "comm_busy": st.comm}
    if costs is not None and costs.fsdp_per_microbatch:
        out["fsdp_in_compute"] = sum(costs.fsdp_extra(a.kind, a.stage, a.span) for a, _, _ in res.timeline[d])
        out["fsdp_comm_busy"] = sum(costs.fsdp_link(a.kind, a.stage) for a, _, _ in res.timeline[d])
    if costs is not None and costs.expert > 1:
        out["alltoall_in_compute"] = sum(costs.ep_in(a.kind, a.stage, a.span) for a, _, _ in res.timeline[d])
    return out


def closed_forms(res: SimResult, costs: ConfigCosts, N: int) -> dict[str, float | None]:
    """Chimera's eq. 1 and Megatron-LM's closed form of the configuration, from its stage times."""
    cfg = costs.config
    S = costs.schedule.stages
    f_t = max(costs.fwd(s) for s in range(S))
    b_t = max(costs.bwd(s) for s in range(S))
    sample_p2p = costs.p2p("SEND_F", 0, 1, 0, 1) if S > 1 and cfg.pipeline > 1 else 0.0
    unoverlapped = 0.0
    eager = set(costs.schedule.params.get("eager") or []) if isinstance(
        costs.schedule.params.get("eager"), list) else set()
    for d in range(cfg.pipeline):
        late = sum(costs.allreduce(s, r, d) for r, s in costs.schedule.stages_on(d) if s not in eager)
        unoverlapped = max(unoverlapped, late)
    per_dev = S // cfg.pipeline if S % cfg.pipeline == 0 else 1
    return {
        "chimera_eq1": chimera_eq1(f_t, b_t, sample_p2p, res.critical_forward, res.critical_backward,
                                   unoverlapped),
        "megatron": megatron_closed_form(cfg.schedule, cfg.pipeline, N, f_t * per_dev, b_t * per_dev,
                                         cfg.chunks or 1),
    }
