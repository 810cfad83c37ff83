"""Ranks and process groups of a run (Megatron-LM's layout, Narayanan et al. SC'21 section 3: tensor
innermost, then pipeline, then data parallel): global rank ``(w * D + d) * t + k`` is tensor rank ``k`` of
pipeline device ``d`` of data-parallel copy ``w``.

Groups, created by every rank in one fixed order (``new_group`` is collective over the world):

* **stage groups** -- for every stage ``s`` and tensor rank ``k``: the ranks that hold a replica of ``s``
  (every replica of the schedule -- Chimera's 2f pipelines, GEMS' 2 -- times the W data-parallel copies);
  the gradient all-reduce of the stage runs there. One group per stage (never shared between stages), so
  all-reduces of different stages cannot be matched against each other whatever order devices issue them.
* **tied group** -- per tensor rank: the ranks holding the first or the last stage, for the tied embedding
  (Megatron-LM keeps a copy on both ends and all-reduces their gradients).
* **tensor groups** -- the t ranks of one pipeline device of one data-parallel copy.

Pipeline point-to-point messages go between the neighbouring ranks of the same copy and tensor rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from planner.schedules.ir import Schedule


@dataclass
class Layout:
    D: int
    W: int
    t: int

    def rank(self, device: int, data: int = 0, tensor: int = 0) -> int:
        return (data * self.D + device) * self.t + tensor

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(device, data copy, tensor rank) of a global rank."""
        k = rank % self.t
        dw = rank // self.t
        return dw % self.D, dw // self.D, k


@dataclass
class Groups:
    layout: Layout
    stage: dict[int, Any] = field(default_factory=dict)  # stage -> group of this rank's tensor rank
    stage_ranks: dict[int, list[int]] = field(default_factory=dict)
    tied: Any = None
    tied_ranks: list[int] = field(default_factory=list)
    tensor: Any = None
    tensor_ranks: list[int] = field(default_factory=list)


def _new(ranks: list[int], me: int) -> Any:
    """A group for ``ranks`` (created on every rank); None for a single member or a non-member."""
    if len(ranks) < 2:
        return None
    g = dist.new_group(ranks)
    return g if me in ranks else None


def make_groups(schedule: Schedule, layout: Layout, rank: int, tied: bool) -> Groups:
    """Create the run's groups (collective: every rank calls it with the same arguments)."""
    D, W, t = layout.D, layout.W, layout.t
    _, _, k_me = layout.coords(rank)
    out = Groups(layout)
    S = schedule.stages
    for s in range(S):
        holders = sorted({row[s] for row in schedule.placement})
        for k in range(t):
            ranks = sorted(layout.rank(d, w, k) for w in range(W) for d in holders)
            g = _new(ranks, rank)
            if k == k_me:
                out.stage_ranks[s] = ranks
                out.stage[s] = g
    if tied and S > 1:
        ends = sorted({row[0] for row in schedule.placement} | {row[S - 1] for row in schedule.placement})
        for k in range(t):
            ranks = sorted(layout.rank(d, w, k) for w in range(W) for d in ends)
            g = _new(ranks, rank)
            if k == k_me:
                out.tied_ranks, out.tied = ranks, g
    if t > 1:
        for w in range(W):
            for d in range(D):
                ranks = [layout.rank(d, w, k) for k in range(t)]
                g = dist.new_group(ranks)
                if rank in ranks:
                    out.tensor, out.tensor_ranks = g, ranks
    return out
