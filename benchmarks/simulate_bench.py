"""Benchmark: build, validate and simulate large schedules (issue: each total under 0.5 s).

Run ``PYTHONPATH=. python benchmarks/simulate_bench.py``. Each schedule is built, validated and
simulated (unit costs with communication, all-reduce and step times, so every path of the replay runs);
the table shows the best of ``REPEATS`` runs of each phase, in seconds.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from planner.schedules import build
from planner.schedules.validate import validate
from planner.simulate import UnitCosts, simulate

REPEATS = 3
CASES: list[tuple[str, str, int, int, dict[str, Any]]] = [
    ("1f1b D=64 N=512", "1f1b", 64, 512, {}),
    ("chimera D=64 N=256", "chimera", 64, 256, {}),
]
COSTS = UnitCosts(1.0, 2.0, comm=0.1, allreduce_time=3.0, step_time=0.5)


def _timed(fn: Callable[..., Any], *args: Any, **kw: Any) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn(*args, **kw)
    return time.perf_counter() - t0, out


def bench(name: str, devices: int, microbatches: int, params: dict[str, Any]) -> dict[str, float]:
    best = {"build": float("inf"), "validate": float("inf"), "simulate": float("inf"),
            "total": float("inf")}
    for _ in range(REPEATS):
        tb, sched = _timed(build, name, devices, microbatches, **params)
        tv, _ = _timed(validate, sched)
        ts, _ = _timed(simulate, sched, COSTS)
        for key, t in (("build", tb), ("validate", tv), ("simulate", ts), ("total", tb + tv + ts)):
            best[key] = min(best[key], t)
    return best


def main() -> None:
    cols = ("build", "validate", "simulate", "total")
    print(f"{'schedule':<22}" + "".join(f"{c:>10}" for c in cols) + "   (seconds, best of "
          f"{REPEATS})")
    for label, name, D, N, params in CASES:
        best = bench(name, D, N, params)
        print(f"{label:<22}" + "".join(f"{best[c]:>10.3f}" for c in cols))


if __name__ == "__main__":
    main()
