"""``pipeplan profile`` on the CPU times with one torch thread unless told otherwise (the executor's ranks run one
each), and no garbage-collector pass falls inside a timed call (:mod:`profiler.timing`). A new user's README
profile of gpt-tiny without ``--threads`` (torch's choice: 2 threads on the 2-core machine, timed on the wall
clock) gave block.0 forwards of 4.7/70/25/87 ms for b = 1/2/4/8 at load 3.4, where a rerun gave 0.7-1.2 ms."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

import torch

from planner.profile import load_profile
from profiler.timing import time_op


def test_the_cpu_default_is_one_thread(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    # a fresh interpreter: torch's own thread count there is the machine's, not what another test set
    code = ("import sys; from pipeplan.cli import main; sys.argv = ['pipeplan', 'profile', '--model', 'gpt-tiny', "
            f"'--micro-batches', '1', '--repeats', '1', '--warmup', '0', '--out', {str(out)!r}]; main()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert load_profile(out).environment["threads"] == "1"


def test_no_collector_pass_inside_a_timed_call() -> None:
    seen: list[bool] = []
    time_op(lambda: None, lambda _: seen.append(gc.isenabled()), torch.device("cpu"), warmup=1, repeats=3)
    assert seen == [False] * 4 and gc.isenabled()
