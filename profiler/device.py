"""``pipeplan profile-device``: measure a :class:`planner.device.DeviceSpec` with torch on this machine.

* **GEMM sweep**: ``torch.matmul`` of ``(batch, m, k) @ (batch, k, n)`` in the device's dtype (bf16 on
  CUDA, fp32 on the CPU by default) over the shapes a transformer layer produces (:func:`model_shapes`:
  QKV, attention scores and attention over values per head, output projection, MLP up/gate and down, at
  the micro-batch sizes and tensor-parallel sizes asked for, Megatron-LM 3.2's column/row split) -- from a
  :class:`planner.model.ModelSpec` preset with ``--model`` -- plus a square sweep. Each shape's median time
  goes into ``gemm_points``; ``gemm_efficiency[dtype]`` is the curve of achieved / peak by GFLOP (median
  efficiency per decade-spaced bin, :func:`efficiency_curve`); the fastest of them is the device's
  ``gemm_ceiling_flops`` (a sweep's maximum achievable matmul FLOP/s: no GEMM is timed faster).
* **Memory sweep**: ``dst.copy_(src)`` over sizes; bytes moved = read + write. ``memory_bandwidth`` is the
  best achieved rate of the copies at least twice the GPU's L2 cache (of all of them on the CPU) and
  ``memory_efficiency`` the curve of achieved / that rate by MB moved (at most 1: an L2-resident copy runs
  faster than the main memory).
* **Kernel overhead**: the time of an add of two one-element tensors: on the CPU the median call (the
  framework's dispatch); on CUDA the GPU's time per add with the adds queued back to back (the launch gap the
  GPU sees between kernels), the host's time to issue one stated in ``sources`` (the floor of a launch-bound
  layer; not modelled).
* **Peak**: the shipped description's datasheet peak when this device matches one
  (:func:`planner.device.find_device`), else the best GEMM rate measured here (the curve then tops at 1,
  and ``sources`` says so).

Timing: on the CPU :func:`profiler.timing.time_op` (``perf_counter``), the fastest of ``repeats`` after
``warmup`` (other processes only add time: on a shared machine a long GEMM's median includes being
descheduled, as in :mod:`profiler.links`). On CUDA :func:`profiler.timing.time_queued`: calls issued while a
sleep kernel holds the GPU, timed by events after it, so each GEMM and copy is its kernel alone; timed one
call after a synchronise instead, every GEMM on a lent H100 took >= 31 us, the host's dispatch
(benchmarks/DEVICE_CHECK.md, 'Runs'). These are burst rates (the GPU rests during the sleep kernel): a GPU
at its power limit under a training run's load runs slower. ``quick=True`` runs a handful of small shapes in a
few seconds (CI on CPU).

What the sweep does not measure -- the rate at the power limit and the power figures, the fused attention
kernels, NCCL's collectives, the SM count the flash kernel's load balance needs (:data:`CARRIED`) -- is carried
over from the shipped description where this device matches one (:func:`unmeasured`), its sources saying so:
a measured H100 is then planned at its power-limited clock as the shipped one is, not at the burst rate.
"""

from __future__ import annotations

import datetime
import math
import os
import platform
from statistics import median
from typing import Any

from planner.device import Curve, DeviceSpec, GemmPoint, find_device
from planner.dtypes import canonical_dtype
from planner.model import ModelSpec

Shape = tuple[int, int, int, int]  # m, n, k, batch


def model_shapes(spec: ModelSpec, micro_batches: list[int], tensor: list[int]) -> list[Shape]:
    """GEMM shapes ``(m, n, k, batch)`` of one transformer layer's forward for each micro-batch size
    ``b`` and tensor-parallel size ``t`` (Megatron-LM 3.2: QKV and MLP-up column-split, so ``n / t``;
    output projection and MLP-down row-split, so ``k / t``; attention per local head, ``a / t`` heads).
    Multi-head latent attention (``spec.mla``; :mod:`planner.mla`, Megatron-Core's ``MLASelfAttention``) has its
    projections instead of QKV: the query down-projection ``(T, c', h)`` and up-projection ``(T, a d / t, c')`` (or
    one ``(T, a d / t, h)`` without a query latent), the key/value down-projection ``(T, c + r, h)`` (the down-
    projections whole on every rank) and up-projection ``(T, a (d - r + v) / t, c)``; values ``v`` wide per head, the
    output projection reading ``a v / t``.
    The backward's GEMMs are these shapes transposed (the same FLOPs); they are not repeated."""
    out: set[Shape] = set()
    s, h, d, f, v = spec.seq, spec.hidden, spec.d, spec.f, spec.v_d
    for b in micro_batches:
        tokens = b * s
        for t in tensor:
            if spec.heads % t or spec.k % t or f % t:
                continue
            a_t = spec.heads // t
            if spec.mla:
                r, c = int(spec.qk_rope_head_dim or 0), int(spec.kv_lora_rank or 0)
                if spec.q_lora_rank is not None:
                    out.add((tokens, spec.q_lora_rank, h, 1))  # query down-projection (whole)
                    out.add((tokens, a_t * d, spec.q_lora_rank, 1))  # query up-projection
                else:
                    out.add((tokens, a_t * d, h, 1))  # query projection
                out.add((tokens, c + r, h, 1))  # key/value down-projection with the shared rotated key (whole)
                out.add((tokens, a_t * (d - r + v), c, 1))  # key/value up-projection
            else:
                out.add((tokens, (spec.q_dim + 2 * spec.kv_dim) // t, h, 1))  # QKV
            out.add((s, s, d, b * a_t))  # scores Q K^T per head
            out.add((s, v, s, b * a_t))  # attention over values
            out.add((tokens, h, a_t * v, 1))  # output projection
            out.add((tokens, (2 if spec.gated_mlp else 1) * f // t, h, 1))  # MLP up (and gate)
            out.add((tokens, h, f // t, 1))  # MLP down
    return sorted(out)


def square_shapes(quick: bool) -> list[Shape]:
    sizes = [32, 64, 128, 256] if quick else [64, 128, 256, 512, 1024, 2048]
    return [(n, n, n, 1) for n in sizes]


def efficiency_curve(points: list[tuple[float, float]], bins_per_decade: int = 2) -> Curve:
    """``(size, efficiency)`` samples -> a :class:`Curve`: median size and efficiency per log-spaced bin,
    efficiencies clamped into (0, 1]."""
    groups: dict[int, list[tuple[float, float]]] = {}
    for size, eff in points:
        if size > 0 and eff > 0:
            groups.setdefault(math.floor(math.log10(size) * bins_per_decade), []).append((size, eff))
    pts = []
    for key in sorted(groups):
        g = groups[key]
        pts.append((median(x for x, _ in g), min(1.0, max(1e-6, median(e for _, e in g)))))
    pts = [p for i, p in enumerate(pts) if i == 0 or p[0] > pts[i - 1][0]]
    return Curve(points=pts)


#: the shipped description's fields a GEMM and copy sweep does not measure (module docstring)
CARRIED = ("sustained_rate", "power", "attention_efficiency", "collective_efficiency", "sm_count")


def unmeasured(shipped: DeviceSpec) -> tuple[dict[str, Any], dict[str, str]]:
    """(fields, sources) of ``shipped`` that :data:`CARRIED` names and it sets. With ``sm_count`` the GEMMs
    lose no wave quantisation on top of the measured curve (``wave_quantisation`` off: the curve is of whole
    kernels, as the shipped H100's is)."""
    default = DeviceSpec.model_fields
    fields = {k: getattr(shipped, k) for k in CARRIED if getattr(shipped, k) != default[k].get_default(
        call_default_factory=True)}
    if "sm_count" in fields:
        fields["wave_quantisation"] = False
    sources = {k: f"not measured by profile-device: the shipped description {shipped.name!r}'s"
                  + (f" ({shipped.sources[k]})" if k in shipped.sources else "") for k in fields}
    return fields, sources


def _memory_bytes(dev: Any) -> int:
    import torch

    if dev.type == "cuda":
        return int(torch.cuda.get_device_properties(dev).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def profile_device(device: str = "cpu", dtype: str | None = None, model: str | None = None,
                   micro_batches: list[int] | None = None, tensor: list[int] | None = None, quick: bool = False,
                   repeats: int | None = None, warmup: int = 2, threads: int | None = None,
                   name: str | None = None) -> DeviceSpec:
    """Measure this machine's ``device`` (module docstring)."""
    import torch

    from profiler.run import check_device, device_name
    from profiler.timing import time_op, time_queued

    if threads is not None:
        torch.set_num_threads(threads)
    dev = check_device(device)
    cuda = dev.type == "cuda"

    def seconds(op: Any) -> float:
        """One call's time: queued kernels on CUDA, the fastest synchronous call on the CPU."""
        if cuda:
            return time_queued(op, dev, calls=10, tries=reps).gpu_s
        return min(time_op(lambda: None, lambda _s: op(), dev, warmup=warmup, repeats=reps).samples)
    dt_name = canonical_dtype(dtype or ("bf16" if cuda else "fp32"))
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}.get(dt_name)
    if torch_dtype is None:
        raise ValueError(f"dtype: profile-device measures fp32, bf16 or fp16, got {dtype!r}")
    reps = repeats or (3 if quick else 7)
    shapes = square_shapes(quick)
    if model is not None:
        from planner.model import PRESETS

        if model not in PRESETS:
            raise ValueError(f"model: unknown preset {model!r}; known: {', '.join(sorted(PRESETS))}")
        spec = PRESETS[model]
        if quick:
            spec = spec.with_(seq=min(spec.seq, 64))
        shapes += model_shapes(spec, micro_batches or ([1] if quick else [1, 2, 4]), tensor or [1, 2, 4, 8])
    shapes = sorted(set(shapes), key=lambda x: 2 * x[0] * x[1] * x[2] * x[3])

    points: list[GemmPoint] = []
    for m, n, k, batch in shapes:
        a = torch.randn(batch, m, k, device=dev, dtype=torch_dtype)
        b = torch.randn(batch, k, n, device=dev, dtype=torch_dtype)
        secs = seconds(lambda a=a, b=b: torch.matmul(a, b))
        points.append(GemmPoint(m=m, n=n, k=k, batch=batch, dtype=dt_name, seconds=max(secs, 1e-9)))
        del a, b

    mem_sizes = [2**p for p in range(12, 25 if quick else 29, 2)]  # 4 KiB .. 16 MiB (quick) / 256 MiB
    mem_rates: list[tuple[float, float]] = []
    for nbytes in mem_sizes:
        src = torch.empty(nbytes, dtype=torch.uint8, device=dev).fill_(1)
        dst = torch.empty_like(src)
        mem_rates.append((2 * nbytes, 2 * nbytes / max(seconds(lambda src=src, dst=dst: dst.copy_(src)), 1e-12)))
        del src, dst
    # the main memory's rate: copies too large for the GPU's L2 cache (queued copies that fit in it run above
    # the HBM datasheet: 3.85 TB/s for 16 MiB on a lent H100, against 2.9-3.0 for 128-256 MiB); on the CPU, or
    # where no copy outgrows the cache, the best of all
    l2 = int(getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 0)) if cuda else 0
    big = [r for nb, r in mem_rates if nb // 2 >= 2 * l2] if l2 else []
    bandwidth = max(big or [r for _, r in mem_rates])

    x = torch.ones(1, device=dev, dtype=torch_dtype)
    if cuda:
        queued = time_queued(lambda: torch.add(x, x), dev, calls=50, tries=max(reps, 5))
        overhead = queued.gpu_s
        overhead_source = (f"GPU time per add of one-element tensors queued back to back (the launch gap between "
                           f"kernels); the host took {queued.host_s * 1e6:.1f} us to issue each (not modelled)")
    else:
        overhead = time_op(lambda: None, lambda _s: torch.add(x, x), dev, warmup=warmup,
                           repeats=max(reps, 21)).median
        overhead_source = "median add of one-element tensors"

    # the CPU is "cpu", as clusters and `pipeplan profile` name it (platform.processor()'s "x86_64" is an
    # architecture: a profile made on that description warned "timed on 'x86_64'" against every CPU cluster); no
    # shipped description is taken by that generic name (planner/devices/cpu.json's peak is one VM's, not every CPU's)
    label = name or (device_name(dev) if cuda else "cpu")
    shipped = find_device(label) if cuda or name else None
    best = max(p.flops / p.seconds for p in points)
    if shipped is not None:
        try:
            peak, peak_source = shipped.peak(dt_name), f"datasheet peak of the shipped description {shipped.name!r}"
        except ValueError:
            shipped = None
    if shipped is None:
        peak, peak_source = best, "the best GEMM rate measured here: no datasheet peak for this device"
    carried, carried_sources = unmeasured(shipped) if shipped is not None else ({}, {})
    curve = efficiency_curve([(p.flops / 1e9, p.flops / (p.seconds * peak)) for p in points])
    mem_curve = efficiency_curve([(nb / 1e6, min(rate / bandwidth, 1.0)) for nb, rate in mem_rates])
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    where = (f"pipeplan profile-device on {platform.node()} ({label}{'' if cuda else ', ' + device_name(dev)}), "
             f"torch {torch.__version__}, "
             f"{torch.get_num_threads()} thread(s), {when}")
    return DeviceSpec(
        name=label, aliases=[] if shipped is None else [shipped.name], kind="gpu" if cuda else "cpu",
        peak_flops={dt_name: peak}, memory_bytes=_memory_bytes(dev), memory_bandwidth=bandwidth,
        gemm_efficiency={dt_name: curve}, gemm_points=points, gemm_ceiling_flops={dt_name: min(best, peak)},
        memory_efficiency=mem_curve,
        kernel_overhead_s=overhead, **carried,
        sources={**carried_sources, "peak_flops": peak_source,
                 "gemm_efficiency": f"{len(points)} GEMMs (fastest of {reps}) measured by {where}",
                 "gemm_points": where,
                 "gemm_ceiling_flops": f"the fastest GEMM of the sweep (this machine's maximum achievable matmul "
                                       f"FLOP/s over the shapes measured), {where}",
                 "memory_bandwidth": f"best dst.copy_(src) rate (read + write)"
                                     f"{' of copies at least twice the L2 cache' if big else ''}, {where}",
                 "memory_efficiency": f"dst.copy_(src) over {len(mem_sizes)} sizes, {where}",
                 "kernel_overhead_s": f"{overhead_source}, {where}",
                 "memory_bytes": "torch.cuda.get_device_properties" if cuda else "physical memory (sysconf)"},
        notes=(f"measured{' (quick mode)' if quick else ''}; GEMM shapes: square sweep"
               + (f" + the layers of {model}" if model else "")))
