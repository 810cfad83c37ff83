"""Timelines as text grids, drawn as the papers draw them (Chimera figure 3, Hanayo figure 3): one row per
device, one cell per time unit, the micro-batch number in each cell of a forward or backward block.

Cells are plain data (:class:`Cell`); the CLI colours them (forward / backward, and the pipeline or
wave they belong to) and :func:`grid_text` gives an uncoloured form where the kind is spelled by a
letter: ``F``/``B``/``I``/``W`` for replica 0 and lower case for the other replicas (Chimera's up
pipelines), ``.`` for idle.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from planner.schedules.ir import COMPUTE_KINDS, Action
from planner.simulate import SimResult


@dataclass(frozen=True)
class Cell:
    kind: str  # F, B, I, W or "" for idle
    mb: int = -1
    replica: int = 0
    stage: int = -1

    def label(self) -> str:
        if not self.kind:
            return "."
        letter = self.kind if self.replica == 0 else self.kind.lower()
        return f"{letter}{self.mb}"


def time_unit(result: SimResult) -> float:
    """The largest unit that divides every compute start and duration (at most 1000 cells a row)."""
    scale = 1000
    g = 0
    for row in result.timeline:
        for a, s, e in row:
            if a.kind in COMPUTE_KINDS:
                for x in (s, e - s):
                    g = gcd(g, round(x * scale))
    unit = g / scale if g else 1.0
    limit = result.makespan / 1000
    return max(unit, limit) if unit > 0 else 1.0


def grid(result: SimResult, unit: float | None = None) -> list[list[Cell]]:
    """One list of cells per device."""
    unit = unit or time_unit(result)
    width = max(1, round(result.makespan / unit))
    rows: list[list[Cell]] = []
    for row in result.timeline:
        cells = [Cell("")] * width
        for a, s, e in row:
            if a.kind not in COMPUTE_KINDS:
                continue
            c0, c1 = round(s / unit), max(round(e / unit), round(s / unit) + 1)
            for m_i, c in enumerate(range(c0, min(c1, width))):
                mb = _mb_for_cell(a, m_i, c1 - c0)
                cells[c] = Cell(a.kind, mb, a.replica, a.stage)
        rows.append(cells)
    return rows


def _mb_for_cell(a: Action, i: int, n: int) -> int:
    """A doubled forward shows its first micro-batch in the first half of the block and its second in
    the second half."""
    if a.span == 1:
        return a.mb
    return a.mb + min(a.span - 1, i * a.span // max(n, 1))


def grid_text(result: SimResult, unit: float | None = None) -> str:
    rows = grid(result, unit)
    w = max((len(c.label()) for row in rows for c in row), default=1)
    lines = []
    for d, row in enumerate(rows):
        lines.append(f"P{d:<3}" + " ".join(c.label().rjust(w) for c in row))
    return "\n".join(lines)
