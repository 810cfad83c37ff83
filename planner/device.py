"""Device descriptions as data: peak throughput, memory, and how efficiently each kind of kernel runs.

A :class:`DeviceSpec` is what the operator-level cost model (:mod:`planner.operators`) needs to time one
kernel on one device (Calculon, Isaev et al. SC'23, section 3: "matrix" and "vector" engines with an
efficiency table each, a memory with an efficiency table by transfer size):

* ``peak_flops[dtype]``: dense matrix-engine (tensor core) peak, FLOP/s, from the datasheet;
* ``vector_flops[dtype]``: the non-matrix (CUDA core / SIMD) peak for element-wise work;
* ``memory_bandwidth`` (bytes/s) and ``memory_bytes``;
* ``gemm_efficiency``: achieved / peak of a GEMM as a function of its FLOPs, one :class:`Curve` per dtype
  (piecewise-linear in ``log10(GFLOP)``, flat outside the table), optionally refined by measured GEMM
  shapes (``gemm_points``, what ``pipeplan profile-device`` writes) and by tile quantisation
  (``tile``: a GEMM whose ``m`` or ``n`` is not a multiple of the tile wastes the padded part) and wave
  quantisation (``sm_count``, ``tiles``: see :meth:`DeviceSpec.quantisation`);
* ``gemm_ceiling_flops[dtype]``: the measured maximum achievable matmul FLOP/s (MAMF: the fastest shape of a
  GEMM sweep, stas00/ml-engineering's ``mamf-finder.py``; or the best GEMM of ``pipeplan profile-device``),
  where one is published. A sweep's maximum is by definition the fastest any GEMM ran, so no GEMM kernel
  may be timed faster: its whole kernel time (tensor-core time after tile and wave quantisation, plus under
  ``no_overlap`` the operands' streaming, plus the launch) is at least ``flops / ceiling``
  (:meth:`DeviceSpec.kernel_time`). The curve top is derived from the same measurement
  (:func:`ceiling_for_measurement`), so at the measured shape both rules give the measured time, and the
  cap binds only where the curve and the memory rule would run a GEMM faster than any measured one (large
  ``k``: little memory time per FLOP, e.g. ~890 TFLOP/s on the H100 before the cap);
* ``attention_efficiency[implementation]``: a fused attention kernel (``"flash2"``: FlashAttention-2,
  ``"flash3"``: FlashAttention-3, ``"cudnn"``: cuDNN's fused attention, what Transformer Engine runs on
  Hopper unless ``NVTE_FUSED_ATTN=0``) as its papers measured it, achieved / peak by sequence length, forward
  and backward, with and without a causal mask (:class:`AttentionEfficiency`). The flash kernel's FLOPs
  run at this rate instead of the GEMM curve (:meth:`DeviceSpec.attention_time`): a fused attention kernel
  is not a GEMM (its softmax, masking and online rescaling share the SMs with the two or five matmuls; FA2
  reaches 35% of the H100's peak where a GEMM reaches 80%), scaled by how evenly the kernel's thread blocks
  fill the SMs at the kernel's shape against the papers' shape (:mod:`planner.attention_waves`: a few heads
  per GPU at micro-batch 1 leave SMs idle); an implementation the device has no figures for falls back to
  the GEMM curve;
* ``memory_efficiency``: achieved / peak bandwidth of a memory-bound kernel by the bytes it moves;
* ``processing``: how a kernel's compute and memory times combine (``roofline``: the larger;
  ``no_overlap``: their sum, Calculon's A100/H100 rule); a measured GEMM ceiling is turned into the top of
  the GEMM curve through this rule (:func:`ceiling_for_measurement`), so the two stay consistent;
* ``kernel_overhead_s``: fixed cost per kernel launch (a floor for tiny kernels; on CPU the framework's
  per-op dispatch cost);
* ``sustained_rate``: the fraction of its burst matrix-engine rate a GPU holds at its power limit under a
  training run's continuous load. The GEMM ceiling (a MAMF sweep) and the attention figures are burst
  measurements; an H100 SXM at 700 W lowers its SM clock from 1980 to ~1400 MHz within a second of GEMM-heavy
  work, and a lone 8192^3 GEMM then runs at 0.86 of its burst rate (measured on a lent H100, the device file's
  ``sources``). GEMM and fused-attention kernels run at this fraction (:meth:`DeviceSpec.kernel_time`,
  :meth:`DeviceSpec.attention_time`); memory-bound kernels do not (the HBM clock is not lowered). 1.0 where it
  is not measured. It is the rate of a GPU busy throughout; ``power`` (:class:`planner.power.PowerLimit`: the
  board's limit, idle and burst draw) gives the rate a step that leaves the GPU idle part of the time holds
  (:func:`planner.power.held_rate`), which the search finds per candidate;
* ``collective_efficiency``: how NCCL's collectives among these devices use a link, per link class
  (``intra``: NVLink inside a node, ``inter``: the node's network, per GPU): the large-message bus bandwidth
  of each collective as a fraction of the link's peak (nccl-tests ``busbw``, measured) and NCCL's
  protocols with their latencies (:class:`CollectiveModel`); the size-dependent efficiency
  (:meth:`LinkCollectives.efficiency_at`) follows from them; ``channels``, the thread blocks a collective keeps
  on the SMs while it runs (:mod:`planner.contention`: what an overlapped collective takes from compute).

Each figure carries its source in ``sources`` (field name -> citation). The shipped devices live in
``planner/devices/*.json``; :func:`get_device` finds one by name or alias (case-insensitive) or reads a
JSON file path, so a cluster's ``device`` string (e.g. ``"A100-SXM4-80GB"``) names its description and
old cluster files stay valid. A cluster whose device is unknown gets :func:`generic_device` built from its
own ``peak_flops`` and ``memory_bandwidth`` with the A100 curves (stated in the device's ``notes``).
"""

from __future__ import annotations

import json
import math
from functools import lru_cache, partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from planner.attention_waves import balance
from planner.dtypes import canonical_dtype
from planner.jsondoc import refuse_duplicate_keys
from planner.limits import MAX_BANDWIDTH, MAX_COUNT, MAX_FLOPS, MAX_MEMORY_BYTES, MAX_SECONDS
from planner.power import PowerLimit

if TYPE_CHECKING:
    from planner.cluster import Cluster

DEVICES_DIR = Path(__file__).parent / "devices"

#: a peak rate, FLOP/s: finite, above 0, at most MAX_FLOPS (planner.limits)
Flops = Annotated[float, Field(gt=0, le=MAX_FLOPS, allow_inf_nan=False)]
#: a side of a GEMM tile, elements (a thread block's output rows or columns: 64-256 on NVIDIA's libraries)
TileSide = Annotated[int, Field(gt=0, le=2**16)]


class Curve(BaseModel):
    """An efficiency as a function of a size: ``points`` are ``(size, efficiency)`` pairs.

    Evaluated piecewise-linearly in ``log10(size)`` between points and flat outside them (the first point's
    efficiency below it, the last one's above it). Sizes are GFLOP for GEMM curves, MB (1e6 bytes) for
    memory and collective curves.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    points: list[tuple[float, float]] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> Curve:
        sizes = [p[0] for p in self.points]
        if any(not 0 < s < math.inf for s in sizes):
            raise ValueError("points: sizes must be finite and > 0 (the curve is interpolated in log size)")
        if sizes != sorted(sizes) or len(set(sizes)) != len(sizes):
            raise ValueError("points: sizes must be strictly increasing")
        for s, e in self.points:
            if not (0 < e <= 1):
                raise ValueError(f"points: efficiency {e} at size {s} must be in (0, 1]")
        return self

    def __call__(self, size: float) -> float:
        pts = self.points
        if size <= pts[0][0]:
            return pts[0][1]
        if size >= pts[-1][0]:
            return pts[-1][1]
        x = math.log10(size)
        for (s0, e0), (s1, e1) in zip(pts, pts[1:], strict=False):
            if size <= s1:
                x0, x1 = math.log10(s0), math.log10(s1)
                return e0 + (e1 - e0) * (x - x0) / (x1 - x0)
        return pts[-1][1]  # pragma: no cover


#: the collectives the cost model times (nccl-tests ``all_reduce_perf``, ``reduce_scatter_perf``,
#: ``all_gather_perf``, ``sendrecv_perf``)
COLLECTIVE_OPS = ("all_reduce", "reduce_scatter", "all_gather", "p2p")


def ring_steps(op: str, ranks: int) -> tuple[int, float]:
    """NCCL's ring: ``(steps, bus factor)`` of a collective among ``ranks``: an all-reduce takes ``2 (r-1)``
    steps and moves ``2 (r-1)/r`` of the message over each GPU's link, a reduce-scatter or all-gather
    ``r-1`` steps and ``(r-1)/r`` (NVIDIA/nccl ``src/graph/tuning.cc``, ``nsteps``; nccl-tests
    ``doc/PERFORMANCE.md``, bus bandwidth); a point-to-point send one step of the whole message."""
    if op == "all_reduce":
        return 2 * (ranks - 1), 2.0 * (ranks - 1) / ranks
    if op in ("reduce_scatter", "all_gather"):
        return ranks - 1, (ranks - 1) / ranks
    if op == "p2p":
        return 1, 1.0
    raise ValueError(f"op: unknown collective {op!r} (one of {', '.join(COLLECTIVE_OPS)})")


class Protocol(BaseModel):
    """One NCCL protocol (LL, LL128, Simple) as NCCL's own tuning model times it (NVIDIA/nccl
    ``src/graph/tuning.cc``, ``ncclTopoTuneModel``): a latency of ``base_s`` per collective plus ``hop_s``
    per ring step on this link class (``baseLat``, ``hwLat``), and a bus bandwidth of ``bandwidth`` times
    the link's large-message (Simple) bus bandwidth, at most ``max_busbw`` bytes/s."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    base_s: float = Field(ge=0, allow_inf_nan=False)
    hop_s: float = Field(ge=0, allow_inf_nan=False)
    bandwidth: float = Field(default=1.0, gt=0, le=1)
    max_busbw: float | None = Field(default=None, gt=0, description="bytes/s cap (NCCL llMaxBws)")


class LinkCollectives(BaseModel):
    """NCCL's collectives on one link class: ``busbw`` is the measured large-message bus bandwidth of each
    collective (``COLLECTIVE_OPS``) as a fraction of the link's peak (the cluster's ``1/beta``);
    ``protocols`` the latency/bandwidth pairs NCCL picks the fastest of by message size."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    busbw: dict[str, float] = Field(description="op -> large-message bus bandwidth / link peak")
    protocols: list[Protocol] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> LinkCollectives:
        for op, e in self.busbw.items():
            if op not in COLLECTIVE_OPS:
                raise ValueError(f"busbw: unknown collective {op!r} (one of {', '.join(COLLECTIVE_OPS)})")
            if not (0 < e <= 1):
                raise ValueError(f"busbw[{op}]: efficiency {e} must be in (0, 1]")
        if "all_reduce" not in self.busbw:
            raise ValueError("busbw: needs at least 'all_reduce'")
        return self

    def _eff(self, op: str) -> float:
        if op in self.busbw:
            return self.busbw[op]
        if op in ("reduce_scatter", "all_gather") and "reduce_scatter" in self.busbw:
            return self.busbw["reduce_scatter"]
        return self.busbw["all_reduce"]

    def time(self, op: str, ranks: int, nbytes: float, peak: float, steps: int | None = None) -> float:
        """Seconds of ``op`` on ``nbytes`` among ``ranks`` over links of ``peak`` bytes/s per direction:
        the fastest protocol's ``base + steps hop + factor L / busbw`` (``steps``: override the ring's count,
        e.g. a tree's ``2 log2 r``)."""
        if ranks <= 1 or nbytes <= 0:
            return 0.0
        n, factor = ring_steps(op, ranks)
        if steps is not None:
            n = steps
        busbw = peak * self._eff(op)
        best = math.inf
        for p in self.protocols:
            bw = busbw * p.bandwidth
            if p.max_busbw is not None:
                bw = min(bw, p.max_busbw)
            best = min(best, p.base_s + n * p.hop_s + factor * nbytes / bw)
        return best

    def efficiency_at(self, op: str, ranks: int, nbytes: float, peak: float) -> float:
        """Achieved bus bandwidth / link peak of ``op`` at ``nbytes`` (what nccl-tests would print as
        ``busbw`` over the peak): the size-dependent collective efficiency."""
        t = self.time(op, ranks, nbytes, peak)
        if t <= 0:
            return 0.0
        return ring_steps(op, ranks)[1] * nbytes / t / peak


class CollectiveModel(BaseModel):
    """Collectives per link class: ``intra`` (NVLink/NVSwitch inside a node), ``inter`` (the network, one
    NIC per GPU). A class left out falls back to the cluster's alpha-beta link."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    intra: LinkCollectives | None = None
    inter: LinkCollectives | None = None
    channels: int | None = Field(
        default=None, ge=1, le=1024,
        description="NCCL channels of a collective, one resident thread block (SM) each while it runs "
                    "(planner.contention)")


class GemmPoint(BaseModel):
    """One measured GEMM: ``batch`` products of (m x k) @ (k x n) in ``dtype`` took ``seconds``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    m: int = Field(gt=0, le=MAX_COUNT, strict=True)
    n: int = Field(gt=0, le=MAX_COUNT, strict=True)
    k: int = Field(gt=0, le=MAX_COUNT, strict=True)
    batch: int = Field(default=1, gt=0, le=MAX_COUNT, strict=True)
    dtype: str
    seconds: float = Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)

    @property
    def flops(self) -> float:
        return 2.0 * self.batch * self.m * self.n * self.k


#: fused attention implementations a profile may assume (``OperatorOptions.attention_impl``)
ATTENTION_IMPLS = ("flash2", "flash3", "cudnn")


class AttentionEfficiency(BaseModel):
    """One fused attention implementation on one device, as measured in its papers: achieved / dense 16-bit
    peak of the kernel by sequence length (``Curve`` sizes are tokens per sequence), for the forward and the
    backward, without and with a causal mask, at ``head_dim``.

    The FLOPs are the papers' (FlashAttention-2, Dao 2023, section 4.1; FlashAttention-3, Shah et al. 2024,
    section 4.1): forward ``4 s^2 d`` per head, halved with a causal mask, backward 2.5 times the forward
    (5 matmuls against 2) -- exactly the flash kernel's FLOPs in :mod:`planner.operators` -- so a kernel's
    time is ``flops / (peak * efficiency)``: the measured rate is a whole kernel's (its memory traffic and
    launch included). Where a causal figure is not published the non-causal one is used (stated in the
    device's ``sources``: a causal kernel runs the same or slower, so this errs fast)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    head_dim: int = Field(gt=0, description="the head dimension of the published figures")
    reference_heads: int = Field(default=16, gt=0, description="heads of the measured shape (hidden / head_dim)")
    reference_tokens: int = Field(default=16384, gt=0,
                                  description="batch x sequence of the measured shape (batch = tokens / seq)")
    block: int = Field(default=128, gt=0, description="rows per thread block of the kernel's grid "
                                                      "(planner.attention_waves)")
    fwd: Curve
    bwd: Curve
    fwd_causal: Curve | None = None
    bwd_causal: Curve | None = None

    def efficiency(self, seq: int, *, backward: bool, causal: bool) -> float:
        """Achieved / peak at sequence length ``seq``."""
        curve = (self.bwd_causal if backward else self.fwd_causal) if causal else None
        if curve is None:
            curve = self.bwd if backward else self.fwd
        return curve(seq)

    def reference_heads_at(self, seq: int) -> int:
        """Batch x heads of the measured shape at sequence length ``seq`` (at least one sequence)."""
        return self.reference_heads * max(1, self.reference_tokens // seq)


class DeviceSpec(BaseModel):
    """One accelerator (or CPU) as the cost model sees it (module docstring)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    aliases: list[str] = Field(default_factory=list, description="other names a cluster may use")
    kind: Literal["gpu", "cpu"] = "gpu"
    peak_flops: dict[str, Flops] = Field(description="dtype -> dense matrix peak FLOP/s")
    vector_flops: dict[str, Flops] = Field(default_factory=dict, description="dtype -> element-wise peak")
    memory_bytes: int = Field(gt=0, le=MAX_MEMORY_BYTES, strict=True)
    memory_bandwidth: float = Field(gt=0, le=MAX_BANDWIDTH, allow_inf_nan=False, description="bytes/s")
    gemm_efficiency: dict[str, Curve] = Field(description="dtype -> efficiency by GEMM GFLOP")
    gemm_points: list[GemmPoint] = Field(default_factory=list, description="measured GEMMs (profile-device)")
    gemm_ceiling_flops: dict[str, float] = Field(
        default_factory=dict, description="dtype -> measured maximum achievable matmul FLOP/s (MAMF): no GEMM "
                                          "kernel is timed faster")
    tile: tuple[TileSide, TileSide] | None = Field(default=None, description="(m, n) GEMM tile for quantisation")
    sm_count: int | None = Field(default=None, gt=0, le=MAX_COUNT, strict=True,
                                 description="streaming multiprocessors (wave quantisation)")
    wave_quantisation: bool = Field(
        default=True, description="whether GEMMs lose the empty part of their last wave of tiles (False where "
                                  "the measured GEMM library shows none: the curve is then measured whole kernels)")
    tiles: list[tuple[TileSide, TileSide]] = Field(
        default_factory=list, description="(m, n) output tiles the GEMM library picks among (wave quantisation)")
    attention_efficiency: dict[str, AttentionEfficiency] = Field(
        default_factory=dict, description="fused attention implementation -> its measured efficiency")
    memory_efficiency: Curve = Field(description="efficiency of memory-bound kernels by MB moved")
    kernel_overhead_s: float = Field(default=0.0, ge=0, le=1.0, allow_inf_nan=False,
                                     description="per kernel (at most 1 s: a launch takes microseconds)")
    sustained_rate: float = Field(
        default=1.0, gt=0, le=1, allow_inf_nan=False,
        description="matrix-engine rate held at the power limit under a training run's continuous load, as a "
                    "fraction of the burst rate the GEMM and attention figures describe")
    power: PowerLimit | None = Field(
        default=None, description="board power limit, idle and burst draw: the clock held by busy share "
                                  "(planner.power); None: sustained_rate whatever the busy share")
    collective_efficiency: CollectiveModel | None = Field(
        default=None, description="NCCL collectives per link class (bus bandwidth by size)")
    processing: Literal["roofline", "no_overlap"] = Field(
        default="roofline", description="kernel time = max(compute, memory) or their sum (Calculon)")
    sources: dict[str, str] = Field(default_factory=dict, description="field -> citation")
    notes: str = ""

    @model_validator(mode="after")
    def _check(self) -> DeviceSpec:
        if not self.peak_flops:
            raise ValueError("peak_flops: needs at least one dtype")
        for field, table in (("peak_flops", self.peak_flops), ("vector_flops", self.vector_flops),
                             ("gemm_ceiling_flops", self.gemm_ceiling_flops)):
            for dt, v in table.items():
                if not (v > 0) or not math.isfinite(v):
                    raise ValueError(f"{field}[{dt}]: must be a finite number > 0, got {v}")
        if not self.gemm_efficiency:
            raise ValueError("gemm_efficiency: needs at least one dtype")
        for impl in self.attention_efficiency:
            if impl not in ATTENTION_IMPLS:
                raise ValueError(f"attention_efficiency: unknown implementation {impl!r} "
                                 f"(one of {', '.join(ATTENTION_IMPLS)})")
        for dt, v in self.gemm_ceiling_flops.items():
            try:
                peak = self.peak(dt)
            except ValueError:
                raise ValueError(f"gemm_ceiling_flops[{dt}]: the device has no peak for dtype {dt!r}") from None
            if v > peak * (1 + 1e-9):
                raise ValueError(f"gemm_ceiling_flops[{dt}]: {v:g} FLOP/s is above the {dt} peak {peak:g}")
        return self

    # ---- lookups ---------------------------------------------------------------------------------
    def _dtype_key(self, table: dict, dtype: str, field: str) -> str:
        key = canonical_dtype(dtype)
        if key in table:
            return key
        # fp16 and bf16 run on the same tensor cores at the same rate on every device we ship
        for alt in {"bf16": ("fp16",), "fp16": ("bf16",)}.get(key, ()):
            if alt in table:
                return alt
        raise ValueError(f"{field}: device {self.name!r} has no entry for dtype {dtype!r} "
                         f"(has {', '.join(sorted(table))})")

    def peak(self, dtype: str) -> float:
        """Dense matrix peak FLOP/s at ``dtype``."""
        return self.peak_flops[self._dtype_key(self.peak_flops, dtype, "peak_flops")]

    def gemm_ceiling(self, dtype: str) -> float | None:
        """The measured maximum achievable matmul FLOP/s at ``dtype`` (``gemm_ceiling_flops``; bf16 and fp16
        stand for each other), or None where the device has none."""
        if not self.gemm_ceiling_flops:
            return None
        try:
            return self.gemm_ceiling_flops[self._dtype_key(self.gemm_ceiling_flops, dtype, "gemm_ceiling_flops")]
        except ValueError:
            return None

    def vector_peak(self, dtype: str) -> float:
        """Element-wise peak FLOP/s at ``dtype`` (the matrix peak / 4 when not given)."""
        if self.vector_flops:
            try:
                return self.vector_flops[self._dtype_key(self.vector_flops, dtype, "vector_flops")]
            except ValueError:
                pass
        return self.peak(dtype) / 4

    def gemm_eff(self, m: int, n: int, k: int, batch: int = 1, dtype: str = "bf16") -> float:
        """Achieved / peak of ``batch`` GEMMs (m x k) @ (k x n): a measured point of the same shape when
        there is one, else the curve at the GEMM's GFLOP times the tile quantisation
        ``(m n) / (ceil(m/tm) tm ceil(n/tn) tn)``."""
        key = canonical_dtype(dtype)
        for p in self.gemm_points:
            if (p.m, p.n, p.k, p.batch) == (m, n, k, batch) and canonical_dtype(p.dtype) == key:
                return min(1.0, p.flops / (p.seconds * self.peak(dtype)))
        curve = self.gemm_efficiency[self._dtype_key(self.gemm_efficiency, dtype, "gemm_efficiency")]
        return curve(2.0 * batch * m * n * k / 1e9) * self.quantisation(m, n, batch)

    def quantisation(self, m: int, n: int, batch: int = 1) -> float:
        """Fraction of a GEMM's tensor-core time spent on useful output: tile and wave quantisation
        (NVIDIA, "Matrix Multiplication Background User's Guide", DU-09799-001, sections 2.3 and 3).

        A GEMM's ``m x n`` output (times ``batch``) is cut into ``tm x tn`` tiles, one thread block each;
        the blocks run in waves of ``sm_count`` (one resident large-tile block per SM). Tile quantisation:
        the padded part of edge tiles is wasted, ``m n / (ceil(m/tm) tm ceil(n/tn) tn)``. Wave
        quantisation: with ``N`` tiles the last of ``ceil(N / sm_count)`` waves runs partly empty, so the
        GEMM takes ``ceil(N/S)`` wave times for ``N/S`` waves of work (the guide's example: 108 SMs of an
        A100 and 256 x 128 tiles). The library picks its tile per shape; we take the best of ``tiles`` (or
        ``tile`` alone where it is set).
        The efficiency curve is the best-shape ceiling (a measured sweep's best shape fills its waves), so
        this factor is applied on top of it. 1.0 when the device has neither ``tile`` nor ``sm_count``; only tile
        quantisation (``tile``) when ``wave_quantisation`` is off (the H100: cuBLAS's Hopper kernels ran 2048 x 9216
        GEMMs, 4.4 waves of 256 x 128 tiles, at the rate of full-wave ones, and 512-row cuts of them at 0.9 of it,
        where the wave rule says 0.87 and 0.55; benchmarks/DEVICE_CHECK.md, 'Runs')."""
        if self.sm_count is None or not self.wave_quantisation:
            if self.tile is None:
                return 1.0
            tm, tn = self.tile
            return (m * n) / (math.ceil(m / tm) * tm * math.ceil(n / tn) * tn)
        best = 0.0
        for tm, tn in ([self.tile] if self.tile else (self.tiles or [(256, 128)])):
            blocks = math.ceil(m / tm) * math.ceil(n / tn) * batch
            waves = blocks / self.sm_count
            best = max(best, (m * n * batch) / (blocks * tm * tn) * waves / math.ceil(waves))
        return best

    def mem_eff(self, nbytes: float) -> float:
        """Achieved / peak bandwidth of a memory-bound kernel moving ``nbytes``."""
        return self.memory_efficiency(max(nbytes, 1.0) / 1e6)

    def kernel_time(self, flops: float, nbytes: float, *, gemm: tuple[int, int, int, int] | None = None,
                    dtype: str = "bf16") -> float:
        """Seconds of one kernel: compute ``flops`` on the matrix engine (``gemm`` = (m, n, k, batch)) or
        the vector engine (``gemm`` None), memory ``nbytes`` at the size-dependent bandwidth, combined by
        ``processing``, plus ``kernel_overhead_s``. A GEMM takes at least ``flops / gemm_ceiling(dtype)``
        in all (module docstring: the measured MAMF is a whole kernel's time at the sweep's best shape)."""
        if gemm is not None:
            m, n, k, batch = gemm
            t_c = flops / (self.peak(dtype) * self.gemm_eff(m, n, k, batch, dtype) * self.sustained_rate) \
                if flops > 0 else 0.0
        else:
            t_c = flops / self.vector_peak(dtype) if flops > 0 else 0.0
        t_m = nbytes / (self.memory_bandwidth * self.mem_eff(nbytes)) if nbytes > 0 else 0.0
        body = max(t_c, t_m) if self.processing == "roofline" else t_c + t_m
        total = body + self.kernel_overhead_s
        if gemm is not None and flops > 0:
            ceiling = self.gemm_ceiling(dtype)
            if ceiling is not None:
                return max(total, flops / (ceiling * self.sustained_rate))
        return total

    def attention_time(self, flops: float, implementation: str, seq: int, *, backward: bool, causal: bool,
                       dtype: str = "bf16", heads: int | None = None) -> float | None:
        """Seconds of one fused attention kernel of ``flops`` (the papers' count: :class:`AttentionEfficiency`)
        by ``implementation`` at sequence length ``seq`` over ``heads`` (batch x heads on this GPU):
        ``flops / (peak * efficiency)``, at least the launch overhead; None where the device has no figures for
        the implementation or ``dtype`` is not 16-bit (the figures are fp16/bf16), so the caller falls back to
        the GEMM curve. Where ``heads`` and ``sm_count`` are known the efficiency is scaled by how evenly the
        kernel's thread blocks fill the SMs at this shape over how evenly they did at the measured one
        (:func:`planner.attention_waves.balance`: few heads of one sequence leave SMs idle)."""
        table = self.attention_efficiency.get(implementation)
        if table is None or canonical_dtype(dtype) not in ("bf16", "fp16"):
            return None
        if flops <= 0:
            return self.kernel_overhead_s
        eff = table.efficiency(seq, backward=backward, causal=causal)
        if heads is not None and self.sm_count is not None:
            fill = partial(balance, seq=seq, block=table.block, sms=self.sm_count, causal=causal, backward=backward)
            eff = min(1.0, eff * fill(heads) / fill(table.reference_heads_at(seq)))
        return max(flops / (self.peak(dtype) * eff * self.sustained_rate), self.kernel_overhead_s)

    @property
    def power_limited(self) -> bool:
        """Whether the device holds its matrix rate below the burst rate by its power limit (``power`` and a
        ``sustained_rate`` below 1): the held clock of :mod:`planner.power` applies."""
        return self.power is not None and self.sustained_rate < 1.0

    def collectives(self, link: str) -> LinkCollectives | None:
        """The collective model of link class ``link`` (``"intra"``/``"inter"``), or None."""
        if self.collective_efficiency is None:
            return None
        return getattr(self.collective_efficiency, link)

    def matches(self, name: str) -> bool:
        """Whether ``name`` names this device (its name or an alias, case- and separator-insensitive)."""
        want = name_key(name)
        return want == name_key(self.name) or any(want == name_key(a) for a in self.aliases)


def ceiling_for_measurement(device: DeviceSpec, m: int, n: int, k: int, tflops: float,
                            dtype: str = "bf16") -> float:
    """The top of ``device``'s GEMM efficiency curve at which its own kernel-time rule reproduces one measured
    GEMM of ``(m x k) @ (k x n)`` running at ``tflops`` TFLOP/s (a large GEMM on the curve's flat top).

    A measured ceiling such as a sweep's maximum achievable matmul FLOPS (MAMF) is a whole kernel's time:
    tensor-core time, plus, under ``processing = "no_overlap"``, the time to stream the operands and the
    output (``2 (m k + k n + m n)`` bytes at 16 bits) at the achieved bandwidth, plus the launch overhead.
    Solving ``seconds = flops / (peak * top * quantisation) + memory + overhead`` for ``top`` keeps the
    measurement and the rule that uses it consistent (a roofline device: the memory term is dropped). The same
    measurement, as ``gemm_ceiling_flops``, caps every GEMM (:meth:`DeviceSpec.kernel_time`): at the measured
    shape the curve's rule and the cap agree, elsewhere the cap binds only where the rule would be faster."""
    flops = 2.0 * m * n * k
    seconds = flops / (tflops * 1e12)
    nbytes = 2.0 * (m * k + k * n + m * n)
    memory = nbytes / (device.memory_bandwidth * device.mem_eff(nbytes)) if device.processing == "no_overlap" else 0.0
    compute = seconds - memory - device.kernel_overhead_s
    if compute <= 0:
        raise ValueError(f"tflops: {tflops} TFLOP/s at {m}x{n}x{k} is faster than the memory time allows")
    return flops / (device.peak(dtype) * device.quantisation(m, n) * compute)


def name_key(name: str) -> str:
    """A device name without case and separators (``H100-SXM5-80GB`` and ``h100 sxm5 80gb`` are one name):
    how names are compared here and in :func:`planner.mismatch.same_device`."""
    return "".join(ch for ch in name.lower() if ch.isalnum())


def load_device(path: str | Path, bases: tuple[DeviceSpec, ...] | None = None) -> DeviceSpec:
    """Read and validate a device description (JSON).

    A description may start from another one: ``"like": "<a shipped device's name>"`` takes every field of
    that device that this file does not set (its aliases excepted), each inherited source prefixed with where
    it came from. The H200 is written so (the H100's die with another memory): one copy of the measured H100
    figures, which the H200 follows when they are measured again. ``bases``: the shipped descriptions to look
    the base up in (default: read from ``planner/devices``; :func:`shipped_devices` passes those it has read)."""
    path = Path(path)
    return _device_from_text(path.read_text(), path, bases)


def _device_from_text(text: str, path: Path, bases: tuple[DeviceSpec, ...] | None) -> DeviceSpec:
    """:func:`load_device` of the file at ``path`` whose contents are ``text`` (a key given twice in one object is
    refused)."""
    refuse_duplicate_keys(text)
    if '"like"' not in text:
        return DeviceSpec.model_validate_json(text)
    raw = json.loads(text)
    like = raw.pop("like", None) if isinstance(raw, dict) else None
    if like is None:  # (or not an object: pydantic says so)
        return DeviceSpec.model_validate_json(text)
    if not isinstance(like, str):
        raise ValueError(f"{path}: like: the name of a shipped device, got {json.dumps(like)[:40]}")
    base = _shipped_base(like, path, bases)
    inherited = json.loads(base.model_dump_json())
    own_sources = raw.get("sources", {})
    if not isinstance(own_sources, dict):
        raise ValueError(f"{path}: sources: an object of field -> where its figure comes from")
    sources = {k: f"as the {base.name} (\"like\"): {v}" for k, v in inherited["sources"].items()
               if k not in own_sources}
    merged = {**inherited, "aliases": [], **raw, "sources": {**sources, **own_sources}}
    return DeviceSpec.model_validate_json(json.dumps(merged))


def _shipped_base(name: str, path: Path, bases: tuple[DeviceSpec, ...] | None) -> DeviceSpec:
    """The shipped description ``name`` that the description at ``path`` is ``like`` (not itself), among
    ``bases`` where given, else read from ``planner/devices``."""
    if bases is not None:
        got = next((dev for dev in bases if dev.matches(name)), None)
        if got is not None:
            return got
    else:
        for other in sorted(DEVICES_DIR.glob("*.json")):
            if other.resolve() == path.resolve():
                continue
            dev = load_device(other)
            if dev.matches(name):
                return dev
    raise ValueError(f"{path}: like: {name!r} is not a shipped device (planner/devices)")


def save_device(device: DeviceSpec, path: str | Path) -> None:
    """Write ``device`` as indented JSON."""
    Path(path).write_text(device.model_dump_json(indent=2) + "\n")


@lru_cache(maxsize=1)
def shipped_devices() -> tuple[DeviceSpec, ...]:
    """The devices in ``planner/devices/*.json`` (read once, in file-name order): those that stand alone first,
    then those ``like`` one of them (:func:`load_device`), each file read once."""
    paths = sorted(DEVICES_DIR.glob("*.json"))
    texts = {p: p.read_text() for p in paths}
    plain = {p: _device_from_text(t, p, None) for p, t in texts.items() if '"like"' not in t}
    bases = tuple(plain.values())
    return tuple(plain[p] if p in plain else _device_from_text(texts[p], p, bases) for p in paths)


def shipped_device(name: str) -> DeviceSpec | None:
    """The shipped device ``name`` names (its name or an alias, case- and separator-insensitive:
    :meth:`DeviceSpec.matches`), or None; never a file (a name declared over the API is not a path to read)."""
    return next((dev for dev in shipped_devices() if dev.matches(name)), None)


def find_device(name: str) -> DeviceSpec | None:
    """A shipped device by name or alias, a device JSON file by path, or None."""
    dev = shipped_device(name)
    if dev is not None:
        return dev
    p = Path(name)
    if p.suffix == ".json" and p.is_file():
        return load_device(p)
    return None


def get_device(name: str) -> DeviceSpec:
    """Like :func:`find_device`, but an unknown name is an error naming the known devices."""
    dev = find_device(name)
    if dev is None:
        known = ", ".join(d.name for d in shipped_devices())
        raise ValueError(f"device: unknown device {name!r}; shipped: {known} (or a path to a device .json)")
    return dev


def generic_device(name: str, peak_flops: float, memory_bandwidth: float, memory_bytes: int,
                   dtype: str = "bf16") -> DeviceSpec:
    """A device known only by its peaks: the A100's efficiency curves (Calculon) on these peaks."""
    base = get_device("A100-SXM4-80GB")
    key = canonical_dtype(dtype)
    return DeviceSpec(
        name=name, kind="gpu", peak_flops={key: peak_flops}, memory_bytes=memory_bytes,
        memory_bandwidth=memory_bandwidth, gemm_efficiency={key: base.gemm_efficiency["fp16"]},
        memory_efficiency=base.memory_efficiency, kernel_overhead_s=base.kernel_overhead_s,
        collective_efficiency=base.collective_efficiency, processing=base.processing,
        sources={"*": "peaks from the cluster file; curves copied from A100-SXM4-80GB"},
        notes=f"generic description of {name!r}: no shipped device matched; curves are the A100's")


def device_for_cluster(cluster: Cluster) -> DeviceSpec:
    """The description of a cluster's device: its ``device`` string looked up with :func:`find_device`,
    else :func:`generic_device` from the cluster's own peak FLOP/s, bandwidth and memory."""
    dev = find_device(cluster.device)
    if dev is not None:
        return dev
    return generic_device(cluster.device, cluster.peak_flops, cluster.memory_bandwidth, cluster.memory_bytes)
