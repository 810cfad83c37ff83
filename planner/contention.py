"""Compute beside a running collective: what an overlapped collective takes from the compute it hides under.

An NCCL collective is a kernel like any other: each of its channels is one thread block that stays resident
on a streaming multiprocessor (SM) for as long as the collective runs. A GEMM launched beside it gets the SMs
that are left, so where the planner overlaps a collective with compute (FSDP's prefetched all-gathers and
reduce-scatters, PyTorch DDP's bucketed all-reduce, Megatron-Core's overlapped reduce-scatter and
all-gather) the compute does not run at full rate while the collective does.

The rule (:func:`overlapped`): a collective of ``comm`` seconds and compute of ``compute`` seconds start
together on their own streams; while the collective runs it holds ``share`` of the device's compute
throughput (:func:`collective_share`: its channels over the device's SMs), so the compute advances at
``1 - share``; once the collective ends the compute runs at full rate. Together they take
``max(comm, compute + share * comm)`` (the collective itself is not slowed). With ``share = 0`` this is the
ideal overlap ``max(comm, compute)`` the planner charged before.

Figures (sources in the device files' ``sources``):

* channels: NCCL's ``INFO`` line at communicator set-up on 8-GPU NVSwitch nodes (DGX A100, DGX H100, AWS
  p5.48xlarge) reads ``24 coll channels`` (NCCL 2.18-2.27): 24 blocks per collective on a DGX A100's 108
  SMs (share 0.22) and on an H100's 132 (share 0.18). Those logs are of one-node communicators; the same
  count is taken for collectives whose rings also cross nodes (an assumption: NCCL sizes a multi-node
  communicator's channels by its NICs and NVLinks, and its kernels' blocks stay resident all the same);
* the effect, measured: an H100 GEMM of 132 blocks beside a 24-block ``ncclAllGather`` (FSDP's prefetch)
  fell from ~80% to ~47% MFU, its blocks pushed into a second wave (NVIDIA developer forum, "Compute-
  Communication Overlap Causes Severe GEMM Performance Degradation because of Tail Effect", 2025); for GPT
  and Llama models on 4 A100s, H100s, MI250s and MI210s, computation overlapped with communication was
  18.9% slower on average, 40% at most, than alone (Lee et al., "Characterizing Compute-Communication
  Overlap in GPU-Accelerated Distributed Deep Learning: Performance and Power Implications", arXiv
  2507.03114, 2025). The share slows compute that a collective overlaps throughout by ``1 / (1 - share) - 1``:
  29% on an A100, 22% on an H100 -- above that average, below its maximum -- and without the wave effect of
  a single GEMM (the planner times a layer's GEMMs together, not each one's waves beside the collective).

Where it applies: the collectives the cost model itself overlaps with compute (:meth:`planner.cost.ConfigCosts`:
FSDP's per-layer gathers and scatters, a one-stage pipeline's overlapped DDP all-reduce or sharded optimizer
sync, a pipelined FSDP stage's gather under its first forward), and an all-reduce the simulator posts in the
middle of a device's list (an eager one, Chimera 3.2's): the replays delay the device's compute after the post
by ``share`` x the all-reduce, or x the compute left if that is shorter
(:func:`planner.schedules.timing.contention_debt`: the delay shows as idle time before the next action). Not
modelled: pipeline sends (NCCL's point-to-point kernels hold fewer blocks, briefly); the collective's own HBM
traffic slowing memory-bound kernels beside it; the slowdown of the collective itself. A device without a
channel count (``collective_efficiency.channels``: CPUs, the V100/P100 files, whose NVLink topologies set other
counts, and a measured ``profile-device`` description) is charged no share.
"""

from __future__ import annotations

from planner.device import DeviceSpec


def collective_share(device: DeviceSpec | None) -> float:
    """Fraction of ``device``'s compute throughput a running collective holds: its NCCL channels (one resident
    thread block each) over the device's SMs; 0 when either is unknown (module docstring)."""
    if device is None or device.sm_count is None or device.collective_efficiency is None:
        return 0.0
    channels = device.collective_efficiency.channels
    if channels is None:
        return 0.0
    return min(1.0, channels / device.sm_count)


def overlapped(compute: float, comm: float, share: float) -> float:
    """Seconds ``compute`` and a collective of ``comm`` seconds take when they start together on their own
    streams and the collective holds ``share`` of the compute throughput while it runs (module docstring):
    ``max(comm, compute + share * comm)``."""
    if comm <= 0.0:
        return compute
    return max(comm, compute + share * comm)
