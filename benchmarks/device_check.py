"""Issue 11's GPU check in one call: device table, per-t profile of gpt2-medium, predicted vs measured layers.

Shell entry (device machine, repo root; installs the carried wheels first, see benchmarks/DEVICE_CHECK.md):

    bash benchmarks/device_check.sh run "$OUT"        # = python3 benchmarks/device_check.py --out "$OUT"

Here, on the CPU, in seconds (what tests/test_device_check.py runs):

    python benchmarks/device_check.py --out /tmp/dc --quick

On whatever device it finds (cuda if present, else cpu), within ``--budget-s`` seconds (default 330), each
phase writing its files under ``--out`` as soon as it ends (a run killed at its limit still returns them):

1. ``machine.json``: torch, CUDA, cuDNN, device properties, ``nvidia-smi -q -d CLOCK,POWER,TEMPERATURE,
   PERFORMANCE`` (before, and again right after the sustained GEMM run), the phases' times and errors.
2. ``device.json``: :func:`profiler.device.profile_device` in bf16 (fp32 on the CPU) with the GEMM shapes of
   the model's layers at t = 1, 2, 4, 8 -- the project's own ``pipeplan profile-device``.
3. ``<model>-<dtype>.json``: :func:`profiler.run.profile_model` with ``tensor=[1, 2, 4, 8]`` -- ``pipeplan
   profile --model gpt2-medium --tensor 1,2,4,8 --dtype bf16 --device cuda --micro-batches 1,2,4,8``.
4. ``layer_check.json`` and ``summary.txt``: the operator model's profile of the same model
   (:func:`planner.analytic.analytic_profile`) with the shipped description of the detected device (an H100
   maps to ``planner/devices/h100-sxm5-80gb.json`` by :func:`planner.device.find_device`) and with the
   just-measured ``device.json``, against the measured profile per layer kind, t and micro-batch: forward and
   backward seconds, errors, median |error| per column; the GEMMs of ``device.json`` against the shipped
   description's kernel times; a ``torch.profiler`` kernel table of one block next to the model's per-operator
   times.
5. ``chunks`` (in ``machine.json`` and ``summary.txt``): the GEMMs of the H100 public runs' layers
   (tests/data/h100_public_runs.json: GPT-3 175B at t 4, b 1, s 2048; Nemotron-4 15B at t 4, b 4, s 4096) whole
   and cut as Transformer Engine's tensor-parallel comm-GEMM overlap cuts them (``ring_exchange``: ``t`` GEMMs
   of ``M/t`` rows; ``pipeline``: ``num_splits = 4`` of ``M/4`` rows; TE ``module/base.py initialize_ub`` and
   NeMo's ``userbuffers_bf16_h100_h12288_tp4_mbs1_seqlen2048``), measured against the shipped description's
   kernel time. 175B's chunks have 512 rows, where the wave quantisation of the shipped model (132 SMs, 256 x
   128 tiles) puts them at 55-73% of the whole GEMM's rate; 15B's have 4096. If the measured chunks are that
   slow, the overlap the 175B recipe turns on costs more than it hides (by the shipped model about +2.6 ms of
   chunking against 1.2 ms of collectives per layer and micro-batch: +1.0 s of 175B's 8.9 s, its gap); 15B's
   would hide its collectives at no chunking cost, unless its chunk transfers outlast its chunk GEMMs, which
   one GPU cannot measure (:func:`chunk_shapes`).
6. ``layers`` (in ``machine.json`` and ``summary.txt``): one transformer layer's 1/t shard of each H100 public run
   (GPT-3 175B at t 4, b 1, s 2048, dropout; Nemotron-4 15B at t 4, b 4, s 4096; Nemotron-4 340B at t 8, b 1, s
   4096; their recipes' shapes and kernels from tests/data/h100_public_runs.json) written out in torch -- norm,
   QKV, ``scaled_dot_product_attention`` (causal), projection, dropout + residual, norm, MLP -- timed forward
   and forward + backward with CUDA events, with the attention on torch's FlashAttention-2 backend and, where
   torch has it, on cuDNN's, against the shipped description's operator model of the same layer
   (:func:`planner.operators.layer_operators`, sequence parallelism off: one GPU runs no collectives). The
   operator model puts these layers' GEMMs at 670-790 TFLOP/s; the public runs are predicted 2-13% fast: is
   the compute of these layers already slower than the model says (:func:`public_layer_specs`)?
6b. ``eager`` (in ``machine.json`` and ``summary.txt``): a Llama 3 8B block (sequence 4096, b 1) as torchtitan's
   eager model code runs it -- fp32 RMSNorm ops, separate q/k/v, complex-number RoPE, ``repeat_kv``, SDPA, SwiGLU
   -- forward and forward + backward, plain and under torchtitan's selective op checkpointing, and its RMSNorm
   and SwiGLU alone, against the shipped operator model with ``kernels="eager"`` (:func:`eager_check`):
   torchtitan's published A100 rows are predicted ~15% fast with eager kernels.
7. ``fp8`` (in ``machine.json`` and ``summary.txt``): the GEMMs of the FP8 rows NVIDIA publishes for DGX H100
   (Llama 3 70B at t 4, b 1, s 8192; the NeMo / Megatron-Bridge performance summaries list their dense H100 runs
   in FP8 only) and of 175B at t 4, in bf16 (``torch.matmul``) and in FP8 (``torch._scaled_mm``, e4m3 inputs with
   per-tensor scales, bf16 out: Transformer Engine's delayed-scaling GEMM), with and without the cast of the
   activation to FP8 each time: TFLOP/s of each and the FP8 / bf16 speed-up per shape -- the GEMM rates an FP8
   device description would need (none is measured or published with a source; FP8 is not modelled).
7b. ``contention`` (in ``machine.json`` and ``summary.txt``): what a collective overlapped with compute takes from
   it (:mod:`planner.contention`: NCCL's 24 channels, one resident block each, hold 24 of the SMs while it runs,
   so compute beside it runs at ``1 - 24 / SMs``). One GPU runs no NCCL collective, so 24 blocks of 512 threads
   (NCCL's thread count) stand in for it, launched on a second stream and kept running while the GEMMs of MPT
   13B's layer (b 2, s 2048) and an element-wise add run on the first: blocks that only spin (the SMs held)
   and blocks that copy a buffer (the SMs and HBM traffic, as a collective moves its bytes). Each op's time
   beside them over its time alone, against the model's ``1 / (1 - share)`` (:func:`contention_check`; Triton
   kernels, so the phase needs Triton, which torch's CUDA wheels install).
8. ``sustained_gemm.json``: one large GEMM (8192^3 bf16) timed with CUDA events, a short MAMF-style
   measurement, then after an idle pause continuously for ``--sustain-s`` seconds (shortened to what the
   budget leaves): TFLOP/s per second of the run, first vs last 10 s, with ``nvidia-smi --query-gpu=clocks.sm,
   power.draw,temperature.gpu`` sampled once a second alongside -- does power or clock throttling under
   sustained load make GEMMs slower than a short measurement (issue 11's leading hypothesis for predictions
   ~11% fast on the published A100 and H100 runs)? It runs last because the layer check is the issue's goal;
   the GPU is then warm, which is the state training runs in.

The operator options are those the profiled model really runs, read from the code (:func:`run_options`): the
zoo's attention is written out (``q @ k^T``, scale, ``masked_fill``, softmax, ``@ v``: unfused, no SDPA
kernel) and its dropout is the preset's ``ModelConfig.dropout`` (0.0: ``F.dropout`` returns its input).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import threading
import time
import traceback
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SMI_QUERY = ("timestamp", "clocks.sm", "clocks.mem", "power.draw", "power.draw.instant", "temperature.gpu")
SMI_REASONS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")  # new name, old name


# ----------------------------------------------------------------------------------------------- bookkeeping
@dataclass
class Run:
    """What the run has so far; written out after every phase."""

    out: Path
    budget_s: float
    t0: float = field(default_factory=time.monotonic)
    machine: dict[str, Any] = field(default_factory=dict)
    phases: list[dict[str, Any]] = field(default_factory=list)
    check: dict[str, Any] | None = None
    sustained: dict[str, Any] | None = None
    chunks: list[dict[str, Any]] | None = None
    layers: list[dict[str, Any]] | None = None
    eager: list[dict[str, Any]] | None = None
    fp8: list[dict[str, Any]] | None = None
    contention: list[dict[str, Any]] | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # benchmarks/device_probes.py's phases
    table: str = ""

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def log(self, msg: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {msg}", flush=True)

    def phase(self, name: str, fn, *args: Any) -> Any:
        start = time.monotonic()
        self.log(f"phase {name}: start ({self.left():.0f} s of budget left)")
        rec: dict[str, Any] = {"phase": name}
        try:
            result = fn(*args)
            rec["status"] = "done"
        except Exception as err:  # one phase's failure must not cost the others
            result = None
            rec["status"] = "failed"
            rec["error"] = f"{type(err).__name__}: {err}"
            traceback.print_exc()
        rec["seconds"] = round(time.monotonic() - start, 2)
        self.phases.append(rec)
        self.log(f"phase {name}: {rec['status']} in {rec['seconds']:.1f} s")
        self.save()
        return result

    def skip(self, name: str, why: str) -> None:
        self.phases.append({"phase": name, "status": "skipped", "why": why, "seconds": 0.0})
        self.log(f"phase {name}: skipped ({why})")
        self.save()

    def save(self) -> None:
        write_json(self.out / "machine.json", {**self.machine, "phases": self.phases, "chunks": self.chunks,
                                               "public_layers": self.layers, "eager": self.eager, "fp8": self.fp8,
                                               "contention": self.contention, "probes": self.extra,
                                               "elapsed_s": round(self.elapsed(), 1)})
        (self.out / "summary.txt").write_text(summary_text(self))


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    tmp.replace(path)


def sh(cmd: list[str], timeout: float = 20.0) -> tuple[int, str]:
    """Run ``cmd``; (return code, stdout + stderr); (-1, why) where it cannot run."""
    if shutil.which(cmd[0]) is None:
        return -1, f"{cmd[0]}: not found"
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as err:
        return -1, f"{type(err).__name__}: {err}"
    return p.returncode, (p.stdout + p.stderr).strip()


# ---------------------------------------------------------------------------------------------- 1. machine
def machine_info(torch: Any, dev: Any) -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(), "platform": platform.platform(), "node": platform.node(),
        "cpus": os.cpu_count(), "torch": torch.__version__, "cuda": getattr(torch.version, "cuda", None),
        "device_type": dev.type, "torch_threads": torch.get_num_threads(),
    }
    for key, get in (("cudnn", lambda: torch.backends.cudnn.version()),
                     ("bf16_reduced_precision_reduction",
                      lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction),
                     ("tf32_matmul", lambda: torch.backends.cuda.matmul.allow_tf32)):
        try:
            info[key] = get()
        except Exception as err:  # noqa: BLE001 - recorded, never fatal
            info[key] = f"unavailable: {err}"
    if dev.type == "cuda":
        try:
            props = torch.cuda.get_device_properties(dev)
            info["device_name"] = torch.cuda.get_device_name(dev)
            info["sm_count"] = props.multi_processor_count
            info["memory_bytes"] = props.total_memory
            info["capability"] = f"{props.major}.{props.minor}"
            info["l2_bytes"] = getattr(props, "L2_cache_size", None)
        except Exception as err:  # noqa: BLE001
            info["device_props_error"] = str(err)
    else:
        info["device_name"] = platform.processor() or platform.machine() or "cpu"
    info["nvidia_smi_before"] = sh(["nvidia-smi", "-q", "-d", "CLOCK,POWER,TEMPERATURE,PERFORMANCE"])[1]
    info["nvidia_smi_gpu"] = sh(["nvidia-smi", "--query-gpu=name,driver_version,power.limit,clocks.max.sm,"
                                 "clocks.max.mem,clocks.applications.graphics", "--format=csv"])[1]
    return info


# ---------------------------------------------------------------------------------------------- 2. device
def measure_device(run: Run, args: argparse.Namespace, dev: Any) -> Any:
    from planner.device import save_device
    from profiler.device import profile_device

    spec = profile_device(dev.type if dev.type != "cuda" else str(dev), args.dtype, args.model,
                          args.micro_batches, args.tensor, quick=args.quick, repeats=args.repeats,
                          threads=args.threads)
    save_device(spec, run.out / "device.json")
    dt = next(iter(spec.peak_flops))
    run.log(f"device.json: {spec.name}, {len(spec.gemm_points)} GEMMs, best "
            f"{spec.gemm_ceiling_flops[dt] / 1e12:.1f} TFLOP/s, memory {spec.memory_bandwidth / 1e9:.0f} GB/s, "
            f"kernel overhead {spec.kernel_overhead_s * 1e6:.1f} us")
    return spec


# ---------------------------------------------------------------------------------------------- 3. profile
def model_config(args: argparse.Namespace) -> Any:
    from executor.models import get_config

    config = get_config(args.model)
    if args.quick:  # seconds on two CPU cores: the preset's heads and layout, narrower and shorter
        config = config.with_(seq=min(config.seq, 64), hidden=min(config.hidden, 256),
                              vocab=min(config.vocab, 4096))
    return config


def measure_profile(run: Run, args: argparse.Namespace, dev: Any, config: Any) -> Any:
    from planner.profile import save_profile
    from profiler.run import profile_model

    repeats = args.repeats or (20 if dev.type == "cuda" else 10)
    prof = profile_model(config, args.micro_batches, device=str(dev), dtype=args.dtype, repeats=repeats,
                         warmup=args.warmup, threads=args.threads, tensor=args.tensor)
    save_profile(prof, run.out / f"{args.model}-{args.dtype}.json")
    return prof


# ---------------------------------------------------------------------------------------------- 4. check
def run_options(config: Any, dtype: str) -> tuple[Any, dict[str, str]]:
    """The operator options the zoo's model really runs with, read from its code and config."""
    from executor.models.blocks import SelfAttention
    from planner.operators import OperatorOptions

    source = inspect.getsource(SelfAttention.forward)
    fused = "scaled_dot_product_attention" in source
    dropout = float(getattr(config, "dropout", 0.0))
    opts = OperatorOptions(attention="flash" if fused else "unfused", causal=True, dropout=dropout > 0,
                           sequence_parallel=False, dtype=dtype, grad_accumulation="separate")
    said = {
        "attention": ("flash (F.scaled_dot_product_attention)" if fused else
                      "unfused: the zoo writes attention out (q @ k^T, scale, masked_fill, softmax, @ v; "
                      "no SDPA/flash kernel) -- the operator model's unfused attention is Megatron's one fused "
                      "scale+mask+softmax kernel, the zoo runs three element-wise kernels there"),
        "dropout": f"p = {dropout} (ModelConfig.dropout){': F.dropout returns its input' if dropout == 0 else ''}",
        "dtype": dtype,
        "grad_accumulation": "separate (the profiler's repeated backwards add into .grad: AccumulateGrad)",
        "sequence_parallel": "false",
        "head": "torch's cross_entropy on the logits in the run's dtype (the model: Megatron's fp32 passes); "
                "embedding and head are replicated by the executor, so they are compared at t = 1 only",
        "bias": "nn.Linear adds its bias inside the GEMM (addmm); the model counts Megatron's separate QKV "
                "bias add",
    }
    return opts, said


def shipped_description(name: str, args: argparse.Namespace) -> tuple[Any, str]:
    from planner.device import find_device, get_device

    if args.shipped:
        return get_device(args.shipped), f"--shipped {args.shipped}"
    found = find_device(name)
    if found is not None:
        return found, f"find_device({name!r})"
    low = name.lower()
    if "h100" in low or "h200" in low:  # same GH100 compute; H200's memory is faster (stated in the summary)
        return get_device("H100-SXM5-80GB"), f"no shipped description matches {name!r}: the H100-SXM5-80GB one"
    if args.device_type == "cpu":
        return get_device("cpu"), f"no shipped description matches {name!r}: the shipped 'cpu' one"
    raise ValueError(f"no shipped device description matches {name!r}; pass --shipped NAME")


def shipped_for(dev: Any, args: argparse.Namespace) -> Any:
    """The shipped description of the torch device the phases run on (:func:`shipped_description`) at its burst
    rate (:func:`at_burst`: every phase compares short or queued measurements); looked up inside a phase, so a
    device without one fails that phase, not the run."""
    import torch

    return at_burst(shipped_description(torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", args)[0])


def at_burst(shipped: Any) -> Any:
    """``shipped`` at its burst rate (``sustained_rate`` 1): what a short or queued measurement of one kernel
    (a GEMM, an attention kernel, a block after a rest) is compared with; a run's sustained time is not."""
    return shipped.model_copy(update={"sustained_rate": 1.0})


def layer_check(run: Run, args: argparse.Namespace, config: Any, measured: Any, device_spec: Any) -> dict:
    from planner.analytic import analytic_profile
    from planner.device import load_device

    opts, said = run_options(config, args.dtype)
    spec = config.spec()
    sizes = tuple(sorted(set(args.micro_batches)))
    shipped, how = shipped_description(measured.environment.get("device_name", measured.device), args)
    shipped = at_burst(shipped)  # the profile's layers are short runs
    predicted: dict[str, Any] = {"shipped": analytic_profile(spec, shipped, args.dtype, sizes, tuple(args.tensor),
                                                             opts)}
    descs = {"shipped": f"{shipped.name} ({how})"}
    dev_path = run.out / "device.json"
    if device_spec is not None and dev_path.exists():
        predicted["measured_desc"] = analytic_profile(spec, at_burst(load_device(dev_path)), args.dtype, sizes,
                                                      tuple(args.tensor), opts)
        descs["measured_desc"] = f"{dev_path.name} (measured just now; its GEMM points are the forward shapes)"
    rows = compare_layers(measured, predicted, args.tensor, sizes)
    medians = {f"{label}_{p}": median_abs([r[f"{label}_{p}_err"] for r in rows])
               for label in predicted for p in ("fwd", "bwd")}
    block_medians = {f"{label}_{p}": median_abs([r[f"{label}_{p}_err"] for r in rows if r["kind"] == "transformer"])
                     for label in predicted for p in ("fwd", "bwd")}
    check = {"model": config.name, "dtype": args.dtype, "device": measured.environment.get("device_name"),
             "descriptions": descs, "options": said, "rows": rows, "median_abs_error": medians,
             "median_abs_error_blocks": block_medians,
             "gemms": gemm_check(device_spec, shipped, args.dtype) if device_spec is not None else None}
    try:
        check["kernels"] = kernel_table(args, config, shipped, opts)
    except Exception as err:  # noqa: BLE001 - a diagnostic, never fatal
        check["kernels"] = {"error": f"{type(err).__name__}: {err}"}
    write_json(run.out / "layer_check.json", check)
    run.check = check
    return check


def compare_layers(measured: Any, predicted: dict[str, Any], tensor: list[int], sizes: tuple[int, ...]) -> list[dict]:
    """One row per (layer kind, t, b): measured and predicted forward/backward seconds, errors pred/meas - 1."""
    rows = []
    for kind in ("embedding", "transformer", "lm_head"):
        m_layer = next((lay for lay in measured.layers if lay.kind == kind), None)
        if m_layer is None:
            continue
        for t in (sorted(set(tensor)) if kind == "transformer" else [1]):
            m_times = m_layer.tensor_times.get(t) if m_layer.tensor_times else None
            m_times = m_times or (m_layer if t == 1 else None)
            if m_times is None:
                continue
            for b in sizes:
                row: dict[str, Any] = {"kind": kind, "t": t, "b": b, "meas_fwd": m_times.fwd_time[b],
                                       "meas_bwd": m_times.bwd_time[b]}
                for label, prof in predicted.items():
                    p_layer = next(lay for lay in prof.layers if lay.kind == kind)
                    p_times = p_layer.tensor_times[t] if p_layer.tensor_times and t in p_layer.tensor_times \
                        else p_layer
                    for p in ("fwd", "bwd"):
                        pred = getattr(p_times, f"{p}_time")[b]
                        row[f"{label}_{p}"] = pred
                        row[f"{label}_{p}_err"] = pred / row[f"meas_{p}"] - 1.0
                rows.append(row)
    return rows


def median_abs(values: list[float]) -> float | None:
    vals = [abs(v) for v in values if math.isfinite(v)]
    return statistics.median(vals) if vals else None


def gemm_check(measured_dev: Any, shipped: Any, dtype: str) -> dict:
    """The measured GEMMs against the shipped description's kernel time for the same shapes."""
    from planner.operators import gemm_seconds

    rows = []
    for p in measured_dev.gemm_points:
        pred = gemm_seconds(shipped, p.m, p.n, p.k, p.batch, dtype)
        rows.append({"m": p.m, "n": p.n, "k": p.k, "batch": p.batch, "gflop": p.flops / 1e9,
                     "meas_s": p.seconds, "meas_tflops": p.flops / p.seconds / 1e12, "pred_s": pred,
                     "err": pred / p.seconds - 1.0})
    big = [r for r in rows if r["gflop"] >= 10]
    return {"rows": rows, "median_abs_error": median_abs([r["err"] for r in rows]),
            "median_abs_error_ge_10_gflop": median_abs([r["err"] for r in big])}


def kernel_table(args: argparse.Namespace, config: Any, shipped: Any, opts: Any, top: int = 15) -> dict:
    """``torch.profiler`` of one block's forward and backward (largest b, t = 1 and the largest t) beside the
    operator model's per-operator times: where a block's error comes from."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from executor.models import build_layers
    from executor.tensor_parallel import TensorParallelBlock
    from planner.operators import layer_operators, time_operators
    from profiler.layers import make_inputs
    from profiler.run import DTYPES
    from profiler.tensor import without_collectives

    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    b = max(args.micro_batches)
    out: dict[str, Any] = {}
    for t in sorted({1, max(args.tensor)}):
        block = build_layers(config, 0, 1, 2)[0].to(dev, DTYPES[args.dtype])
        with without_collectives():
            layer = block if t == 1 else TensorParallelBlock.from_block(block, 0, t, None).to(dev, DTYPES[args.dtype])
            layer.train()
            inputs = make_inputs(config, 1, layer, b, dev, DTYPES[args.dtype])
            for _ in range(2):
                layer(*inputs()).backward(torch.ones(b, config.seq, config.hidden, device=dev,
                                                     dtype=DTYPES[args.dtype]))
            if cuda:
                torch.cuda.synchronize(dev)
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            reps = 3
            with profile(activities=acts) as prof:
                for _ in range(reps):
                    y = layer(*inputs())
                    y.backward(torch.ones_like(y))
                if cuda:
                    torch.cuda.synchronize(dev)
        kernels = kernel_rows(prof, reps, cuda)
        pred = time_operators(layer_operators(config.spec(), b, t, opts), shipped, args.dtype)
        out[f"t{t}_b{b}"] = {
            "measured_total_ms_per_iter": sum(k["ms_per_iter"] for k in kernels),
            "measured_top": kernels[:top],
            "predicted_shipped_ms": {name: {"fwd": f * 1e3, "bwd_i": i * 1e3, "bwd_w": w * 1e3}
                                     for name, (f, i, w) in pred.per_op.items()},
            "predicted_total_ms": (pred.fwd + pred.bwd) * 1e3,
        }
        del layer, block
    return out


def kernel_rows(prof: Any, reps: int, cuda: bool) -> list[dict]:
    """A finished ``torch.profiler`` run of ``reps`` iterations as kernels: name, launches and device
    milliseconds per iteration (on the CPU: the aten ops' self time), the longest first."""
    kernels = []
    for e in prof.key_averages():
        dev_us = (getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0) or 0) \
            if cuda else e.self_cpu_time_total
        if dev_us > 0 and (not cuda or getattr(e, "device_type", None) is None
                           or "CUDA" in str(getattr(e, "device_type", ""))):
            kernels.append({"name": e.key[:90], "count_per_iter": e.count / reps, "ms_per_iter": dev_us / reps / 1e3})
    kernels.sort(key=lambda k: -k["ms_per_iter"])
    if not cuda:  # CPU: self time of the aten ops (the top-level ops double-count their children otherwise)
        kernels = [k for k in kernels if k["name"].startswith("aten::")]
    return kernels


# ---------------------------------------------------------------------------------------------- 5. chunks
def chunk_shapes() -> list[tuple[str, int, int, int, int]]:
    """(label, m, n, k, chunks) of the forward GEMMs of the H100 public runs that overlap their tensor-parallel
    collectives (module docstring, item 5): each GEMM whole (``chunks = 1``) and cut into the ``M/chunks``-row
    GEMMs Transformer Engine runs (``t`` for ring exchange, 4 for the pipelined reduce-scatter). ``M = b s``
    tokens, ``n``/``k`` the 1/t shard (QKV ``(a + 2 k_v) d / t``, MLP ``f / t``)."""
    runs = {"175b": (12288, 96, 96, 49152, 1, 2048, 4), "15b": (6144, 48, 8, 24576, 4, 4096, 4)}
    out = []
    for name, (h, a, kv, f, b, seq, t) in runs.items():
        d, m = h // a, b * seq
        gemms = {"qkv": (m, (a + 2 * kv) * d // t, h, t), "proj": (m, h, a * d // t, 4),
                 "fc1": (m, f // t, h, t), "fc2": (m, h, f // t, t)}
        for op, (mm, n, k, c) in gemms.items():
            for chunks in (1, c):
                out.append((f"{name} {op}", mm // chunks, n, k, chunks))
    return out


def chunk_check(run: Run, args: argparse.Namespace, dev: Any) -> list[dict]:
    """Each :func:`chunk_shapes` GEMM timed (its kernels alone, queued behind a sleep kernel: a burst;
    ``chunks`` of them back to back for a cut GEMM) against ``chunks`` times the shipped description's kernel
    time of one chunk at its burst rate. (The first run, 2026-11-27, timed one call after a synchronise, which
    adds the host's ~30 us dispatch: 10% of 175B's 0.22 ms projection.)"""
    shipped = shipped_for(dev, args)
    import torch

    from planner.operators import gemm_seconds
    from profiler.run import DTYPES
    from profiler.timing import time_queued

    dt = DTYPES[args.dtype]
    scale = 1 if dev.type == "cuda" and not args.quick else 16  # the CPU test shrinks every dimension
    rows = []
    for label, m, n, k, chunks in chunk_shapes():
        m, n, k = max(1, m // scale), max(1, n // scale), max(1, k // scale)
        a = torch.randn(m * chunks, k, device=dev, dtype=dt)
        w = torch.randn(k, n, device=dev, dtype=dt)
        parts = list(a.split(m))

        def op(parts: list = parts, w: Any = w) -> None:
            for x in parts:
                torch.matmul(x, w)

        meas = time_queued(op, dev, calls=5, tries=args.repeats or 5).gpu_s
        flops = 2.0 * m * n * k
        pred = chunks * gemm_seconds(shipped, m, n, k, 1, args.dtype)
        rows.append({"label": label, "m": m, "n": n, "k": k, "chunks": chunks, "meas_s": meas,
                     "meas_tflops": chunks * flops / meas / 1e12, "pred_s": pred, "err": pred / meas - 1.0})
        del a, w, parts
    run.chunks = rows
    return rows


def fp8_shapes() -> list[tuple[str, int, int, int]]:
    """(label, m, n, k) of the 1/t-shard forward GEMMs of Llama 3 70B at t 4, b 1, s 8192 (h 8192, 64 query and
    8 key/value heads of 128, f 28672; gate and up in one GEMM) and of GPT-3 175B's MLP at t 4, b 1, s 2048."""
    m = 8192
    return [("70b qkv", m, (64 + 16) * 128 // 4, 8192), ("70b proj", m, 8192, 64 * 128 // 4),
            ("70b fc1", m, 2 * 28672 // 4, 8192), ("70b fc2", m, 8192, 28672 // 4),
            ("175b fc1", 2048, 49152 // 4, 12288)]


def fp8_check(run: Run, args: argparse.Namespace, dev: Any) -> list[dict]:
    """Each :func:`fp8_shapes` GEMM in bf16 and in FP8 (module docstring, item 7), CUDA events, median."""
    import torch

    from profiler.timing import time_op

    # the quick test shrinks every dimension; on a CPU by 128: torch's FP8 GEMMs there are reference loops, 60-300x
    # a bf16 GEMM's time (0.1-0.66 s each at 1/32 on the 2-core machine: 23 s of the test's 37)
    scale = 1 if dev.type == "cuda" and not args.quick else 32 if dev.type == "cuda" else 128
    one = torch.tensor(1.0, device=dev)
    rows = []
    for label, m, n, k in fp8_shapes():
        m, n, k = max(16, m // scale // 16 * 16), max(16, n // scale // 16 * 16), max(16, k // scale // 16 * 16)
        a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)  # (out, in), as a Linear's weight
        a8, w8 = a.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn)

        def bf16(_: Any, a: Any = a, w: Any = w) -> None:
            torch.matmul(a, w.t())

        def fp8(_: Any, a8: Any = a8, w8: Any = w8) -> None:
            torch._scaled_mm(a8, w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

        def fp8_cast(_: Any, a: Any = a, w8: Any = w8) -> None:
            torch._scaled_mm(a.to(torch.float8_e4m3fn), w8.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

        flops = 2.0 * m * n * k
        times = {name: time_op(lambda: None, fn, dev, warmup=args.warmup, repeats=args.repeats or 7).median
                 for name, fn in (("bf16", bf16), ("fp8", fp8), ("fp8_cast", fp8_cast))}
        rows.append({"label": label, "m": m, "n": n, "k": k,
                     **{f"{name}_s": t for name, t in times.items()},
                     **{f"{name}_tflops": flops / t / 1e12 for name, t in times.items()},
                     "speedup": times["bf16"] / times["fp8"], "speedup_cast": times["bf16"] / times["fp8_cast"]})
        del a, w, a8, w8
    run.fp8 = rows
    return rows


# ------------------------------------------------------------------------------------------ 7b. contention
#: blocks and threads per block of the stand-in for a collective (NCCL's channels: planner/devices/*.json
#: ``collective_efficiency.channels``; NCCL runs 512 threads per channel block, NCCL_NTHREADS' default)
CONTENTION_BLOCKS, CONTENTION_WARPS = 24, 16


def contention_ops() -> list[tuple[str, int, int, int]]:
    """(label, m, n, k) of MPT 13B's layer GEMMs at b 2, s 2048 (h 5120; FSDP, t 1: torchtitan's and MosaicML's
    runs overlap their gathers with these), and an element-wise add of the layer's activations (n = k = 0:
    ``m`` elements)."""
    m, h = 2 * 2048, 5120
    return [("qkv", m, 3 * h, h), ("fc1", m, 4 * h, h), ("fc2", m, h, 4 * h), ("add", m * h, 0, 0)]


def contention_rows(times: dict[tuple[str, str], float], sm_count: int | None,
                    blocks: int = CONTENTION_BLOCKS) -> list[dict]:
    """Rows of the contention table from the measured seconds per (op, beside) (``beside``: ``alone``, ``spin``,
    ``copy``): each op's time beside the stand-in over its time alone, and the model's ratio ``1 / (1 - share)``
    with ``share = blocks / sm_count`` (:func:`planner.contention.collective_share`)."""
    share = blocks / sm_count if sm_count else None
    rows = []
    for label in dict.fromkeys(op for op, _ in times):
        alone = times.get((label, "alone"))
        row: dict[str, Any] = {"label": label, "alone_s": alone, "share": share,
                               "predicted_ratio": 1.0 / (1.0 - share) if share is not None else None}
        for beside in ("spin", "copy"):
            t = times.get((label, beside))
            row[f"{beside}_s"] = t
            row[f"{beside}_ratio"] = t / alone if t and alone else None
        rows.append(row)
    return rows


def _contention_kernels() -> tuple[Any, Any]:
    """The stand-in's two Triton kernels: ``spin`` keeps its blocks busy on arithmetic for ``iters`` rounds
    (the SMs held, no memory traffic); ``copy`` copies ``src`` to ``dst`` ``passes`` times, each block a strided
    share of it (the SMs and the HBM bytes a collective moves)."""
    import triton
    import triton.language

    # Triton resolves the names a kernel uses in its function's globals (this module's), not in this closure
    globals()["tl"] = tl = triton.language

    @triton.jit
    def spin(out_ptr, iters):  # noqa: ANN001, ANN202
        x = tl.program_id(0).to(tl.float32) + tl.arange(0, 512).to(tl.float32)
        for _ in range(iters):
            x = x * 0.9999999 + 1e-7
        tl.store(out_ptr + tl.program_id(0) * 512 + tl.arange(0, 512), x)

    @triton.jit
    def copy(src, dst, n, passes, BLOCK: tl.constexpr, PROGRAMS: tl.constexpr):  # noqa: ANN001, ANN202, N803
        pid = tl.program_id(0)
        for _ in range(passes):
            for start in range(pid * BLOCK, n, PROGRAMS * BLOCK):
                offs = start + tl.arange(0, BLOCK)
                mask = offs < n
                tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)

    return spin, copy


def contention_check(run: Run, args: argparse.Namespace, dev: Any) -> list[dict]:
    """Module docstring, item 7b: each :func:`contention_ops` op timed alone and beside
    :data:`CONTENTION_BLOCKS` blocks that spin or copy on a second stream (CUDA events around ``reps`` ops; the
    stand-in sized to outlast them), against the shipped description's share."""
    import torch

    if dev.type != "cuda":
        raise RuntimeError("needs a CUDA device (the stand-in is two Triton kernels)")
    spin, copy = _contention_kernels()
    side = torch.cuda.Stream(device=dev)
    scratch = torch.empty(CONTENTION_BLOCKS * 512, device=dev)
    src = torch.randn(64 * 2**20, device=dev, dtype=torch.bfloat16)  # 128 MiB, beyond L2
    dst = torch.empty_like(src)
    reps = 20

    def loop(fn: Any) -> tuple[float, Any, Any]:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / reps, start, end

    def stand_in(kind: str, scale: int) -> Any:
        """Launch the stand-in on the side stream; the event recorded after it."""
        done = torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(side):
            if kind == "spin":
                spin[(CONTENTION_BLOCKS,)](scratch, scale, num_warps=CONTENTION_WARPS)
            else:
                copy[(CONTENTION_BLOCKS,)](src, dst, src.numel(), scale, BLOCK=4096, PROGRAMS=CONTENTION_BLOCKS,
                                           num_warps=CONTENTION_WARPS)
            done.record()
        return done

    def stand_in_seconds(kind: str, scale: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        stand_in(kind, scale)
        side.synchronize()
        return time.perf_counter() - t0

    times: dict[tuple[str, str], float] = {}
    short: list[str] = []  # (op, stand-in) whose stand-in ended before the op's loop did
    for label, m, n, k in contention_ops():
        if n:
            a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)

            def op(a: Any = a, w: Any = w) -> None:
                torch.matmul(a, w.t())
        else:
            x, y = (torch.randn(m, device=dev, dtype=torch.bfloat16) for _ in range(2))

            def op(x: Any = x, y: Any = y) -> None:
                torch.add(x, y)
        for _ in range(3):
            op()
        times[(label, "alone")] = alone = loop(op)[0]
        for kind, unit in (("spin", 200_000), ("copy", 4)):  # ~ms each on an H100
            stand_in_seconds(kind, unit)  # compile and warm
            per_unit = stand_in_seconds(kind, unit) / unit
            scale = max(unit, int(3 * (reps * alone + 0.002) / max(per_unit, 1e-12)))  # outlast the loop 3x
            torch.cuda.synchronize()
            done = stand_in(kind, scale)
            torch.cuda._sleep(2_000_000)  # let the stand-in's blocks take their SMs first
            times[(label, kind)], start, end = loop(op)
            side.synchronize()
            if start.elapsed_time(done) < start.elapsed_time(end):
                short.append(f"{label}/{kind}")
        run.log(f"contention {label}: alone {alone * 1e3:.3f} ms, beside spin {times[(label, 'spin')] * 1e3:.3f}, "
                f"beside copy {times[(label, 'copy')] * 1e3:.3f}")
    shipped = shipped_for(dev, args)
    rows = contention_rows(times, shipped.sm_count if shipped is not None else None)
    for r in rows:
        r["stand_in_ended_first"] = [x.split("/")[1] for x in short if x.split("/")[0] == r["label"]]
    run.contention = rows
    return rows


# ---------------------------------------------------------------------------------------------- 6. layers
def public_layer_specs(args: argparse.Namespace) -> list[tuple[str, Any, int, int, Any]]:
    """(label, ModelSpec, micro-batch, t, OperatorOptions) of one layer of each H100 public run (the first row of
    each model in tests/data/h100_public_runs.json, its recipe's options with sequence parallelism off); in
    ``--quick`` mode or on the CPU a small stand-in of the same structure (GQA, squared ReLU, no bias)."""
    from dataclasses import replace

    from planner.fidelity import load_tables, public_runs
    from planner.model import ModelSpec
    from planner.operators import OperatorOptions

    if args.quick or args.device_type != "cuda":
        spec = ModelSpec(name="stand-in", layers=1, hidden=256, heads=4, kv_heads=2, ffn_hidden=1024, seq=128,
                         vocab=512, activation="relu", bias=False)
        return [("stand-in", spec, 1, 2, OperatorOptions(attention="flash", causal=True, dropout=False,
                                                         dtype=args.dtype, grad_accumulation="fused"))]
    first: dict[str, Any] = {}
    for r in public_runs(load_tables(ROOT / "tests" / "data" / "h100_public_runs.json")):
        first.setdefault(r.model, r)
    return [(m, r.spec, r.micro_batch, r.t, replace(r.options(), sequence_parallel=False, dtype=args.dtype))
            for m, r in first.items()]


def layer_shard(spec: Any, b: int, t: int, dropout: bool, dev: Any, dt: Any,
                notes: dict[str, Any] | None = None) -> tuple[Any, Any, list[Any]]:
    """One layer's 1/t shard in plain torch (Megatron's column/row split, no collectives): ``(forward, input,
    parameters)``; ``forward(x, backend)`` runs it with ``scaled_dot_product_attention`` on ``backend``.
    ``notes["gqa_repeated"]`` is set where the backend took no grouped key/value heads and they were repeated
    (extra copies the operator model does not have)."""
    import torch
    import torch.nn.functional as F

    h, d, s = spec.hidden, spec.d, spec.seq
    a_t, k_t, f_t = spec.heads // t, max(spec.k // t, 1), -(-spec.f // t)
    p = 0.1 if dropout else 0.0

    def param(*shape: int, fill: float | None = None) -> Any:
        w = torch.full(shape, fill, device=dev, dtype=dt) if fill is not None else \
            torch.randn(*shape, device=dev, dtype=dt) * 0.02
        return w.requires_grad_()

    bias = spec.bias
    w = {"n1": param(h, fill=1.0), "n1b": param(h, fill=0.0), "n2": param(h, fill=1.0), "n2b": param(h, fill=0.0),
         "qkv": param((a_t + 2 * k_t) * d, h), "proj": param(h, a_t * d), "fc1": param(f_t, h), "fc2": param(h, f_t)}
    if bias:
        w.update(qkv_b=param((a_t + 2 * k_t) * d, fill=0.0), proj_b=param(h, fill=0.0), fc1_b=param(f_t, fill=0.0),
                 fc2_b=param(h, fill=0.0))

    def norm(x: Any, g: str) -> Any:
        if spec.norm == "layernorm":
            return F.layer_norm(x, (h,), w[g], w[g + "b"])
        return F.rms_norm(x, (h,), w[g])

    def attend(q: Any, k: Any, v: Any, backend: Any) -> Any:
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel(backend):
            if k_t == a_t:
                return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
            try:
                return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True, enable_gqa=True)
            except (TypeError, RuntimeError):  # a backend without GQA: the key/value heads repeated
                if notes is not None:
                    notes["gqa_repeated"] = True
                rep = a_t // k_t
                return F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                                      dropout_p=p, is_causal=True)

    def forward(x: Any, backend: Any) -> Any:
        qkv = F.linear(norm(x, "n1"), w["qkv"], w.get("qkv_b"))
        q, k, v = qkv.split([a_t * d, k_t * d, k_t * d], dim=-1)
        q, k, v = (z.reshape(b, s, -1, d).transpose(1, 2) for z in (q, k, v))
        o = attend(q, k, v, backend).transpose(1, 2).reshape(b * s, a_t * d)
        x = x + F.dropout(F.linear(o, w["proj"], w.get("proj_b")), p)
        u = F.linear(norm(x, "n2"), w["fc1"], w.get("fc1_b"))
        u = F.gelu(u, approximate="tanh") if spec.activation == "gelu" else \
            (F.silu(u) if spec.activation == "silu" else torch.square(F.relu(u)))
        return x + F.dropout(F.linear(u, w["fc2"], w.get("fc2_b")), p)

    x = torch.randn(b * s, h, device=dev, dtype=dt, requires_grad=True)
    return forward, x, list(w.values())


def public_layer_check(run: Run, args: argparse.Namespace, dev: Any) -> list[dict]:
    """Each :func:`public_layer_specs` layer timed forward and forward + backward (median of the repeats) per
    attention backend, against the shipped operator model (forward; backward = input + weight gradient) with
    the implementation that backend runs (FlashAttention-2: ``flash2``; cuDNN: ``cudnn``)."""
    shipped = shipped_for(dev, args)
    import torch
    from torch.nn.attention import SDPBackend

    cuda = dev.type == "cuda"
    backends = [("flash2", SDPBackend.FLASH_ATTENTION), ("cudnn", getattr(SDPBackend, "CUDNN_ATTENTION", None))] \
        if cuda else [("math", SDPBackend.MATH)]
    rows = []
    for label, spec, b, t, opts in public_layer_specs(args):
        for row in _time_layer(run, args, dev, shipped, label, spec, b, t, opts, backends):
            rows.append(row)
        if cuda:
            torch.cuda.empty_cache()
    run.layers = rows
    return rows


def _layer_kernels(forward: Any, x: Any, gy: Any, zero: Any, backend: Any, dev: Any, reps: int = 3) -> list[dict]:
    """``torch.profiler`` kernels of ``reps`` forward + backward passes of a :func:`layer_shard` layer."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = dev.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(reps):
            zero()
            forward(x, backend).backward(gy)
        if cuda:
            torch.cuda.synchronize(dev)
    return kernel_rows(prof, reps, cuda)


def _time_layer(run: Run, args: argparse.Namespace, dev: Any, shipped: Any, label: str, spec: Any, b: int, t: int,
                opts: Any, backends: list[tuple[str, Any]]) -> list[dict]:
    """:func:`public_layer_check`'s rows of one layer, one per attention backend."""
    from dataclasses import replace

    import torch

    from planner.operators import layer_operators, time_operators
    from profiler.run import DTYPES
    from profiler.timing import time_op

    notes: dict[str, Any] = {}
    forward, x, params = layer_shard(spec, b, t, opts.dropout, dev, DTYPES[args.dtype], notes)
    gy = torch.randn_like(x)

    def zero() -> None:
        for q in (*params, x):
            q.grad = None

    rows = []
    for impl, backend in backends:
        if backend is None:
            continue
        row: dict[str, Any] = {"label": label, "t": t, "b": b, "seq": spec.seq, "attention": impl}
        try:
            f = time_op(lambda: None, lambda _, k=backend: forward(x, k), dev, warmup=args.warmup,
                        repeats=args.repeats or 10)
            fb = time_op(zero, lambda _, k=backend: forward(x, k).backward(gy), dev, warmup=args.warmup,
                         repeats=args.repeats or 10)
            o = replace(opts, attention_impl=impl) if dev.type == "cuda" else opts
            pt = time_operators(layer_operators(spec, b, t, o), shipped, args.dtype)
            row.update(meas_fwd_s=f.median, meas_bwd_s=max(fb.median - f.median, 0.0), pred_fwd_s=pt.fwd,
                       pred_bwd_s=pt.bwd)
            row["fwd_err"] = pt.fwd / f.median - 1.0
            row["bwd_err"] = pt.bwd / row["meas_bwd_s"] - 1.0 if row["meas_bwd_s"] > 0 else None
            row["fwd_bwd_err"] = (pt.fwd + pt.bwd) / fb.median - 1.0
            if impl == backends[0][0]:  # where the time goes, kernel by kernel, beside the model's operators
                row["kernels"] = _layer_kernels(forward, x, gy, zero, backend, dev)[:12]
                row["pred_per_op_ms"] = {n: [round(v * 1e3, 4) for v in fiw] for n, fiw in pt.per_op.items()}
        except Exception as err:  # one backend's failure (unsupported shape, no cuDNN) keeps the others
            row["error"] = f"{type(err).__name__}: {err}"[:300]
        row["gqa_repeated"] = notes.pop("gqa_repeated", False)
        rows.append(row)
        run.log(f"layer {label} ({impl}): " + (row.get("error") or
                f"fwd {row['meas_fwd_s'] * 1e3:.3f} ms (pred {row['pred_fwd_s'] * 1e3:.3f}), fwd+bwd "
                f"{(row['meas_fwd_s'] + row['meas_bwd_s']) * 1e3:.3f} ms ({fmt_err(row['fwd_bwd_err'])})"))
    return rows


# ------------------------------------------------------------------------------------------ 6b. eager layer
def eager_spec(args: argparse.Namespace) -> tuple[Any, int]:
    """(ModelSpec, micro-batch) of the eager check: Llama 3 8B's layer (GQA 32/8, SwiGLU 14336) at sequence
    4096, b 1 -- torchtitan's published A100 rows are this layer at 8192 (tests/data/torchtitan_runs.json); on
    the CPU or ``--quick`` a small stand-in of the same structure."""
    from planner.model import ModelSpec

    llama = {"gated_mlp": True, "activation": "silu", "norm": "rmsnorm", "position": "rotary", "bias": False,
             "tied_embeddings": False}
    if args.quick or args.device_type != "cuda":
        return ModelSpec(name="stand-in", layers=1, hidden=256, heads=4, kv_heads=2, ffn_hidden=688, seq=128,
                         vocab=512, **llama), 1
    return ModelSpec(name="llama3-8b", layers=1, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, seq=4096,
                     vocab=128256, **llama), 1


def eager_layer(spec: Any, b: int, dev: Any, dt: Any) -> tuple[Any, Any, list[Any]]:
    """One Llama block as torchtitan's model code writes it (``torchtitan/models/llama/model.py`` and
    ``norms.py``, 2024), eager: ``RMSNorm`` as ``(x.float() * rsqrt(pow(2).mean + eps)).type_as(x) * weight``,
    separate wq/wk/wv, the complex-number rotary embedding, ``repeat_kv``, SDPA (causal), wo, the residual add,
    SwiGLU as ``w2(silu(w1(x)) * w3(x))``. ``(forward, input, parameters)``."""
    import torch
    import torch.nn.functional as F

    h, d, s, a, k, f = spec.hidden, spec.d, spec.seq, spec.heads, spec.k, spec.f

    def param(*shape: int, fill: float | None = None) -> Any:
        w = torch.full(shape, fill, device=dev, dtype=dt) if fill is not None else \
            torch.randn(*shape, device=dev, dtype=dt) * 0.02
        return w.requires_grad_()

    w = {"n1": param(h, fill=1.0), "n2": param(h, fill=1.0), "wq": param(a * d, h), "wk": param(k * d, h),
         "wv": param(k * d, h), "wo": param(h, a * d), "w1": param(f, h), "w3": param(f, h), "w2": param(h, f)}
    freqs = 1.0 / (10000.0 ** (torch.arange(0, d, 2, device=dev)[: d // 2].float() / d))
    cis = torch.polar(torch.ones(s, d // 2, device=dev), torch.outer(torch.arange(s, device=dev).float(), freqs))

    def norm(x: Any, g: str) -> Any:
        y = x.float()
        return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(x) * w[g]

    def rope(x: Any) -> Any:
        c = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(c * cis.view(1, s, 1, d // 2)).flatten(3).type_as(x)

    def repeat(x: Any) -> Any:
        n = a // k
        return x if n == 1 else x.unsqueeze(3).expand(b, s, k, n, d).reshape(b, s, a, d)

    def forward(x: Any) -> Any:
        hn = norm(x, "n1")
        q, kk, v = F.linear(hn, w["wq"]), F.linear(hn, w["wk"]), F.linear(hn, w["wv"])
        q, kk, v = q.view(b, s, -1, d), kk.view(b, s, -1, d), v.view(b, s, -1, d)
        q, kk = rope(q), rope(kk)
        o = F.scaled_dot_product_attention(q.transpose(1, 2), repeat(kk).transpose(1, 2),
                                           repeat(v).transpose(1, 2), is_causal=True)
        x = x + F.linear(o.transpose(1, 2).contiguous().view(b, s, -1), w["wo"])
        hn = norm(x, "n2")
        return x + F.linear(F.silu(F.linear(hn, w["w1"])) * F.linear(hn, w["w3"]), w["w2"])

    x = torch.randn(b, s, h, device=dev, dtype=dt, requires_grad=True)
    return forward, x, list(w.values())


def op_checkpointed(forward: Any) -> Any:
    """``forward`` under torchtitan's selective op checkpointing (``_save_list``: mm and the SDPA kernels; every
    second mm recomputed), as ``torch.utils.checkpoint`` with ``create_selective_checkpoint_contexts``."""
    from collections import defaultdict
    from functools import partial

    import torch
    from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

    save = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_flash_attention.default,
            torch.ops.aten._scaled_dot_product_efficient_attention.default}
    cudnn = getattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", None)
    if cudnn is not None:
        save.add(cudnn.default)

    def policy(meta: dict, ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        key = f"{'recompute' if ctx.is_recompute else 'forward'}_mm_count"
        if func == torch.ops.aten.mm.default:
            meta[key] += 1
        keep = func in save and not (func == torch.ops.aten.mm.default and meta[key] % 2 == 0)
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    def context() -> Any:
        return create_selective_checkpoint_contexts(partial(policy, defaultdict(int)))

    return lambda x: checkpoint(forward, x, use_reentrant=False, context_fn=context)


def eager_check(run: Run, args: argparse.Namespace, dev: Any) -> list[dict]:
    """:func:`eager_layer` timed forward and forward + backward, plain and under :func:`op_checkpointed`, and
    its RMSNorm and SwiGLU alone, against the shipped operator model with ``kernels="eager"`` (and ``"fused"``
    beside it, what the model said before eager kernels were modelled); torchtitan's rows are predicted
    15% fast with eager kernels (benchmarks/torchtitan_bench.py): is this layer already slower than the
    model says?"""
    import torch
    import torch.nn.functional as F

    from planner.dtypes import DTYPE_BYTES
    from planner.operators import (
        OperatorOptions,
        eager_rms_norm,
        eager_swiglu,
        layer_operators,
        time_operators,
    )
    from profiler.run import DTYPES
    from profiler.timing import time_op

    shipped = shipped_for(dev, args)
    spec, b = eager_spec(args)
    dt, el = DTYPES[args.dtype], DTYPE_BYTES[args.dtype]
    reps = args.repeats or 10
    rows: list[dict] = []

    def measure(label: str, fwd: Any, x: Any, params: list[Any], pred: Any, fused: Any = None) -> None:
        gy = torch.randn_like(x)

        def zero() -> None:
            for q in (*params, x):
                q.grad = None

        row: dict[str, Any] = {"label": label, "seq": spec.seq, "b": b}
        try:
            f = time_op(lambda: None, lambda _: fwd(x), dev, warmup=args.warmup, repeats=reps)
            fb = time_op(zero, lambda _: fwd(x).backward(gy), dev, warmup=args.warmup, repeats=reps)
            row.update(meas_fwd_s=f.median, meas_fwd_bwd_s=fb.median, pred_fwd_s=pred[0],
                       pred_fwd_bwd_s=pred[0] + pred[1], fwd_err=pred[0] / f.median - 1.0,
                       fwd_bwd_err=(pred[0] + pred[1]) / fb.median - 1.0)
            if fused is not None:
                row.update(fused_fwd_bwd_s=fused[0] + fused[1], fused_err=(fused[0] + fused[1]) / fb.median - 1.0)
        except Exception as err:  # one case's failure (memory, an op the torch lacks) keeps the others
            row["error"] = f"{type(err).__name__}: {err}"[:300]
        rows.append(row)
        said = row.get("error") or (f"fwd+bwd {row['meas_fwd_bwd_s'] * 1e3:.3f} ms, predicted "
                                    f"{row['pred_fwd_bwd_s'] * 1e3:.3f} ({fmt_err(row['fwd_bwd_err'])})")
        run.log(f"eager {label}: {said}")

    def layer_pred(**kw: Any) -> tuple[float, float]:
        o = OperatorOptions(attention="flash", causal=True, dropout=False, dtype=args.dtype, **kw)
        pt = time_operators(layer_operators(spec, b, 1, o), shipped, args.dtype)
        return pt.fwd, pt.bwd

    forward, x, params = eager_layer(spec, b, dev, dt)
    measure("layer", forward, x, params, layer_pred(kernels="eager"), layer_pred())
    measure("layer, op checkpointing", op_checkpointed(forward), x, params, layer_pred(kernels="eager", recompute="op"),
            layer_pred(recompute="op"))
    del forward, x, params
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    rows_n, h, f = b * spec.seq, spec.hidden, spec.f
    xn = torch.randn(rows_n, h, device=dev, dtype=dt, requires_grad=True)
    g = torch.ones(h, device=dev, dtype=dt, requires_grad=True)

    def rms(z: Any) -> Any:
        y = z.float()
        return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-5)).type_as(z) * g

    op = eager_rms_norm("rms", rows_n, h, el)
    pt = time_operators([op], shipped, args.dtype)
    measure("RMSNorm", rms, xn, [g], (pt.fwd, pt.bwd))
    u = torch.randn(rows_n, f, device=dev, dtype=dt, requires_grad=True)
    v = torch.randn(rows_n, f, device=dev, dtype=dt, requires_grad=True)
    pt = time_operators([eager_swiglu("swiglu", rows_n * f, el)], shipped, args.dtype)
    measure("SwiGLU", lambda z: F.silu(z) * v, u, [v], (pt.fwd, pt.bwd))
    run.eager = rows
    return rows


# ---------------------------------------------------------------------------------------------- 7. sustained
class SmiSampler:
    """``nvidia-smi --query-gpu=...`` once a second in a thread (nothing where there is no nvidia-smi)."""

    def __init__(self, period: float = 1.0) -> None:
        self.period, self.samples, self.fields = period, [], list(SMI_QUERY)
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self.available = shutil.which("nvidia-smi") is not None
        if self.available:  # a field this driver does not know fails the whole query: keep the known ones

            def known(fields: list[str]) -> bool:
                return sh(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"], 10)[0] == 0

            if not known(self.fields):
                self.fields = [f for f in self.fields if known([f])]
            self.fields += next(([r] for r in SMI_REASONS if known([r])), [])
            self.available = bool(self.fields)
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> SmiSampler:
        self.t0 = time.monotonic()
        if self.available:
            self._thread.start()
        return self

    def _loop(self) -> None:
        query = ["nvidia-smi", f"--query-gpu={','.join(self.fields)}", "--format=csv,noheader,nounits"]
        while not self._stop.is_set():
            at = time.monotonic() - self.t0
            rc, text = sh(query, 5)
            if rc == 0 and text:
                values = [v.strip() for v in text.splitlines()[0].split(",")]
                self.samples.append({"t": round(at, 2), **dict(zip(self.fields, values, strict=False))})
            self._stop.wait(max(0.0, self.period - (time.monotonic() - self.t0 - at)))

    def stop(self) -> list[dict]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        return self.samples


def _num(text: Any) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def events_seconds(dev: Any, fn: Any, k: int) -> float:
    """Seconds of ``k`` calls of ``fn`` back to back: between two CUDA events (waited for), or the wall clock
    on the CPU."""
    import torch

    if dev.type != "cuda":
        t = time.perf_counter()
        for _ in range(k):
            fn()
        return time.perf_counter() - t
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(k):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def back_to_back(dev: Any, fn: Any, per_chunk: int, seconds: float,
                 progress: Any = None) -> list[tuple[float, int]]:
    """``fn`` called back to back for ``seconds``, timed in chunks of ``per_chunk`` calls: (seconds, calls) per
    chunk on the device's own timeline. On CUDA each chunk is bracketed by events and the host runs at most two
    chunks ahead, so the GPU's queue never runs dry; on the CPU the wall clock. ``progress(chunks)`` is called
    every 10 s (partial results written while a long run goes on)."""
    import torch

    chunks: list[tuple[float, int]] = []
    pending: deque = deque()
    end = last = time.monotonic()
    end += seconds

    def collect(start: Any, stop: Any, k: int) -> None:
        stop.synchronize()
        chunks.append((start.elapsed_time(stop) / 1e3, k))

    while time.monotonic() < end:
        if dev.type == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(per_chunk):
                fn()
            stop.record()
            pending.append((start, stop, per_chunk))
            while len(pending) > 2:
                collect(*pending.popleft())
        else:
            chunks.append((events_seconds(dev, fn, per_chunk), per_chunk))
        if progress is not None and time.monotonic() - last > 10:
            progress(chunks)
            last = time.monotonic()
    while pending:
        collect(*pending.popleft())
    return chunks


def sustained_gemm(run: Run, args: argparse.Namespace, dev: Any, seconds: float, cool: float) -> dict:
    import torch

    from profiler.run import DTYPES

    n = args.gemm_n
    dt = DTYPES[args.dtype]
    a = torch.randn(n, n, device=dev, dtype=dt)
    b = torch.randn(n, n, device=dev, dtype=dt)
    c = torch.empty(n, n, device=dev, dtype=dt)
    flops = 2.0 * n ** 3

    def gemm() -> None:
        torch.matmul(a, b, out=c)

    for _ in range(3):
        gemm()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    short = events_seconds(dev, gemm, 10)  # the MAMF-finder / KINDS.md way: mean of 10 after 3 warm-ups
    result: dict[str, Any] = {"n": n, "dtype": args.dtype, "flops_per_gemm": flops,
                              "short_10_tflops": flops * 10 / short / 1e12, "cool_s": cool, "seconds": seconds}
    per_chunk = max(1, int(round(args.chunk_s / (short / 10))))
    result["gemms_per_chunk"] = per_chunk
    sampler = SmiSampler().start()
    time.sleep(cool)  # idle first: the burst starts from a GPU that has rested (clocks, temperature)
    idle_samples = len(sampler.samples)
    run_start = time.monotonic() - sampler.t0

    def partial(chunks: list[tuple[float, int]]) -> None:
        write_json(run.out / "sustained_gemm.json", {**result, **summarise_chunks(chunks, flops), "partial": True})

    chunks = back_to_back(dev, gemm, per_chunk, seconds, partial)
    samples = sampler.stop()
    result.update(summarise_chunks(chunks, flops))
    result["smi_fields"] = sampler.fields
    result["smi_samples"] = samples
    result["smi_run_start_s"] = round(run_start, 2)
    result.update(smi_summary(samples[:idle_samples], samples[idle_samples:]))
    result["nvidia_smi_after"] = sh(["nvidia-smi", "-q", "-d", "CLOCK,POWER,TEMPERATURE,PERFORMANCE"])[1]
    write_json(run.out / "sustained_gemm.json", result)
    run.sustained = result
    return result


def summarise_chunks(chunks: list[tuple[float, int]], flops: float) -> dict:
    """Per-second TFLOP/s on the device's own timeline (cumulative chunk time: the queue never ran dry)."""
    bins: dict[int, list[float]] = {}
    at = 0.0
    for secs, k in chunks:
        bins.setdefault(int(at + secs / 2), [0.0, 0.0])
        bins[int(at + secs / 2)][0] += secs
        bins[int(at + secs / 2)][1] += k * flops
        at += secs
    per_second = [{"second": s, "tflops": f / t / 1e12} for s, (t, f) in sorted(bins.items()) if t > 0]

    def window(lo: float, hi: float) -> float | None:
        sel = [(t, f) for s, (t, f) in bins.items() if lo <= s < hi and t > 0]
        return sum(f for _, f in sel) / sum(t for t, _ in sel) / 1e12 if sel else None

    total = at
    span = min(10.0, total / 3) if total > 0 else 0.0
    first, last = window(0, max(span, 1)), window(total - span, total + 1) if total >= 2 else None
    return {"run_s": total, "gemms": sum(k for _, k in chunks), "per_second": per_second,
            "burst_first_1s_tflops": window(0, 1), "first_window_tflops": first, "last_window_tflops": last,
            "window_s": span, "last_over_first": (last / first) if first and last else None,
            "mean_tflops": sum(k for _, k in chunks) * flops / total / 1e12 if total > 0 else None}


def smi_summary(idle: list[dict], busy: list[dict]) -> dict:
    def stats(samples: list[dict], key: str) -> dict | None:
        vals = [v for v in (_num(s.get(key)) for s in samples) if v is not None]
        return {"min": min(vals), "median": statistics.median(vals), "max": max(vals)} if vals else None

    out = {}
    for key in ("clocks.sm", "power.draw", "power.draw.instant", "temperature.gpu"):
        out[f"idle_{key}"] = stats(idle, key)
        out[f"busy_{key}"] = stats(busy, key)
        head, tail = busy[:10], busy[-10:]
        out[f"busy_first10_{key}"] = stats(head, key)
        out[f"busy_last10_{key}"] = stats(tail, key)
    reasons = {s.get(k) for s in busy for k in SMI_REASONS if s.get(k)}
    out["busy_clock_event_reasons"] = sorted(reasons)
    return out


# ---------------------------------------------------------------------------------------------- summary
def fmt_ms(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x * 1e3:.3f}"


def _rows(rows: list[dict], head: Any, body: Any) -> list[str]:
    """Summary lines of measured rows: ``head(row)`` then ``body(row)``, or the row's error where it failed."""
    return [head(r) + (f"failed: {r['error']}" if "error" in r else body(r)) for r in rows]


def fmt_err(x: float | None) -> str:
    return "-" if x is None or not math.isfinite(x) else f"{x * 100:+.1f}%"


def layer_table(check: dict) -> str:
    labels = list(check["descriptions"])
    head = f"{'layer':<12}{'t':>3}{'b':>4}{'meas fwd ms':>13}{'meas bwd ms':>13}"
    for label in labels:
        head += f" | {label + ' fwd':>19}{'err':>8}{label + ' bwd':>19}{'err':>8}"
    lines = [head, "-" * len(head)]
    for r in check["rows"]:
        line = f"{r['kind']:<12}{r['t']:>3}{r['b']:>4}{fmt_ms(r['meas_fwd']):>13}{fmt_ms(r['meas_bwd']):>13}"
        for label in labels:
            line += (f" | {fmt_ms(r[f'{label}_fwd']):>19}{fmt_err(r[f'{label}_fwd_err']):>8}"
                     f"{fmt_ms(r[f'{label}_bwd']):>19}{fmt_err(r[f'{label}_bwd_err']):>8}")
        lines.append(line)
    for title, med in (("median |error|, all rows", check["median_abs_error"]),
                       ("median |error|, blocks  ", check["median_abs_error_blocks"])):
        line = f"{title:<45}"
        for label in labels:
            line += (f" | {'':>19}{fmt_err(med[f'{label}_fwd']).lstrip('+'):>8}"
                     f"{'':>19}{fmt_err(med[f'{label}_bwd']).lstrip('+'):>8}")
        lines.append(line)
    return "\n".join(lines)


def summary_text(run: Run) -> str:
    m = run.machine
    out = [f"pipeplan device check (benchmarks/device_check.py), {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
           f"device: {m.get('device_name')} ({m.get('device_type')}), torch {m.get('torch')}, CUDA {m.get('cuda')}, "
           f"cuDNN {m.get('cudnn')}, python {m.get('python')}, {m.get('cpus')} CPUs"
           f"{', QUICK (CPU test mode: shrunk model, few repeats)' if m.get('quick') else ''}",
           f"elapsed {run.elapsed():.1f} s of a {run.budget_s:.0f} s budget; phases: " + ", ".join(
               f"{p['phase']} {p['status']} {p['seconds']:.1f}s" + (f" ({p.get('error') or p.get('why')})"
                                                                    if p["status"] != "done" else "")
               for p in run.phases), ""]
    c = run.check
    if c:
        out += [f"PREDICTED vs MEASURED layer times: {c['model']} in {c['dtype']} on {c['device']}",
                "err = predicted / measured - 1; measured: profiler.run.profile_model (median of the repeats, "
                "CUDA events on the GPU; t > 1: the rank-0 shard without its collectives)"]
        out += [f"  {label}: {desc}" for label, desc in c["descriptions"].items()]
        out += ["operator options, as the profiled model runs:"] + [f"  {k}: {v}" for k, v in c["options"].items()]
        out += ["", layer_table(c), ""]
        g = c.get("gemms")
        if g:
            out += [f"GEMMs of device.json against the shipped description's kernel time: median |error| "
                    f"{fmt_err(g['median_abs_error']).lstrip('+')} over {len(g['rows'])} shapes, "
                    f"{fmt_err(g['median_abs_error_ge_10_gflop']).lstrip('+')} over those of >= 10 GFLOP",
                    f"  {'m':>6}{'n':>6}{'k':>6}{'batch':>6}{'GFLOP':>9}{'meas TFLOP/s':>14}{'meas ms':>10}"
                    f"{'pred ms':>10}{'err':>8}"]
            for r in sorted(g["rows"], key=lambda r: -r["gflop"])[:12]:
                out.append(f"  {r['m']:>6}{r['n']:>6}{r['k']:>6}{r['batch']:>6}{r['gflop']:>9.2f}"
                           f"{r['meas_tflops']:>14.4g}{fmt_ms(r['meas_s']):>10}{fmt_ms(r['pred_s']):>10}"
                           f"{fmt_err(r['err']):>8}")
            out.append("")
        k = c.get("kernels") or {}
        if "error" in k:
            out += [f"kernel table: failed ({k['error']})", ""]
        for key, v in k.items():
            if key == "error":
                continue
            out.append(f"kernels of one block fwd+bwd ({key}): measured {v['measured_total_ms_per_iter']:.3f} ms "
                       f"(sum of self device time), predicted (shipped) {v['predicted_total_ms']:.3f} ms")
            out += [f"  {x['ms_per_iter']:9.3f} ms x{x['count_per_iter']:<5g} {x['name']}" for x in v["measured_top"]]
            out.append("  predicted per operator (fwd / bwd input / bwd weight, ms): " + "; ".join(
                f"{n} {p['fwd']:.3f}/{p['bwd_i']:.3f}/{p['bwd_w']:.3f}" for n, p in v["predicted_shipped_ms"].items()))
            out.append("")
    if run.chunks:
        out += ["GEMMs WHOLE and CUT as Transformer Engine's TP comm-GEMM overlap cuts them (H100 public runs' "
                "shapes; time of all chunks, against chunks x the shipped kernel time of one):",
                f"  {'gemm':<12}{'m':>6}{'n':>7}{'k':>7}{'chunks':>7}{'meas TFLOP/s':>14}{'meas ms':>10}"
                f"{'pred ms':>10}{'err':>8}"]
        out += [f"  {r['label']:<12}{r['m']:>6}{r['n']:>7}{r['k']:>7}{r['chunks']:>7}{r['meas_tflops']:>14.4g}"
                f"{fmt_ms(r['meas_s']):>10}{fmt_ms(r['pred_s']):>10}{fmt_err(r['err']):>8}" for r in run.chunks]
        out.append("")
    if run.fp8:
        out += ["FP8 vs BF16 GEMMs (Llama 3 70B at t 4 and 175B's fc1; torch._scaled_mm, e4m3, per-tensor scales; "
                "+cast: the activation cast to FP8 each time):",
                f"  {'gemm':<10}{'m':>6}{'n':>7}{'k':>7}{'bf16 TF/s':>11}{'fp8 TF/s':>10}{'+cast':>8}{'x':>7}"]
        out += [f"  {r['label']:<10}{r['m']:>6}{r['n']:>7}{r['k']:>7}{r['bf16_tflops']:>11.4g}{r['fp8_tflops']:>10.4g}"
                f"{r['fp8_cast_tflops']:>8.4g}{r['speedup']:>7.3g}" for r in run.fp8]
        out.append("")
    if run.layers:
        out += ["PUBLIC-RUN LAYERS: one layer's 1/t shard of each H100 public run in torch (no collectives), "
                "measured against the shipped operator model (err = predicted / measured - 1):",
                f"  {'layer':<16}{'t':>3}{'b':>3}{'seq':>6} {'attention':<9}{'meas fwd':>10}{'pred fwd':>10}{'err':>8}"
                f"{'meas bwd':>10}{'pred bwd':>10}{'err':>8}{'fwd+bwd err':>13}"]
        out += _rows(run.layers, lambda r: f"  {r['label']:<16}{r['t']:>3}{r['b']:>3}{r['seq']:>6} {r['attention']:<9}",
                     lambda r: f"{fmt_ms(r['meas_fwd_s']):>10}{fmt_ms(r['pred_fwd_s']):>10}{fmt_err(r['fwd_err']):>8}"
                     f"{fmt_ms(r['meas_bwd_s']):>10}{fmt_ms(r['pred_bwd_s']):>10}{fmt_err(r['bwd_err']):>8}"
                     f"{fmt_err(r['fwd_bwd_err']):>13}"
                     + ("  (GQA heads repeated: the backend took no grouped heads)" if r.get("gqa_repeated") else ""))
        for r in run.layers:
            if r.get("kernels"):
                out.append(f"  kernels of {r['label']} ({r['attention']}), fwd+bwd, ms per iteration (x launches):")
                out += [f"    {k['ms_per_iter']:9.3f} x{k['count_per_iter']:<5g} {k['name']}" for k in r["kernels"]]
                out.append("    predicted per operator (fwd / bwd input / bwd weight, ms): " + "; ".join(
                    f"{n} {f:.3f}/{i:.3f}/{w:.3f}" for n, (f, i, w) in r["pred_per_op_ms"].items()))
        out.append("")
    if run.eager:
        out += ["EAGER LAYER: a Llama block as torchtitan's eager code runs it (and its RMSNorm and SwiGLU alone), "
                "measured against the shipped operator model with kernels=eager (fused: the model's fused kernels; "
                "err = predicted / measured - 1):",
                f"  {'case':<26}{'seq':>6}{'meas fwd':>10}{'pred fwd':>10}{'err':>8}{'meas f+b':>10}{'pred f+b':>10}"
                f"{'err':>8}{'fused err':>11}"]
        out += _rows(run.eager, lambda r: f"  {r['label']:<26}{r['seq']:>6}",
                     lambda r: f"{fmt_ms(r['meas_fwd_s']):>10}{fmt_ms(r['pred_fwd_s']):>10}{fmt_err(r['fwd_err']):>8}"
                     f"{fmt_ms(r['meas_fwd_bwd_s']):>10}{fmt_ms(r['pred_fwd_bwd_s']):>10}"
                     f"{fmt_err(r['fwd_bwd_err']):>8}{fmt_err(r.get('fused_err')):>11}")
        out.append("")
    if run.contention:
        out += [f"CONTENTION: each op beside {CONTENTION_BLOCKS} blocks of {32 * CONTENTION_WARPS} threads (a stand-in "
                "for NCCL's channels) over the op alone; predicted 1 / (1 - share), share = blocks / SMs "
                "(planner/contention.py):",
                f"  {'op':<6}{'alone':>10}{'spin':>10}{'x':>7}{'copy':>10}{'x':>7}{'predicted x':>13}"]
        out += [f"  {r['label']:<6}{fmt_ms(r['alone_s']):>10}{fmt_ms(r['spin_s']):>10}{_f(r['spin_ratio'], '.3f'):>7}"
                f"{fmt_ms(r['copy_s']):>10}{_f(r['copy_ratio'], '.3f'):>7}{_f(r['predicted_ratio'], '.3f'):>13}"
                + (f"  (the stand-in ended first: {', '.join(r['stand_in_ended_first'])})"
                   if r.get("stand_in_ended_first") else "")
                for r in run.contention]
        out.append("")
    s = run.sustained
    if s:
        out += [f"SUSTAINED vs BURST GEMM: {s['n']}^3 {s['dtype']}, {s.get('gemms')} GEMMs over "
                f"{s.get('run_s', 0):.1f} s after {s['cool_s']:.0f} s idle",
                f"  TFLOP/s: short (10 after 3 warm-ups) {_f(s['short_10_tflops'])}; burst (first 1 s) "
                f"{_f(s.get('burst_first_1s_tflops'))}; first {s.get('window_s', 0):.3g} s "
                f"{_f(s.get('first_window_tflops'))}; last {s.get('window_s', 0):.3g} s "
                f"{_f(s.get('last_window_tflops'))}; last/first {_f(s.get('last_over_first'))}; "
                f"mean {_f(s.get('mean_tflops'))}",
                "  TFLOP/s per second: " + " ".join(f"{p['tflops']:.4g}" for p in s.get("per_second", []))]
        for key in ("clocks.sm", "power.draw", "power.draw.instant", "temperature.gpu"):
            idle, first, last = (s.get(f"{w}_{key}") for w in ("idle", "busy_first10", "busy_last10"))
            if idle or first or last:
                out.append(f"  {key}: idle {_stat(idle)}, first 10 samples {_stat(first)}, "
                           f"last 10 samples {_stat(last)}")
        if s.get("busy_clock_event_reasons"):
            out.append(f"  clock event reasons while busy: {', '.join(s['busy_clock_event_reasons'])}")
        out.append("")
    if run.extra:
        from benchmarks.device_probes import probes_summary

        out += probes_summary(run.extra)
    out.append(f"files: {', '.join(sorted(p.name for p in run.out.iterdir() if p.is_file() and p.suffix != '.tmp'))}")
    return "\n".join(out) + "\n"


def _f(x: float | None, spec: str = ".4g") -> str:
    return "-" if x is None else format(x, spec)


def _stat(st: dict | None) -> str:
    return "-" if not st else f"{st['median']:g} (min {st['min']:g}, max {st['max']:g})"


# ---------------------------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="folder for the results ($OUT on the device machine)")
    p.add_argument("--quick", action="store_true", help="seconds on the CPU: shrunk model, few repeats (the test)")
    p.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    p.add_argument("--dtype", default=None, help="default bf16 on CUDA, fp32 on the CPU")
    p.add_argument("--model", default="gpt2-medium")
    p.add_argument("--tensor", default="1,2,4,8")
    p.add_argument("--micro-batches", default=None, help="default 1,2,4,8 (quick: 1,2)")
    p.add_argument("--repeats", type=int, default=None,
                   help="timed repeats (default: profile 20 on CUDA, else 10; device 7; quick 3)")
    p.add_argument("--warmup", type=int, default=None, help="default 3 (quick 1)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default 1 on the CPU)")
    p.add_argument("--budget-s", type=float, default=330.0, help="total seconds; later phases shrink or skip")
    p.add_argument("--sustain-s", type=float, default=None, help="sustained GEMM run (default 45; quick 1.5)")
    p.add_argument("--cool-s", type=float, default=None, help="idle seconds before it (default 8; quick 0)")
    p.add_argument("--gemm-n", type=int, default=None, help="its GEMM size (default 8192; quick / CPU 256)")
    p.add_argument("--chunk-s", type=float, default=0.1, help="GEMMs timed per event pair, in seconds")
    p.add_argument("--phases", default=None,
                   help="comma-separated phases to run (default all): machine is always run; device, profile, "
                        "check, chunks, layers, eager, fp8, contention, sustained, and benchmarks/device_probes.py's "
                        "queued, dispatch, attention, sustained_layer, duty_cycle")
    p.add_argument("--duty-s", type=float, default=None,
                   help="duty_cycle: seconds per pattern (default 12; quick / CPU 0.5)")
    p.add_argument("--sustain-layer-s", type=float, default=None,
                   help="sustained_layer: seconds per layer (default 20; quick / CPU 1)")
    p.add_argument("--shipped", default=None, help="the shipped description to predict with (default: by name)")
    args = p.parse_args(argv)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    run = Run(out=args.out, budget_s=args.budget_s)
    import torch

    dev = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    cuda = dev.type == "cuda"
    args.device, args.device_type = str(dev), dev.type
    args.dtype = args.dtype or ("bf16" if cuda else "fp32")
    args.tensor = [int(x) for x in args.tensor.split(",") if x.strip()]
    args.micro_batches = ([int(x) for x in args.micro_batches.split(",") if x.strip()] if args.micro_batches
                          else ([1, 2] if args.quick else [1, 2, 4, 8]))
    if args.quick:
        args.tensor = [t for t in args.tensor if t <= 2] or [1]
        args.repeats = args.repeats or 3
    args.warmup = args.warmup if args.warmup is not None else (1 if args.quick else 3)
    if not cuda and args.threads is None:
        args.threads = 1
    if args.threads:
        torch.set_num_threads(args.threads)
    sustain = args.sustain_s if args.sustain_s is not None else (1.5 if args.quick or not cuda else 45.0)
    cool = args.cool_s if args.cool_s is not None else (8.0 if cuda and not args.quick else 0.0)
    args.gemm_n = args.gemm_n or (8192 if cuda and not args.quick else 256)

    run.machine = run.phase("machine", machine_info, torch, dev) or {}
    run.machine.update({"quick": args.quick, "args": {k: (str(v) if isinstance(v, Path) else v)
                                                       for k, v in vars(args).items()}})
    run.save()
    config = model_config(args)
    chosen = None if not args.phases else {x.strip() for x in args.phases.split(",") if x.strip()}

    def want(name: str) -> bool:
        return chosen is None or name in chosen

    # rough seconds per phase on an H100 (benchmarks/DEVICE_CHECK.md); a phase that does not fit is skipped
    need = {"device": 40, "profile": 100, "check": 20} if cuda and not args.quick else {"device": 1, "profile": 1,
                                                                                      "check": 1}
    device_spec = None
    if not want("device"):
        pass
    elif run.left() > need["device"]:
        device_spec = run.phase("device", measure_device, run, args, dev)
    else:
        run.skip("device", f"{run.left():.0f} s left")
    if cuda:
        torch.cuda.empty_cache()
    measured = None
    if run.left() < need["profile"] and len(args.micro_batches) > 2:
        args.micro_batches = args.micro_batches[:2]  # a shorter profile rather than none
        run.log(f"profile shortened to micro-batches {args.micro_batches}: {run.left():.0f} s left")
    if not want("profile"):
        pass
    elif run.left() > need["profile"] / 3:
        measured = run.phase("profile", measure_profile, run, args, dev, config)
    else:
        run.skip("profile", f"{run.left():.0f} s left")
    if cuda:
        torch.cuda.empty_cache()
    if not want("check"):
        pass
    elif measured is not None:
        run.phase("check", layer_check, run, args, config, measured, device_spec)
    else:
        run.skip("check", "no measured profile")
    if run.check:
        print(layer_table(run.check), flush=True)
    # the GPU checks, each with the seconds it needs on an H100 (else skipped)
    from benchmarks.device_probes import PROBES

    for name, fn, need in (("chunks", chunk_check, 10), ("layers", public_layer_check, 30), ("eager", eager_check, 20),
                           ("fp8", fp8_check, 10), ("contention", contention_check, 15), *PROBES):
        if not want(name):
            continue
        if name == "contention" and not cuda:
            run.skip(name, "needs a CUDA device")
        elif run.left() > (need if cuda and not args.quick else 1):
            run.phase(name, fn, run, args, dev)
            if cuda:
                torch.cuda.empty_cache()
        else:
            run.skip(name, f"{run.left():.0f} s left")
    seconds = min(sustain, run.left() - cool - 15.0) if cuda and not args.quick else sustain
    if not want("sustained"):
        pass
    elif seconds >= min(10.0, sustain):
        run.phase("sustained", sustained_gemm, run, args, dev, seconds, cool)
    else:
        run.skip("sustained", f"{run.left():.0f} s left")
    run.save()
    print(summary_text(run), flush=True)
    return 0 if all(p["status"] != "failed" for p in run.phases) else 1


if __name__ == "__main__":
    sys.exit(main())
