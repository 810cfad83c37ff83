"""Emulated runs against the simulator: the figure ``tests/test_executor_run.py`` used to assert (issue 13
item 6: on a loaded machine the ratio moves with the load, so it is a benchmark figure, not a test).

D = 4, N = 4, a uniform 4-layer profile (4 ms forward, 8 ms backward per layer and sample), 1F1B and
Chimera, 4 gloo processes: measured iteration time / the simulator's prediction with the same costs, per
repeat and their median. Goal (issue 11): within 10%.

The prediction's cluster is this machine measured as the run uses it (:func:`profiler.local_cluster.
measured_cluster` with 4 processes: links, the host's cores, the executor's per-action overhead with compute
emulated), so the prediction counts the executor's own cost per action and gloo's real message latency, which
the run pays; ``--local`` predicts with :data:`executor.emulate.LOCAL_CLUSTER` instead (nominal loopback links,
no executor overhead: what this benchmark did before, 1.12-1.13 on a quiet machine).

Run: ``python benchmarks/emulate_bench.py [--repeats 5] [--local]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from executor.emulate import uniform_profile  # noqa: E402
from executor.launch import launch  # noqa: E402
from executor.plan import RunPlan  # noqa: E402
from planner.profile import save_profile  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iterations", type=int, default=3)
    ap.add_argument("--local", action="store_true", help="predict with LOCAL_CLUSTER (no measured overhead)")
    args = ap.parse_args()
    print(f"load at start (1, 5, 15 min): {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "profile.json"
        save_profile(uniform_profile(4, fwd=0.004, bwd=0.008), path)
        cluster: dict[str, str] = {}
        if not args.local:
            from planner.cluster import load_cluster, save_cluster
            from profiler.local_cluster import measured_cluster

            base = load_cluster(REPO / "examples" / "clusters" / "local-cpu-4.json")
            measured = measured_cluster(base)[0]
            save_cluster(measured, Path(tmp) / "cluster.json")
            cluster = {"cluster": str(Path(tmp) / "cluster.json")}
            ex = measured.executor
            assert ex is not None and ex.emulated is not None
            print(f"cluster measured: emulated overhead per compute action {ex.emulated.compute * 1e6:.0f} us, "
                  f"send {ex.emulated.send * 1e6:.0f}, recv {ex.emulated.recv * 1e6:.0f}; p2p alpha "
                  f"{measured.intra.alpha * 1e6:.0f} us")
        names = ("1f1b", "chimera")
        plans = [RunPlan.direct(s, 4, 4, emulate=str(path), iterations=args.iterations, warmup=1, **cluster)
                 for s in names]
        ratios: dict[str, list[float]] = {name: [] for name in names}
        for _ in range(args.repeats):
            res = launch(plans, 4, timeout=60)
            for name, run in zip(names, res["runs"], strict=True):
                ratios[name].append(run["ratio"])
    for name, rs in ratios.items():
        print(f"{name:10s} measured/predicted: median {statistics.median(rs):.3f}  "
              f"(each: {', '.join(f'{r:.3f}' for r in rs)})")
    print(f"load at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
