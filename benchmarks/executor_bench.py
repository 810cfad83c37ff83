"""Executor benchmark (issue 5): measured vs predicted iteration time, and ours vs torch.distributed.pipelining.

1. **Emulated, 8 processes** -- every schedule on D = 8 with a uniform profile (compute waits for the profiled
   time, communication is real, ``"emulated": true``): measured iteration time / the simulator's prediction
   with the same costs and the link measured first on the same 8 processes (goal: within 10%).
2. **Real compute, 2 processes** -- gpt-tiny, fp32, one thread per process: measured / predicted from a
   profile measured here (:func:`profiler.run.profile_model`).
3. **Ours vs torch** -- the same model (:data:`VERSUS`, a GPT where compute matters, untied embeddings;
   ``torch-tiny``: gpt-tiny), partition, micro-batches and processes under torch's ``ScheduleGPipe`` /
   ``Schedule1F1B`` / ``ScheduleInterleaved1F1B``, the two run alternately (goal: ratio <= 1).

4. **Real compute, a wider GPT, 2 processes** -- measured / predicted without and with the executor's
   per-action overhead measured here (``profile-links --executor-overhead``; goal: within 15%).

Run: ``PYTHONPATH=. python benchmarks/executor_bench.py [emulated,real,wide,torch,torch-tiny]`` (CPU, gloo; a few
minutes; the argument picks sections, all by default).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

MODEL = "gpt-tiny"
D_REAL, N_REAL, B_REAL = 2, 8, 2
ITER, WARM = 5, 2


def measured_cluster(tmp: str, procs: int = 8, overhead: bool = False) -> str:
    """A cluster file whose link is measured on ``procs`` local gloo processes (``pipeplan profile-links``):
    on a small CPU machine a message costs far more than the emulated default link assumes. ``overhead``:
    also the executor's per-action overhead (``--executor-overhead``, :mod:`profiler.overhead`)."""
    from planner.cluster import Cluster, ExecutorOverhead, Link, save_cluster

    links = Path(tmp) / f"links-{procs}.json"
    subprocess.run([sys.executable, "-m", "pipeplan.cli", "profile-links", "--local-procs", str(procs),
                    "--out", str(links)] + (["--executor-overhead"] if overhead else []),
                   check=True, capture_output=True, cwd=REPO)
    data = json.loads(links.read_text())
    fit = data["intra_node"]
    link = Link(alpha=fit["alpha"], beta=fit["beta"])
    ex = ExecutorOverhead.model_validate(data["executor_overhead"]) if overhead else None
    path = Path(tmp) / f"cluster-{procs}{'-overhead' if overhead else ''}.json"
    save_cluster(Cluster(name=f"local-{procs}-procs", nodes=1, gpus_per_node=procs, device="cpu",
                         memory_bytes=2**40, peak_flops=1e12, memory_bandwidth=1e12, intra=link, inter=link,
                         executor=ex, notes="link (and executor overhead) measured by pipeplan profile-links "
                         "on this machine"), path)
    return str(path)


def emulated() -> None:
    from executor.emulate import uniform_profile
    from executor.launch import launch
    from executor.plan import RunPlan
    from planner.profile import save_profile

    with tempfile.TemporaryDirectory(prefix="pipeplan-bench-") as tmp:
        path = Path(tmp) / "profile.json"
        save_profile(uniform_profile(16, fwd=0.006, bwd=0.012, out_bytes=16384, param_bytes=1 << 16), path)
        cases = [("gpipe", {}), ("1f1b", {}), ("interleaved", {"chunks": 2}), ("chimera", {}),
                 ("hanayo", {"waves": 1}), ("zb-h1", {}), ("gems", {})]
        cluster = measured_cluster(tmp)
        print(f"link measured on 8 local processes: {json.loads(Path(cluster).read_text())['intra']}")
        plans = [RunPlan.direct(s, 8, 8, emulate=str(path), iterations=ITER, warmup=WARM, cluster=cluster, **kw)
                 for s, kw in cases]
        res = launch(plans, 8, timeout=120)
        assert res is not None  # one node: rank 0 is here
    print("\n== emulated compute, 8 processes (D=8, N=8, uniform 16-layer profile) ==")
    print(f"{'schedule':<22}{'predicted ms':>14}{'measured ms':>14}{'ratio':>8}{'bubble pred':>13}{'bubble meas':>13}")
    for (s, kw), run in zip(cases, res["runs"], strict=True):
        label = s + (f"({','.join(f'{k}={v}' for k, v in kw.items())})" if kw else "")
        print(f"{label:<22}{run['predicted']['iteration_time'] * 1e3:>14.2f}"
              f"{run['measured']['iteration_time'] * 1e3:>14.2f}{run['ratio']:>8.3f}"
              f"{run['predicted']['bubble_ratio']:>13.3f}{run['measured']['bubble_ratio']:>13.3f}")


def real() -> dict[str, float]:
    import torch

    from executor.emulate import Emulator
    from executor.launch import launch
    from executor.models import get_config
    from executor.plan import RunPlan
    from planner.cluster import load_cluster
    from profiler.run import profile_model

    with tempfile.TemporaryDirectory(prefix="pipeplan-bench-") as tmp:
        cluster = load_cluster(measured_cluster(tmp, D_REAL, overhead=True))
    torch.set_num_threads(1)
    profile = profile_model(get_config(MODEL), micro_batches=[1, 2, 4], threads=1, repeats=7)
    cases = [("gpipe", {}), ("1f1b", {}), ("interleaved", {"chunks": 2}), ("chimera", {}),
             ("hanayo", {"waves": 1}), ("zb-h1", {}), ("gems", {})]
    plans = [RunPlan.direct(s, D_REAL, N_REAL, model=MODEL, micro_batch=B_REAL, dtype="float32", iterations=ITER,
                            warmup=WARM, **kw) for s, kw in cases]
    res = launch(plans, D_REAL, timeout=120)
    assert res is not None  # one node: rank 0 is here
    print(f"\n== real compute, {D_REAL} processes ({MODEL}, fp32, N={N_REAL}, b={B_REAL}) ==")
    print("predicted: the default local link; pred+ovh: link and executor overhead measured here")
    print(f"{'schedule':<22}{'predicted ms':>14}{'measured ms':>14}{'ratio':>8}{'pred+ovh ms':>13}{'ratio':>8}")
    out = {}
    for (s, kw), plan, run in zip(cases, plans, res["runs"], strict=True):
        pred = Emulator(plan, plan.compute_schedule(), profile).predict()["iteration_time"]
        with_ovh = Emulator(plan, plan.compute_schedule(), profile, cluster).predict()["iteration_time"]
        meas = run["measured"]["iteration_time"]
        out[s] = meas
        label = s + (f"({','.join(f'{k}={v}' for k, v in kw.items())})" if kw else "")
        print(f"{label:<22}{pred * 1e3:>14.2f}{meas * 1e3:>14.2f}{meas / pred:>8.3f}{with_ovh * 1e3:>13.2f}"
              f"{meas / with_ovh:>8.3f}")
    return out


#: a GPT wider than gpt-tiny, so that compute is not all overhead (about 10 ms per block forward at b=2)
WIDE = {"hidden": 256, "heads": 4, "seq": 64, "layers": 4, "vocab": 512}


def real_wide() -> None:
    """Real compute, a wider GPT, 2 processes: measured / predicted from a profile measured here, without
    and with the executor's per-action overhead (and the link) measured by ``pipeplan profile-links
    --local-procs 2 --executor-overhead``. Goal: within 15% with the overhead."""
    import torch

    from executor.emulate import Emulator
    from executor.launch import launch
    from executor.models import get_config
    from executor.plan import RunPlan
    from planner.cluster import load_cluster
    from profiler.run import profile_model

    with tempfile.TemporaryDirectory(prefix="pipeplan-bench-") as tmp:
        cluster = load_cluster(measured_cluster(tmp, D_REAL, overhead=True))
    ex = cluster.executor.model_dump(exclude={"source"}) if cluster.executor else None
    print(f"\nexecutor overhead measured here (s per action): {ex}")
    print(f"link measured here: {cluster.intra}")
    torch.set_num_threads(1)
    cfg = get_config(MODEL).with_(**WIDE)
    profile = profile_model(cfg, micro_batches=[1, 2, 4], threads=1, repeats=7)
    cases = [("gpipe", {}), ("1f1b", {}), ("interleaved", {"chunks": 2}), ("chimera", {}),
             ("hanayo", {"waves": 1}), ("zb-h1", {}), ("gems", {})]
    plans = [RunPlan.direct(s, D_REAL, N_REAL, model=MODEL, model_overrides=WIDE, micro_batch=B_REAL,
                            dtype="float32", iterations=ITER, warmup=WARM, **kw) for s, kw in cases]
    res = launch(plans, D_REAL, timeout=300)
    assert res is not None  # one node: rank 0 is here
    best = fastest(profile, profile_model(cfg, micro_batches=[1, 2, 4], threads=1, repeats=7))  # after the runs
    plain = cluster.model_copy(update={"executor": None})
    print(f"\n== real compute, {D_REAL} processes (gpt {WIDE}, fp32, N={N_REAL}, b={B_REAL}) ==")
    print("median iteration vs the profile taken before the runs; fastest iteration vs the faster of the two "
          "profiles (before and after the runs: on a shared machine noise only adds time)")
    print(f"{'schedule':<22}{'measured ms':>12}{'pred ms':>10}{'ratio':>8}{'pred+ovh ms':>13}{'ratio':>8}"
          f"{'fastest ms':>12}{'pred+ovh ms':>13}{'ratio':>8}")
    for (s, kw), plan, run in zip(cases, plans, res["runs"], strict=True):
        meas = run["measured"]["iteration_time"]
        low = min(run["measured"]["iteration_times"])
        before = Emulator(plan, plan.compute_schedule(), profile, plain).predict()["iteration_time"]
        after = Emulator(plan, plan.compute_schedule(), profile, cluster).predict()["iteration_time"]
        after_best = Emulator(plan, plan.compute_schedule(), best, cluster).predict()["iteration_time"]
        label = s + (f"({','.join(f'{k}={v}' for k, v in kw.items())})" if kw else "")
        print(f"{label:<22}{meas * 1e3:>12.2f}{before * 1e3:>10.2f}{meas / before:>8.3f}{after * 1e3:>13.2f}"
              f"{meas / after:>8.3f}{low * 1e3:>12.2f}{after_best * 1e3:>13.2f}{low / after_best:>8.3f}")


def fastest(a: Any, b: Any) -> Any:
    """Per layer and micro-batch size, the smaller time of two profiles of the same model."""
    layers = []
    for x, y in zip(a.layers, b.layers, strict=True):
        upd = {k: {s: min(getattr(x, k)[s], getattr(y, k)[s]) for s in getattr(x, k)}
               for k in ("fwd_time", "bwd_time")}
        layers.append(x.model_copy(update=upd))
    return a.model_copy(update={"layers": layers})


def torch_worker(kind: str, out: str, overrides: dict[str, Any] | None = None) -> None:
    """Under torchrun: torch.distributed.pipelining on the same model, partition and micro-batches."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch import nn
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    from executor.models import build_layers, get_config
    from executor.models.data import synthetic_batch
    from executor.plan import even_layer_split

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))
    rank, world = dist.get_rank(), dist.get_world_size()
    cfg = get_config(MODEL).with_(**(overrides or {}))
    chunks = 2 if kind == "interleaved" else 1
    S = world * chunks
    bounds = even_layer_split(cfg.num_profile_layers, S)

    class Part(nn.Module):
        def __init__(self, a: int, b: int) -> None:
            super().__init__()
            self.layers = nn.ModuleList(build_layers(cfg, 0, a, b))
            self.last = b == cfg.num_profile_layers

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for i, layer in enumerate(self.layers):
                x = layer.logits(x) if (self.last and i == len(self.layers) - 1) else layer(x)
            return x

    mine = [s for s in range(S) if s % world == rank]
    parts = [Part(*bounds[s]) for s in mine]
    stages = [PipelineStage(p, s, S, torch.device("cpu")) for p, s in zip(parts, mine, strict=True)]
    probe: dict[str, list[float]] = {}  # PIPEPLAN_PROBE: per "F<stage>"/"B<stage>", [wall s, thread CPU s]
    if os.environ.get("PIPEPLAN_PROBE"):
        def timed(name: str, fn: Any) -> Any:
            def run(*a: Any, **k: Any) -> Any:
                w0, c0 = time.perf_counter(), time.thread_time()
                try:
                    return fn(*a, **k)
                finally:
                    acc = probe.setdefault(name, [0.0, 0.0])
                    acc[0] += time.perf_counter() - w0
                    acc[1] += time.thread_time() - c0
            return run
        for p, s, st in zip(parts, mine, stages, strict=True):
            p.forward = timed(f"F{s}", p.forward)  # type: ignore[method-assign]
            st.backward_one_chunk = timed(f"B{s}", st.backward_one_chunk)  # type: ignore[method-assign]
        import torch.distributed.pipelining.schedules as tsched
        tsched._batch_p2p = timed("POST", tsched._batch_p2p)  # posting the step's sends and receives
        tsched._wait_batch_p2p = timed("WAIT", tsched._wait_batch_p2p)  # waiting for them

    def loss_fn(out: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.flatten(0, 1), tgt.flatten())

    if kind == "interleaved":
        sched = ScheduleInterleaved1F1B(stages, N_REAL, loss_fn=loss_fn)
    else:
        sched = (Schedule1F1B if kind == "1f1b" else ScheduleGPipe)(stages[0], N_REAL, loss_fn=loss_fn)
    opt = torch.optim.SGD([p for m in parts for p in m.parameters()], lr=0.1)
    times, cpus = [], []
    for it in range(WARM + ITER):
        inputs, targets = synthetic_batch(cfg, N_REAL * B_REAL, 0, it)
        dist.barrier()
        c0 = time.process_time()
        t0 = time.perf_counter()
        if rank == 0:
            sched.step(inputs)
        elif rank == world - 1:
            sched.step(target=targets)
        else:
            sched.step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        t1 = time.perf_counter()
        c1 = time.process_time()
        both = [None] * world
        dist.all_gather_object(both, (t0, t1, c1 - c0))
        if it == WARM - 1:
            probe.clear()
        if it >= WARM:
            times.append(max(t[1] for t in both) - min(t[0] for t in both))  # type: ignore[index]
            cpus.append(sum(t[2] for t in both))  # type: ignore[index]
    if probe:
        Path(f"{out}.probe{rank}").write_text(json.dumps({k: [v[0] / ITER, v[1] / ITER] for k, v in probe.items()}))
    if rank == 0:
        Path(out).write_text(json.dumps([statistics.median(times), statistics.median(cpus)]))
    dist.destroy_process_group()


#: the comparison with torch: a GPT where compute matters, embeddings untied (torch's stages would not
#: all-reduce a tied copy; ours would: the same training on both sides needs an untied model)
VERSUS = {**WIDE, "layers": 8, "tied_embeddings": False}


def torch_time(kind: str, overrides: dict[str, Any]) -> tuple[float, float, float]:
    """torch's median iteration (wall), its median CPU time of all ranks per iteration, and its compute per
    rank and iteration (the stage modules' forwards and ``backward_one_chunk`` calls, ``PIPEPLAN_PROBE``; the
    mean over ranks), seconds."""
    with tempfile.TemporaryDirectory(prefix="pipeplan-bench-") as tmp:
        out = Path(tmp) / "t.json"
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PIPEPLAN_PROBE": "1"}
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc-per-node={D_REAL}", __file__, "--torch-worker", kind, str(out),
                        json.dumps(overrides)], env=env, check=True, capture_output=True, timeout=600)
        wall, cpu = json.loads(out.read_text())
        compute = statistics.mean(
            sum(v[0] for k, v in json.loads(Path(f"{out}.probe{r}").read_text()).items() if k[0] in "FB")
            for r in range(D_REAL))
        return float(wall), float(cpu), float(compute)


def versus_torch(overrides: dict[str, Any] | None = None, rounds: int = 3) -> None:
    """Ours and torch.distributed.pipelining on the same model, partition, micro-batches and processes, run
    alternately (``rounds`` times each, ours first in even rounds and torch first in odd ones, so both see
    the same machine load and neither always takes the same phase of it); the median of each side's
    median iterations and of the per-round ratios, the same for the CPU time of all ranks per iteration
    (process time: the work each runtime costs the cores, which the machine's load does not lengthen), and
    the per-round ratio of iteration / compute (forward and backward time per rank, mean over ranks; ours
    from ``time_by_kind``, torch's from its stage modules' forwards -- the loss outside them -- and
    ``backward_one_chunk``): the same kernels run up to 10% slower or faster from one minute to the next
    on this VM, which this ratio divides out, leaving what each runtime adds around its compute."""
    from executor.launch import launch
    from executor.plan import RunPlan

    overrides = VERSUS if overrides is None else overrides
    print(f"\n== ours vs torch.distributed.pipelining, {D_REAL} processes ({MODEL} {overrides}, fp32, N={N_REAL}, "
          f"b={B_REAL}), {rounds} alternating rounds; load {' '.join(f'{x:.2f}' for x in os.getloadavg())} ==")
    print(f"{'schedule':<14}{'torch ms':>10}{'ours ms':>10}{'ours/torch':>12}   per round"
          f"{'':>14}{'CPU torch':>11}{'CPU ours':>10}{'ours/torch':>12}   per round"
          f"{'':>14}{'iter/compute ours/torch':>25}   per round")
    for kind in ("gpipe", "1f1b", "interleaved"):
        kw = {"chunks": 2} if kind == "interleaved" else {}
        plan = RunPlan.direct(kind, D_REAL, N_REAL, model=MODEL, model_overrides=overrides, micro_batch=B_REAL,
                              dtype="float32", iterations=ITER, warmup=WARM, **kw)
        ours, theirs, ours_cpu, theirs_cpu, norm = [], [], [], [], []
        for r in range(rounds):
            got: dict[str, tuple[float, float, float]] = {}
            for side in (("ours", "torch") if r % 2 == 0 else ("torch", "ours")):
                if side == "torch":
                    got[side] = torch_time(kind, overrides)
                else:
                    res = launch([plan], D_REAL, timeout=600)
                    assert res is not None
                    m = res["runs"][0]["measured"]
                    got[side] = (m["iteration_time"], m["cpu_time"], m["time_by_kind"]["F"] + m["time_by_kind"]["B"])
            ours.append(got["ours"][0])
            ours_cpu.append(got["ours"][1])
            theirs.append(got["torch"][0])
            theirs_cpu.append(got["torch"][1])
            norm.append((got["ours"][0] / got["ours"][2]) / (got["torch"][0] / got["torch"][2]))
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
        cpu_ratios = [a / b for a, b in zip(ours_cpu, theirs_cpu, strict=True)]
        t, o = statistics.median(theirs), statistics.median(ours)
        tc, oc = statistics.median(theirs_cpu), statistics.median(ours_cpu)
        print(f"{kind:<14}{t * 1e3:>10.2f}{o * 1e3:>10.2f}{statistics.median(ratios):>12.3f}   "
              f"{' '.join(f'{r:.3f}' for r in ratios):<24}{tc * 1e3:>11.2f}{oc * 1e3:>10.2f}"
              f"{statistics.median(cpu_ratios):>12.3f}   {' '.join(f'{r:.3f}' for r in cpu_ratios):<24}"
              f"{statistics.median(norm):>25.3f}   {' '.join(f'{r:.3f}' for r in norm)}")
    print(f"(load at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())})")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--torch-worker":
        torch_worker(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]) if len(sys.argv) > 4 else None)
    else:
        t = time.time()
        sections = sys.argv[1].split(",") if len(sys.argv) > 1 else ["emulated", "real", "wide", "torch"]
        if "emulated" in sections:
            emulated()
        if "real" in sections:
            real()
        if "torch" in sections:
            versus_torch()
        if "torch-tiny" in sections:
            versus_torch({})
        if "wide" in sections:
            real_wide()
        print(f"\n(total {time.time() - t:.0f} s)")
