"""End to end: ``pipeplan plan`` for GPT-3 175B on 1024 A100s (DGX A100 nodes), B^ = 1536, every synchronous
schedule -- process start to printed table -- and ``pipeplan --help``, each run ``--runs`` times (default 5)
as separate processes under ``/usr/bin/time``; prints the median wall and user CPU seconds (user time is the
figure that varies less on a machine shared with other work) and the load average when it ran.

Run: ``python benchmarks/plan_cli_bench.py [--runs 5]``. The profile is written first with
``pipeplan profile-analytic --preset gpt3-175b --device a100-80gb`` (the README's command), into a
temporary directory. Issue 13 item 3's goal: plan under 1.0 s, ``--help`` under 0.3 s, on the 2-core
development machine.

The split of one run's time (``--phases``, with one and two processes): the interpreter alone (``python -c
pass``), the imports of the plan command (``pipeplan.cli`` and ``pipeplan.commands_plan``) and, from the command
itself (``PIPEPLAN_TIMES=1`` makes it print them on stderr), loading the inputs, the search, the printing, and
its own CPU seconds (a forked child's excluded: on an idle machine, about its wall time); medians of ``--runs``.

Bytecode: before timing, the project's modules that the plan command imports (``planner``, ``pipeplan``) are
compiled to ``__pycache__`` (:func:`bytecode`), as an ordinary interpreter does on the first run. Where
``PYTHONDONTWRITEBYTECODE`` is set (this development environment sets it) no run would ever write them, and
every run would compile those ~45 modules from source again (0.06-0.09 s of each run, measured); ``--source``
times that case (no bytecode written; what is already there is still read).

The second core (``--split``): in this process, the search of several sizes -- gpt-tiny on the local CPU
cluster up to GPT-3 175B on 1024 A100s -- with one process and with two (``processes=2``, the size
threshold off), median wall of ``--runs`` each: where two are slower, the threshold
(``planner.split_search.MIN_ACTIONS``) keeps one.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "examples" / "clusters" / "dgx-a100-80gb.json"


def bytecode() -> str:
    """Compile the plan command's project modules to bytecode (module docstring); a line saying so."""
    ok = all(compileall.compile_dir(ROOT / pkg, quiet=1) for pkg in ("planner", "pipeplan"))
    flag = "set" if os.environ.get("PYTHONDONTWRITEBYTECODE") else "not set"
    return (f"bytecode of planner/ and pipeplan/ written before timing ({'ok' if ok else 'with errors'}; "
            f"PYTHONDONTWRITEBYTECODE {flag})")


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
    print(f"{name:16s} median of {runs}: wall {statistics.median(walls):.2f} s, user {statistics.median(users):.2f} s"
          f"   (wall {', '.join(f'{w:.2f}' for w in walls)}; user {', '.join(f'{u:.2f}' for u in users)})")


def plan_cmd(prof: Path, *extra: str) -> list[str]:
    """The timed command: GPT-3 175B (``prof``) on 1024 A100s, B = 1536, every schedule; ``extra`` options."""
    return [*pipeplan(), "plan", "--profile", str(prof), "--cluster", str(CLUSTER), "--global-batch", "1536",
            "--gpus", "1024", *extra]


def phases(prof: Path, runs: int, processes: int) -> None:
    """Median seconds of each part of the plan command (module docstring); ``own-cpu``: the command's own
    CPU seconds from its start to its end (a forked child's not in them)."""
    cmd = plan_cmd(prof, "--processes", str(processes))
    got: dict[str, list[float]] = {}
    for _ in range(runs):
        for name, argv in (("interpreter", [sys.executable, "-c", "pass"]),
                           ("imports", [sys.executable, "-c", "import pipeplan.cli, pipeplan.commands_plan"])):
            t = time.perf_counter()
            subprocess.run(argv, cwd=ROOT, check=True)
            got.setdefault(name, []).append(time.perf_counter() - t)
        t = time.perf_counter()
        r = subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "PIPEPLAN_TIMES": "1"})
        got.setdefault("whole command", []).append(time.perf_counter() - t)
        for part in r.stderr.split("times:")[-1].split(","):
            name, secs = part.split()[0], float(part.split()[1])
            got.setdefault(name, []).append(secs)
    print(f"phases, --processes {processes}, median of {runs} (s): "
          + ", ".join(f"{k} {statistics.median(v):.3f}" for k, v in got.items()))


SPLIT_CASES = [  # (profile: a preset analysed for the cluster's device, cluster, GPUs, global batch)
    ("gpt-tiny", "local-cpu-4", 2, 4),
    ("gpt-tiny", "local-cpu-4", 4, 8),
    ("gpt-tiny", "local-cpu-4", 4, 32),
    ("bert-tiny", "dgx-a100-80gb", 8, 64),
    ("bert-48", "piz-daint-p100-16gb", 4, 64),
    ("bert-48", "piz-daint-p100-16gb", 16, 128),
    ("gpt2-1.3b", "piz-daint-p100-16gb", 64, 512),
    ("gpt2-medium", "dgx-a100-80gb", 64, 512),
    ("gpt3-175b", "dgx-a100-80gb", 256, 1536),
    ("gpt3-175b", "dgx-a100-80gb", 1024, 1536),
]


def split(runs: int) -> None:
    """One process against two, per size (module docstring)."""
    sys.path.insert(0, str(ROOT))
    from planner import split_search
    from planner.analytic import analytic_profile
    from planner.cluster import load_cluster
    from planner.device import device_for_cluster
    from planner.model import PRESETS
    from planner.request import TrainingRequest
    from planner.search import Planner
    from planner.units import is_cpu

    split_search.MIN_ACTIONS = 0
    split_search.spare_core = lambda: True  # two processes whatever the load (the figures say what it does)
    for preset, cluster, gpus, batch in SPLIT_CASES:
        cl = load_cluster(ROOT / "examples" / "clusters" / f"{cluster}.json")
        prof = analytic_profile(PRESETS[preset], device_for_cluster(cl), dtype="fp32" if is_cpu(cl.device) else "bf16")
        req = TrainingRequest(global_batch=batch, gpus=gpus)
        walls: dict[int, list[float]] = {1: [], 2: []}
        configs = 0
        for _ in range(runs):
            for n in (1, 2):
                t = time.perf_counter()
                res = Planner(prof, cl, req).search(processes=n)
                walls[n].append(time.perf_counter() - t)
                configs = res.evaluated
        one, two = statistics.median(walls[1]), statistics.median(walls[2])
        size = split_search.work(Planner(prof, cl, req).configs(Counter()), batch)
        print(f"{preset:12s} {cluster:20s} P={gpus:5d} B={batch:5d}: {configs:5d} configurations, "
              f"{size:9d} actions (sum of D x N), one process "
              f"{one:.3f} s, two {two:.3f} s ({one / two:.2f}x)   load {os.getloadavg()[0]:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--phases", action="store_true", help="also the split of one run's time")
    ap.add_argument("--split", action="store_true", help="only: one process against two, per search size")
    ap.add_argument("--source", action="store_true",
                    help="do not write the project's bytecode first (under PYTHONDONTWRITEBYTECODE every run "
                         "then compiles the modules it imports)")
    args = ap.parse_args()
    if args.split:
        print(f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} CPUs)")
        split(args.runs)
        return
    if not Path("/usr/bin/time").exists() or shutil.which("/usr/bin/time") is None:
        raise SystemExit("needs /usr/bin/time (apt-get install time)")
    tmp = Path(tempfile.mkdtemp(prefix="plan_cli_bench_"))
    try:
        prof = tmp / "gpt3.json"
        subprocess.run([*pipeplan(), "profile-analytic", "--preset", "gpt3-175b", "--device", "a100-80gb",
                        "--out", str(prof)], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        print(f"load average before: {', '.join(f'{x:.2f}' for x in os.getloadavg())} "
              f"({os.cpu_count()} CPUs)")
        print("no bytecode written (--source)" if args.source else bytecode())
        report("pipeplan --help", [*pipeplan(), "--help"], args.runs)
        report("pipeplan plan", plan_cmd(prof), args.runs)
        for n in (1, 2):  # the default is 2 where a core is idle (planner.split_search.spare_core), else 1
            report(f"  --processes {n}", plan_cmd(prof, "--processes", str(n)), args.runs)
        if args.phases:
            for n in (1, 2):
                phases(prof, args.runs, n)
        print(f"load average after: {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
