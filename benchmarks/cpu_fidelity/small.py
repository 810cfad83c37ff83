"""The gpt-small-ish model these scripts measure: ``SMALL`` of benchmarks/cpu_run_bench.py (hidden 256,
sequence 64, 8 blocks), and one of its blocks in float32 with a micro-batch of 2 as input."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from cpu_run_bench import SMALL  # noqa: E402

__all__ = ["SMALL", "small_block"]


def small_block() -> tuple[Any, Any, Any]:
    """(config, the first block in train mode, an input of micro-batch 2)."""
    import torch

    from executor.models import build_layers, get_config

    cfg = get_config("gpt-tiny").with_(**SMALL)
    return cfg, build_layers(cfg, 0, 1, 2)[0].float().train(), torch.randn(2, cfg.seq, cfg.hidden)


def alternate(run: Any, names: tuple[str, str, str], rounds: int) -> None:
    """Print ``run(0)``, ``run(8)`` and ``run(2)`` for ``rounds`` alternating rounds (the VM's drift cancels
    in their ratios), then the median ratios to ``run(0)``; ``names`` label the three."""
    import os
    import statistics

    print("load", os.getloadavg())
    rs = []
    for r in range(rounds):
        a, b, c = run(0), run(8), run(2)
        rs.append((b / a, c / a))
        print(f"round {r}: {names[0]} {a * 1e3:.2f} {names[1]} {b * 1e3:.2f} {names[2]} {c * 1e3:.2f}")
    print(f"median {names[1]}/{names[0]} {statistics.median(x for x, _ in rs):.3f} {names[2]}/{names[0]} "
          f"{statistics.median(y for _, y in rs):.3f}; load {os.getloadavg()}")
