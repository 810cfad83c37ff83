"""Expert parallelism: a mixture of experts' experts split over ``e`` data-parallel replicas.

Symbols: ``e`` the expert-parallel size (:attr:`planner.request.Config.expert`), ``E`` experts per layer, ``k``
experts per token, ``T = b s`` tokens of a micro-batch, ``h`` hidden, ``t`` tensor-parallel size, ``W`` data-parallel
width, ``D`` pipeline devices, ``G`` GPUs per node, ``el`` bytes per element.

The method is GShard's (Lepikhin et al. 2021, section 2.2 and 3.2: experts sharded over the devices that otherwise
replicate the model; tokens sent to their experts by an all-to-all and back by another), as Megatron-Core runs it
(``--expert-model-parallel-size``, ``MoEAlltoAllTokenDispatcher``) and pipeplan's executor
(:mod:`executor.expert_parallel`):

* **Layout**: an expert-parallel group is ``e`` consecutive data-parallel replicas at the same pipeline device and
  tensor rank (replica ``w`` is EP rank ``w mod e`` of group ``w // e``: :func:`ep_group`); EP rank ``i`` holds
  experts ``[i E/e, (i+1) E/e)`` of every mixture-of-experts layer, and every other weight (attention, norms, the
  router, embeddings) as without expert parallelism. Where the group's ranks are is the configuration's rank order
  (:mod:`planner.placement`): with the pipeline outermost (``tp-dp-pp``, Megatron-Core's default) ``t`` apart, in
  one node when ``e t <= G``; with the pipeline inside data parallelism (``tp-pp-dp``) ``D t`` apart.
* **Compute**: balanced routing, as :mod:`planner.moe` assumes: each rank runs its ``E/e`` experts on ``e T k / E``
  rows each, the same FLOPs as all ``E`` experts on ``T k / E`` rows, in larger GEMMs (fewer launches one expert at
  a time). The layer's times at ``e`` are :attr:`planner.profile.LayerProfile.expert_times` (the operator model at
  those shapes); where a layer lacks them (a measured profile) its times without expert parallelism, whose FLOPs are
  the same (:func:`expert_view`). The busiest rank's excess under imbalanced routing is not modelled.
* **Communication**, per mixture-of-experts layer and micro-batch: the dispatch and the combine, each an all-to-all
  among the ``e`` ranks in which a rank sends ``T k h el`` bytes (its token copies; ``1/e`` of them stay) and
  receives as many (:func:`alltoall_bytes`), the dispatch after an exchange of the token counts (an all-to-all of
  ``E`` int64 per rank: the split sizes); the same two in the backward (the gradients go back the way they came,
  in the counts' splits); a recomputed layer repeats its forward's three. Under tensor parallelism each tensor rank
  exchanges with the EP peers of its own tensor rank all ``T k`` copies (the tokens are whole on every tensor rank:
  pipeplan's executor), or ``1/t`` of them with sequence parallelism (Megatron-Core dispatches each rank's sequence
  shard).
  The all-to-all's time: :func:`planner.cost.alltoall_time`. Not overlapped with compute (Megatron-Core's
  dispatcher waits for it; pipeplan's executor too).
* **Gradients**: the dense weights are reduced over all their data-parallel copies as without expert parallelism;
  an expert's over the ``W/e`` replicas holding it (the same EP rank of every group: :func:`expert_data_ranks`).
  Its gradient already sums the ``e`` replicas' tokens, which the dispatch's backward brought.
* **Memory**: a device holds ``1/e`` of the experts' weights, gradients and optimizer state; a sharded optimizer
  splits the experts' state over their ``W/e`` replicas (:func:`state_split`).
* Sharded weights (FSDP, the request's ``shard_parameters``) with ``e > 1`` are not planned.

**Expert tensor parallelism** (:attr:`planner.request.Config.expert_tensor`; Megatron-Core's
``--expert-tensor-parallel-size``, 2024 on): above the experts are split over the ``t`` tensor ranks as the dense MLP
(``etp = t``, Megatron-Core's default). With ``etp = 1`` each rank holds its experts whole and expert parallelism
runs over the ``t W`` ranks of a stage: ``e`` divides ``t W`` (Megatron-Core's ``etp x ep x edp = tp x dp``),
sequence parallelism assumed (each rank routes its own ``T/t`` tokens; Megatron-Core runs tensor-parallel experts
only with it). The expert ranks of a stage are numbered by slot ``j = w t + k`` (replica ``w``, tensor rank ``k``)
and split as Megatron-Core's expert rank generator orders them, ``etp`` innermost, then ``ep``, then the expert
data parallelism: ``j = (q e + i) etp + r`` is EP rank ``i`` of EP group ``(q, r)`` (:func:`ep_slots`,
:func:`expert_data_slots`; at ``etp = t`` these are :func:`ep_group` and :func:`expert_data_ranks`). Per layer with
experts: no tensor-parallel collective around the experts (attention's stay), the all-to-alls as above among the
group's ``e`` ranks (which may be tensor peers: in one node), each rank's ``E/e`` experts whole on the ``e T k / (t E)``
copies routed to each (:attr:`planner.profile.LayerProfile.unsplit_expert_times`; the same FLOPs), the experts'
weights, gradients and state ``1/e`` of them per rank, whole (not over ``t``), and their gradients reduced over the
``t W / e`` ranks with the same experts. Megatron-Core refuses it with the pipeline inside data parallelism unless
``e etp = t`` (:meth:`planner.request.Config._stages`). pipeplan's executor splits the experts over ``t`` only
(:func:`planner.runspec.executor_refusal`).
"""

from __future__ import annotations

from planner.profile import LayerProfile, ModelProfile

#: the view's ``environment`` key saying where its experts' times come from: absent when every layer had times at
#: ``e``, ``"e=1"`` when some kept their times without expert parallelism (:func:`expert_view`)
EXPERT_TIMES_KEY = "expert_parallel_times"


def expert_count(profile: ModelProfile) -> int | None:
    """The profile's experts per layer ``E`` (its shape's), or None for a dense model or one without a shape."""
    return profile.shape.experts if profile.shape is not None else None


def expert_sizes(experts: int | None, data: int) -> list[int]:
    """The expert-parallel sizes ``e`` a search tries at data-parallel width ``W = data``: the divisors of both ``E``
    and ``W`` (1 alone for a dense model)."""
    if not experts:
        return [1]
    return [e for e in range(1, min(experts, data) + 1) if experts % e == 0 and data % e == 0]


def expert_error(profile: ModelProfile, expert: int, shard_parameters: bool = False,
                 expert_tensor: int | None = None) -> str | None:
    """Why a configuration with expert-parallel size ``expert`` (and expert tensor-parallel size ``expert_tensor``)
    cannot be planned for ``profile``, or None; what ``e`` must divide among the configuration's own sizes,
    :class:`planner.request.Config` checks."""
    if expert_tensor is not None:
        if not any(lay.expert_params for lay in profile.layers):
            return f"expert_tensor: whole experts need a mixture of experts; profile {profile.name!r} has none"
        if profile.environment.get("sequence_parallel") != "true":
            return ("expert_tensor: experts whole on each rank need sequence parallelism (each rank routes its own "
                    "T/t tokens; Megatron-Core runs tensor-parallel experts only with it): profile "
                    f"{profile.name!r} was made without it")
    if expert == 1:
        return None
    E = expert_count(profile)
    if not E or not any(lay.expert_params for lay in profile.layers):
        return f"expert: expert parallelism ({expert}) needs a mixture of experts; profile {profile.name!r} has none"
    if E % expert:
        return f"expert: the expert-parallel size {expert} must divide the model's {E} experts"
    if shard_parameters:
        return ("expert: expert parallelism with sharded weights (shard_parameters) is not planned: shard the "
                "optimizer state instead (shard_optimizer)")
    return None


def ep_group(replica: int, expert: int) -> list[int]:
    """The data-parallel replicas in ``replica``'s expert-parallel group (module docstring, "Layout")."""
    first = replica - replica % expert
    return list(range(first, first + expert))


def expert_data_ranks(replica: int, expert: int, data: int) -> list[int]:
    """The data-parallel replicas holding the same experts as ``replica``: its EP rank in every group."""
    return list(range(replica % expert, data, expert))


def ep_slots(slot: int, expert: int, etp: int) -> list[int]:
    """The slots (``j = w t + k`` within a stage: module docstring, "Expert tensor parallelism") of ``slot``'s
    expert-parallel group at expert tensor-parallel size ``etp``."""
    r, base = slot % etp, slot // etp
    first = base - base % expert
    return [(first + i) * etp + r for i in range(expert)]


def expert_data_slots(slot: int, expert: int, etp: int, slots: int) -> list[int]:
    """The slots of a stage's ``slots`` (``t W``) holding the same experts as ``slot`` (the same EP rank and expert
    tensor rank in every group)."""
    r, i = slot % etp, (slot // etp) % expert
    return [(q * expert + i) * etp + r for q in range(slots // (expert * etp))]


def alltoall_bytes(samples: float, seq: int, hidden: int, experts_per_token: int, el: int, tensor: int,
                   sequence_parallel: bool) -> float:
    """Bytes one rank sends (and receives) in one dispatch or combine all-to-all of a micro-batch of ``samples``:
    ``T k h el``, over ``t`` with sequence parallelism (module docstring, "Communication")."""
    return samples * seq * experts_per_token * hidden * el / (tensor if sequence_parallel else 1)


def state_split(params: float, expert_params: float, per_param_dense: float, per_param_expert: float) -> float:
    """Model state bytes of ``params`` parameters of which ``expert_params`` are experts (already the ``1/e`` a
    device holds): the dense ones at ``per_param_dense`` bytes each (state sharded over ``W``), the experts' at
    ``per_param_expert`` (over their ``W/e`` replicas)."""
    return (params - expert_params) * per_param_dense + expert_params * per_param_expert


def _layer_view(lay: LayerProfile, expert: int, whole_at: int | None = None,
                tensor: int | None = None) -> tuple[LayerProfile, bool]:
    """(the layer as an EP rank of ``expert`` holds and runs it, whether its times are at that ``e``); ``whole_at``:
    the tensor-parallel size ``t`` at which its experts are whole (expert tensor parallelism 1; :func:`expert_view`);
    ``tensor``: the ``t`` at which its replicated parameters are counted whole."""
    if tensor is not None and tensor > 1 and lay.replicated_params:
        # held whole on each of t ranks: t times the 1/t share the models divide by t (as whole experts below)
        el = lay.param_bytes / lay.params if lay.params else 0.0
        extra = lay.replicated_params * (tensor - 1)
        lay = lay.model_copy(update={"params": lay.params + extra, "param_bytes": int(round(lay.param_bytes
                                                                                             + extra * el)),
                                     "replicated_params": lay.replicated_params * tensor})
    if not lay.expert_params or expert == 1 and whole_at is None:
        return lay, True
    el = lay.param_bytes / lay.params if lay.params else 0.0
    held = lay.expert_params // expert
    dropped = lay.expert_params - held
    update: dict = {"params": lay.params - dropped, "param_bytes": int(round(lay.param_bytes - dropped * el)),
                    "expert_params": held, "expert_times": None, "unsplit_expert_times": None}
    shards = (lay.expert_times or {}).get(expert)
    if shards is not None:
        one = shards[1]
        update.update(tensor_times=shards, fwd_time=one.fwd_time, bwd_time=one.bwd_time,
                      recompute_time=one.recompute_time,
                      stashed_bytes_per_sample=int(one.stashed_bytes_per_sample or lay.stashed_bytes_per_sample),
                      transient_bytes_per_sample=one.transient_bytes_per_sample,
                      held_grad_bytes_per_sample=one.held_grad_bytes_per_sample,
                      fwd_spread=None, bwd_spread=None)
    exact = shards is not None or expert == 1
    if whole_at is not None:  # held whole: t times the 1/t share the models divide by t (expert_view)
        whole = (lay.unsplit_expert_times or {}).get(expert, {}).get(whole_at)
        extra = held * (whole_at - 1)
        times = dict(update.get("tensor_times") or lay.tensor_times or {})
        if whole is not None:
            times[whole_at] = whole
        update.update(params=update["params"] + extra, param_bytes=int(round(update["param_bytes"] + extra * el)),
                      expert_params=held + extra, tensor_times=times or None)
        exact = whole is not None
    return lay.model_copy(update=update), exact


def expert_view(profile: ModelProfile, expert: int, whole_at: int | None = None,
                tensor: int | None = None) -> ModelProfile:
    """``profile`` as one rank of an expert-parallel group of ``expert`` holds and runs it: each mixture-of-experts
    layer with ``1/e`` of its experts' parameters (``params``, ``param_bytes`` and ``expert_params`` that rank's) and
    its times at ``e`` (:attr:`LayerProfile.expert_times`). Where some layer has no times at ``e`` it keeps its times
    without expert parallelism (the same FLOPs under balanced routing) and the view's environment says so under
    :data:`EXPERT_TIMES_KEY`. The profile itself at ``e = 1``.

    ``whole_at``: the experts whole at that tensor-parallel size ``t`` (expert tensor parallelism 1): the view's
    times at ``t`` are :attr:`LayerProfile.unsplit_expert_times` (else the split ones, the same FLOPs: said as above),
    and its experts' parameters ``t`` times the ``1/e`` share, so that the cost and memory models, which divide a
    layer's parameters by ``t``, find each rank's whole experts. A view for that ``t`` only.

    ``tensor``: the tensor-parallel size ``t`` at which each layer's :attr:`LayerProfile.replicated_params` (held
    whole on every tensor rank: latent attention's down-projections) are counted whole the same way, ``t`` times
    over in ``params``; a view for that ``t`` only (the profile itself where no layer has any)."""
    replicated = tensor is not None and tensor > 1 and any(lay.replicated_params for lay in profile.layers)
    if expert == 1 and whole_at is None and not replicated:
        return profile
    views = [_layer_view(lay, expert, whole_at, tensor if replicated else None) for lay in profile.layers]
    exact = all(ok for _, ok in views)
    missing = f"e={expert} whole at t={whole_at}: split" if whole_at is not None else "e=1"
    env = profile.environment if exact else {**profile.environment, EXPERT_TIMES_KEY: missing}
    return profile.model_copy(update={"layers": [v for v, _ in views], "environment": env})
