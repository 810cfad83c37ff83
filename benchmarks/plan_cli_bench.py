"""End to end: ``pipeplan plan`` for GPT-3 175B on 1024 A100s (DGX A100 nodes), B^ = 1536, every synchronous
schedule -- process start to printed table -- and ``pipeplan --help``, each run ``--runs`` times (default 5)
as separate processes under ``/usr/bin/time``; prints the median wall and user CPU seconds (user time is the
figure that varies less on a machine shared with other work) and the load average when it ran.

Run: ``python benchmarks/plan_cli_bench.py [--runs 5]``. The profile is written first with
``pipeplan profile-analytic --preset gpt3-175b --device a100-80gb`` (the README's command), into a
temporary directory. Issue 13 item 3's goal: plan under 1.0 s, ``--help`` under 0.3 s, on the 2-core
development machine.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "examples" / "clusters" / "dgx-a100-80gb.json"


def pipeplan() -> list[str]:
    """The installed ``pipeplan`` script beside this interpreter, else ``python -m pipeplan.cli``."""
    script = Path(sys.executable).with_name("pipeplan")
    return [str(script)] if script.exists() else [sys.executable, "-m", "pipeplan.cli"]


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall, user) seconds of one run of ``cmd`` from ``/usr/bin/time`` (its output discarded)."""
    with tempfile.NamedTemporaryFile("r", suffix=".time") as f:
        r = subprocess.run(["/usr/bin/time", "-f", "%e %U", "-o", f.name, *cmd], cwd=ROOT,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode:
            raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}): {r.stderr[-2000:]}")
        wall, user = f.read().split()[-2:]
    return float(wall), float(user)


def report(name: str, cmd: list[str], runs: int) -> None:
    got = [timed(cmd) for _ in range(runs)]
    walls, users = [w for w, _ in got], [u for _, u in got]
    print(f"{name:14s} median of {runs}: wall {statistics.median(walls):.2f} s, user {statistics.median(users):.2f} s"
          f"   (wall {', '.join(f'{w:.2f}' for w in walls)}; user {', '.join(f'{u:.2f}' for u in users)})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    if not Path("/usr/bin/time").exists() or shutil.which("/usr/bin/time") is None:
        raise SystemExit("needs /usr/bin/time (apt-get install time)")
    tmp = Path(tempfile.mkdtemp(prefix="plan_cli_bench_"))
    try:
        prof = tmp / "gpt3.json"
        subprocess.run([*pipeplan(), "profile-analytic", "--preset", "gpt3-175b", "--device", "a100-80gb",
                        "--out", str(prof)], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        print(f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())} "
              f"({os.cpu_count()} CPUs)")
        report("pipeplan --help", [*pipeplan(), "--help"], args.runs)
        report("pipeplan plan", [*pipeplan(), "plan", "--profile", str(prof), "--cluster", str(CLUSTER),
                                 "--global-batch", "1536", "--gpus", "1024"], args.runs)
        print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
