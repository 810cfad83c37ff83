"""What starting a run costs: wall and CPU time of :func:`executor.launch.launch` on a tiny plan (gpt-tiny
shrunk to 2 layers per device, one iteration, no warm-up), so the figure is the launcher's and the ranks'
start-up, not the model's compute.

    PYTHONPATH=. .venv/bin/python benchmarks/launch_bench.py [--repeat 3] [--procs 2,4]

Prints, per process count, the median over the repeats of the wall time of ``launch`` and of the CPU time
of the processes it started (``RUSAGE_CHILDREN``: user + system of the launcher and every rank), and the
run's own measured iteration time beside them.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

from executor.launch import launch
from executor.plan import RunPlan

SMALL = {"layers": 2, "hidden": 16, "heads": 2, "seq": 8, "vocab": 32}


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def once(procs: int) -> tuple[float, float, float]:
    plan = RunPlan.direct("1f1b", procs, 4, model_overrides={**SMALL, "layers": 2 * procs}, iterations=1,
                          warmup=0)
    cpu0, t0 = children_cpu(), time.perf_counter()
    res = launch([plan], procs, timeout=120)
    wall, cpu = time.perf_counter() - t0, children_cpu() - cpu0
    assert res is not None
    return wall, cpu, res["runs"][0]["measured"]["iteration_time"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--procs", default="2,4")
    args = ap.parse_args()
    for procs in (int(p) for p in args.procs.split(",")):
        runs = [once(procs) for _ in range(args.repeat)]
        wall, cpu, it = (statistics.median(x) for x in zip(*runs, strict=True))
        print(f"{procs} processes: launch {wall:.2f} s wall (runs {', '.join(f'{r[0]:.2f}' for r in runs)}), "
              f"{cpu:.2f} s CPU of the launched processes, iteration {it * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
