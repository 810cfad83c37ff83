"""Real-compute and emulated executor runs on this machine's CPU: measured against predicted (issues 11 and 13).

For 2 and 4 gloo processes the local cluster is measured first as its jobs run
(:func:`profiler.local_cluster.measured_cluster`: links, the all-reduce of that many processes, the host's
effective cores for that many processes, the executor's per-action overhead), each model is profiled in one
process before and after its runs (:func:`profiler.run.profile_model`, one torch thread, float32: the time of
a layer on a core of its own; sharing the cores is the cost model's part, :func:`planner.cost.host_share`;
per layer the mean of the two, :func:`mean_profile`; the profile times a layer as a pipeline stage
runs it, earlier micro-batches' activations alive, :mod:`profiler.layers`), then

* **real**: each configuration runs for real; predicted = the simulator with that profile and cluster, the
  host's effective cores measured again just before the runs (``Emulator(..., emulated=False).predict()``:
  the same :class:`planner.cost.ConfigCosts` the planner uses), with the time per action kind beside it;
* **emulated**: the same plans with compute replaced by waits (``--emulate``), predicted by the run itself;
* **newcomer**: ``make serve``'s flow -- the planner's first candidate for gpt-tiny on the measured
  ``local-cpu-4`` cluster, global batch 8 -- run for real.

Configurations: 2 processes (D=2) and 4 processes (gpt-tiny: D=2 W=2; gpt-small: D=4), GPipe, 1F1B,
interleaved (2 chunks) and ZB-H1 (zero-bubble's split backward: I and W); gpt-tiny (hidden 64, seq 32:
mostly per-op overhead) and a gpt-small-ish model
(:data:`SMALL`: hidden 256, seq 64, 8 blocks, where compute matters). The figures are the median iteration
over 5 measured iterations after 2 warm-up ones. The machine's load is printed at the start and the end:
on a shared machine it moves every figure; the host's effective cores are measured under that load.

Run: ``PYTHONPATH=. python benchmarks/cpu_run_bench.py [--quick]`` (a few minutes; ``--quick``: gpt-tiny only).
``--interleave R [--model gpt-small] [--procs 2]``: where the error comes from, per action kind, over ``R``
repeats of (host, profile, runs) one after the other (:func:`interleaved`).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

#: a GPT where compute is not all overhead (about 5 ms per block forward at b=2 on one core here)
SMALL = {"hidden": 256, "heads": 4, "seq": 64, "layers": 8, "vocab": 512}
MODELS = {"gpt-tiny": {}, "gpt-small": SMALL}
ITER, WARM, N, B = 5, 2, 8, 2
SCHEDULES: list[tuple[str, dict[str, Any]]] = [("gpipe", {}), ("1f1b", {}), ("interleaved", {"chunks": 2}),
                                               ("zb-h1", {})]


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def cluster_for(procs: int, tmp: str) -> tuple[Any, str]:
    from planner.cluster import load_cluster, save_cluster
    from profiler.local_cluster import measured_cluster

    base = load_cluster(REPO / "examples" / "clusters" / "local-cpu-4.json")
    base = base.model_copy(update={"name": f"local-cpu-{procs}", "gpus_per_node": procs})
    cluster = measured_cluster(base)[0]
    path = str(Path(tmp) / f"cluster-{procs}.json")
    save_cluster(cluster, path)
    return cluster, path


def layouts(model: str, procs: int) -> list[tuple[int, int]]:
    """(D, W) of the configurations run on ``procs`` processes."""
    if procs == 2:
        return [(2, 1)]
    return [(2, 2)] if model == "gpt-tiny" else [(4, 1)]


KINDS = ("F", "B", "I", "W", "STEP")


def mean_profile(a: Any, b: Any) -> Any:
    """Per layer and micro-batch size, the mean time of two profiles of the same model (before and after
    the runs). The VM's speed drifts by tens of percent within a minute (issue 11, cpufid3: six profiles of
    gpt-small taken back to back summed 20.0-27.0 ms forward, 40.3-50.6 ms backward at b=2; one block's
    forward 2.4-3.6 ms from one round of 9 repeats to the next), so one profile is a snapshot of that
    drift; the runs in between see its average. The smaller of the two, as taken before, is biased
    low by about 0.56 of the drift's standard deviation (the expected minimum of two normal draws,
    ``mu - sigma / sqrt(pi)``: 4-7% with the spreads above)."""
    layers = []
    for x, y in zip(a.layers, b.layers, strict=True):
        upd = {k: {s: (getattr(x, k)[s] + getattr(y, k)[s]) / 2 for s in getattr(x, k)}
               for k in ("fwd_time", "bwd_time")}
        layers.append(x.model_copy(update=upd))
    return a.model_copy(update={"layers": layers})


def per_kind_measured(trace: dict[str, Any]) -> dict[str, float]:
    """Seconds per iteration and rank spent in each action kind (measured iterations; RECV: waiting)."""
    sums: dict[str, float] = {}
    ranks, iters = set(), set()
    for ev in trace["traceEvents"]:
        if ev.get("ph") != "X" or ev["args"]["iteration"] < WARM:
            continue
        ranks.add(ev["tid"])
        iters.add(ev["args"]["iteration"])
        kind = "RECV" if ev["cat"].startswith("RECV") else ev["cat"]
        sums[kind] = sums.get(kind, 0.0) + ev["dur"] / 1e6
    n = max(len(ranks) * len(iters), 1)
    return {k: v / n for k, v in sums.items()}


def last_step_measured(trace: dict[str, Any]) -> float:
    """Median over the measured iterations of the STEP (with its optimizer) of the rank that ends the iteration
    last: the STEP on the critical path. The per-rank mean of STEP also holds the other ranks' waits there
    (the last stage waits in the tied-embedding all-reduce for the first stage's last backward)."""
    import statistics

    ends: dict[int, dict[int, tuple[float, float]]] = {}
    for ev in trace["traceEvents"]:
        if ev.get("ph") != "X" or ev["args"]["iteration"] < WARM:
            continue
        it, rank = ev["args"]["iteration"], ev["tid"]
        end, step = ends.setdefault(it, {}).get(rank, (0.0, 0.0))
        ends[it][rank] = (max(end, ev["ts"] + ev["dur"]), ev["dur"] if ev["cat"] == "STEP" else step)
    return statistics.median(max(by_rank.values())[1] for by_rank in ends.values()) / 1e6 if ends else 0.0


def last_step_predicted(em: Any) -> float:
    """The simulator's STEP of the device that ends last."""
    from planner.simulate import simulate

    tl = simulate(em.schedule, em.costs).timeline
    last = max(range(len(tl)), key=lambda d: max((e for _, _, e in tl[d]), default=0.0))
    return sum(e - s for a, s, e in tl[last] if a.kind == "STEP")


def without_inflation(plan: Any, prof: Any, cluster: Any) -> float:
    """The prediction with the host's CPU-time inflation of taking turns on the cores left out (1): what the
    model predicted before it had that term."""
    from executor.emulate import Emulator

    host = cluster.host.model_copy(update={"cpu_inflation": 1.0})
    return Emulator(plan, plan.compute_schedule(), prof, cluster.model_copy(update={"host": host}),
                    emulated=False).predict()["iteration_time"]


def per_kind_predicted(em: Any) -> dict[str, float]:
    """The same from the simulator's timeline (per device of one copy; the copies run alike)."""
    from planner.simulate import simulate

    tl = simulate(em.schedule, em.costs).timeline
    sums: dict[str, float] = {}
    for row_ in tl:
        for a, start, end in row_:
            sums[a.kind] = sums.get(a.kind, 0.0) + end - start
    return {k: v / len(tl) for k, v in sums.items()}


def breakdown(meas: dict[str, float], pred: dict[str, float]) -> str:
    return "  ".join(f"{k} {meas.get(k, 0) * 1e3:.1f}/{pred.get(k, 0) * 1e3:.1f}" for k in KINDS) + \
        f"  RECV wait {meas.get('RECV', 0) * 1e3:.1f}"


def row(label: str, meas: float, pred: float, extra: str = "") -> None:
    print(f"{label:<44}{meas * 1e3:>11.1f}{pred * 1e3:>11.1f}{meas / pred:>8.2f}  {extra}")


def bench(models: list[str], procs_list: list[int]) -> list[tuple[str, float]]:
    import torch

    from executor.emulate import Emulator
    from executor.launch import launch
    from executor.models import get_config
    from executor.plan import RunPlan
    from planner.profile import save_profile
    from profiler.local_cluster import measure_host
    from profiler.run import profile_model

    torch.set_num_threads(1)
    ratios: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="pipeplan-cpu-bench-") as tmp:
        for procs in procs_list:
            cluster, cpath = cluster_for(procs, tmp)
            h = cluster.host
            assert h is not None and cluster.executor is not None
            print(f"\n== {procs} processes: host {h.effective_cores:.2f} effective cores of {h.cores} "
                  f"(slowdown {h.slowdown:.2f}x), all-reduce fit "
                  f"{cluster.allreduce_fit.link if cluster.allreduce_fit else None}, "
                  f"executor overhead compute {cluster.executor.compute * 1e6:.0f} us, step "
                  f"{cluster.executor.step * 1e6:.0f} us; load {load()} ==")
            print(f"{'configuration':<44}{'measured':>11}{'predicted':>11}{'ratio':>8}  (ms)")
            for model in models:
                cfg = get_config("gpt-tiny").with_(**MODELS[model])
                before = profile_model(cfg, micro_batches=[1, 2, 4], threads=1, repeats=9)
                prof = before
                ppath = str(Path(tmp) / f"{model}.json")
                save_profile(prof, ppath)
                plans, labels = [], []
                for D, Wd in layouts(model, procs):
                    for s, kw in SCHEDULES:
                        if s == "interleaved" and D * kw["chunks"] > len(prof.layers):
                            continue
                        plans.append(RunPlan.direct(s, D, N, data=Wd, model="gpt-tiny", model_overrides=MODELS[model],
                                                    micro_batch=B, dtype="float32", iterations=ITER, warmup=WARM,
                                                    **kw))
                        labels.append(f"{model} D={D} W={Wd} b={B} N={N} {s}")
                # the host's cores as they are now (a shared machine's load moves by the minute)
                now = cluster.model_copy(update={"host": measure_host(procs)})
                assert now.host is not None
                print(f"{model}: host now {now.host.effective_cores:.2f} effective cores "
                      f"(slowdown {now.host.slowdown:.2f}x, CPU time {now.host.cpu_inflation:.2f}x taking turns), "
                      f"load {load()}")
                real = launch(plans, procs, trace=True, timeout=600)
                emu_plans = [RunPlan.from_dict({**p.to_dict(), "emulate": ppath, "cluster": cpath}) for p in plans]
                emu = launch(emu_plans, procs, timeout=600)
                assert real is not None and emu is not None
                prof = mean_profile(before, profile_model(cfg, micro_batches=[1, 2, 4], threads=1, repeats=9))
                for label, plan, r, e in zip(labels, plans, real["runs"], emu["runs"], strict=True):
                    em = Emulator(plan, plan.compute_schedule(), prof, now, emulated=False)
                    pred = em.predict()["iteration_time"]
                    meas = r["measured"]["iteration_time"]
                    before = without_inflation(plan, prof, now)
                    row("real " + label, meas, pred, f"core share {em.costs.share:.2f} x turns "
                        f"{em.costs.core_stretch / em.costs.share:.2f}; without turns {before * 1e3:.1f} ms "
                        f"({meas / before:.2f})")
                    print(f"{'':<6}per device and iteration, measured/predicted ms: "
                          f"{breakdown(per_kind_measured(r['trace']), per_kind_predicted(em))}  critical-path "
                          f"STEP {last_step_measured(r['trace']) * 1e3:.1f}/{last_step_predicted(em) * 1e3:.1f}")
                    ratios.append(("real " + label, meas / pred))
                    row("emulated " + label, e["measured"]["iteration_time"], e["predicted"]["iteration_time"])
                    ratios.append(("emulated " + label, e["ratio"]))
            if procs == 4 and "gpt-tiny" in models:
                ratios.append(newcomer(cluster, tmp))
    return ratios


def newcomer(cluster: Any, tmp: str) -> tuple[str, float]:
    """``make serve``'s first job: the planner's top candidate for gpt-tiny on the measured local cluster."""
    from executor.emulate import Emulator
    from executor.launch import launch
    from executor.plan import RunPlan
    from planner.request import TrainingRequest
    from planner.search import plan as plan_search
    from profiler.run import profile_model

    prof = profile_model("gpt-tiny", micro_batches=[1, 2, 4, 8], threads=1, repeats=5, warmup=2)
    cand = plan_search(prof, cluster, TrainingRequest(global_batch=8)).candidates[0].to_dict()
    plan = RunPlan.from_candidate(json.loads(json.dumps(cand, default=str)), model="gpt-tiny", iterations=ITER,
                                  warmup=WARM, dtype="float32")
    c = plan.spec.config
    res = launch([plan], c.pipeline * c.data * c.tensor, timeout=600)
    assert res is not None
    meas = res["runs"][0]["measured"]["iteration_time"]
    em = Emulator(plan, plan.compute_schedule(), prof, cluster, emulated=False)
    label = f"newcomer: plan's first, {cand['label']}"
    row(label, meas, cand["iteration_time"], f"(simulated again: {em.predict()['iteration_time'] * 1e3:.1f} ms)")
    return label, meas / cand["iteration_time"]


def predicted_by_kind(em: Any) -> dict[str, tuple[float, float]]:
    """Per device and iteration, per compute kind (and STEP): (the profile's work alone, the simulator's
    duration: work and the executor's overhead, stretched by the host's core share)."""
    from planner.simulate import simulate

    tl = simulate(em.schedule, em.costs).timeline
    out: dict[str, list[float]] = {}
    for d, row_ in enumerate(tl):
        for a, start, end in row_:
            if a.kind in ("F", "B", "I", "W", "STEP"):
                work = em.costs.step_work(d) if a.kind == "STEP" else em.costs.work(a.kind, a.stage, a.span)
                acc = out.setdefault(a.kind, [0.0, 0.0])
                acc[0] += work
                acc[1] += end - start
    return {k: (v[0] / len(tl), v[1] / len(tl)) for k, v in out.items()}


def interleaved(model: str, procs: int, repeats: int) -> None:
    """Item 1 of issue 11: where the prediction error of real runs comes from, per action kind. The cluster
    (links, all-reduce, executor overhead) is measured once; then ``repeats`` times, one after the other:
    the host's cores (:func:`profiler.local_cluster.measure_host`), the model's profile (one process, one
    thread), and a real run of each schedule with its prediction from those figures. Per kind it prints
    the measured wall time and the walker's CPU time (``measured.time_by_kind`` / ``cpu_by_kind``) beside
    the profile's work and the simulator's duration (work + overhead, times the core share), then the
    medians over the repeats, with the load average of each repeat."""
    import statistics

    import torch

    from executor.emulate import Emulator
    from executor.launch import launch
    from executor.models import get_config
    from executor.plan import RunPlan
    from profiler.local_cluster import measure_host
    from profiler.run import profile_model

    torch.set_num_threads(1)
    cfg = get_config("gpt-tiny").with_(**MODELS[model])
    rows: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="pipeplan-cpu-bench-") as tmp:
        cluster, _ = cluster_for(procs, tmp)
        ex = cluster.executor
        assert ex is not None
        print(f"{model}, {procs} processes: executor overhead compute {ex.compute * 1e6:.0f} us, send "
              f"{ex.send * 1e6:.0f}, recv {ex.recv * 1e6:.0f}, step {ex.step * 1e6:.0f}; load {load()}")
        D, Wd = layouts(model, procs)[0]
        plans = {s: RunPlan.direct(s, D, N, data=Wd, model="gpt-tiny", model_overrides=MODELS[model], micro_batch=B,
                                   dtype="float32", iterations=ITER, warmup=WARM, **kw) for s, kw in SCHEDULES
                 if not (s == "interleaved" and D * kw.get("chunks", 1) > cfg.layers + 2)}
        for rep in range(repeats):
            host = measure_host(procs, rounds=3, reps=100)
            prof = profile_model(cfg, micro_batches=[1, 2, 4], threads=1, repeats=5, warmup=2)
            now = cluster.model_copy(update={"host": host})
            res = launch(list(plans.values()), procs, trace=True, timeout=600)
            assert res is not None
            print(f"repeat {rep + 1}: host {host.effective_cores:.2f} effective cores, CPU time "
                  f"{host.cpu_inflation:.2f}x taking turns, load {load()}")
            for (name, plan), run in zip(plans.items(), res["runs"], strict=True):
                em = Emulator(plan, plan.compute_schedule(), prof, now, emulated=False)
                pred = em.predict()["iteration_time"]
                m = run["measured"]
                wall, cpu, pk = m["time_by_kind"], m["cpu_by_kind"] or {}, predicted_by_kind(em)
                fig = {"ratio": m["iteration_time"] / pred,
                       "ratio without turns": m["iteration_time"] / without_inflation(plan, prof, now),
                       "share": em.costs.share, "turns": em.costs.core_stretch / em.costs.share,
                       "crit STEP meas/pred": (last_step_measured(run["trace"]) / last_step_predicted(em)
                                               if run.get("trace") else 0.0)}
                parts = []
                for k in ("F", "B", "STEP"):
                    w, c = wall.get(k, 0.0) + (wall.get("OPT", 0.0) if k == "STEP" else 0.0), cpu.get(k, 0.0)
                    fig.update({f"{k} wall/pred": w / pk[k][1], f"{k} cpu/work": c / pk[k][0] if pk[k][0] else 0.0,
                                f"{k} wall/cpu": w / c if c else 0.0})
                    parts.append(f"{k} wall {w * 1e3:.1f} cpu {c * 1e3:.1f} | work {pk[k][0] * 1e3:.1f} "
                                 f"pred {pk[k][1] * 1e3:.1f}")
                fig["RECV+other wall"] = (wall.get("RECV", 0.0) + wall.get("other", 0.0)) * 1e3
                # the same prediction with the host's slowdown as the run itself had it (wall per CPU second
                # of its F and B): what is left is the model's error apart from the load's change
                seen = ((wall.get("F", 0.0) + wall.get("B", 0.0)) / (cpu.get("F", 0.0) + cpu.get("B", 0.0))
                        if cpu.get("F") else 0.0)
                if seen > 0:
                    assert now.host is not None
                    during = now.model_copy(update={"host": now.host.model_copy(update={
                        "effective_cores": min(float(now.host.cores), procs / seen), "slowdown": seen})})
                    em2 = Emulator(plan, plan.compute_schedule(), prof, during, emulated=False)
                    fig["ratio at run load"] = m["iteration_time"] / em2.predict()["iteration_time"]
                    fig["seen slowdown"] = seen
                rows.setdefault(name, []).append(fig)
                print(f"  {name:<12} measured {m['iteration_time'] * 1e3:.1f} predicted {pred * 1e3:.1f} ratio "
                      f"{fig['ratio']:.2f} share {em.costs.share:.2f} (ratio at the run's own load "
                      f"{fig.get('ratio at run load', 0):.2f}); ms per device: " + "; ".join(parts)
                      + f"; RECV wait {wall.get('RECV', 0) * 1e3:.1f} other {wall.get('other', 0) * 1e3:.1f}")
    print(f"\nmedians over {repeats} repeats ({model}, {procs} processes; load at end {load()}):")
    for name, figs in rows.items():
        print(f"  {name:<12} " + "  ".join(f"{k} {statistics.median(f[k] for f in figs):.2f}" for k in figs[0]))


def main() -> None:
    if "--interleave" in sys.argv:
        i = sys.argv.index("--interleave")
        repeats = int(sys.argv[i + 1])
        model = sys.argv[sys.argv.index("--model") + 1] if "--model" in sys.argv else "gpt-small"
        procs = int(sys.argv[sys.argv.index("--procs") + 1]) if "--procs" in sys.argv else 2
        print(f"load at start (1, 5, 15 min): {load()}")
        interleaved(model, procs, repeats)
        return
    quick = "--quick" in sys.argv
    t0 = time.time()
    print(f"load at start (1, 5, 15 min): {load()}")
    ratios = bench(["gpt-tiny"] if quick else ["gpt-tiny", "gpt-small"], [2, 4])
    real = [r for n, r in ratios if not n.startswith("emulated")]
    emu = [r for n, r in ratios if n.startswith("emulated")]
    print(f"\nreal (and newcomer): {len(real)} runs, ratio min {min(real):.2f} "
          f"median {sorted(real)[len(real) // 2]:.2f} "
          f"max {max(real):.2f}; within 15%: {sum(abs(r - 1) <= 0.15 for r in real)}")
    print(f"emulated: {len(emu)} runs, ratio min {min(emu):.2f} median {sorted(emu)[len(emu) // 2]:.2f} "
          f"max {max(emu):.2f}; within 10%: {sum(abs(r - 1) <= 0.10 for r in emu)}")
    print(f"load at end: {load()}  (total {time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
