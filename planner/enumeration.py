"""Every configuration the search considers for a GPU budget (the search's module docstring says which):
``t`` dividing the GPUs per node (up to ``max_tensor``), ``D`` and ``W`` with ``t D W = P``, micro-batch
sizes ``b`` (powers of two dividing ``B^/W``), every allowed schedule with each parameter set valid for
``D`` and ``N = B^/(W b)``, with and without recomputation; for a mixture of experts every expert-parallel size
``e`` dividing both its experts and ``W`` (up to ``max_expert``; :mod:`planner.expert_parallel`); both rank orders
where they place some group on other nodes (:func:`planner.placement.orders_differ`), else the default one, unless
the request names one (``rank_order``); at t > 1 the experts also whole on each rank (``expert_tensor`` 1) with ``e``
dividing ``t W``. Enumeration only: nothing is evaluated."""

from __future__ import annotations

from collections import Counter
from typing import Any

from planner.cluster import Cluster
from planner.expert_parallel import expert_sizes
from planner.model import tensor_split_error
from planner.placement import DEFAULT_ORDER, ORDERS, experts_placeable, orders_differ
from planner.request import Config, TrainingRequest
from planner.schedules import BACKWARD_HALVING, BUILDERS, PROFILE_DRIVEN
from planner.units import devices


def divisors(n: int) -> list[int]:
    """The divisors of ``n`` in ascending order (pairs ``d``, ``n/d`` up to the square root: 16,384 GPUs take
    128 steps, not 16,384)."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def powers_of_two_dividing(n: int) -> list[int]:
    out, b = [], 1
    while n % b == 0:
        out.append(b)
        b *= 2
    return out


def schedule_variants(name: str, D: int, N: int, b: int, layers: int, recompute: bool) -> list[dict[str, Any]]:
    """The parameter sets of schedule ``name`` that are valid for D, N (empty: none): interleaved chunks
    ``v`` with ``N mod D = 0``; Chimera's ``f`` dividing ``D/2`` and, for ``N > D``, its three
    concatenations (Chimera 3.5: direct; forward doubling with recomputation; backward halving without,
    for even b); Hanayo's waves; GEMS on an even D."""
    if name == "interleaved":
        if D < 2 or N % D:
            return []
        return [{"chunks": v} for v in (2, 4, 8) if D * v <= layers]
    if name == "chimera":
        if D % 2:
            return []
        out = []
        for f in divisors(D // 2):
            if N <= D:
                out.append({"pipelines": f, "concat": "direct"})
                continue
            out.append({"pipelines": f, "concat": "direct"})
            if recompute:
                out.append({"pipelines": f, "concat": "forward-doubling"})
            elif b % 2 == 0:
                out.append({"pipelines": f, "concat": BACKWARD_HALVING})
        return out
    if name == "hanayo":
        return [{"waves": w} for w in (1, 2, 4) if 2 * w * D <= layers]
    if name == "gems" and (D < 2 or D % 2):
        # GEMS places its second replica reversed (stage s on device D-1-s) so that every device holds two
        # stages (Chimera section 2); with an odd D the middle device would hold one stage copy for both
        return []
    if name == "pipedream-2bw" and N < D:
        return []
    return [{}]


def enumerate_configs(layers: int, cluster: Cluster, request: TrainingRequest,
                      rejected: Counter[str], heads: int | None = None, tensor_parallel: bool = True,
                      experts: int | None = None, whole_experts: bool = False) -> list[Config]:
    """Every configuration for ``request`` on ``cluster`` of a model of ``layers`` layers (and ``heads``
    attention heads, where known: ``t`` must divide them, :func:`planner.model.tensor_split_error`), in a
    fixed order; what is skipped is counted in ``rejected`` by reason. ``tensor_parallel`` False: t = 1 only
    (a profile whose layers tensor parallelism is not known to split,
    :attr:`planner.profile.ModelProfile.tensor_split_problem`). ``experts``: a mixture of experts' experts per layer
    (None: a dense model, e = 1 only); ``whole_experts``: its experts may also be whole on each rank at t > 1 (expert
    tensor parallelism 1: a profile with sequence parallelism, :mod:`planner.expert_parallel`)."""
    req, cl = request, cluster
    P = req.gpus or cl.gpus
    if P > cl.gpus:
        raise ValueError(f"gpus: budget {P} exceeds the cluster's {devices(cl.device, cl.gpus)}")
    max_t = req.max_tensor or cl.gpus_per_node
    # (PipeDream's replicated stages come from the profile: :meth:`planner.search.Planner.configs` adds them)
    names = [n for n in req.allowed() if n in BUILDERS and n not in PROFILE_DRIVEN]
    # sharded weights leave out the schedules with two copies or versions of a stage (planner.fsdp): counted
    unsharded = [n for n in req.unshardable() if n in BUILDERS and n not in PROFILE_DRIVEN]
    out: list[Config] = []
    for t in divisors(P):
        if t > max_t or (t <= cl.gpus_per_node and cl.gpus_per_node % t):
            continue
        if t > 1 and not tensor_parallel:
            rejected["t > 1: the profile's layers are none tensor parallelism is known to split"] += 1
            continue
        if heads is not None and tensor_split_error(heads, t) is not None:
            rejected[f"t does not divide the model's {heads} attention heads"] += 1
            continue
        for D in divisors(P // t):
            W = P // (t * D)
            if D > layers:
                rejected["more pipeline stages than layers"] += 1
                continue
            if req.global_batch % W:
                rejected["global batch not divisible by W"] += 1
                continue
            sizes = req.micro_batches or powers_of_two_dividing(req.global_batch // W)
            eps = [e for e in expert_sizes(experts, W) if e <= (req.max_expert or e)]
            orders = [req.rank_order] if req.rank_order else \
                list(ORDERS) if orders_differ(t, D, W, cl.gpus_per_node) else [DEFAULT_ORDER]
            if req.shard_parameters and len(eps) > 1:
                rejected["e > 1: expert parallelism is not planned with sharded weights (shard_parameters)"] += \
                    len(eps) - 1
                eps = [1]
            # (e, etp, order): the experts split over t, and where it may, whole on each rank (etp = 1) with e over
            # the stage's t W ranks, in an order Megatron-Core allows (planner.placement.experts_placeable)
            splits = [(e, None, o) for e in eps for o in orders]
            if whole_experts and t > 1 and not req.shard_parameters:
                splits += [(e, 1, o) for e in expert_sizes(experts, t * W) if e <= (req.max_expert or e)
                           for o in orders if experts_placeable(o, D, W, t * W // e)]
            for b in sizes:
                if (req.global_batch // W) % b:
                    rejected["micro-batch does not divide B^/W"] += 1
                    continue
                N = req.global_batch // (W * b)
                for rc in ((False, True) if req.allow_recompute else (False,)):
                    for name in names:
                        variants = schedule_variants(name, D, N, b, layers, rc)
                        if not variants:
                            rejected[f"{name}: not valid for this D and N"] += 1
                        for params in variants:
                            out.extend(Config(tensor=t, pipeline=D, data=W, micro_batch=b, schedule=name,
                                              recompute=rc, expert=e, expert_tensor=etp, order=o, **params)
                                       for e, etp, o in splits)
                    for name in unsharded:
                        n = len(schedule_variants(name, D, N, b, layers, rc))
                        if n:
                            rejected[f"{name}: its weights cannot be sharded (shard_parameters)"] += n
    return out
