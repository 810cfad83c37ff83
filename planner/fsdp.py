"""Fully sharded data parallelism (ZeRO stage 3, PyTorch FSDP2): what the request's ``shard_parameters`` moves
and holds, as torchtitan runs it.

ZeRO (Rajbhandari et al. 2020, section 5.3, ``P_os+g+p``) splits the weights, the gradients and the optimizer
state of every stage over its ``W`` data-parallel replicas: a device keeps ``bytes_per_param / W`` of the model
state per parameter (``(2 + 2 + K) Psi / N_d``; :meth:`planner.request.TrainingRequest.state_bytes_per_param`).
A layer's weights are all-gathered before it computes and its gradients reduce-scattered after its backward
(section 7.2.2: 1.5x the all-reduce's bytes). PyTorch's ``fully_shard`` (FSDP2) does it per module: torchtitan
wraps the embedding, every transformer block and the final norm with the output layer (our profile's layers,
one unit each), keeps the sharded weights and gradients in fp32 (16 bytes per parameter with Adam's state:
our default ``bytes_per_param``), all-gathers them in the compute dtype (``MixedPrecisionPolicy.param_dtype``,
the profile's ``el`` bytes) and reduce-scatters the gradients in fp32 (torchtitan's
``training.mixed_precision_reduce = "float32"``: :data:`REDUCE_BYTES`).

When it gathers (:func:`reshards_after_forward`; torchtitan's ``parallelism.fsdp_reshard_after_forward =
"default"``: "for PP, by default do not reshard after forward to avoid per-microbatch all-gathers", else
reshard):

* **No pipeline (D = 1)**: every micro-batch's forward all-gathers each layer, its backward all-gathers them
  again (not the last layer, which stays gathered: torchtitan does not reshard the last block) and
  reduce-scatters each layer's gradient (FSDP2 syncs gradients in every backward by default). FSDP2 issues the
  next layer's all-gather while the current one computes (implicit prefetching), so a forward takes
  ``AG_0 + max(F, AG_rest)`` (:func:`forward_time`) and a backward ``max(B, AG_rest + RS_rest) + RS_0``
  (:func:`backward_time`: the all-gathers and reduce-scatters share the link, the first layer's
  reduce-scatter is left after the last backward compute), each ``max`` the overlap of compute and a
  collective whose kernel holds part of the SMs while it runs (:func:`planner.contention.overlapped`). A
  device holds, besides its shards, the gathered weights of two layers (the one computing, the one
  prefetched) and one layer's gradient in ``el`` and in the reduce dtype (:func:`unsharded_bytes`).
* **Pipelined (D > 1)**: torch's pipeline schedules turn gradient sync off for all micro-batches but the last
  (``_PipelineStageBase.backward_maybe_with_nosync``) and the weights stay gathered: one all-gather of each
  stage's weights per iteration, prefetched under its first forward (what exceeds that forward is left,
  at least the largest layer's), and one reduce-scatter of its gradients after its last backward, which
  the simulator overlaps with the device's later work as it does an all-reduce
  (:meth:`planner.cost.ConfigCosts.allreduce`). The gathered weights and the gradients accumulated over
  the micro-batches stay whole for the iteration: ``el`` bytes per parameter beside the shards for the weights
  and :data:`REDUCE_BYTES` for the gradients (FSDP2 accumulates them in the reduce dtype while sync is off,
  ``FSDPParam.to_accumulated_grad_if_needed``).
  An approximation: the all-gather's exposed part is charged with the reduce-scatter, after the stage's last
  backward (where the simulator's action lists have a per-stage synchronisation action), as if every device
  gathered its stages at once (torch's multi-stage runtime issues ``UNSHARD`` actions ahead of use); torch's
  single-stage schedules (GPipe, 1F1B) start it at the stage's first forward instead (FSDP's pre-forward hook
  runs once the input has arrived), so on the pipeline's fill the stages' exposed parts follow one another:
  Llama 3.1 8B at t = 1, D = 8, W = 8 on DGX A100s, 0.19 s summed over the 8 stages where this charges the
  slowest device's 0.04 s, of a 10.1 s iteration.

**Copies** (FSDP2's ``_fsdp_collectives.py``): each all-gather lands in one flat buffer that
``foreach_all_gather_copy_out`` splits into the layer's unsharded weights (``torch.split_with_sizes_copy``) on
the compute stream before the layer runs: it reads and writes ``el`` bytes per parameter
(:data:`COPY_OUT_BYTES`), compute-stream time per gather. Before each reduce-scatter,
``foreach_reduce_scatter_copy_in`` (``torch._chunk_cat``) copies the unsharded ``el``-byte gradients into the
reduce-scatter's fp32 input on the reduce-scatter stream (:func:`copy_in_bytes`), link-side time before the
collective. Both at the device's memory bandwidth (:meth:`planner.cost.ConfigCosts.fsdp_layers`).

FSDP shards a stage over its ``W`` data-parallel copies only: schedules that keep two copies of a stage in a
pipeline group (Chimera, GEMS, PipeDream's replicated stages) or several weight versions (PipeDream, 2BW) are
not planned with it (:data:`INCOMPATIBLE`). Collective times: NCCL's rings over the ``W`` ranks
(:func:`planner.cost.sharded_collective_time`).
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.contention import overlapped

#: bytes per element of the gradient reduce-scatter: torchtitan reduces in fp32 (module docstring)
REDUCE_BYTES = 4.0

#: bytes per parameter FSDP2's all-gather copy-out moves on the compute stream, per ``el`` (read the gathered
#: buffer, write the unsharded weight: module docstring, "Copies")
COPY_OUT_BYTES = 2.0


def copy_in_bytes(el: float) -> float:
    """Bytes per parameter of FSDP2's reduce-scatter copy-in: read the ``el``-byte gradient, write it in the
    reduce dtype (module docstring, "Copies")."""
    return el + REDUCE_BYTES


#: schedules that keep more than one copy (or version) of a stage per pipeline group (module docstring)
INCOMPATIBLE = ("chimera", "gems", "1f1b-rr", "pipedream", "pipedream-rr", "pipedream-2bw")


def step_grad_pass_bytes(dtype: str) -> float:
    """Bytes per parameter the optimizer step of sharded weights moves over the gradients besides reading and
    writing the state: they arrive reduce-scattered in fp32 into the shard, so there is no copy into fp32 main
    gradients as Megatron's mixed-precision optimizer makes (:data:`planner.cost.MIXED_PRECISION_GRAD_PASS_BYTES`);
    clipping reads them once for their norm (torchtitan clips, ``max_norm`` 1.0): 4; fp16 adds the gradient
    scaler's unscale and inf check (``ShardedGradScaler``: read and write, 8)."""
    return 4.0 + (8.0 if dtype.lower() in ("fp16", "float16", "half") else 0.0)


def reshards_after_forward(devices: int) -> bool:
    """torchtitan's default policy: reshard after forward (gather again per micro-batch) only without a
    pipeline (``devices`` = D = 1)."""
    return devices == 1


def forward_time(fwd: float, gathers: Sequence[float], overlap: bool = True,
                 copies: Sequence[float] = (), share: float = 0.0) -> float:
    """A forward of compute ``fwd`` whose layers are all-gathered in order (``gathers``, seconds each) with the
    next one prefetched while the current one computes: the first gather, then the compute (with each gather's
    copy-out, ``copies``, on the compute stream) beside the other gathers, which hold ``share`` of its
    throughput while they run (:func:`planner.contention.overlapped`). ``overlap`` False (a host whose
    communication takes the cores compute runs on, :attr:`planner.cluster.HostCpu.comm_overlaps_compute`):
    the compute and every gather, one after another."""
    if not gathers:
        return fwd
    fwd += sum(copies)
    if not overlap:
        return fwd + sum(gathers)
    return gathers[0] + overlapped(fwd, sum(gathers[1:]), share)


def backward_time(bwd: float, gathers: Sequence[float], scatters: Sequence[float], overlap: bool = True,
                  copies: Sequence[float] = (), share: float = 0.0) -> float:
    """A backward of compute ``bwd`` over layers in forward order (``gathers`` and ``scatters`` per layer):
    the last layer is still gathered, the others are gathered again (their copy-outs, ``copies``, on the
    compute stream) while the layer after them computes and each gradient is reduce-scattered after its layer
    (the collectives holding ``share`` of the compute while they run, as in :func:`forward_time`); the first
    layer's reduce-scatter comes after all the compute. ``overlap`` False: all of them after one another."""
    if not gathers:
        return bwd
    bwd += sum(copies[:-1])
    if not overlap:
        return bwd + sum(gathers[:-1]) + sum(scatters)
    return overlapped(bwd, sum(gathers[:-1]) + sum(scatters[1:]), share) + scatters[0]


def gather_exposed(fwd: float, gathers: Sequence[float], share: float = 0.0) -> float:
    """Pipelined: what is left of one iteration's all-gather of a stage after its first forward, as
    :func:`forward_time` has it: the first layer's gather, then the others beside that forward (holding ``share``
    of its compute: :func:`planner.contention.overlapped`) beyond it; at least the stage's largest layer's."""
    if not gathers:
        return 0.0
    return max(max(gathers), gathers[0] + overlapped(fwd, sum(gathers[1:]), share) - fwd)


def gathered_bytes_per_param(el: float) -> float:
    """Pipelined: bytes per parameter a device keeps whole for the iteration beside its shards: the gathered
    weights (``el``) and the gradients accumulated over the micro-batches, which FSDP2 keeps in the reduce dtype
    when gradient sync is off (``FSDPParam.to_accumulated_grad_if_needed``: :data:`REDUCE_BYTES`)."""
    return el + REDUCE_BYTES


def unsharded_bytes(layer_params: Sequence[float], el: float, tensor: int, devices: int) -> float:
    """Bytes a device holds of one stage beside its shards (module docstring): pipelined, the stage's
    gathered weights and accumulated gradients (:func:`gathered_bytes_per_param`); without a pipeline two
    layers' weights and one layer's gradient in ``el`` and in :data:`REDUCE_BYTES`, of the largest layer;
    over ``tensor``."""
    if not layer_params:
        return 0.0
    if reshards_after_forward(devices):
        return max(layer_params) * (3 * el + REDUCE_BYTES) / tensor
    return sum(layer_params) * gathered_bytes_per_param(el) / tensor
