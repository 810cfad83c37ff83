"""Ranks and process groups of a run. Which global rank runs tensor rank ``k`` of pipeline device ``d`` of
data-parallel copy ``w`` is the configuration's rank order (``Config.order``), and :mod:`planner.placement` alone
says how (:func:`planner.placement.global_rank`, :func:`planner.placement.coords`; the planner's cost model reads
the same functions). Tensor parallelism is innermost in both orders:

* ``"tp-pp-dp"`` (the default; the executor's only layout before the order was searched): rank
  ``(w D + d) t + k``, a copy's pipeline contiguous (Narayanan et al. SC'21 section 3; Megatron-LM with
  ``--use-tp-pp-dp-mapping``);
* ``"tp-dp-pp"``: rank ``(d W + w) t + k``, the pipeline outermost and a stage's data-parallel copies contiguous
  (Megatron-LM's default, ``megatron.core.parallel_state.initialize_model_parallel``: "8 data_parallel groups:
  [g0, g2], [g1, g3], ...; 4 pipeline model-parallel groups: [g0, g4, g8, g12], ..." for 16 GPUs, t = 2, D = 4).

Groups, created by every rank in one fixed order (``new_group`` is collective over the world):

* **stage groups** -- for every stage ``s`` and tensor rank ``k``: the ranks that hold a replica of ``s``
  (every replica of the schedule -- Chimera's 2f pipelines, GEMS' 2 -- times the W data-parallel copies);
  the gradient all-reduce of the stage runs there. One group per stage (never shared between stages), so
  all-reduces of different stages cannot be matched against each other whatever order devices issue them.
* **tied group** -- per tensor rank: the ranks holding the first or the last stage, for the tied embedding
  (Megatron-LM keeps a copy on both ends and all-reduces their gradients).
* **tensor groups** -- the t ranks of one pipeline device of one data-parallel copy.
* with expert parallelism (``e > 1``, :mod:`executor.expert_parallel`): the data-parallel copies form groups of
  ``e`` consecutive copies -- copy ``w`` is expert-parallel (EP) rank ``w % e`` of EP group ``w // e`` -- and

  * **expert groups** -- per pipeline device ``d``, tensor rank ``k`` and EP group ``g``: the ``e`` ranks of copies
    ``g e .. g e + e - 1`` at ``(d, k)``, among which a mixture of experts' tokens go all-to-all;
  * **expert-data groups** -- per stage ``s``, tensor rank ``k`` and EP rank ``i``: the ranks of the stage's
    holders (as its stage group) whose copy has EP rank ``i`` (``W / e`` copies per holder). They hold the same
    experts of the stage, whose gradients are all-reduced there; the other parameters are reduced over the whole
    stage group as without expert parallelism. One group per stage, as the stage groups.

Pipeline point-to-point messages go between the neighbouring ranks of the same copy and tensor rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from planner.expert_parallel import ep_group, expert_data_ranks
from planner.placement import DEFAULT_ORDER, coords, global_rank, order_error
from planner.schedules.ir import Schedule

if TYPE_CHECKING:
    from planner.request import Config


@dataclass
class Layout:
    """A run's ranks: ``D`` pipeline devices, ``W`` data-parallel copies, tensor-parallel size ``t``, expert-parallel
    size ``e`` and the rank ``order`` (:mod:`planner.placement`)."""

    D: int
    W: int
    t: int
    e: int = 1  # expert-parallel size: a divisor of W
    order: str = DEFAULT_ORDER  # rank order: planner.placement.ORDERS

    def __post_init__(self) -> None:
        if (why := order_error(self.order)) is not None:  # (global_rank reads any other string as the default)
            raise ValueError(why)

    @classmethod
    def of(cls, config: Config) -> Layout:
        """The layout of a configuration (``pipeline``, ``data``, ``tensor``, ``expert``, ``order``)."""
        return cls(config.pipeline, config.data, config.tensor, config.expert, config.order)

    def ep_rank(self, data: int) -> int:
        """The expert-parallel rank of data-parallel copy ``data`` (which experts it holds)."""
        return data % self.e

    def ep_copies(self, data: int) -> list[int]:
        """The data-parallel copies of ``data``'s expert-parallel group (``e`` consecutive copies: the planner's
        layout, :func:`planner.expert_parallel.ep_group`)."""
        return ep_group(data, self.e)

    def rank(self, device: int, data: int = 0, tensor: int = 0) -> int:
        """The global rank of tensor rank ``tensor`` of pipeline device ``device`` of data-parallel copy ``data``
        (:func:`planner.placement.global_rank`)."""
        return global_rank(self.order, device, data, tensor, self.D, self.W, self.t)

    def coords(self, rank: int) -> tuple[int, int, int]:
        """(device, data copy, tensor rank) of a global rank (:func:`planner.placement.coords`)."""
        return coords(self.order, rank, self.D, self.W, self.t)

    def pairs(self, device: int, peer: int) -> list[tuple[int, int]]:
        """The (rank, rank) pairs between pipeline devices ``device`` and ``peer``: one per data-parallel copy and
        tensor rank, the ranks that exchange the copy's point-to-point messages
        (:func:`executor.comm.neighbour_pairs`)."""
        return [(self.rank(device, w, k), self.rank(peer, w, k)) for w in range(self.W) for k in range(self.t)]


@dataclass
class Groups:
    layout: Layout
    stage: dict[int, Any] = field(default_factory=dict)  # stage -> group of this rank's tensor rank
    stage_ranks: dict[int, list[int]] = field(default_factory=dict)
    tied: Any = None
    tied_ranks: list[int] = field(default_factory=list)
    tensor: Any = None
    tensor_ranks: list[int] = field(default_factory=list)
    expert: Any = None  # this rank's expert group (e > 1): all-to-all of a mixture of experts' tokens
    expert_ranks: list[int] = field(default_factory=list)
    expert_data: dict[int, Any] = field(default_factory=dict)  # stage -> group reducing its experts' gradients
    expert_data_ranks: dict[int, list[int]] = field(default_factory=dict)

    def all(self) -> list[Any]:
        """Every group this rank is a member of, once each."""
        found = [*self.stage.values(), self.tied, self.tensor, self.expert, *self.expert_data.values()]
        return list({id(g): g for g in found if g is not None}.values())


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
    e = layout.e
    if e > 1:
        for d in range(D):
            for k in range(t):
                for first in range(0, W, e):
                    ranks = [layout.rank(d, w, k) for w in ep_group(first, e)]
                    g = dist.new_group(ranks)
                    if rank in ranks:
                        out.expert, out.expert_ranks = g, ranks
        for s in range(S):
            holders = sorted({row[s] for row in schedule.placement})
            for k in range(t):
                for i in range(e):
                    ranks = sorted(layout.rank(d, w, k) for w in expert_data_ranks(i, e, W) for d in holders)
                    g = _new(ranks, rank)
                    if rank in ranks:
                        out.expert_data_ranks[s], out.expert_data[s] = ranks, g
    return out
