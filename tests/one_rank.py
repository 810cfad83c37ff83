"""Run executor code as one rank of a one-process gloo group, in a fresh interpreter (what it imports, and
nothing a test process imported before, is in its ``sys.modules``): :func:`one_rank` runs ``body`` after
``init_process_group`` and returns what it printed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

PRELUDE = """
import os, sys, tempfile
import torch.distributed as dist
from executor.plan import RunPlan
from executor.rank import run_plan
dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tempfile.mkdtemp(), "store"), 1), rank=0,
                        world_size=1)
"""


def one_rank(body: str, timeout: float = 300) -> str:
    out = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body)], capture_output=True, text=True,
                         timeout=timeout, cwd=REPO,
                         env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr
    return out.stdout
