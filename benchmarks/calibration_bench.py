"""Calibration from real runs (issue 11 item 5): how much fitting the cluster's factors to finished runs
improves the prediction of runs it was not fitted to.

1. A GPT wider than gpt-tiny (``executor_bench.WIDE``) is profiled here (1 thread) and the link and the
   executor's per-action overhead are measured on 2 local gloo processes (``profile-links
   --executor-overhead``).
2. The planner ranks the configurations for 2 processes; up to 8 distinct ones that fit are run by the
   executor (real compute, fp32, the planner's partition).
3. :func:`planner.calibrate.fit` on all runs (in-sample) and leave-one-out (each run predicted by the
   factors fitted to the others): median and worst |measured / predicted - 1| before and after.

Run: ``PYTHONPATH=. python benchmarks/calibration_bench.py`` (CPU, a few minutes). Timings on a shared
machine vary from run to run: say so with the figures.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

RUNS = 8


def main() -> None:
    import torch
    from executor_bench import WIDE, measured_cluster  # type: ignore[import-not-found]

    from executor.launch import launch
    from executor.models import get_config
    from executor.plan import RunPlan
    from planner.calibrate import Observation, fit, predicted, with_calibration
    from planner.cluster import load_cluster
    from planner.request import Config, TrainingRequest
    from planner.search import plan
    from profiler.run import profile_model

    t0 = time.time()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="pipeplan-bench-") as tmp:
        cluster = load_cluster(measured_cluster(tmp, 2, overhead=True))
    profile = profile_model(get_config("gpt-tiny").with_(**WIDE), micro_batches=[1, 2, 4], threads=1, repeats=7)
    req = TrainingRequest(global_batch=8, gpus=2, top=100)
    seen, picked = set(), []
    for c in plan(profile, cluster, req).candidates:
        d = c.to_dict()
        key = (d["tensor"], d["pipeline"], d["data"], d["micro_batch"], d["schedule"], d["recompute"])
        if d["fits"] and key not in seen:
            seen.add(key)
            picked.append(d)
        if len(picked) == RUNS:
            break
    plans = [RunPlan.from_candidate(d, model="gpt-tiny", model_overrides=WIDE, dtype="float32", iterations=5,
                                    warmup=2) for d in picked]
    res = launch(plans, 2, timeout=300)
    assert res is not None  # one node: rank 0 is here
    fields = ("tensor", "pipeline", "data", "micro_batch", "schedule", "recompute", "chunks", "waves", "pipelines",
              "concat")
    obs = [Observation(profile, req, Config(**{k: d[k] for k in fields if d.get(k) is not None}),
                       run["measured"]["iteration_time"], i)
           for i, (d, run) in enumerate(zip(picked, res["runs"], strict=True))]
    base = with_calibration(cluster, None)
    whole = fit(base, obs)
    loo = []
    for i, o in enumerate(obs):
        others = fit(base, obs[:i] + obs[i + 1:]).calibration
        loo.append(o.measured / predicted(o, with_calibration(base, others)) - 1)
    print(f"\n== calibration from {len(obs)} real runs, 2 processes (gpt {WIDE}, fp32, B=8) ==")
    cal = whole.calibration
    print(f"fitted on all: compute_scale {cal.compute_scale:.3f}, link_scale {cal.link_scale:.3f}, "
          f"action_overhead {cal.action_overhead * 1e6:.0f} us (fitted: {', '.join(cal.fitted)})")
    for w in whole.warnings:
        print(f"note: {w}")
    print(f"{'configuration':<48}{'measured ms':>12}{'before':>9}{'in-sample':>11}{'left out':>10}")
    for j, e in zip(whole.jobs, loo, strict=True):
        print(f"{j.label[:47]:<48}{j.measured * 1e3:>12.1f}{j.measured / j.before - 1:>+9.1%}"
              f"{j.measured / j.after - 1:>+11.1%}{e:>+10.1%}")
    before = [abs(j.measured / j.before - 1) for j in whole.jobs]
    after = [abs(j.measured / j.after - 1) for j in whole.jobs]
    print(f"median |error|: before {median(before):.1%}, in-sample {median(after):.1%}, "
          f"left out {median(abs(e) for e in loo):.1%}; worst: {max(before):.1%}, {max(after):.1%}, "
          f"{max(abs(e) for e in loo):.1%}")
    print(f"(total {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
