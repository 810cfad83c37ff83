"""Per-action overhead of our executor (issue 11 item 4): what an action costs beyond the work it does.

The executor (:mod:`executor.interpreter`) walks each rank's action list in Python: per action it posts
the p2p groups due, dispatches on the kind, runs a stage module (a forward splits and concatenates
micro-batches, a backward calls autograd with the stage's parameters), records two clock stamps. On a CPU
with small layers this is a sizeable part of an iteration that the layer profile does not contain.

We measure it with the executor itself on a model whose layers do nearly nothing (``NEARLY_NOTHING``: hidden
8, sequence 1): ``pipeplan run``'s own trace of ``D`` gloo processes running 1F1B gives every action's
duration, and the profiled times of the same tiny layers (measured in isolation, as any profile is) are
subtracted from F and B, so what remains is the executor's share:

* ``compute``: mean over F and B actions of (duration - the stage's profiled layer time);
* ``send`` / ``recv``: the mean SEND duration and the 10th percentile of RECV durations (a receive also
  waits for its message; its fastest cases are the overhead), each plus an equal share of the p2p posting
  records (``POST``: the isend/irecv calls made before an action; their mean times their count);
* ``allreduce``: mean ALLREDUCE duration (gradient flattening and issuing the collective);
* ``step``: per iteration the shortest STEP over the ranks (the others wait there for the last one),
  mean over iterations: waiting on sends, the tied-embedding all-reduce, the optimizer's fixed cost
  (its per-byte cost is the cluster's ``memory_bandwidth``'s), bookkeeping;
* the loop's own time between records is spread evenly over the actions (added to each kind; the mean over
  ranks and iterations);
* ``split_input`` / ``split_weight``: a second run of the same model under ZB-H1, whose backward is split
  (:mod:`executor.split_backward`): per layer of the stage, the mean over I (W) actions of the duration less
  half the stage's profiled backward (what the cost model charges each) and ``compute``, over the stage's
  layers -- the graph walk I makes and the backward call per join W makes.

Each figure is a **mean** over the measured actions, iterations and ranks, not a median: a prediction of an
iteration adds the actions' costs, so each must be its expected cost, and on a host the per-action costs
have a long tail that every iteration pays (a process preempted when the peer its send wakes takes its core,
gloo's threads, a wake-up from a blocking wait). Measured on the 2-core development machine, 1F1B of this
model, N=16, 20 iterations (the raw figures give both, per kind): the posting records had median 107 us,
mean 317 us on 2 processes and 125 / 487 us on 4; F's overhead 278 / 366 and 341 / 506 us; B's 126 / 252
and 216 / 448 us. With the medians all 17 real runs of ``benchmarks/cpu_run_bench.py`` were slower than
predicted (measured/predicted 1.04-1.55, median 1.13); with the means, two runs: median 1.03 and 1.04. A mean
is the noisier figure: five measurements of ``compute`` on the same machine within minutes gave 273-607 us
(three other runs of 10 iterations: medians 103-193 us, means 198-300 us). The result is a
:class:`planner.cluster.ExecutorOverhead`.
"""

from __future__ import annotations

import platform
import statistics
from collections import defaultdict
from typing import Any

import numpy as np

from planner.cluster import ExecutorOverhead
from planner.schedules.ir import parse_action

NEARLY_NOTHING = {"hidden": 8, "heads": 1, "seq": 1, "vocab": 8, "ffn_hidden": 8}


def _per_kind(trace: dict[str, Any], warmup: int) -> tuple[dict[str, list[tuple[str, float]]], float]:
    """Durations (seconds) per record kind, with the action text, over the measured iterations; and the
    mean gap per action (time of a rank's iteration covered by no record, over its actions: records
    other than POST and OPT)."""
    kinds: dict[str, list[tuple[str, float]]] = defaultdict(list)
    by_rank_iter: dict[tuple[int, int], list[tuple[float, float, bool]]] = defaultdict(list)
    for ev in trace["traceEvents"]:
        if ev.get("ph") != "X" or ev["args"]["iteration"] < warmup:
            continue
        kinds[ev["cat"]].append((ev["name"], ev["dur"] / 1e6))
        by_rank_iter[(ev["tid"], ev["args"]["iteration"])].append((ev["ts"] / 1e6, ev["dur"] / 1e6,
                                                                   ev["cat"] not in ("POST", "OPT")))
    gaps = []
    for recs in by_rank_iter.values():
        recs.sort()
        covered, end = 0.0, recs[0][0]  # OPT nests inside STEP: the union of the records is covered
        for s, d, _ in recs:
            if s + d <= end:
                continue
            covered += s + d - max(s, end)
            end = s + d
        span = end - recs[0][0]
        gaps.append(max(span - covered, 0.0) / max(sum(1 for r in recs if r[2]), 1))  # per action
    return kinds, statistics.fmean(gaps) if gaps else 0.0


def _fastest_rank_steps(trace: dict[str, Any], warmup: int) -> list[float]:
    """Per measured iteration, the shortest STEP over the ranks: the others also wait there for the last
    rank (the tied-embedding all-reduce), which is pipeline time, not overhead."""
    per_iter: dict[int, float] = {}
    for ev in trace["traceEvents"]:
        if ev.get("ph") == "X" and ev["cat"] == "STEP" and ev["args"]["iteration"] >= warmup:
            it = ev["args"]["iteration"]
            per_iter[it] = min(per_iter.get(it, float("inf")), ev["dur"] / 1e6)
    return [per_iter[k] for k in sorted(per_iter)]


def overhead_from_trace(trace: dict[str, Any], fwd: list[float], bwd: list[float], warmup: int,
                        source: str) -> tuple[ExecutorOverhead, dict[str, Any]]:
    """The per-kind overhead of a run's trace (module docstring), ``fwd``/``bwd`` the profiled (or, emulated,
    slept) layer time of each stage; and the raw figures."""
    kinds, gap = _per_kind(trace, warmup)
    compute = []
    for kind, table in (("F", fwd), ("B", bwd)):
        for name, dur in kinds.get(kind, []):
            compute.append(dur - table[parse_action(name).stage])
    sends = [d for k in ("SEND_F", "SEND_B") for _, d in kinds.get(k, [])]
    recvs = [d for k in ("RECV_F", "RECV_B") for _, d in kinds.get(k, [])]
    posts = [d for _, d in kinds.get("POST", [])]
    # the posting records (the expected one: a few are preempted, and that is paid too), shared by the messages
    post_share = sum(posts) / max(len(sends) + len(recvs), 1)
    mean = statistics.fmean
    opt = mean([d for _, d in kinds["OPT"]]) if kinds.get("OPT") else 0.0
    steps = _fastest_rank_steps(trace, warmup)
    ars = [d for _, d in kinds.get("ALLREDUCE", [])]
    ex = ExecutorOverhead(
        compute=max(mean(compute) + gap, 0.0) if compute else 0.0,
        send=max(mean(sends) + post_share + gap, 0.0) if sends else 0.0,
        recv=max(float(np.percentile(recvs, 10)) + post_share + gap, 0.0) if recvs else 0.0,
        allreduce=max(mean(ars) + gap, 0.0) if ars else 0.0,
        step=max(mean(steps) + gap, 0.0) if steps else 0.0,
        source=source)
    med = statistics.median
    raw = {"gap_per_action": gap, "post_share_per_message": post_share, "optimizer": opt, "step_fastest_rank": steps,
           **{k: {"median": med([d for _, d in v]), "mean": mean([d for _, d in v]), "count": len(v)}
              for k, v in sorted(kinds.items())},
           "profiled_fwd_per_stage": fwd, "profiled_bwd_per_stage": bwd}
    return ex, raw


NearlyNothing = tuple[dict[str, Any], Any, list[float], list[float]]


def nearly_nothing(procs: int, microbatches: int = 16, iterations: int = 20, warmup: int = 3) -> NearlyNothing:
    """The run options of the nearly-nothing 1F1B plan on ``procs`` processes, its model's profile (one thread)
    and the profiled forward and backward time of each stage. A caller measuring both overheads on the same
    number of processes profiles it once and hands it to both (``nearly``)."""
    import torch

    from executor.models import get_config
    from executor.plan import RunPlan
    from profiler.run import profile_model

    overrides = {**NEARLY_NOTHING, "layers": 2 * procs}
    kw: dict[str, Any] = {"model": "gpt-tiny", "model_overrides": overrides, "micro_batch": 1, "dtype": "float32",
                          "iterations": iterations, "warmup": warmup}
    torch.set_num_threads(1)
    prof = profile_model(get_config("gpt-tiny").with_(**overrides), micro_batches=[1], threads=1, repeats=21,
                         warmup=5)
    bounds = RunPlan.direct("1f1b", procs, microbatches, **kw).bounds(procs, len(prof.layers))
    fwd = [sum(prof.layers[i].time("fwd", 1) for i in range(a, b)) for a, b in bounds]
    bwd = [sum(prof.layers[i].time("bwd", 1) for i in range(a, b)) for a, b in bounds]
    return kw, prof, fwd, bwd


def _what(procs: int, microbatches: int, iterations: int) -> str:
    import torch

    return (f"{procs} gloo processes on {platform.node()} ({platform.processor() or platform.machine()}), 1F1B, "
            f"N={microbatches}, {iterations} iterations, layers of hidden 8 / sequence 1; torch {torch.__version__}")


def measure_emulated_overhead(procs: int, cluster: Any, microbatches: int = 16, iterations: int = 20,
                              warmup: int = 3, timeout: float = 120.0, nearly: NearlyNothing | None = None,
                              ) -> tuple[ExecutorOverhead, dict[str, Any]]:
    """The overhead of our executor with compute emulated (``--emulate``: every compute action sleeps its
    profiled time, messages are real): the nearly-nothing plan on ``procs`` local gloo processes, emulated with
    its own profile and ``cluster`` (this machine's, with its ``host``), measured as :func:`measure_overhead`
    does with the slept time subtracted. Emulated processes sleep rather than compute, so they are measured
    as many at once as the runs they predict (a sleep's overshoot and a wake-up's wait for a core grow with
    them), not scaled to a core of their own. ``nearly``: :func:`nearly_nothing` of the same arguments, when
    the caller has it."""
    import tempfile
    from pathlib import Path

    from executor.launch import launch
    from executor.plan import RunPlan
    from planner.cluster import save_cluster
    from planner.profile import save_profile

    kw, prof, fwd, bwd = nearly or nearly_nothing(procs, microbatches, iterations, warmup)
    with tempfile.TemporaryDirectory() as tmp:
        ppath, cpath = str(Path(tmp) / "profile.json"), str(Path(tmp) / "cluster.json")
        save_profile(prof, ppath)
        save_cluster(cluster.model_copy(update={"calibration": None, "gpus_per_node": max(cluster.gpus_per_node,
                                                                                          procs)}), cpath)
        plan = RunPlan.direct("1f1b", procs, microbatches, emulate=ppath, cluster=cpath, **kw)
        res = launch([plan], procs, trace=True, timeout=timeout)
    assert res is not None
    return overhead_from_trace(res["runs"][0]["trace"], fwd, bwd, warmup,
                               f"pipeplan's executor with compute emulated (sleeping the profiled time): "
                               f"{_what(procs, microbatches, iterations)}")


def measure_overhead(procs: int = 2, microbatches: int = 16, iterations: int = 20, warmup: int = 3,
                     timeout: float = 120.0, nearly: NearlyNothing | None = None,
                     ) -> tuple[ExecutorOverhead, dict[str, Any]]:
    """Run the executor on ``procs`` local gloo processes with the nearly-nothing model; return the
    overhead and the raw figures (per kind: median and mean seconds, count). ``nearly``: :func:`nearly_nothing` of
    the same arguments, when the caller has it."""
    from executor.launch import launch
    from executor.plan import RunPlan

    kw, prof, fwd, bwd = nearly or nearly_nothing(procs, microbatches, iterations, warmup)
    plans = [RunPlan.direct("1f1b", procs, microbatches, **kw), RunPlan.direct("zb-h1", procs, microbatches, **kw)]
    res = launch(plans, procs, trace=True, timeout=timeout)
    assert res is not None  # one node: rank 0 is here
    what = _what(procs, microbatches, iterations)
    ex, raw = overhead_from_trace(res["runs"][0]["trace"], fwd, bwd, warmup,
                                  f"pipeplan profile-links --executor-overhead: {what}; the split backward "
                                  f"from ZB-H1 on the same")
    layers = [b - a for a, b in plans[1].bounds(procs, len(prof.layers))]
    split, raw["split"] = split_from_trace(res["runs"][1]["trace"], bwd, layers, ex.compute, warmup)
    return ex.model_copy(update=split), raw


def split_from_trace(trace: dict[str, Any], bwd: list[float], layers: list[int], compute: float,
                     warmup: int) -> tuple[dict[str, float], dict[str, Any]]:
    """``split_input`` and ``split_weight`` (module docstring) from a ZB-H1 run's trace: per I (W) action its
    duration less half its stage's profiled backward ``bwd`` and ``compute``, over the stage's ``layers``;
    the mean of each, floored at 0; and the raw per-layer figures."""
    kinds, gap = _per_kind(trace, warmup)
    out: dict[str, float] = {}
    raw: dict[str, Any] = {}
    for kind, name in (("I", "split_input"), ("W", "split_weight")):
        per = [(dur + gap - bwd[parse_action(a).stage] / 2 - compute) / max(layers[parse_action(a).stage], 1)
               for a, dur in kinds.get(kind, [])]
        raw[name] = per
        out[name] = max(statistics.fmean(per), 0.0) if per else 0.0
    return out, raw
