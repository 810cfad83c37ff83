"""Emulated runs against the simulator: the figure ``tests/test_executor_run.py`` used to assert (issue 13
item 6: on a loaded machine the ratio moves with the load, so it is a benchmark figure, not a test).

D = 4, N = 4, a uniform 4-layer profile (4 ms forward, 8 ms backward per layer and sample), 1F1B and
Chimera, 4 gloo processes: measured iteration time / the simulator's prediction with the same costs, per
repeat and their median. Goal: 0.8-1.35 on an idle machine.

Run: ``python benchmarks/emulate_bench.py [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from executor.emulate import uniform_profile  # noqa: E402
from executor.launch import launch  # noqa: E402
from executor.plan import RunPlan  # noqa: E402
from planner.profile import save_profile  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "profile.json"
        save_profile(uniform_profile(4, fwd=0.004, bwd=0.008), path)
        names = ("1f1b", "chimera")
        plans = [RunPlan.direct(s, 4, 4, emulate=str(path), iterations=args.iterations, warmup=1) for s in names]
        ratios: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(args.repeats):
            res = launch(plans, 4, timeout=60)
            for name, run in zip(names, res["runs"], strict=True):
                ratios[name].append(run["ratio"])
    for name, rs in ratios.items():
        print(f"{name:10s} measured/predicted: median {statistics.median(rs):.3f}  "
              f"(each: {', '.join(f'{r:.3f}' for r in rs)})")


if __name__ == "__main__":
    main()
