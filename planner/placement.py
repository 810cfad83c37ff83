"""Rank order: which global GPU runs tensor rank ``k`` of pipeline device ``d`` of data-parallel replica ``w``.

Symbols: ``t`` tensor-parallel size, ``D`` pipeline devices, ``W`` data-parallel replicas, ``G`` GPUs per node.
Global ranks fill a node's GPUs consecutively (rank ``r`` on node ``r // G``: torchrun and Slurm number them so).
Tensor parallelism is innermost in both orders, so a tensor-parallel group is one node whenever ``t`` divides
``G`` (``t = 3`` on 8-GPU nodes puts ranks 6-8 on two nodes; the search tries no such ``t``).

Two orders, named as Megatron-Core names them (innermost first, ``--use-tp-pp-dp-mapping``):

* ``"tp-pp-dp"``: the pipeline inside data parallelism, rank ``(w D + d) t + k``. A replica's pipeline is
  contiguous: pipeline neighbours sit ``t`` ranks apart (their point-to-point messages stay in a node where
  ``D t <= G``), a stage's data-parallel copies ``D t`` apart. Megatron-LM with ``--use-tp-pp-dp-mapping``;
  pipeplan's placement before the rank order was searched, and the default of a :class:`planner.request.Config`.
* ``"tp-dp-pp"``: data parallelism inside the pipeline, the pipeline outermost, rank ``(d W + w) t + k``. A stage's
  copies are contiguous: its gradient reduction (and an expert-parallel group's all-to-alls, which are among
  data-parallel replicas: :mod:`planner.expert_parallel`) stay in a node where ``W t <= G``, pipeline neighbours
  ``W t`` apart. Megatron-LM's default (``initialize_model_parallel``, 2020 on: "8 data_parallel groups: [g0, g2],
  [g1, g3], ...; 4 pipeline model-parallel groups: [g0, g4, g8, g12], ..." for 16 GPUs, t = 2, D = 4; Megatron-Core
  ``order="tp-cp-ep-dp-pp"``), torchtitan's device mesh ``["pp", "dp_replicate", "dp_shard", "cp", "tp"]`` and
  DeepSpeed's ``PipeModelDataParallelTopology`` (axes pipe, data, model).

Neither order is better everywhere: the first keeps the per-micro-batch point-to-point messages on NVLink, the
second the per-iteration gradient reduction and the per-layer expert all-to-alls. The search times both where they
place the groups differently (:func:`orders_differ`); the cost model (:meth:`planner.cost.ConfigCosts.rank`) and
the executor (:class:`executor.groups.Layout`) read the rank from :func:`global_rank` alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # (planner.request imports this module)
    from planner.request import Config

RankOrder = Literal["tp-pp-dp", "tp-dp-pp"]
#: the orders, the default (:attr:`planner.request.Config.order`) first
ORDERS: tuple[RankOrder, ...] = ("tp-pp-dp", "tp-dp-pp")
DEFAULT_ORDER: RankOrder = "tp-pp-dp"


def order_error(order: str) -> str | None:
    """Why ``order`` is not a rank order, or None."""
    if order in ORDERS:
        return None
    return f"order: unknown rank order {order!r}; known: {', '.join(ORDERS)} (innermost first)"


def global_rank(order: str, device: int, replica: int, tensor: int, D: int, W: int, t: int) -> int:
    """The global rank of tensor rank ``tensor`` of pipeline device ``device`` of data-parallel replica ``replica``
    (module docstring)."""
    if order == "tp-dp-pp":
        return (device * W + replica) * t + tensor
    return (replica * D + device) * t + tensor


def coords(order: str, rank: int, D: int, W: int, t: int) -> tuple[int, int, int]:
    """(pipeline device, data-parallel replica, tensor rank) of global rank ``rank``: :func:`global_rank`'s
    inverse."""
    k, rest = rank % t, rank // t
    if order == "tp-dp-pp":
        return rest // W, rest % W, k
    return rest % D, rest // D, k


def orders_differ(t: int, D: int, W: int, gpus_per_node: int) -> bool:
    """Whether the two orders place some group's GPUs on different nodes, so that their times may differ: with
    ``D = 1`` or ``W = 1`` the ranks are the same; with ``t`` a multiple of ``G`` every (device, replica) fills whole
    nodes of its own in both; with ``t D W <= G`` every GPU is in one node."""
    return D > 1 and W > 1 and t % gpus_per_node != 0 and t * D * W > gpus_per_node


def experts_placeable(order: str, pipeline: int, data: int, expert_data: int) -> bool:
    """Whether Megatron-Core places the experts of a configuration in ``order`` (``initialize_model_parallel``:
    "When not using pp-last rank ordering, the data parallel size of the attention and moe layers must be the
    same"): with the pipeline outermost, without a pipeline, at W = 1 (where the orders are the same ranks), or where
    the experts' data-parallel size ``expert_data`` (:attr:`planner.request.Config.expert_data`) is W."""
    return order == "tp-dp-pp" or pipeline == 1 or data == 1 or expert_data == data


def pipeline_outermost_order(pipeline: int, data: int) -> RankOrder:
    """The order of a run whose framework puts the pipeline outermost (Megatron-LM by default, torchtitan's device
    mesh, DeepSpeed's topology: ``tp-dp-pp``) as a configuration names it: the default at D = 1 or W = 1, where the
    orders are the same ranks."""
    return "tp-dp-pp" if pipeline > 1 and data > 1 else DEFAULT_ORDER


def placement_text(order: str) -> str:
    """A candidate's ``placement`` line: its rank order in words."""
    if order == "tp-dp-pp":
        return "ranks: tensor innermost, then data parallel, then pipeline (Megatron-LM's default order)"
    return "ranks: tensor innermost, then pipeline, then data parallel (Megatron-LM's --use-tp-pp-dp-mapping)"


def link_key(config: Config) -> tuple[str, int | None]:
    """What, beside ``t`` and ``D``, decides which pipeline neighbours share a node (a cache key's part): the order
    and, with the pipeline outermost (devices ``W t`` apart), ``W``."""
    return config.order, config.data if config.order == "tp-dp-pp" else None
