"""The cost model: durations of every action of a schedule for one configuration, fed to the simulator.

Symbols: ``t`` tensor-parallel size, ``D`` pipeline devices, ``W`` data-parallel width, ``b`` micro-batch
size, ``s`` sequence, ``h`` hidden, ``el`` bytes per element.

* **Compute** (Chimera 3.4): F and B of a stage are the sums over its layers of the profile's times at
  the micro-batch size (interpolated, :meth:`planner.profile.LayerProfile.time`). With recomputation the
  backward is the profile's ``recompute`` time (forward re-run + backward; 3x forward when only the
  forward was measured) of each checkpointed layer, the plain backward of the embedding and the LM head
  (:func:`planner.profile.checkpointed`; their memory: :func:`recompute_kept_bytes`). Zero-bubble splits
  B into I (input gradient) and W (weight gradient), half each (their GEMMs have equal FLOPs); the
  recomputed forward goes to I. That is what our executor runs (:mod:`executor.split_backward`) except on a
  stage with checkpointed layers, which it does not split: there W is one whole backward for the weights
  (:meth:`ConfigCosts.split_backward`).
* **Tensor parallelism** (Megatron-LM 3.2, 2.3): when the profile has compute at this ``t``
  (``LayerProfile.tensor_times``: measured, or the operator model's sharded GEMMs, :mod:`planner.operators`)
  those times are used; otherwise the t = 1 time divided by ``t`` and by ``tensor_efficiency`` (a t-way
  GEMM is smaller and runs below peak). :attr:`ConfigCosts.compute_source` says which. Plus per
  transformer layer 2 all-reduces in the forward and 2 in the backward of ``b s h`` elements each among
  the ``t`` GPUs -- in total ``8 b s h (t-1)/t`` elements per layer and micro-batch with a ring
  all-reduce -- or, with sequence parallelism (Korthikanti et al. 2022, 4.2.2), an all-gather and a
  reduce-scatter in place of each all-reduce (the same bytes: ``(t-1)/t L`` each), on the intra-node link
  (NVLink) when the ``t`` GPUs share a node, else on the inter-node link, which then bounds the ring.
  A recomputed layer repeats its forward collectives. Megatron-LM does not overlap them with compute.
  With sequence parallelism the backward also redoes the all-gather of each column-parallel GEMM's input
  (two per layer, one for the LM head: :meth:`ConfigCosts._sp_regather`).
  The first stage's forward also all-reduces the vocabulary-parallel embedding's output and the last
  stage's backward the LM head's input gradient (one ``b s h`` all-reduce each; the cross-entropy adds
  three ``b s`` fp32 all-reduces forward): :meth:`ConfigCosts._tp_edges`.
* **Collective times** (:func:`collective_time`): with the device's NCCL model
  (:class:`planner.device.LinkCollectives`, per link class: the measured large-message bus bandwidth of each
  collective as a fraction of the link peak ``1/beta``, NCCL's protocols LL/LL128/Simple with their latencies
  from NCCL's own tuning model) a collective of ``L`` bytes among ``r`` ranks takes the fastest protocol's
  ``base + steps hop + factor L / busbw`` (ring: ``2 (r-1)`` steps and factor ``2 (r-1)/r`` for an all-reduce,
  ``r-1`` and ``(r-1)/r`` for a reduce-scatter or all-gather, one step of ``L`` for a send), so the achieved
  bandwidth rises with the message size; without one, the alpha-beta formulas named below.
* **Pipeline p2p** (Chimera 3.4, alpha-beta, or the NCCL model's send): ``alpha + beta * bytes`` of the
  boundary activation (forward) or gradient (backward) that each tensor-parallel rank sends to its peer. Without
  sequence parallelism the boundary tensor is whole on every one of the ``t`` ranks, and each sends all of it
  (pipeplan's executor: ``executor.comm`` pairs every tensor rank with its peer; Megatron-Core). With
  sequence parallelism each rank holds, and sends, ``1/t`` of it. Megatron-LM's scatter/gather (Narayanan et al.
  SC'21 section 4.1, ``--scatter-gather-tensors-in-pipeline``, its default in 2021-22; the profile's
  ``environment["p2p_scatter_gather"] = "on"``): each rank sends a ``1/t`` share and the receivers all-gather
  it over NVLink (charged where the runtime blocks, below). Link by placement: the configuration's rank order
  (:mod:`planner.placement`) gives stage devices ``d`` and ``d'`` of replica 0 GPUs ``r(d)`` and ``r(d')``: they share
  a node when ``r(d) // G == r(d') // G`` (``G`` GPUs per node) -- ``d t`` and ``d' t`` with the pipeline inside data
  parallelism, ``d W t`` and ``d' W t`` with the pipeline outermost. Every group below takes its GPUs from the same
  order.
* **Blocking p2p** (only when the profile's ``environment["p2p"]`` is ``"blocking"``: a runtime that waits
  for its sends and synchronizes the device, as Megatron-LM's 2021 ``p2p_communication`` did with
  ``req.wait(); torch.cuda.synchronize()``, then all-gathers the scatter/gather chunks over NVLink): each
  F and B also holds the compute stream for its send (and, with scatter/gather, the ``t``-way all-gather of
  the boundary tensor), and the message is at the receiver when that action ends (the p2p action takes no further
  time: the transfer is not counted twice on the critical path). Our executor posts sends without
  blocking, so by default they overlap compute.
* **Gradient all-reduce** of a stage across its ``r`` replicas (the W data-parallel copies times the
  schedule's own replicas, Chimera's 2f): Rabenseifner ``2 log2(r) alpha + 2 (r-1)/r beta L``
  (Chimera 3.4) with ``L`` the stage's gradient bytes divided by ``t``; hierarchical when the replicas
  span nodes: reduce-scatter inside the node (``k`` replicas per node), Rabenseifner across the ``r/k``
  nodes on ``L/k``, all-gather inside the node. The simulator overlaps eager all-reduces (Chimera 3.2).
  By default the all-reduce starts after the backward (Megatron-LM's own DDP, ``--DDP-impl local``, 2021:
  ``allreduce_gradients`` after the whole backward). With ``environment["dp_allreduce"] = "overlapped"``
  (PyTorch ``DistributedDataParallel``, ``--DDP-impl torch``, which Megatron 2021 ran without pipelining:
  ``no_sync`` for all micro-batches but the last) the gradient buckets (25 MB, DDP's ``bucket_cap_mb``)
  are all-reduced while the last backward runs, so of a one-stage pipeline's all-reduce only what exceeds
  that backward, and at least the last bucket, is left after it. With a sharded optimizer (the request's
  ``shard_optimizer``) the all-reduce is a reduce-scatter of the gradients and an all-gather of the updated
  weights, NCCL's rings over all the replicas (:func:`sharded_collective_time`; overlapped: the all-gather
  under the next first forward, and the bucket left after the backward is Megatron-Core's, which grows with
  the replicas: :func:`megatron_core_bucket_bytes`). The buckets that run beside the backward (or forward) slow it:
  their NCCL channels hold part of the SMs while they run (:mod:`planner.contention`).
* **Sharded weights** (the request's ``shard_parameters``: ZeRO-3, PyTorch FSDP2 as torchtitan runs it;
  :mod:`planner.fsdp`): each layer's weights all-gathered and its gradients reduce-scattered among the stage's
  W replicas (:meth:`ConfigCosts.fsdp_layers`); without a pipeline in every micro-batch's F and B, prefetched
  under their compute and slowing it by their channels' share of the SMs (:func:`planner.fsdp.forward_time`,
  :func:`planner.fsdp.backward_time`, :mod:`planner.contention`), pipelined once
  per iteration in the stage's ALLREDUCE (:meth:`ConfigCosts._fsdp_sync`); its optimizer step makes the gradient
  passes of :func:`planner.fsdp.step_grad_pass_bytes` instead of the mixed-precision optimizer's.
* **Optimizer step**: reading and writing the model state of the stages a device holds at the memory
  bandwidth (``2 bytes_per_param`` per parameter), plus, for 16-bit training, the passes a mixed-precision
  optimizer makes over the gradients before the update (Megatron-LM ``optimizer/optimizer.py``,
  Float16OptimizerWithFloat16Params, 2021-22): the 16-bit gradients copied into fp32 main gradients (read
  2, write 4 bytes), unscaled and checked for inf/NaN in one pass (``_amp_foreach_non_finite_check_and_
  unscale_``: read 4, write 4) and their norm taken for clipping (``multi_tensor_l2norm``: read 4):
  :data:`MIXED_PRECISION_GRAD_PASS_BYTES` = 18 bytes per parameter. With a sharded optimizer (the request's
  ``shard_optimizer``: ZeRO-1, Megatron-LM's distributed optimizer) a device updates only its ``1/W`` of the
  optimizer state and makes these gradient passes over its ``1/W`` of the gradients (Megatron-LM
  ``optimizer/distrib_optimizer.py``: the main gradients and the clipping norm are the shard's); the
  bytes it reads and writes are then ``2 state_bytes_per_param(W) + 18 / W``. On a CPU cluster measured by
  :func:`profiler.local_cluster.measured_cluster` the bandwidth is that of the executor's own step timed after a
  backward (:func:`profiler.local_cluster.measure_step_bandwidth`). The devices holding the first or the last
  stage also all-reduce the tied embedding's gradients before they step (:meth:`ConfigCosts.tied_allreduce`).
* **Calibration and executor overhead** (issue 11 items 4 and 5; the hook at the end of this file): a
  cluster's fitted :class:`planner.cluster.Calibration` multiplies compute (F/B/I/W, step) by
  ``compute_scale`` and communication (p2p, all-reduce, tensor-parallel collectives) by ``link_scale``;
  every action of the lowered list the executor walks costs its measured
  :class:`planner.cluster.ExecutorOverhead` plus the fitted ``action_overhead``, folded into the compute
  action it belongs to (a RECV before it, a SEND after it) and into STEP (the ALLREDUCEs and STEP itself).
* **A shared CPU host** (issues 11 item 4 and 13; :func:`host_share`, the end of this file): when the
  cluster's devices are processes on shared cores (``cluster.host``, :class:`planner.cluster.HostCpu`, measured
  by ``pipeplan seed`` / :func:`profiler.local_cluster.measure_host`), the core time of an action -- its
  compute, the executor's overhead, the optimizer step; only the overhead when compute is emulated -- is
  stretched by the slowdown ``s`` at which ``k`` processes with work at once share ``C`` effective cores
  (processor sharing: each runs at ``C / k``); ``k`` is the concurrency the core time sees in the simulated
  schedule itself (with gloo's message and collective copies when communication does not overlap compute),
  and ``s = max(1, k / C)`` its fixed point; and by the host's measured CPU-time inflation of processes taking
  turns on a core (their caches refilled at each turn, :func:`host_inflation`) in proportion to ``s``. GPU
  clusters have no ``host``: nothing changes for them.

:func:`chimera_eq1` and :func:`megatron_closed_form` give the papers' closed forms beside the simulated
time.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from planner import fsdp
from planner.cluster import Calibration, Cluster, ExecutorOverhead, HostCpu, Link
from planner.contention import collective_share, overlapped
from planner.device import DeviceSpec, LinkCollectives, find_device
from planner.dtypes import DTYPE_BYTES
from planner.expert_parallel import EXPERT_TIMES_KEY, alltoall_bytes, ep_slots, expert_data_slots, state_split
from planner.placement import global_rank
from planner.power import MAX_PASSES, RATE_TOLERANCE, PowerLimit, busy_share, held_rate
from planner.profile import (
    LayerProfile,
    ModelProfile,
    TransformerShape,
    checkpointed,
    recompute_granularity,
    stage_splits_backward,
)
from planner.request import Config, TrainingRequest
from planner.runspec import schedule_samples
from planner.schedules import splits_backward
from planner.schedules.ir import SEND_F, Schedule
from planner.simulate import Costs, SimResult

#: PyTorch DistributedDataParallel's default gradient bucket (``bucket_cap_mb=25``)
DDP_BUCKET_BYTES = 25 * 2**20


def megatron_core_bucket_bytes(replicas: int, el: int) -> float:
    """Bytes of one gradient bucket of Megatron-Core's ``DistributedDataParallel`` (what its distributed
    optimizer reduce-scatters and all-gathers bucket by bucket under ``--overlap-grad-reduce``): by default
    ``max(40000000, 1000000 * data_parallel_world_size)`` parameters ("if using very large dp_sizes, make
    buckets larger to ensure that chunks used in NCCL ring-reduce implementations are large enough to remain
    bandwidth-bound rather than latency-bound": megatron/core/distributed/distributed_data_parallel.py,
    ``ddp_config.bucket_size``), of ``el`` bytes each (the gradient buffer in the parameters' dtype)."""
    return max(40_000_000, 1_000_000 * replicas) * float(el)


#: bytes per parameter a 16-bit (mixed-precision) optimizer step moves over the gradients besides reading and
#: writing the model state (module docstring, "Optimizer step")
MIXED_PRECISION_GRAD_PASS_BYTES = 18.0

#: bytes of the tied-embedding all-reduce inside the executor-overhead measurement's ``step``
#: (:mod:`profiler.overhead`: ``NEARLY_NOTHING``, vocabulary 8 x hidden 8 in float32)
OVERHEAD_TIED_BYTES = 8 * 8 * 4.0


def rabenseifner(r: int, nbytes: float, link: Link) -> float:
    """Chimera 3.4: ``2 log2(r) alpha + 2 (r-1)/r beta L``."""
    if r <= 1 or nbytes <= 0:
        return 0.0
    return 2 * math.log2(r) * link.alpha + 2 * (r - 1) / r * link.beta * nbytes


def ring_allreduce(r: int, nbytes: float, link: Link) -> float:
    """Ring all-reduce: ``2 (r-1) alpha + 2 (r-1)/r beta L``."""
    if r <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (r - 1) * link.alpha + 2 * (r - 1) / r * link.beta * nbytes


def ring_allgather(r: int, nbytes: float, link: Link) -> float:
    """Ring all-gather (or reduce-scatter) of ``nbytes`` in all: ``(r-1) alpha + (r-1)/r beta L``
    (Thakur et al. 2005; NCCL's ring)."""
    if r <= 1 or nbytes <= 0:
        return 0.0
    return (r - 1) * link.alpha + (r - 1) / r * link.beta * nbytes


@lru_cache(maxsize=64)
def _device(device: str) -> DeviceSpec | None:
    """The description of a cluster's device string (:func:`planner.device.find_device`), looked up once."""
    return find_device(device)


def power_of(profile: ModelProfile) -> tuple[PowerLimit, float] | None:
    """(power limit, busy-throughout rate) of the profile's device where it has a power limit below its burst
    rate and the profile's shards carry their matrix share (operator-model profiles: :mod:`planner.power`);
    None otherwise (measured times are what they are)."""
    dev = _device(profile.device)
    if dev is None or not dev.power_limited:
        return None
    if not any(st.matrix_share for lay in profile.layers for st in (lay.tensor_times or {}).values()):
        return None
    assert dev.power is not None  # power_limited
    return dev.power, dev.sustained_rate


def link_collectives(cluster: Cluster, which: str) -> LinkCollectives | None:
    """The device's NCCL model of link class ``which`` (``"intra"``/``"inter"``), or None (alpha-beta)."""
    dev = _device(cluster.device)
    return dev.collectives(which) if dev is not None else None


def collective_time(cluster: Cluster, which: str, op: str, ranks: int, nbytes: float,
                    steps: int | None = None) -> float:
    """Seconds of one collective ``op`` (``all_reduce``, ``reduce_scatter``, ``all_gather``, ``p2p``) of
    ``nbytes`` among ``ranks`` GPUs on link class ``which``.

    With the device's collective model (:class:`planner.device.LinkCollectives`: NCCL's protocols with
    their latencies, the measured large-message bus bandwidth of each collective as a fraction of the
    link's peak ``1/beta``) the time is the fastest protocol's ``base + steps hop + factor L / busbw``, so
    the achieved bandwidth depends on the message size and the collective. Without one, the cluster's
    alpha-beta link: a ring all-reduce ``2 (r-1) alpha + 2 (r-1)/r beta L``, a ring reduce-scatter or
    all-gather half of it, a send ``alpha + beta L``."""
    if ranks <= 1 or nbytes <= 0:
        return 0.0
    link = cluster.intra if which == "intra" else cluster.inter
    model = link_collectives(cluster, which)
    if model is not None and link.beta > 0:
        return model.time(op, ranks, nbytes, 1.0 / link.beta, steps)
    if op == "all_reduce":
        if steps is not None:  # a tree / recursive-halving count of steps: Rabenseifner
            return rabenseifner(ranks, nbytes, link)
        return ring_allreduce(ranks, nbytes, link)
    if op in ("reduce_scatter", "all_gather"):
        return ring_allgather(ranks, nbytes, link)
    return link.time(nbytes)


def tensor_group(t: int, gpus_per_node: int, world: int) -> list[int]:
    """The global ranks of a tensor-parallel group of ``t`` that spans nodes (nodes of ``gpus_per_node``
    consecutive ranks), among the ``world // t`` groups of consecutive ranks (tensor parallelism innermost:
    :mod:`planner.placement`), or the first group where none does."""
    if gpus_per_node % t:
        for k in range(world // t):
            lo, hi = k * t, (k + 1) * t - 1
            if lo // gpus_per_node != hi // gpus_per_node:
                return list(range(lo, hi + 1))
    return list(range(t))


def ranks_per_node(cluster: Cluster, ranks: list[int]) -> dict[int, int]:
    """Node -> how many of the global GPU ``ranks`` it holds (``gpus_per_node`` consecutive ranks a node)."""
    per_node: dict[int, int] = {}
    for g in ranks:
        per_node[g // cluster.gpus_per_node] = per_node.get(g // cluster.gpus_per_node, 0) + 1
    return per_node


def alltoall_time(cluster: Cluster, ranks: list[int], nbytes: float) -> float:
    """One all-to-all among the global GPUs ``ranks`` in which each sends ``nbytes`` (``1/r`` of it to each rank, its
    own share staying; :mod:`planner.expert_parallel`'s dispatch and combine). NCCL runs it as concurrent sends and
    receives to every peer: a rank on a node holding ``c`` of the ``r`` ranks sends ``(c-1)/r`` of its bytes over the
    intra-node link and ``(r-c)/r`` over its inter-node link at once (each GPU its own NIC, as on a DGX), each timed as
    one message on its link class (:func:`collective_time` ``p2p``); the slowest rank's larger part sets the time."""
    r = len(ranks)
    if r <= 1 or nbytes <= 0:
        return 0.0
    worst = 0.0
    for c in set(ranks_per_node(cluster, ranks).values()):
        intra = collective_time(cluster, "intra", "p2p", 2, nbytes * (c - 1) / r) if c > 1 else 0.0
        inter = collective_time(cluster, "inter", "p2p", 2, nbytes * (r - c) / r) if c < r else 0.0
        worst = max(worst, intra, inter)
    return worst


def allreduce_time(cluster: Cluster, ranks: list[int], nbytes: float) -> float:
    """All-reduce among global GPU ``ranks``; hierarchical when they span nodes: reduce-scatter inside the
    node (``k`` ranks per node), all-reduce across the nodes on ``L/k`` (each GPU on its own NIC), all-gather
    inside the node. Across nodes ``cluster.allreduce = "rabenseifner"`` counts ``2 ceil(log2 n)`` latency
    steps (Chimera 3.4; NCCL's tree, ``2 log2(nNodes)`` network hops), ``"ring"`` ``2 (n-1)``."""
    r = len(ranks)
    if r <= 1 or nbytes <= 0:
        return 0.0
    per_node = ranks_per_node(cluster, ranks)
    if len(per_node) == 1:
        fit = cluster.allreduce_fit  # measured as a whole (planner.cluster.AllReduceFit)
        if fit is not None and r <= fit.ranks:
            return fit.link.time(nbytes)
        if link_collectives(cluster, "intra") is None and cluster.allreduce == "rabenseifner":
            return rabenseifner(r, nbytes, cluster.intra)
        return collective_time(cluster, "intra", "all_reduce", r, nbytes)
    k = max(per_node.values())
    nodes = len(per_node)
    inside = 0.0
    if k > 1:  # reduce-scatter + all-gather inside the node: (k-1)/k of L each way
        if link_collectives(cluster, "intra") is None:  # alpha-beta: as Chimera 3.4 (log2 k latency terms)
            inside = 2 * (math.log2(k) * cluster.intra.alpha + (k - 1) / k * cluster.intra.beta * nbytes)
        else:
            inside = (collective_time(cluster, "intra", "reduce_scatter", k, nbytes)
                      + collective_time(cluster, "intra", "all_gather", k, nbytes))
    # across the nodes: NCCL's model with a tree's step count, or (alpha-beta) Rabenseifner / the ring
    steps = 2 * math.ceil(math.log2(nodes)) if cluster.allreduce == "rabenseifner" else None
    return inside + collective_time(cluster, "inter", "all_reduce", nodes, nbytes / k, steps)


def sharded_collective_time(cluster: Cluster, ranks: list[int], nbytes: float, op: str) -> float:
    """One ``reduce_scatter`` or ``all_gather`` of a ``nbytes`` buffer among global GPU ``ranks``, as a sharded
    optimizer issues them (ZeRO-1, Rajbhandari et al. 2020 section 5.1 and 7.2.1; Megatron-LM's distributed
    optimizer): NCCL runs both as rings over all the ranks (no tree), ``r - 1`` steps each paying the slowest
    hop's latency -- the network's when the ranks span nodes; the bytes cross the network through every GPU's own
    NIC, the ``k`` ranks of a node carrying ``1/k`` of them each (NCCL's channels), the same bus bandwidth as
    :func:`allreduce_time`'s hierarchical all-reduce, of which the pair moves the bytes."""
    r = len(ranks)
    if r <= 1 or nbytes <= 0:
        return 0.0
    per_node = ranks_per_node(cluster, ranks)
    if len(per_node) == 1:
        return collective_time(cluster, "intra", op, r, nbytes)
    return collective_time(cluster, "inter", op, r, nbytes / max(per_node.values()))


@dataclass
class StageInfo:
    layers: tuple[int, int]  # [start, end)
    param_bytes: float  # of the whole stage (before dividing by t)
    params: float
    tied_params: float  # parameters that copy another stage's (tied embedding)
    out_bytes: float  # boundary activation per sample after the stage
    stash_bytes: float  # stashed activations per sample, no recomputation
    #: per sample, what the stage keeps of a micro-batch in flight under full recomputation
    #: (:func:`recompute_kept_bytes`: each checkpointed layer's input, the others' whole stash)
    recompute_kept_bytes: float
    #: the largest stash per sample of one checkpointed layer: materialised again while that layer is
    #: recomputed (the recomputation working set; 0 when the stage has no checkpointed layer)
    recompute_working_bytes: float
    transformer_layers: int
    #: the largest transient per sample of one of its layers (:func:`layer_transient`): held beside the
    #: stashed activations while that layer runs
    transient_bytes: float = 0.0
    #: the stage holds the (vocabulary-parallel) embedding / the LM head with its loss
    has_embedding: bool = False
    has_head: bool = False
    #: per sample, the output gradients a split backward's I keeps for its W (:func:`layer_held_grads`)
    held_grad_bytes: float = 0.0
    #: of ``params`` / ``param_bytes``, the experts' (a mixture of experts: what expert parallelism splits), and
    #: how many of its layers have experts (each does the all-to-alls of :mod:`planner.expert_parallel`)
    expert_params: float = 0.0
    expert_param_bytes: float = 0.0
    moe_layers: int = 0


def own_layer_params(profile: ModelProfile, info: StageInfo) -> list[float]:
    """Per layer of a stage, the parameters it holds of its own: a tied LM head in the stage of the embedding it
    copies is that parameter (one copy, gathered once; :mod:`planner.fsdp`), so its tied part is not its own."""
    i, j = info.layers
    return [float(lay.params - (lay.tied_params if info.has_embedding else 0)) for lay in profile.layers[i:j]]


def layer_stash(lay: LayerProfile, tensor: int, shape: TransformerShape | None) -> float:
    """Stashed activation bytes per sample of one layer's ``1/t`` shard: the profile's own figure at this
    ``t`` (operator model or measured) when it has one, else Korthikanti et al. 2022 eq. 2 scaling of the
    t = 1 figure for transformer layers (``s h (10 + 24/t + 5 a s/(h t))`` of ``s h (34 + 5 a s/h)``), else
    the t = 1 figure over ``t``."""
    shard = lay.tensor_times.get(tensor) if lay.tensor_times else None
    if shard is not None and shard.stashed_bytes_per_sample is not None:
        return float(shard.stashed_bytes_per_sample)
    if lay.kind == "transformer" and shape is not None and tensor > 1:
        a_s_h = 5 * shape.heads * shape.seq / shape.hidden
        return lay.stashed_bytes_per_sample * (10 + 24 / tensor + a_s_h / tensor) / (34 + a_s_h)
    return lay.stashed_bytes_per_sample / tensor


def layer_transient(lay: LayerProfile, tensor: int) -> float:
    """Transient bytes per sample of one layer's ``1/t`` shard (:class:`planner.profile.LayerProfile`'s
    ``transient_bytes_per_sample``): the profile's figure at this ``t`` when it has one, else the t = 1 figure
    over ``t`` (the vocabulary-parallel loss holds ``1/t`` of the logits), 0 where the profile has none."""
    shard = lay.tensor_times.get(tensor) if lay.tensor_times else None
    if shard is not None and shard.transient_bytes_per_sample is not None:
        return float(shard.transient_bytes_per_sample)
    return (lay.transient_bytes_per_sample or 0) / tensor


def layer_held_grads(lay: LayerProfile, tensor: int) -> float:
    """Bytes per sample of the output gradients one layer's ``1/t`` shard keeps from a split backward's I to
    its W (:attr:`planner.profile.ShardTimes.held_grad_bytes_per_sample`): the profile's figure at this ``t``,
    else the t = 1 figure over ``t``, 0 where the profile has none (a measured profile)."""
    shard = lay.tensor_times.get(tensor) if lay.tensor_times else None
    if shard is not None and shard.held_grad_bytes_per_sample is not None:
        return float(shard.held_grad_bytes_per_sample)
    return (lay.held_grad_bytes_per_sample or 0) / tensor


def recompute_kept_bytes(lay: LayerProfile, stash: float, tensor: int, sequence_parallel: bool) -> float:
    """Bytes per sample layer ``lay`` keeps of a micro-batch in flight under full recomputation
    (:mod:`planner.profile`'s rule, :func:`planner.profile.checkpointed`): a checkpointed layer its input --
    replicated on every tensor-parallel rank, so divided by ``t`` only with sequence parallelism (Korthikanti
    et al. 2022, section 5 and Table 2, "full activation recomputation": ``2 s b h L`` bytes for ``L``
    layers at 16 bits, ``2 s b h L / t`` with sequence parallelism); a layer that is not checkpointed (the
    embedding, the LM head with its loss) its whole stash ``stash`` (:func:`layer_stash`)."""
    if not checkpointed(lay.kind):
        return stash
    return lay.input_bytes_per_sample / (tensor if sequence_parallel else 1)


def stage_infos(profile: ModelProfile, bounds: list[tuple[int, int]], tensor: int,
                cache: dict[tuple[int, int, int], StageInfo] | None = None) -> list[StageInfo]:
    """Per stage ``[i, j)`` of ``bounds``, its sizes at tensor-parallel size ``tensor``. Under full
    recomputation a micro-batch in flight keeps the sum of :func:`recompute_kept_bytes` over the stage's
    layers, and the backward re-materialises one checkpointed layer's stash at a time. ``cache`` (optional,
    one per profile): the infos already computed, by ``(i, j, tensor)`` (read-only: partitions of a search
    share most of their stages)."""
    out = []
    shape = profile.shape
    sp = profile.environment.get("sequence_parallel") == "true"
    for i, j in bounds:
        if cache is not None:
            got = cache.get((i, j, tensor))
            if got is not None:
                out.append(got)
                continue
        layers = profile.layers[i:j]
        stashes = [layer_stash(lay, tensor, shape) for lay in layers]
        out.append(StageInfo(
            layers=(i, j), param_bytes=sum(x.param_bytes for x in layers),
            params=sum(x.params for x in layers),
            tied_params=sum(x.tied_params for x in layers),
            out_bytes=layers[-1].output_bytes_per_sample, stash_bytes=sum(stashes),
            recompute_kept_bytes=sum(recompute_kept_bytes(lay, st, tensor, sp)
                                     for lay, st in zip(layers, stashes, strict=True)),
            recompute_working_bytes=max((st for lay, st in zip(layers, stashes, strict=True)
                                         if checkpointed(lay.kind)), default=0.0),
            transformer_layers=sum(1 for x in layers if x.kind == "transformer"),
            transient_bytes=max(layer_transient(lay, tensor) for lay in layers),
            has_embedding=any(x.kind == "embedding" for x in layers),
            has_head=any(x.kind == "lm_head" for x in layers),
            held_grad_bytes=sum(layer_held_grads(lay, tensor) for lay in layers),
            expert_params=sum(x.expert_params for x in layers),
            expert_param_bytes=sum(x.param_bytes * x.expert_params / x.params for x in layers if x.expert_params),
            moe_layers=sum(1 for x in layers if x.expert_params)))
        if cache is not None:
            cache[(i, j, tensor)] = out[-1]
    # a tied copy sharing the stage of its original is not a second copy
    return out


def _counts_bytes(shape: TransformerShape) -> float:
    """Bytes per rank of the token counts' exchange before a dispatch: ``E`` int64 (:meth:`ConfigCosts.ep_counts`)."""
    return 8.0 * int(shape.experts or 1)


class ConfigCosts(Costs):
    """:class:`planner.simulate.Costs` of one configuration (module docstring)."""

    def __init__(self, profile: ModelProfile, cluster: Cluster, request: TrainingRequest, config: Config,
                 schedule: Schedule, bounds: list[tuple[int, int]],
                 held: list[list[tuple[int, int]]] | None = None, shared: dict | None = None,
                 layer_sums: dict | None = None, emulated: bool = False,
                 stage_cache: dict[tuple[int, int, int], StageInfo] | None = None,
                 alltoalls: dict[tuple, float] | None = None) -> None:
        """``shared`` (optional) is a dict reused by every configuration with the same t, partition,
        micro-batch size and recomputation: stage infos and F/B durations are computed once for all.
        ``layer_sums`` (optional) is a dict reused by every configuration of one profile: per (kind,
        samples), the running sums of the layers' times; ``stage_cache`` (optional), one too: the stage infos
        by (first layer, end, t) (:func:`stage_infos`); ``alltoalls`` (optional), one too: the expert-parallel
        all-to-all times (:meth:`_alltoall`), by placement (t, D, W, e, etp, rank order), devices and bytes.
        ``emulated``: compute waits instead of running (:mod:`executor.emulate`), so on a shared host
        (``cluster.host``) only the executor's own overhead takes core time."""
        self.profile, self.cluster, self.request, self.config = profile, cluster, request, config
        self.schedule = schedule
        t = config.tensor
        self.t = t
        shared = shared if shared is not None else {}
        if "infos" not in shared:
            shared.update(infos=stage_infos(profile, bounds, t, stage_cache), fwd={}, bwd={}, steps={})
        self.stages = shared["infos"]
        # the step per stage, by the model state it reads and writes (W-dependent with a sharded optimizer)
        #: weights sharded over the W replicas (:mod:`planner.fsdp`), and gathered again for every micro-batch
        #: (no pipeline: torchtitan's reshard policy) rather than once per iteration
        self.fsdp = request.shard_parameters and config.data > 1
        self.fsdp_per_microbatch = self.fsdp and fsdp.reshards_after_forward(schedule.devices)
        #: the gathers run beside the compute (not on a shared CPU host whose collectives take its cores)
        self.fsdp_overlap = cluster.host is None or cluster.host.comm_overlaps_compute
        #: of the compute throughput, what a collective overlapped with it holds while it runs
        #: (:func:`planner.contention.collective_share`: its NCCL channels' SMs)
        self.comm_share = collective_share(_device(cluster.device))
        self._fsdp_layers: dict[int, tuple[list[float], list[float]]] = {}
        #: expert-parallel size e (:mod:`planner.expert_parallel`; ``profile`` is then one EP rank's view of the model)
        self.expert = config.expert
        #: expert tensor-parallel size: t, or 1 with the experts whole on each rank (``profile`` is then the view of
        #: them at this t: :func:`planner.expert_parallel.expert_view`)
        self.etp = config.etp
        shard = config.data if request.sharded_state else 1
        # an expert's state is sharded over the W/e replicas holding it
        expert_shard = config.expert_data if request.sharded_state else 1
        step_key = (request.state_bytes_per_param(config.data), shard, self.fsdp,
                    request.state_bytes_per_param(config.expert_data), expert_shard)
        if step_key not in shared["steps"]:
            grad_pass = MIXED_PRECISION_GRAD_PASS_BYTES if DTYPE_BYTES.get(profile.dtype.lower(), 2) == 2 else 0.0
            if self.fsdp:  # the gradients arrive reduce-scattered in fp32 (planner.fsdp)
                grad_pass = fsdp.step_grad_pass_bytes(profile.dtype)
            unit = calibration(cluster).compute_scale / cluster.memory_bandwidth / t
            scale = (2 * step_key[0] + grad_pass / shard) * unit
            expert_scale = (2 * step_key[3] + grad_pass / expert_shard) * unit
            shared["steps"][step_key] = [state_split(info.params, info.expert_params, scale, expert_scale)
                                         for info in self.stages]
        self._step_of: list[float] = shared["steps"][step_key]
        # the size of one micro-batch of the schedule: backward halving runs micro-batches of b/2
        self.base_b = schedule_samples(config)
        self.eff = 1.0 if t == 1 else request.tensor_efficiency
        self.el = DTYPE_BYTES.get(profile.dtype.lower(), 2)
        #: the global ranks of the slowest tensor-parallel group: one that spans nodes if any does (t > G, or a t
        #: that does not divide G: t = 3 on 8-GPU nodes puts ranks 6-8 on two; ``pipeplan predict`` takes such
        #: a t, the search does not try it), and ``tp_spans`` whether it does
        self.tp_ranks = tensor_group(t, cluster.gpus_per_node, t * config.pipeline * config.data)
        self.tp_spans = self.tp_ranks[0] // cluster.gpus_per_node != self.tp_ranks[-1] // cluster.gpus_per_node
        if "per_t" not in shared:
            have = [t in (lay.tensor_times or {}) for lay in profile.layers]
            shared["per_t"] = (any(have), not all(have))
        #: compute at this t from the profile's shard times (per layer, where it has them) or t = 1 times
        #: divided by (t * tensor_efficiency); ``partial``: some layers lack times at this t
        self.per_t, self.partial = shared["per_t"]
        self.sequence_parallel = profile.environment.get("sequence_parallel") == "true"
        #: what the profile's layers re-run in the backward where the candidate does not recompute fully:
        #: "selective", their attention core (the unfused one, or the flash kernel's forward as Megatron-Core
        #: does; Korthikanti et al. 2022 section 5), "op", what torchtitan's selective op checkpointing re-runs,
        #: or "none" (:mod:`planner.operators`): already in the profile's times and stash, recorded here for the
        #: candidate's output
        self.granularity = recompute_granularity(profile.environment.get("recompute_granularity"))
        #: the kernels the profile's times assume: "eager" (PyTorch eager ops) or "fused" (planner.operators)
        self.kernels = "eager" if profile.environment.get("kernels") == "eager" else "fused"
        self.blocking_p2p = profile.environment.get("p2p") == "blocking"
        #: Megatron-LM's scatter/gather (module docstring, "Pipeline p2p"; ``environment["p2p_scatter_gather"]``
        #: ``"on"``): each tensor-parallel rank sends a 1/t share of the boundary tensor and the receivers
        #: all-gather it. Otherwise every rank sends the whole tensor (pipeplan's executor, Megatron-Core), except
        #: under sequence parallelism, where each rank's boundary tensor is its 1/t of the sequence anyway
        self.scatter_gather = profile.environment.get("p2p_scatter_gather") == "on" and not self.sequence_parallel
        self.p2p_share = self.t if self.scatter_gather or self.sequence_parallel else 1
        self.overlapped_dp = profile.environment.get("dp_allreduce") == "overlapped"
        self._layer_sums: dict[tuple[str, float, int, bool], list[float]] = layer_sums if layer_sums is not None else {}
        #: F (stage, span) / B (stage) durations at the busy-throughout rate and their matrix part
        self._fwd: dict[tuple[int, int], tuple[float, float]] = shared["fwd"]
        #: :meth:`send_time` per (link class, bytes), shared like the F/B durations (the cluster is the same)
        self._sends: dict[tuple[str, float], float] = shared.setdefault("sends", {})
        self._bwd: dict[int, tuple[float, float]] = shared["bwd"]
        #: :meth:`_tp_one` per micro-batch size, shared like the F/B durations (of t and the cluster only)
        self._tp_ones: dict[float, float] = shared.setdefault("tp_one", {})
        #: :meth:`_dp_allreduce`, shared like :attr:`_tp_ones`
        self._allreduces: dict[tuple[tuple[int, ...], int, int, str, float], float] = \
            shared.setdefault("allreduce", {})
        #: a blocking runtime's send held by each F (stage, span) / B (stage): of this configuration's placement
        #: (which device, hence which link, the neighbour stage sits on), never shared with the configurations
        #: that share the compute above (an interleaved pipeline of D = 2 and a 1F1B one of D = 8 have the same
        #: 8 stages, and Chimera's two pipelines run their stages in opposite directions)
        self._held_send: dict[tuple[str, int, int], float] = {}
        #: :meth:`holders` per stage, of the placement it was read from (a later :meth:`use_schedule` may bring
        #: another): Chimera's bounds ask :meth:`allreduce` ~500 times per configuration at D = 256, 2f = 256,
        #: each reading the 256 replicas' rows, for ~120 distinct stages. The tuples are shared like
        #: :attr:`_allreduces` (whose keys hold them): the candidates keep their costs to the end of the search
        self._holders: tuple[list[list[int]] | None, dict[int, tuple[int, ...]]] = (None, {})
        self._holder_tuples: dict[tuple[int, ...], tuple[int, ...]] = shared.setdefault("holders", {})
        #: (replica, stage) pairs each device holds
        self.held = held if held is not None else [schedule.stages_on(d) for d in range(schedule.devices)]
        self.cal = calibration(cluster)
        self.emulated = emulated
        #: (holds no reference back to these costs: a cycle would keep every candidate's costs, and the
        #: schedule they time, alive until the garbage collector runs -- which the search pauses)
        self.overheads = ActionOverheads(cluster, emulated)
        #: slowdown of core time on a shared CPU host (:func:`host_share`); None until first needed
        self._share: float | None = None if cluster.host is not None else 1.0
        self._tied: dict[int, float] = {}  # per device: :meth:`tied_allreduce`
        #: the experts' gradient reduction (:meth:`allreduce`), of this placement
        self._ep_times: dict[tuple, float] = {}
        #: :meth:`_alltoall`'s times, which depend on the placement alone (its key names it): shared by the
        #: configurations of one search that have it, whatever their schedule, partition or micro-batch size
        self._alltoalls: dict[tuple, float] = alltoalls if alltoalls is not None else {}
        #: :meth:`p2p`'s times (of the configuration's placement, links and stage outputs: not of the clock)
        self._p2p: dict[tuple, float] = {}
        if "power" not in shared:
            shared["power"] = power_of(profile) if self.per_t else None
        #: the profile's device's power limit and busy-throughout rate (:mod:`planner.power`) where the profile's
        #: shards carry their matrix share, else None; ``relief``: ``1 - sustained_rate / held rate``, the part of
        #: the matrix time a clock held above the busy-throughout one saves (0 until the search sets it)
        self.power: tuple[PowerLimit, float] | None = shared["power"]
        self.relief = 0.0

    # ---- helpers -------------------------------------------------------------------------------
    def rank(self, device: int, data_replica: int = 0) -> int:
        """Global GPU of tensor rank 0 of pipeline device ``device`` of replica ``data_replica``, in the
        configuration's rank order (:func:`planner.placement.global_rank`)."""
        c = self.config
        return global_rank(c.order, device, data_replica, 0, c.pipeline, c.data, self.t)

    def slot_rank(self, device: int, slot: int) -> int:
        """Global GPU of slot ``slot = w t + k`` (replica ``w``, tensor rank ``k``) of pipeline device ``device``
        (:mod:`planner.expert_parallel`, "Expert tensor parallelism")."""
        c = self.config
        w, k = divmod(slot, self.t)
        return global_rank(c.order, device, w, k, c.pipeline, c.data, self.t)

    def link(self, src: int, dst: int) -> Link:
        return self.cluster.intra if self.link_class(src, dst) == "intra" else self.cluster.inter

    def link_class(self, src: int, dst: int) -> str:
        """``"intra"`` when pipeline devices ``src`` and ``dst`` share a node, else ``"inter"``."""
        g = self.cluster.gpus_per_node
        return "intra" if self.rank(src) // g == self.rank(dst) // g else "inter"

    def send_time(self, src: int, dst: int, nbytes: float) -> float:
        """One point-to-point message of ``nbytes`` from pipeline device ``src`` to ``dst``
        (:func:`collective_time` ``p2p``: NCCL send/recv on the link between them)."""
        key = (self.link_class(src, dst), nbytes)
        v = self._sends.get(key)
        if v is None:  # the same few (link, size) pairs for every send of a pipeline: computed once each
            v = self._sends[key] = collective_time(self.cluster, key[0], "p2p", 2, nbytes)
        return v

    @property
    def compute_source(self) -> str:
        """Where the compute times come from: ``"per-t measured"``, ``"per-t operators"`` (the profile's
        times at this t) or ``"t=1 / (t * tensor_efficiency)"`` (``"t=1"`` when t is 1)."""
        if self.per_t:
            src = next(lay.tensor_times[self.t].source for lay in self.profile.layers
                       if lay.tensor_times and self.t in lay.tensor_times)
            return (f"per-t {src}" + (" (other layers: t=1 / (t * tensor_efficiency))" if self.partial else "")
                    + self._expert_source)
        return ("t=1" if self.t == 1 else "t=1 / (t * tensor_efficiency)") + self._expert_source

    @property
    def _expert_source(self) -> str:
        """What the experts' times are at e > 1 (:func:`planner.expert_parallel.expert_view`)."""
        whole = " whole (etp=1)" if self.etp < self.t else ""
        if self.expert == 1 and not whole:
            return ""
        missing = self.profile.environment.get(EXPERT_TIMES_KEY)
        if missing == "e=1":
            return f"; experts at e={self.expert}: the times without expert parallelism (same FLOPs)"
        if missing:
            return f"; experts at e={self.expert}{whole}: the times with them split over t (same FLOPs)"
        return f"; experts at e={self.expert}{whole}"

    def _tp_one(self, samples: float, width: int | None = None) -> float:
        """One tensor-parallel all-reduce of the ``b s h`` boundary tensor (with sequence parallelism: an
        all-gather and a reduce-scatter of it), before the calibration's link scale; ``width``: of ``b s width``
        elements instead (latent attention's: :meth:`_tp_comm`)."""
        shape = self.profile.shape
        if self.t == 1 or shape is None:
            return 0.0
        key = samples if width is None else (samples, width)
        got = self._tp_ones.get(key)  # (the same for every stage: once per size)
        if got is None:
            nbytes = samples * shape.seq * (shape.hidden if width is None else width) * self.el
            if self.sequence_parallel and not self.tp_spans:
                # an all-gather and a reduce-scatter in place of the all-reduce
                got = (self._tp_all_gather(nbytes)
                       + collective_time(self.cluster, "intra", "reduce_scatter", self.t, nbytes))
            else:
                got = self._tp_allreduce(nbytes)
            self._tp_ones[key] = got
        return got

    def _tp_all_gather(self, nbytes: float) -> float:
        """One all-gather of ``nbytes`` in a tensor-parallel group, before the calibration's link scale: the
        intra-node collective model, or, when t spans nodes, half of :meth:`_tp_allreduce` (an all-reduce is a
        reduce-scatter and an all-gather of the same bytes)."""
        if not self.tp_spans:
            return collective_time(self.cluster, "intra", "all_gather", self.t, nbytes)
        return self._tp_allreduce(nbytes) / 2

    def _tp_allreduce(self, nbytes: float) -> float:
        """One all-reduce of ``nbytes`` in the slowest tensor-parallel group (``tp_ranks``), before
        the calibration's link scale: when t spans nodes, the hierarchical :func:`allreduce_time` (NCCL's
        rings cross nodes on every GPU's own NIC, so the inter-node hop carries 1/k of the data per GPU);
        on a cluster with a measured all-reduce (:class:`planner.cluster.AllReduceFit`, CPU clusters) that
        fit, through :func:`allreduce_time`; else the intra-node collective model."""
        if self.tp_spans or self.cluster.allreduce_fit is not None:
            return allreduce_time(self.cluster, self.tp_ranks, nbytes)
        return collective_time(self.cluster, "intra", "all_reduce", self.t, nbytes)

    def _tp_comm(self, stage: int, samples: float) -> float:
        """Two all-reduces of ``b s h`` elements per transformer layer (one pass, Megatron 3.2), or with
        sequence parallelism two all-gathers and two reduce-scatters of the same tensors. A layer with experts
        under sequence parallelism and expert parallelism (:meth:`_moe_gathers`) gathers its experts' token copies
        instead of the MLP's input; one with its experts whole on each rank (``etp = 1``) moves nothing around them
        (each rank routes its own ``T/t`` tokens; attention's collectives stay). A layer's shared expert
        (:meth:`_shared`) adds a dense MLP's: Megatron-Core's ``SharedExpertMLP`` gathers its input and
        reduce-scatters its output (or all-reduces it) on its own, whatever the routed experts' dispatcher does.

        Latent attention (the profile's ``latent_width``: :mod:`planner.mla`): its column-parallel up-projections
        read the latents (and the queries' input without a query latent), which the down-projections duplicated on
        every rank made whole, so the collective on the attention's input side moves ``b s w`` elements, ``w`` the
        latent width, not ``b s h`` (Megatron-Core's ``MLASelfAttention``: with sequence parallelism it gathers the
        compressed latents; without, the backward all-reduces their gradients); the output side's stays ``b s h``.
        Charged as half of each per pass (exact with sequence parallelism; without it the forward's is the ``h``
        one and the backward's the latent one, the same in sum)."""
        info = self.stages[stage]
        moe = self._moe_gathers(info)
        one = self._tp_one(samples)
        total = ((2 * info.transformer_layers - moe - self._whole_experts(info) + self._shared(info)) * one
                 + (moe * self._tp_one(samples * self._k) if moe else 0.0))
        latent = self._latent_width
        if latent is not None and info.transformer_layers:
            total += info.transformer_layers * (self._tp_one(samples, latent) - one) / 2
        total += info.transformer_layers * self._split_norms(samples)
        return total * self.cal.link_scale

    def _split_norms(self, samples: float) -> float:
        """Per transformer layer and pass, the all-reduces of the norms over a width split over ``t`` (the profile's
        ``split_norms``: OLMo 2's query and key norms over the whole projections): each rank sums the squares of its
        columns of each of the ``b s`` rows, and the ``b s`` fp32 partial sums are all-reduced over the group -- in the
        forward for the norm, in the backward for the mean of its gradient times its input (RMSNorm's backward reads
        the whole row): one all-reduce of ``4 b s`` bytes per norm and pass, latency-bound (:meth:`_tp_comm` is one
        pass's). Where ``t`` does not divide the key/value heads (the profile's ``kv_heads``) each rank computes the
        whole key projection (:mod:`executor.tensor_parallel`'s replicated key rows) and its norm needs no
        all-reduce: the query norm's only."""
        shape = self.profile.shape
        if self.t == 1 or shape is None or not shape.split_norms:
            return 0.0
        norms = shape.split_norms - (1 if shape.kv_heads is not None and shape.kv_heads % self.t else 0)
        return norms * self._tp_allreduce(samples * shape.seq * 4.0)

    @property
    def _latent_width(self) -> int | None:
        """The width latent attention's tensor-parallel input collective moves (the profile's ``latent_width``), or
        None for standard attention."""
        shape = self.profile.shape
        return shape.latent_width if shape is not None else None

    def _shared(self, info: StageInfo) -> int:
        """How many of the stage's layers run a shared expert beside their routed ones (the profile's
        ``shared_expert_ffn_hidden``: every layer with experts)."""
        shape = self.profile.shape
        return info.moe_layers if shape is not None and shape.shared_expert_ffn_hidden is not None else 0

    def _moe_gathers(self, info: StageInfo) -> int:
        """How many of the stage's layers gather their experts' token copies over the tensor-parallel group: with
        sequence parallelism and ``e > 1`` (Megatron-Core's all-to-all dispatcher, which the Megatron export sets;
        ``MoEAlltoAllTokenDispatcher``: the layer takes its ``T/t`` rows without an all-gather, routes them, sends
        their ``k`` copies to their experts over the EP group, then all-gathers the copies it received over the
        expert tensor-parallel group, ``t`` here, so that each rank runs its ``1/t`` of each expert on all of them;
        the combine reduce-scatters them back): an all-gather and a reduce-scatter of ``T k h`` where a dense MLP
        moves ``T h``, ``k`` times the bytes. Without expert parallelism Megatron-Core's default dispatcher
        all-gathers the ``T h`` input (the dense layer's collectives); without sequence parallelism the experts'
        outputs are all-reduced over ``T h`` (pipeplan's executor, :mod:`executor.expert_parallel`)."""
        gathers = self.expert > 1 and self.sequence_parallel and 1 < self.t == self.etp
        return info.moe_layers if gathers else 0

    def _whole_experts(self, info: StageInfo) -> int:
        """How many of the stage's layers hold their experts whole (``etp = 1``): no tensor-parallel collective around
        their experts, whose input is the rank's own ``T/t`` rows (:mod:`planner.expert_parallel`)."""
        return info.moe_layers if self.etp < self.t else 0

    @property
    def _k(self) -> int:
        """Experts per token ``k`` of the profile's mixture of experts (1 for a dense model)."""
        shape = self.profile.shape
        return int(shape.experts_per_token or 1) if shape is not None else 1

    def _sp_regather(self, stage: int, samples: float) -> float:
        """With sequence parallelism, the all-gathers of the column-parallel GEMMs' inputs redone in the
        backward: Megatron-LM stashes only the ``T/t``-row shard of the input of the QKV and MLP-up GEMMs
        (and of the LM head's logits GEMM) and all-gathers it again for the weight gradient
        (Korthikanti et al. 2022, section 4.2.2; ``LinearWithGradAccumulationAndAsyncCommunication.
        backward``, 2022), whether or not the layer was recomputed (the recomputed forward stashes the
        shard too): two ``b s h`` all-gathers per transformer layer, one for the head, per backward.
        Megatron issues them asynchronously ahead of the input-gradient GEMM; like every tensor-parallel
        collective here they are charged in full (no compute/communication overlap is modelled). One per layer whose
        experts gather their token copies (:meth:`_moe_gathers`) or are whole on each rank (``etp = 1``); one more per
        shared expert (:meth:`_shared`: its first GEMM's input)."""
        info = self.stages[stage]
        shape = self.profile.shape
        if not self.sequence_parallel or self.t == 1 or shape is None:
            return 0.0
        # a layer whose experts gather their token copies (:meth:`_moe_gathers`) keeps them for its weight gradients:
        # only its QKV input is gathered again
        count = (2 * info.transformer_layers - self._moe_gathers(info) - self._whole_experts(info)
                 + self._shared(info) + (1 if info.has_head else 0))
        if count == 0:
            return 0.0
        one = self._tp_all_gather(samples * shape.seq * shape.hidden * self.el)
        out = count * one
        latent = self._latent_width
        if latent is not None and info.transformer_layers:  # latent attention re-gathers its latents' shard instead
            out += info.transformer_layers * (self._tp_all_gather(samples * shape.seq * latent * self.el) - one)
        return out * self.cal.link_scale

    def _tp_edges(self, stage: int, samples: float, backward: bool) -> float:
        """The tensor-parallel collectives of the embedding and the LM head (Megatron-LM 2021-22, without
        sequence parallelism): the vocabulary-parallel embedding sums its partial lookups with one
        all-reduce of ``b s h`` in the forward (``VocabParallelEmbedding``: ``reduce_from_tensor_model_
        parallel_region``); the LM head's input enters by ``copy_to_tensor_model_parallel_region``, whose
        backward all-reduces the ``b s h`` input gradient; the vocabulary-parallel cross-entropy all-reduces
        three ``b s`` fp32 vectors in the forward (row max, target logit, sum of exponentials). With
        sequence parallelism the embedding's all-reduce is a reduce-scatter and the head's input an
        all-gather forward and a reduce-scatter backward: half of :meth:`_tp_one` each."""
        info = self.stages[stage]
        shape = self.profile.shape
        if self.t == 1 or shape is None or not (info.has_embedding or info.has_head):
            return 0.0
        one = self._tp_one(samples)
        edge = one / 2 if self.sequence_parallel else one
        out = 0.0
        if backward:
            out += edge if info.has_head else 0.0
        else:
            out += edge if info.has_embedding else 0.0
            if info.has_head:
                out += edge if self.sequence_parallel else 0.0
                out += 3 * self._tp_allreduce(samples * shape.seq * 4.0)
        return out * self.cal.link_scale

    def tp_seconds(self, device: int) -> float:
        """Seconds per micro-batch of the tensor-parallel collectives on ``device``'s compute stream, as the F
        and B durations charge them: per stage it holds, the transformer layers' collectives of the forward
        (:meth:`_tp_comm`) and of the backward (twice with full recomputation), the embedding's and the LM
        head's (:meth:`_tp_edges`) and the sequence-parallel re-gathers of the backward (:meth:`_sp_regather`)."""
        b = self.base_b
        rc = 2 if self.config.recompute else 1
        per = 0.0
        for _replica, s in self.held[device]:
            layers = self._tp_comm(s, b)
            per += (layers + self._tp_edges(s, b, backward=False)
                    + rc * layers + self._tp_edges(s, b, backward=True) + self._sp_regather(s, b))
        return per

    def ep_seconds(self, device: int) -> float:
        """Seconds per micro-batch of the expert-parallel all-to-alls on ``device``'s compute stream, as the F and B
        durations charge them (:meth:`ep_in`); 0 at e = 1."""
        if self.expert == 1:
            return 0.0
        return sum(self.ep_in("F", s, 1) + self.ep_in("B", s, 1) for _replica, s in self.held[device])

    def ep_in(self, kind: str, stage: int, span: int = 1) -> float:
        """Of an F, B or I action, the seconds of its expert-parallel all-to-alls (:meth:`_pass_alltoalls`, each
        layer's in the slowest of the stage's groups); W runs none."""
        if self.expert == 1 or kind not in ("F", "B", "I"):
            return 0.0
        return self._pass_alltoalls(kind, span, lambda nbytes: self._per_moe_layer(stage, nbytes))

    def model_ep_in(self, kind: str, span: int = 1) -> float:
        """:meth:`ep_in` of an F or B (a split one's I and W together) through every layer of the model at once, each
        layer with experts at the least all-to-all of any pipeline device's group: at most what :meth:`ep_in` charges
        the stages of any partition between them (each stage's layers at the slowest group of its holders);
        0 at e = 1 (:meth:`planner.bounds.TimeBounds.work_bound`)."""
        shape = self.profile.shape
        if self.expert == 1 or shape is None or kind not in ("F", "B"):
            return 0.0
        layers = sum(info.moe_layers for info in self.stages)  # (the stages hold every layer once)
        if not layers:
            return 0.0
        devices = range(self.schedule.devices)

        def least(nbytes: Callable[[TransformerShape], float]) -> float:
            n = nbytes(shape)
            return layers * min(self._alltoall((d,), n) for d in devices) * self.cal.link_scale

        return self._pass_alltoalls(kind, span, least)

    def _pass_alltoalls(self, kind: str, span: int, per_layer: Callable[[Callable[[TransformerShape], float]], float]
                        ) -> float:
        """The all-to-alls of an F (of ``span`` micro-batches) or a backward, given ``per_layer(nbytes)``: the seconds
        of one all-to-all of ``nbytes(shape)`` per rank in each layer with experts. A forward: the dispatch and the
        combine (:meth:`ep_comm`) and the token counts' exchange (:meth:`ep_counts`); a backward: its dispatch and
        combine, and with recomputation the recomputed forward's too."""
        comm = 2 * per_layer(self._dispatch_bytes(self.base_b * span if kind == "F" else self.base_b))
        if kind == "F":
            return comm + per_layer(_counts_bytes)
        return comm + (comm + per_layer(_counts_bytes) if self.config.recompute else 0.0)

    def ep_counts(self, stage: int) -> float:
        """A forward's exchange of the token counts before each dispatch (:mod:`planner.expert_parallel`: an
        all-to-all of ``E`` int64 per rank, per layer with experts), with the link scale; 0 at e = 1."""
        return self._per_moe_layer(stage, _counts_bytes)

    def ep_comm(self, stage: int, samples: float) -> float:
        """One pass's expert-parallel all-to-alls of ``stage`` for a micro-batch of ``samples``: per layer with
        experts the dispatch and the combine (:mod:`planner.expert_parallel`, "Communication"), each
        :func:`alltoall_time` in the slowest of the stage's expert-parallel groups, with the link scale; 0 at e = 1."""
        return 2 * self._per_moe_layer(stage, self._dispatch_bytes(samples))

    def _dispatch_bytes(self, samples: float) -> Callable[[TransformerShape], float]:
        """Bytes per rank of one dispatch (or combine) of a micro-batch of ``samples``, of the model's shape."""
        return lambda shape: alltoall_bytes(samples, shape.seq, shape.hidden, int(shape.experts_per_token or 1),
                                            self.el, self.t, self.sequence_parallel)

    def _per_moe_layer(self, stage: int, nbytes: Callable[[TransformerShape], float]) -> float:
        """One all-to-all of ``nbytes(shape)`` per rank (:meth:`_alltoall`) in each of ``stage``'s layers with
        experts, with the link scale; 0 at e = 1 or where the stage has none."""
        info = self.stages[stage]
        shape = self.profile.shape
        if self.expert == 1 or not info.moe_layers or shape is None:
            return 0.0
        return info.moe_layers * self._alltoall(self.holders(stage), nbytes(shape)) * self.cal.link_scale

    def _alltoall(self, holders: tuple[int, ...], nbytes: float) -> float:
        """:func:`alltoall_time` in the slowest expert-parallel group of the pipeline devices ``holders`` (expert tensor
        rank 0; every one's group is laid out alike: :func:`planner.expert_parallel.ep_slots`), once per (placement,
        holders, bytes: :attr:`_alltoalls`). A group's nodes depend on where its first rank falls in a node, which
        repeats every ``G`` groups at most."""
        c = self.config
        key = (self.t, c.pipeline, c.data, self.expert, self.etp, c.order, holders, nbytes)
        got = self._alltoalls.get(key)
        if got is None:
            e, etp = self.expert, self.etp
            groups = self.t * self.config.data // (e * etp)  # (q, r) groups: q's, each with its etp = 1 or t alike
            got = self._alltoalls[key] = max(
                alltoall_time(self.cluster, [self.slot_rank(d, j) for j in ep_slots(q * e * etp, e, etp)], nbytes)
                for d in holders for q in range(min(groups, self.cluster.gpus_per_node)))
        return got

    def busy_share(self, res: SimResult) -> float:
        """The pipeline's mean busy share of the simulated step ``res`` (:func:`planner.power.busy_share`): per
        device its compute (the step's time taken out), the communication inside it -- the tensor-parallel
        collectives and, with a blocking runtime, the sends each F and B waits for -- (the schedule's micro-
        batches over its replicas of each stage) and its exposed data-parallel reduction."""
        microbatches = self.schedule.microbatches
        per = []
        for d, st in enumerate(res.devices):
            step = st.step[1] - st.step[0]
            sends = sum(self._held("F", s, 1) + self._held("B", s, 1) for _r, s in self.held[d]) \
                if self.blocking_p2p else 0.0
            inside = (self.tp_seconds(d) + self.ep_seconds(d) + sends) * microbatches / max(1, self.schedule.replicas)
            per.append((st.busy - step, inside, max(0.0, st.step[0] - st.compute_end)))
        return busy_share(res.makespan, per)

    @property
    def held_rate(self) -> float | None:
        """The matrix rate (of the burst rate) the durations assume under a power limit; None without one."""
        return None if self.power is None else self.power[1] / (1.0 - self.relief)

    def hold_clock(self, res: SimResult, resimulate: Callable[[], SimResult]) -> SimResult:
        """The step at the clock a power-limited GPU holds (:mod:`planner.power`): a fixed point of the rate and
        the busy share -- from the simulated step ``res``, read the busy share, set the held rate
        (:attr:`relief`), ``resimulate`` -- until the rate moves less than
        :data:`planner.power.RATE_TOLERANCE` (at most :data:`planner.power.MAX_PASSES` more simulations). The
        last simulation is returned: its times are those of the lists at that clock. ``res`` as it is without a
        power limit."""
        if self.power is None:
            return res
        power, sustained = self.power
        for _ in range(MAX_PASSES):
            rate = held_rate(power, sustained, self.busy_share(res))
            if abs(rate - (self.held_rate or 1.0)) < RATE_TOLERANCE:
                break
            self.relief = 1.0 - sustained / rate
            res = resimulate()
        return res

    def _blocking_send(self, stage: int, to: int, span: int) -> float:
        """Seconds a blocking runtime holds the compute stream to send stage ``stage``'s boundary tensor to
        stage ``to`` (0 when there is no such stage or both sit on one device) plus the all-gather of the
        scatter/gather chunks (module docstring)."""
        if not 0 <= to < self.schedule.stages:
            return 0.0
        row = self.schedule.placement[0]
        src, dst = row[stage], row[to]
        if src == dst:
            return 0.0
        boundary = stage if to > stage else to
        seconds = self.send_time(src, dst, self.p2p_bytes(boundary, span))
        if self.scatter_gather:  # the receivers all-gather the 1/t chunks into the whole tensor
            full = self.stages[boundary].out_bytes * self.base_b * span
            seconds += self._tp_all_gather(full)
        return seconds * self.cal.link_scale

    def _sums(self, kind: str, samples: float) -> list[float]:
        """Running sums over the model's layers of their seconds of ``kind`` at ``samples`` per micro-batch (computed
        once per kind and size): a range of layers' seconds is a difference of two (:meth:`_layers_parts`)."""
        t = self.t
        key = (kind, samples, t, self.per_t)
        sums = self._layer_sums.get(key)
        if sums is None:
            sums = [0.0]
            split = kind in ("bwd_input", "bwd_weight")
            for lay in self.profile.layers:
                v = lay.shard_time(kind, samples, t) if self.per_t else None
                if v is None:  # no times at this t: the t = 1 time over t and the split efficiency
                    v = lay.time("bwd" if split else kind, samples) * (0.5 if split else 1.0) / (t * self.eff)  # type: ignore[arg-type]
                sums.append(sums[-1] + v)
            self._layer_sums[key] = sums
        return sums

    def _matrix_sums(self, kind: str, samples: float) -> list[float]:
        """:meth:`_sums` of the part that runs on the matrix engines at the held rate (the shards' ``matrix_share``; 0
        for layers without one); asked for with a power limit only."""
        t = self.t
        key = ("matrix " + kind, samples, t, self.per_t)
        sums = self._layer_sums.get(key)
        if sums is None:
            sums = [0.0]
            for lay in self.profile.layers:
                st = lay.tensor_times.get(t) if lay.tensor_times else None
                v = lay.shard_time(kind, samples, t) if st is not None and st.matrix_share else None
                sums.append(sums[-1] + (v * st.matrix_share_at(samples) if v is not None else 0.0))
            self._layer_sums[key] = sums
        return sums

    def model_compute(self, kind: str, samples: float) -> float:
        """:meth:`_compute` of ``kind`` at ``samples`` over every layer of the model once -- what the stages of any
        partition hold between them, less what an F or B adds to its layers' compute (collectives, overheads) --
        at the held clock (:meth:`planner.bounds.TimeBounds.work_bound`)."""
        return self._layers_compute(0, len(self.profile.layers), kind, samples)

    def _compute_parts(self, stage: int, kind: str, samples: float) -> tuple[float, float]:
        """(the stage's layers' compute at the busy-throughout rate, its matrix part), calibrated."""
        i, j = self.stages[stage].layers
        return self._layers_parts(i, j, kind, samples)

    def _layers_parts(self, i: int, j: int, kind: str, samples: float) -> tuple[float, float]:
        """(the compute of layers ``[i, j)`` at the busy-throughout rate, its matrix part), calibrated."""
        scale = self.cal.compute_scale
        sums = self._sums(kind, samples)
        if self.power is None:
            return (sums[j] - sums[i]) * scale, 0.0
        matrix = self._matrix_sums(kind, samples)
        return (sums[j] - sums[i]) * scale, (matrix[j] - matrix[i]) * scale

    def _compute(self, stage: int, kind: str, samples: float) -> float:
        """The stage's layers' compute at the held clock (:meth:`_layers_compute`)."""
        i, j = self.stages[stage].layers
        return self._layers_compute(i, j, kind, samples)

    def _layers_compute(self, i: int, j: int, kind: str, samples: float) -> float:
        """The compute of layers ``[i, j)`` at the held clock: :meth:`_layers_parts` less ``relief`` of its matrix
        part."""
        total, matrix = self._layers_parts(i, j, kind, samples)
        return total - self.relief * matrix

    def fwd(self, stage: int, span: int = 1) -> float:
        v = self._plain_fwd(stage, span) + self.ep_in("F", stage, span)
        if self.fsdp_per_microbatch:
            v += self.fsdp_extra("F", stage, span)
        if self.blocking_p2p:
            return v + self._held("F", stage, span)
        return v

    def bwd(self, stage: int) -> float:
        v = self._plain_bwd(stage) + self.ep_in("B", stage)
        if self.fsdp_per_microbatch:
            v += self.fsdp_extra("B", stage)
        if self.blocking_p2p:
            return v + self._held("B", stage, 1)
        return v

    def _plain_fwd(self, stage: int, span: int) -> float:
        """An F's compute and tensor-parallel collectives, shared by the configurations of these stages (what
        this configuration's placement or data-parallel width adds is not in it)."""
        key = (stage, span)
        v = self._fwd.get(key)
        if v is None:
            samples = self.base_b * span
            compute, matrix = self._compute_parts(stage, "fwd", samples)
            v = self._fwd[key] = (compute + self._tp_comm(stage, samples)
                                  + self._tp_edges(stage, samples, backward=False), matrix)
        return v[0] - self.relief * v[1]

    def _plain_bwd(self, stage: int) -> float:
        """A B's compute and tensor-parallel collectives, shared as :meth:`_plain_fwd`."""
        v = self._bwd.get(stage)
        if v is None:
            compute, matrix = self._compute_parts(stage, "recompute" if self.config.recompute else "bwd", self.base_b)
            v = self._bwd[stage] = (compute + self._tp_comm(stage, self.base_b) * (2 if self.config.recompute else 1)
                                    + self._tp_edges(stage, self.base_b, backward=True)
                                    + self._sp_regather(stage, self.base_b), matrix)
        return v[0] - self.relief * v[1]

    def fsdp_extra(self, kind: str, stage: int, span: int = 1) -> float:
        """Of an F, B or I action, the seconds its sharded weights' collectives add to its compute (what the
        layers' compute does not hide: :func:`planner.fsdp.forward_time`, :func:`planner.fsdp.backward_time`);
        0 unless every micro-batch gathers them (:attr:`fsdp_per_microbatch`)."""
        if not self.fsdp_per_microbatch or kind not in ("F", "B", "I"):
            return 0.0
        gathers, scatters = self.fsdp_layers(stage)
        copies = self.fsdp_copies(stage)
        if kind == "F":
            plain = self._plain_fwd(stage, span)
            return fsdp.forward_time(plain, gathers, self.fsdp_overlap, copies, self.comm_share) - plain
        plain = self._plain_bwd(stage)
        return fsdp.backward_time(plain, gathers, scatters, self.fsdp_overlap, copies, self.comm_share) - plain

    def _fsdp_collective(self, ranks: list[int], nbytes: float, op: str) -> float:
        """One all-gather or reduce-scatter of a layer among ``ranks``: NCCL's ring
        (:func:`sharded_collective_time`), or on a cluster with a measured all-reduce of that many ranks on a
        node (:class:`planner.cluster.AllReduceFit`: gloo on a shared CPU, as :func:`allreduce_time` uses it) the
        fit's latency and half its bandwidth term (an all-reduce is a reduce-scatter and an all-gather of the same
        bytes)."""
        fit = self.cluster.allreduce_fit
        if fit is not None and 1 < len(ranks) <= fit.ranks and len(ranks_per_node(self.cluster, ranks)) == 1:
            return fit.link.alpha + fit.link.beta * nbytes / 2
        return sharded_collective_time(self.cluster, ranks, nbytes, op)

    def fsdp_link(self, kind: str, stage: int) -> float:
        """Of an F, B or I action, the seconds its sharded weights' collectives take on the link, hidden or not
        (an F gathers every layer; a B every layer but the last and reduce-scatters every gradient); 0 unless
        every micro-batch gathers them."""
        if not self.fsdp_per_microbatch or kind not in ("F", "B", "I"):
            return 0.0
        gathers, scatters = self.fsdp_layers(stage)
        return sum(gathers) if kind == "F" else sum(gathers[:-1]) + sum(scatters)

    def fsdp_copies(self, stage: int) -> list[float]:
        """Per layer of ``stage``, the compute-stream seconds of FSDP2's copy-out of its gathered weights
        (:data:`planner.fsdp.COPY_OUT_BYTES` x ``el`` per parameter over t, at the cluster's memory bandwidth,
        with the calibration's compute scale)."""
        scale = fsdp.COPY_OUT_BYTES * self.el / self.t / self.cluster.memory_bandwidth * self.cal.compute_scale
        return [p * scale for p in own_layer_params(self.profile, self.stages[stage])]

    def fsdp_layers(self, stage: int) -> tuple[list[float], list[float]]:
        """Per layer of ``stage``, in order, the all-gather of its weights (``el`` bytes per parameter over t)
        and the reduce-scatter of its gradients (:data:`planner.fsdp.REDUCE_BYTES` per parameter over t) among
        the stage's W data-parallel replicas (:meth:`_fsdp_collective`), with the calibration's link scale, the
        reduce-scatter after its copy-in on the same stream (:func:`planner.fsdp.copy_in_bytes` per parameter over
        t at the cluster's memory bandwidth); once per configuration."""
        got = self._fsdp_layers.get(stage)
        if got is None:
            ranks = self._dp_ranks(sorted({row[stage] for row in self.schedule.placement}))
            params = own_layer_params(self.profile, self.stages[stage])
            scale = self.cal.link_scale
            copy_in = fsdp.copy_in_bytes(self.el) / self.t / self.cluster.memory_bandwidth
            got = self._fsdp_layers[stage] = (
                [self._fsdp_collective(ranks, p * self.el / self.t, "all_gather") * scale for p in params],
                [self._fsdp_collective(ranks, p * fsdp.REDUCE_BYTES / self.t, "reduce_scatter") * scale
                 + p * copy_in for p in params])
        return got

    def _held(self, kind: str, stage: int, span: int) -> float:
        """:meth:`_blocking_send` of an F (to the next stage) or a B (to the previous one), once per
        configuration (``_held_send``)."""
        key = (kind, stage, span)
        v = self._held_send.get(key)
        if v is None:
            v = self._held_send[key] = self._blocking_send(stage, stage + 1 if kind == "F" else stage - 1, span)
        return v

    def recompute_extra(self, stage: int) -> float:
        if not self.config.recompute:
            return 0.0
        plain = (self._compute(stage, "bwd", self.base_b)
                 + self._tp_comm(stage, self.base_b) + self._tp_edges(stage, self.base_b, backward=True)
                 + self._sp_regather(stage, self.base_b) + self.ep_comm(stage, self.base_b))  # (+ its counts: extra)
        return max(self.bwd(stage) - plain, 0.0)

    # ---- Costs interface -------------------------------------------------------------------------
    def compute(self, kind: str, stage: int, span: int, device: int) -> float:
        if self._share == 1.0:  # devices of their own (no shared host): as before
            return self.work(kind, stage, span) + self.overheads.of(self, kind, stage, device)
        work, over = self.work(kind, stage, span), self.overheads.of(self, kind, stage, device)
        core = self.core_stretch
        return (work if self.emulated else work * core) + over * core

    @property
    def core_stretch(self) -> float:
        """Wall seconds per second of core time alone on a shared CPU host: the core share times the CPU
        time it costs more to take turns on the cores (:func:`host_inflation`); 1 for devices of their own."""
        share = self.share
        return 1.0 if share == 1.0 else share * host_inflation(self.cluster.host, share)

    @contextmanager
    def unit_share(self) -> Iterator[None]:
        """Inside, a shared host's core share is 1 (durations are the work and the executor's overhead): what
        a bound may use whatever share the candidate is finally timed with (every share is at least 1)."""
        saved, self._share = self._share, 1.0
        try:
            yield
        finally:
            self._share = saved

    @contextmanager
    def fastest_clock(self) -> Iterator[None]:
        """Inside, a power-limited GPU holds its burst rate (``relief`` ``1 - sustained_rate``: every matrix part
        as short as any held clock makes it, :mod:`planner.power`): what a bound may use whatever clock the
        candidate is finally timed at (:meth:`hold_clock`; the communication, which no clock shortens, is as it
        is). Without a power limit, nothing changes."""
        saved = self.relief
        if self.power is not None:
            self.relief = 1.0 - self.power[1]
        try:
            yield
        finally:
            self.relief = saved

    def use_schedule(self, schedule: Schedule) -> None:
        """Time ``schedule`` from now on (the full lists of a merged schedule, built once the candidate is
        reached): what was derived from the lists before -- a shared host's slowdown, found by simulating
        them (:func:`host_share`) -- is found again from these."""
        if schedule is not self.schedule and self.cluster.host is not None:
            self._share = None
        self.schedule = schedule

    @property
    def share(self) -> float:
        """Slowdown of core time on a shared CPU host (1 for devices of their own; :func:`host_share`)."""
        if self._share is None:
            self._share = host_share(self)
        return self._share

    def split_backward(self, stage: int) -> bool:
        """Whether the executor splits ``stage``'s backward into I and W as zero-bubble means it
        (:func:`planner.profile.stage_splits_backward`)."""
        i, j = self.stages[stage].layers
        return stage_splits_backward((lay.kind for lay in self.profile.layers[i:j]), self.config.recompute)

    def work(self, kind: str, stage: int, span: int) -> float:
        """:meth:`compute` without the executor's per-action overhead (what emulated compute sleeps)."""
        if kind == "F":
            return self.fwd(stage, span)
        if kind == "B":
            return self.bwd(stage)
        if kind == "W" and not self.split_backward(stage):
            # a stage with checkpointed layers is not split by the executor (executor.split_backward: each
            # backward call recomputes the layers): its W is one whole backward for the weights, which walks the
            # layers again -- recomputed forward, input gradients and weight gradients (I + W = 1.64 B measured)
            return self._plain_bwd(stage)
        if self.per_t:  # the profile's own split: W is the weight-gradient GEMMs, I the rest
            w = self._compute(stage, "bwd_weight", self.base_b)
            return w if kind == "W" else self.bwd(stage) - w
        extra = self.recompute_extra(stage)
        own = self.ep_comm(stage, self.base_b)  # the backward's all-to-alls carry input gradients: I's
        half = (self.bwd(stage) - extra - own) / 2
        return half + extra + own if kind == "I" else half

    def p2p(self, kind: str, stage: int, span: int, src: int, dst: int) -> float:
        """Seconds from the end of the sending action to the message's arrival; once per (kind, stage, span, src,
        dst) of these costs (:attr:`_p2p`: every replay of the search's fixed point and bounds asks again)."""
        key = (kind, stage, span, src, dst)
        v = self._p2p.get(key)
        if v is None:
            if self.blocking_p2p:
                # the sending action returned only once the transfer (and the scatter/gather all-gather) was
                # done (:meth:`_blocking_send`): the message is there when it ends, not one transfer later
                v = 0.0
            else:
                boundary = stage if kind == SEND_F else stage - 1
                v = self.send_time(src, dst, self.p2p_bytes(boundary, span)) * self.cal.link_scale
            self._p2p[key] = v
        return v

    def p2p_bytes(self, boundary: int, span: int) -> float:
        """Bytes each tensor-parallel rank sends across the boundary after stage ``boundary`` for ``span``
        micro-batches (module docstring, "Pipeline p2p"): the whole tensor, or ``1/t`` of it under sequence
        parallelism or scatter/gather (``p2p_share``). What the emulated executor moves too."""
        return self.stages[boundary].out_bytes * self.base_b * span / self.p2p_share

    def holders(self, stage: int) -> tuple[int, ...]:
        """The pipeline devices holding a copy of ``stage`` (every replica's), sorted: who all-reduce its
        gradients. Read once per stage and placement (:attr:`_holders`)."""
        placement = self.schedule.placement
        seen, got = self._holders
        if seen is not placement:
            got = {}
            self._holders = (placement, got)
        holders = got.get(stage)
        if holders is None:
            holders = tuple(sorted({row[stage] for row in placement}))
            holders = got[stage] = self._holder_tuples.setdefault(holders, holders)
        return holders

    def allreduce(self, stage: int, replica: int, device: int) -> float:
        holders = self.holders(stage)
        info = self.stages[stage]
        if self.fsdp:
            return self._fsdp_sync(stage)
        if (self.expert > 1 or self.etp < self.t) and info.expert_params:
            # the dense weights over all their copies, then the experts' over the ranks holding them (W/e replicas,
            # or with whole experts t W / e ranks: their tensor peers hold the same experts)
            return self._reduce(holders, (info.param_bytes - info.expert_param_bytes) / self.t, stage) \
                + self._expert_reduce(holders, info.expert_param_bytes / self.t, stage)
        return self._reduce(holders, info.param_bytes / self.t, stage)

    def _expert_reduce(self, holders: tuple[int, ...], nbytes: float, stage: int) -> float:
        """The experts' gradient reduction of ``stage`` (``nbytes`` per rank) among the ranks holding the same
        experts (:func:`planner.expert_parallel.expert_data_slots`; the replicas of :func:`expert_data_ranks` where
        the experts are split over t): an all-reduce, or with a sharded optimizer its
        reduce-scatter and all-gather; in the slowest EP rank's group, with the link scale."""
        key = ("experts", holders, nbytes)
        got = self._ep_times.get(key)
        if got is None:
            e, etp, slots = self.expert, self.etp, self.t * self.config.data
            worst = 0.0
            for i in range(min(e, self.cluster.gpus_per_node)):  # EP rank i's, expert tensor rank 0's
                ranks = [self.slot_rank(d, j) for j in expert_data_slots(i * etp, e, etp, slots) for d in holders]
                worst = max(worst, self._sharded_sync(stage, ranks, nbytes) if self.request.shard_optimizer
                            else allreduce_time(self.cluster, ranks, nbytes) * self.cal.link_scale)
            got = self._ep_times[key] = worst
        return got

    def _reduce(self, holders: tuple[int, ...], nbytes: float, stage: int) -> float:
        """The gradient reduction of ``nbytes`` per rank of ``stage`` among all its data-parallel copies (module
        docstring, "Gradient all-reduce")."""
        if self.request.shard_optimizer:
            return self._sharded_sync(stage, self._dp_ranks(holders), nbytes)
        whole = self._dp_allreduce(holders, nbytes) * self.cal.link_scale
        if self.overlapped_dp and self.schedule.stages == 1:
            # PyTorch DDP: buckets all-reduced while the synchronising backward runs; what is left after it
            # is the all-reduce beyond that backward, at least the last bucket (module docstring)
            bucket = self._dp_allreduce(holders, min(nbytes, DDP_BUCKET_BYTES)) * self.cal.link_scale
            return self._left_after(self.bwd(stage), whole, bucket)
        return whole

    def _dp_ranks(self, holders: Sequence[int]) -> list[int]:
        """The global GPUs (tensor rank 0) of pipeline devices ``holders`` (those holding a stage) in every
        data-parallel replica."""
        return [self.rank(d, w) for w in range(self.config.data) for d in holders]

    def _dp_allreduce(self, holders: tuple[int, ...], nbytes: float) -> float:
        """:func:`allreduce_time` among :meth:`_dp_ranks`, before the link scale; shared like the F/B durations
        (of t and the cluster), by (holders, W, D, rank order, bytes): at W in the thousands, the ranks' list and their
        count per node cost more than the rest of the cost model's calls."""
        key = (holders, self.config.data, self.config.pipeline, self.config.order, nbytes)
        got = self._allreduces.get(key)
        if got is None:
            got = self._allreduces[key] = allreduce_time(self.cluster, self._dp_ranks(holders), nbytes)
        return got

    def _left_after(self, compute: float, comm: float, last: float) -> float:
        """Of a collective of ``comm`` seconds run in buckets beside ``compute`` (its last bucket, ``last``
        seconds, after it), what is left once the compute ends: the buckets beside the compute hold
        :attr:`comm_share` of it while they run (:func:`planner.contention.overlapped`), then the last bucket;
        without a share, what exceeds the compute, at least the last bucket."""
        return overlapped(compute, comm - last, self.comm_share) - compute + last

    def _sharded_sync(self, stage: int, ranks: list[int], nbytes: float) -> float:
        """A sharded optimizer's gradient reduce-scatter and, after its step, the all-gather of the updated
        weights (:func:`sharded_collective_time`). With ``dp_allreduce = overlapped`` on a one-stage pipeline
        the reduce-scatter runs in buckets under the synchronising backward and the all-gather under the next
        iteration's first forward (Megatron-Core's ``--overlap-grad-reduce --overlap-param-gather``): of each
        what exceeds that compute, at least one bucket (:func:`megatron_core_bucket_bytes`: it grows with the
        replicas), is left."""
        rs = sharded_collective_time(self.cluster, ranks, nbytes, "reduce_scatter")
        ag = sharded_collective_time(self.cluster, ranks, nbytes, "all_gather")
        if self.overlapped_dp and self.schedule.stages == 1:
            bucket = min(nbytes, megatron_core_bucket_bytes(len(ranks), self.el))
            rs = self._left_after(self.bwd(stage), rs,
                                  sharded_collective_time(self.cluster, ranks, bucket, "reduce_scatter"))
            ag = self._left_after(self.fwd(stage), ag,
                                  sharded_collective_time(self.cluster, ranks, bucket, "all_gather"))
        return (rs + ag) * self.cal.link_scale

    def _fsdp_sync(self, stage: int) -> float:
        """Sharded weights (:mod:`planner.fsdp`): nothing when every micro-batch gathers and reduce-scatters its
        own (in its F and B); pipelined, the stage's gradients reduce-scattered layer by layer after its last
        backward and what its weights' all-gather leaves after the first forward
        (:func:`planner.fsdp.gather_exposed`), with the gathered weights' copy-out (:meth:`fsdp_copies`, charged
        here with the exposed gather)."""
        if self.fsdp_per_microbatch:
            return 0.0
        gathers, scatters = self.fsdp_layers(stage)
        return (sum(scatters) + fsdp.gather_exposed(self.fwd(stage), gathers, self.comm_share)
                + sum(self.fsdp_copies(stage)))

    def step_per_stage(self) -> list[float]:
        """:meth:`step` of one replica of each stage."""
        return self._step_of

    def step(self, device: int) -> float:
        """Optimizer step of ``device``'s stages: read and write its model state once (memory bound), plus
        the executor's overhead of the device's ALLREDUCE and STEP actions, plus the tied-embedding
        all-reduce's bytes (:meth:`tied_allreduce`; not with compute emulated, whose STEP runs none)."""
        tied = 0.0 if self.emulated else self.tied_allreduce(device)
        if self._share == 1.0:
            return self.step_work(device) + self.overheads.of(self, "STEP", -1, device) + tied
        work, over = self.step_work(device), self.overheads.of(self, "STEP", -1, device)
        core = self.core_stretch
        return (work if self.emulated else work * core) + over * core + tied

    def tied_allreduce(self, device: int) -> float:
        """Seconds of the tied-embedding all-reduce in ``device``'s STEP: the gradients of the word embedding
        (first stage) and of the LM head's copy of it (last stage) are summed over the devices holding either
        end and the data-parallel copies before the optimizer steps (Megatron-LM's embedding group; our
        executor's ``groups.tied``, :meth:`executor.interpreter.RankRuntime._step`): ``tied_params`` elements
        of ``el`` bytes over ``t``, timed by :func:`allreduce_time` among those ranks. A cluster with a measured
        executor overhead already has, in its ``step`` figure, one such all-reduce of the nearly-nothing
        model's tied embedding (:data:`OVERHEAD_TIED_BYTES`: its latency), so that time is subtracted there.
        Issue 11 (cpufid3): on the 2-core machine gpt-small's 512 KiB tied all-reduce between the two stages
        took 2.5-3.5 ms of the last stage's STEP, which the model did not cost. 0 for a device holding
        neither end, one stage, or no tied parameters; and 0 on clusters without a measured executor
        overhead (GPU clusters: Megatron-LM's own embedding all-reduce is not costed yet, and
        :mod:`planner.bounds`' per-device step would have to carry it to stay tight)."""
        v = self._tied.get(device)
        if v is None:
            v = self._tied[device] = self._tied_allreduce(device)
        return v

    def _tied_allreduce(self, device: int) -> float:
        S = self.schedule.stages
        ends = {0, S - 1}
        if self.cluster.executor is None or S <= 1 or device >= len(self.held):
            return 0.0
        if not any(s in ends for _, s in self.held[device]):
            return 0.0
        tied = max(self.stages[0].tied_params, self.stages[S - 1].tied_params)
        if tied <= 0:
            return 0.0
        ranks = self._dp_ranks(sorted({row[0] for row in self.schedule.placement}
                                      | {row[S - 1] for row in self.schedule.placement}))
        if len(ranks) <= 1:
            return 0.0
        v = allreduce_time(self.cluster, ranks, tied * self.el / self.t)
        if self.cluster.executor.step > 0:  # (executor is not None: checked above)
            v -= allreduce_time(self.cluster, ranks, OVERHEAD_TIED_BYTES)
        return max(v, 0.0) * self.cal.link_scale

    def step_work(self, device: int) -> float:
        """:meth:`step` without the executor's per-action overhead."""
        per_stage = self._step_of
        return sum(per_stage[s] for _, s in self.held[device])

    def activation(self, stage: int) -> float:
        """Bytes stage ``stage`` keeps per micro-batch in flight: its stash, or under full recomputation
        what its layers keep (:func:`recompute_kept_bytes`); per stage, from the shared :func:`stage_infos`."""
        info = self.stages[stage]
        per_sample = info.recompute_kept_bytes if self.config.recompute else info.stash_bytes
        return per_sample * self.base_b

    def held_grads(self, stage: int) -> float:
        """Bytes a split backward's I adds per micro-batch and its W frees with the activations: the output
        gradients of the stage's weight GEMMs, which W needs (``dW = dY^T X``; zero-bubble, Qi et al. 2024,
        section 2). 0 where the backward is not split (other schedules; a stage the executor does not split,
        :meth:`split_backward`) or the profile does not know them."""
        if not splits_backward(self.config.schedule) or not self.split_backward(stage):
            return 0.0
        return self.stages[stage].held_grad_bytes * self.base_b


def chimera_eq1(f_t: float, b_t: float, comm_p2p: float, c_f: int, c_b: int, unoverlapped: float) -> float:
    """Chimera eq. (1): ``T = (F_t + Comm_p2p) C_f + (B_t + Comm_p2p) C_b + max_i Comm_unoverlapped(i)``."""
    return (f_t + comm_p2p) * c_f + (b_t + comm_p2p) * c_b + unoverlapped


def megatron_closed_form(schedule: str, D: int, N: int, f_t: float, b_t: float, chunks: int = 1) -> float | None:
    """Megatron-LM 2.2: GPipe/1F1B take ``(N + D - 1)(t_f + t_b)``; interleaved with ``v`` chunks
    ``(N + (D-1)/v)(t_f + t_b)`` (``t_f``, ``t_b`` of a whole device's share). None for other schedules."""
    if schedule in ("gpipe", "1f1b", "zb-h1"):
        return (N + D - 1) * (f_t + b_t)
    if schedule == "interleaved":
        return (N + (D - 1) / chunks) * (f_t + b_t)
    return None


# ---- calibration and executor-overhead hook (issue 11 items 4, 5; fitted by planner.calibrate) ---------------

IDENTITY = Calibration()


def calibration(cluster: Cluster) -> Calibration:
    """The cluster's fitted factors, or the identity."""
    return cluster.calibration or IDENTITY


class ActionOverheads:
    """Executor overhead per action, folded into the actions the simulator times.

    The lowered list (:func:`planner.schedules.ir.lower`) puts a ``RECV`` before a compute action whose
    input comes from another device and a ``SEND`` after one whose output goes to another device; each
    device's list ends with one ``ALLREDUCE`` per stage replica it holds and one ``STEP``. The overhead of
    those actions (:class:`planner.cluster.ExecutorOverhead`, per kind, plus the calibration's
    ``action_overhead`` for every action) is added to the compute action they surround and to STEP
    (without ``step`` itself when compute is emulated: an emulated STEP runs no optimizer and no
    tied-embedding all-reduce, which that figure measures). With compute emulated, the overhead measured
    on emulated runs where the cluster has it (:attr:`planner.cluster.ExecutorOverhead.emulated`: a sleep's
    overshoot and the walker's bookkeeping, not the stage module and autograd the real figure holds).
    An ``I`` or ``W`` of a stage the executor splits also pays the split backward's own cost per layer of the
    stage (``split_input`` / ``split_weight``). Zero when the cluster has neither, so nothing changes for
    clusters without them.
    """

    def __init__(self, cluster: Cluster, emulated: bool = False) -> None:
        self.ex = cluster.executor or ExecutorOverhead()
        if emulated and self.ex.emulated is not None:  # what an emulated action costs (measured so)
            self.ex = self.ex.emulated
        self.extra = calibration(cluster).action_overhead
        self.zero = self.extra == 0 and not any(
            (self.ex.compute, self.ex.send, self.ex.recv, self.ex.allreduce, self.ex.step, self.ex.split_input,
             self.ex.split_weight))
        self._cache: dict[tuple[str, int, int], float] = {}

    def of(self, costs: ConfigCosts, kind: str, stage: int, device: int) -> float:
        """Seconds of overhead charged to the ``kind`` action of ``stage`` on ``device`` (``STEP``: the
        device's all-reduces and step) of ``costs`` (those that own these overheads: the figures are cached)."""
        if self.zero:
            return 0.0
        key = (kind, stage, device)
        v = self._cache.get(key)
        if v is None:
            v = self._cache[key] = self._of(costs, kind, stage, device)
        return v

    def _of(self, costs: ConfigCosts, kind: str, stage: int, device: int) -> float:
        ex, extra = self.ex, self.extra
        held = costs.held[device] if device < len(costs.held) else []
        if kind == "STEP":
            # ``step`` is measured on real runs: the optimizer's fixed cost and the tied-embedding all-reduce
            # (profiler.overhead); an emulated STEP runs neither (it waits its handles and sleeps the
            # optimizer's predicted time, executor.interpreter), so it is not charged there
            step = 0.0 if costs.emulated else ex.step
            return step + extra + len(held) * (ex.allreduce + extra)
        place = costs.schedule.placement
        S = costs.schedule.stages
        rows = [row for row in place if row[stage] == device] or place[:1]
        row = rows[0]
        device = row[stage]  # asked for a device that does not hold the stage (a bound): its holder's
        before = after = False  # a message received before / sent after this action
        if kind == "F":
            before = stage > 0 and row[stage - 1] != device
            after = stage < S - 1 and row[stage + 1] != device
        elif kind in ("B", "I"):
            before = stage < S - 1 and row[stage + 1] != device
            after = stage > 0 and row[stage - 1] != device
        out = ex.compute + extra
        if kind in ("I", "W") and costs.split_backward(stage):
            # the split backward's own cost, per layer of the stage (executor.split_backward; a stage with
            # checkpointed layers is not split: ConfigCosts.work)
            i, j = costs.stages[stage].layers
            out += (ex.split_input if kind == "I" else ex.split_weight) * (j - i)
        if before:
            out += ex.recv + extra
        if after:
            out += ex.send + extra
        return out


# ---- a shared CPU host (issue 11 item 4, issue 13): processes sharing the cores -----------------------------


def _cpu_fraction(costs: ConfigCosts, kind: str, stage: int, span: int, device: int) -> float:
    """Part of a compute action (or STEP, ``stage`` -1) that takes core time: all of it when the work
    runs, only the executor's overhead when compute is emulated (a sleeping process holds no core)."""
    if not costs.emulated:
        return 1.0
    over = costs.overheads.of(costs, kind, stage, device)
    work = costs.step_work(device) if kind == "STEP" else costs.work(kind, stage, span)
    return over / (work + over) if work + over > 0 else 0.0


def experienced_concurrency(costs: ConfigCosts, timeline: list | SimResult, copies: float) -> float:
    """Processes with work at once, as the core time sees it: ``∫ k_cpu(t) k(t) dt / ∫ k_cpu(t) dt``, where
    ``k_cpu`` counts the node's processes computing at ``t`` (each simulated device stands for ``copies``
    processes in step with it: its data-parallel copies and tensor ranks on the node) and ``k`` adds the
    messages and collectives being copied at ``t`` when communication does not overlap compute (gloo moves
    them with memory copies on the same cores, :class:`planner.cluster.HostCpu`). 0 without compute.

    ``timeline``: a simulation's timeline, or the simulation (:meth:`SimResult.host_spans` reads what this
    needs without building the timeline). The integral is taken over the events (the start and end of each
    action, in the timeline's order, device by device, sorted stably by time) with running sums in that
    order: numpy's ``cumsum`` adds in sequence, so the floats are those of the event-by-event loop."""
    from planner.schedules.timing import SPAN_KIND, timeline_spans

    host = costs.cluster.host
    comm_counts = host is not None and not host.comm_overlaps_compute
    spans = timeline.host_spans() if isinstance(timeline, SimResult) else timeline_spans(timeline)
    times: list[np.ndarray] = []  # per device, its events: the start then the end of each action kept
    d_cpu: list[np.ndarray] = []  # change of k_cpu
    d_k: list[np.ndarray] = []  # change of k
    for d, (code, stage, span, start, end) in enumerate(spans):
        keep = ~(end <= start)  # (as the loop's ``end <= start: skip``, NaN included)
        if not comm_counts:  # the copies (code 5) count only when they hold the cores
            keep &= code <= 4
        sel = np.nonzero(keep)[0]
        if not sel.size:
            continue
        c = code[sel]
        comp = c <= 4
        frac = np.zeros(sel.size)
        if comp.any():
            if costs.emulated:  # per (kind, stage, span): the part of it that takes core time
                keys = np.stack((c, stage[sel], span[sel]), axis=1)[comp]
                uniq, inv = np.unique(keys, axis=0, return_inverse=True)
                u_frac = np.array([_cpu_fraction(costs, SPAN_KIND[k], s if k != 4 else -1, sp, d) * copies
                                   for k, s, sp in uniq.tolist()])
                frac[comp] = u_frac[inv.reshape(-1)]
            else:  # all of it (_cpu_fraction's 1.0 * copies)
                frac[comp] = copies
        up_k = np.where(comp, frac, copies)
        times.append(np.stack((start[sel], end[sel]), axis=1).reshape(-1))
        d_cpu.append(np.stack((frac, np.where(comp, -frac, 0.0)), axis=1).reshape(-1))
        d_k.append(np.stack((up_k, -up_k), axis=1).reshape(-1))
    if not times:
        return 0.0
    at = np.concatenate(times)
    dc = np.concatenate(d_cpu)
    dk = np.concatenate(d_k)
    if not np.isfinite(at).all():  # (sorting NaNs as Python does is not numpy's): the loop itself
        events = sorted(zip(at.tolist(), dc.tolist(), dk.tolist(), strict=True), key=lambda e: e[0])
        num = den = k_cpu = k = 0.0
        last = events[0][0]
        for t, c_, k_ in events:
            dt = t - last
            num += k_cpu * k * dt
            den += k_cpu * dt
            k_cpu, k, last = k_cpu + c_, k + k_, t
        return num / den if den > 0 else 0.0
    order = np.argsort(at, kind="stable")
    at, dc, dk = at[order], dc[order], dk[order]
    # before event i: k_cpu and k summed over the events before it, from 0 (np.cumsum adds in sequence), and
    # dt its time less the previous event's (0 for the first)
    k_cpu = np.cumsum(np.concatenate(([0.0], dc)))[:-1]
    k = np.cumsum(np.concatenate(([0.0], dk)))[:-1]
    dt = at - np.concatenate((at[:1], at[:-1]))
    num = float(np.cumsum(np.concatenate(([0.0], k_cpu * k * dt)))[-1])
    den = float(np.cumsum(np.concatenate(([0.0], k_cpu * dt)))[-1])
    return num / den if den > 0 else 0.0


def host_inflation(host: HostCpu | None, share: float) -> float:
    """Core time per core second of the same work alone when processes take turns on the cores at core share
    ``share`` (:attr:`planner.cluster.HostCpu.cpu_inflation`, measured at the host's ``slowdown``): each turn
    starts by refilling the caches the other processes evicted (Mogul and Borg, ASPLOS 1991), so the extra is
    taken in proportion to how far the sharing goes, ``1 + (I - 1) min(1, (s - 1) / (S - 1))`` with ``I``
    the measured inflation, ``S`` the measured slowdown and ``s`` this schedule's share; 1 without sharing."""
    if host is None or share <= 1.0 or host.cpu_inflation <= 1.0:
        return 1.0
    part = 1.0 if host.slowdown <= 1.0 else min(1.0, (share - 1.0) / (host.slowdown - 1.0))
    return 1.0 + (host.cpu_inflation - 1.0) * part


def host_share(costs: ConfigCosts, iterations: int = 12, tolerance: float = 1e-3) -> float:
    """Slowdown of core time when the node's processes share ``cluster.host.effective_cores`` cores: the
    fixed point of ``s = max(1, k(s) / C)`` with ``k(s)`` the concurrency core time experiences in the
    schedule simulated with core time stretched by ``s`` (:func:`experienced_concurrency`; processor
    sharing, Kleinrock 1967: ``k`` runnable processes on ``C < k`` cores each progress at ``C / k``). The
    processes of the node are the job's ``D W t`` (or ``gpus_per_node``, if fewer); every simulated device
    stands for the ``W t`` copies of it. Secant iteration on ``s - k(s) / C`` from ``s = 1`` and one plain step:
    ``k`` changes little with ``s`` (a stretch of core time moves the actions, not how many overlap: 1-5% over
    the whole range, measured on gpt-tiny plans of local-cpu-4), so it converges in 3 simulations where the
    half steps it replaced took 8-10 (68% of a local-cpu-4 plan's time, cProfile); a step outside
    ``[1, max(s, k/C) * 2]`` falls back to a half step."""
    from planner.schedules.encoded import EncodedSchedule
    from planner.schedules.ir import builder_eager
    from planner.simulate import simulate

    host = costs.cluster.host
    if host is None:
        return 1.0
    c = costs.config
    procs = c.pipeline * c.data * c.tensor
    per_node = min(procs, costs.cluster.gpus_per_node)
    if per_node <= host.effective_cores:
        return 1.0
    copies = per_node / c.pipeline
    # the schedule's plan, encoded once for the iterations (simulate would encode it on each; its lowered
    # layout, EncodedSchedule.host_layout, is kept with it): only the times change with the share
    sched = costs.schedule
    plan = None if sched.lowered else EncodedSchedule.encode(sched, builder_eager(sched))
    s, before = 1.0, None  # before: the previous (s, g) of g(s) = f(s) - s
    for _ in range(iterations):
        costs._share = s
        k = experienced_concurrency(costs, simulate(sched, costs, compiled=plan), copies)
        new = max(1.0, k / host.effective_cores)
        g = new - s
        if abs(g) <= tolerance * s:
            s = new
            break
        step = new  # a plain fixed-point step, then secant steps
        if before is not None and g != before[1]:
            step = s - g * (s - before[0]) / (g - before[1])
        if not 1.0 <= step <= 2.0 * max(s, new):  # (NaN too) a secant thrown off: half a step instead
            step = 0.5 * (s + new)
        before, s = (s, g), step
    costs._share = s
    return s
