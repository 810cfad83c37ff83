"""PipeDream's weight stashing computed in one process with explicit weight versions: what an asynchronous
per-micro-batch schedule (``pipedream``, ``pipedream-rr``) must equal (Harlap et al., SOSP'19, section 3.3).

Independent of the interpreter (:mod:`executor.interpreter`): it walks the schedule's compute-only lists in any
order their data allows (a device's weights depend only on its own list's order) and keeps, per device, the live
weights of the stage replica it holds and, per micro-batch in flight, **the copy of the weights its forward used**
(the stashed version), from which its backward computes the gradients. Every stage replica steps (plain SGD,
``p - lr g``) after each backward. A ``pipedream-rr`` window then adds, on each replica of a replicated stage,
the other replicas' updates of the window (``params["replica_sync"] == "per-window"``,
:mod:`planner.schedules.pipedream_rr`). Losses are scaled by ``1 / N``, as the interpreter scales them (W = 1).

``stash=False`` is the negative control: each backward recomputes its forward on the **live** weights of that
moment (no stash), so its gradient is taken at weights its forward did not use; a run whose parameters equal the
stashed reference and differ from this one used its stashes.
"""

from __future__ import annotations

import torch
from torch.func import functional_call

from executor.interpreter import DTYPES, StageModule
from executor.models.llama import expert_bias_state, not_counted, update_expert_bias
from executor.plan import RunPlan
from planner.schedules.ir import B, F


def train_stashed_reference(plan: RunPlan, steps: int, stash: bool = True) -> dict[str, torch.Tensor]:
    """``"{layer}.{name}" -> tensor`` after ``steps`` windows (iterations) of the plan's asynchronous schedule.

    Every replica of a stage ends a window with the same weights (one entry per parameter)."""
    sched = plan.compute_schedule()
    kinds = {a.kind for row in sched.actions for a in row}
    if not kinds <= {F, B}:
        raise ValueError(f"the stashed reference runs F and B only, the schedule has {sorted(kinds)}")
    if plan.spec.config.data != 1 or plan.spec.config.tensor != 1:
        raise ValueError("the stashed reference runs W = t = 1 (as the executor runs asynchronous schedules)")
    source, dtype, rows, N, S = plan.source(), DTYPES[plan.dtype], plan.rows, sched.microbatches, sched.stages
    bounds = plan.bounds(S)
    held = sched.stages_by_device()
    if any(len(h) != 1 for h in held):
        raise ValueError("the stashed reference needs one stage per device")
    stage_of = [h[0][1] for h in held]
    modules = []
    for s in range(S):
        a, b = bounds[s]
        modules.append(StageModule(source.build(plan.seed, a, b), a, rows, False).to(dtype=dtype))
    live = [{n: p.detach().clone() for n, p in modules[stage_of[d]].named_parameters()}
            for d in range(sched.devices)]
    window_sync = sched.params.get("replica_sync") == "per-window"
    replicas = [[d for d in range(sched.devices) if stage_of[d] == s] for s in range(S)]
    for step in range(steps):
        inputs, targets = source.batch(plan.spec.global_batch, plan.seed, step)
        inputs = inputs.to(dtype) if inputs.is_floating_point() else inputs
        applied = [{n: torch.zeros_like(p) for n, p in w.items()} for w in live]
        acts: dict[tuple[int, int], torch.Tensor] = {}  # (stage, mb) -> output sent to stage + 1
        grads: dict[tuple[int, int], torch.Tensor] = {}  # (stage, mb) -> gradient sent to stage - 1
        saved: dict[tuple[int, int], tuple[torch.Tensor, dict[str, torch.Tensor]]] = {}
        pos = [0] * sched.devices
        left = sum(len(row) for row in sched.actions)
        while left:
            moved = False
            for d, row in enumerate(sched.actions):
                while pos[d] < len(row):
                    a = row[pos[d]]
                    s, m, mod = a.stage, a.mb, modules[a.stage]
                    if a.kind == F:
                        if s > 0 and (s - 1, m) not in acts:
                            break
                        x = inputs[m * rows:(m + 1) * rows] if s == 0 else acts.pop((s - 1, m))
                        x = x.detach().requires_grad_(s > 0)
                        params = {n: p.clone() for n, p in live[d].items()}  # the stashed version
                        saved[(s, m)] = (x, params)
                        if s < S - 1:  # (the routers' loads are counted by the backward's forward)
                            with torch.no_grad(), not_counted():
                                acts[(s, m)] = functional_call(mod, params, (x, None))[0]
                    else:
                        if s < S - 1 and (s + 1, m) not in grads:
                            break
                        x, params = saved.pop((s, m))
                        used = params if stash else {n: p.clone() for n, p in live[d].items()}
                        used = {n: p.detach().requires_grad_(True) for n, p in used.items()}
                        tg = [targets[m * rows:(m + 1) * rows]] if mod.has_head else None
                        out = functional_call(mod, used, (x, tg))[0]
                        if mod.has_head:
                            out = out / N
                        wrt = list(used.values()) + ([x] if s > 0 else [])
                        got = torch.autograd.grad(out, wrt, None if s == S - 1 else grads.pop((s + 1, m)),
                                                  allow_unused=True)
                        if s > 0:
                            grads[(s, m)] = got[-1]
                        for (n, _), g in zip(used.items(), got, strict=False):
                            if g is not None:
                                live[d][n].add_(g, alpha=-plan.lr)
                                applied[d][n] += g
                    pos[d] += 1
                    left -= 1
                    moved = True
            if not moved:
                raise ValueError("the schedule's lists wait on each other (deadlock)")
        if window_sync:
            for devs in replicas:
                if len(devs) < 2:
                    continue
                total = {n: sum(applied[d][n] for d in devs) for n in applied[devs[0]]}
                for d in devs:
                    for n, p in live[d].items():
                        p.add_(total[n] - applied[d][n], alpha=-plan.lr)
        for mod in modules:  # DeepSeek-V3's bias, once per iteration (the replicas of a stage share its module)
            update_expert_bias([mod], plan.expert_bias_rate)
    out: dict[str, torch.Tensor] = {}
    for d in range(sched.devices):
        start = bounds[stage_of[d]][0]
        for n, canonical in _aliases(modules[stage_of[d]]).items():
            li, rest = n.split(".", 2)[1:]  # "layers.{i}.{name}" in the StageModule
            out.setdefault(f"{start + int(li)}.{rest}", live[d][canonical].clone())
        for li, layer in enumerate(modules[stage_of[d]].layers):
            for n, b in expert_bias_state(layer).items():
                out.setdefault(f"{start + li}.{n}", b)
    return out


def _aliases(module: torch.nn.Module) -> dict[str, str]:
    """Every parameter name of ``module`` -> the name ``named_parameters`` lists its Parameter under: a weight
    that two layers of one stage share (the tied embedding and LM head of a one-stage run) is one entry of
    the stage's weights, and a parameter of both layers."""
    first: dict[int, str] = {}
    return {n: first.setdefault(id(p), n) for n, p in module.named_parameters(remove_duplicate=False)}
