"""The device check's second set of phases (issue 11): what the first GPU run (2026-11-27, H100) left open.

That run (benchmarks/DEVICE_CHECK.md, "First run") found four things these phases measure apart:

1. ``queued``: every GEMM of ``profile-device``'s sweep below ~17 GFLOP took >= 31 us, a 64^3 GEMM too:
   :func:`profiler.timing.time_op` brackets one op with events after a synchronise, so the GPU waits for the
   host to issue the op and the time includes the host's dispatch. Here each GEMM is also timed *queued*:
   ``k`` of them issued while a ``torch.cuda._sleep`` blocker holds the GPU, so the events see only the
   kernels (the host's issue time is checked to be shorter than the blocker, i.e. the queue never ran dry).
   The same for one gpt2-medium block forward + backward at t 1 and 8, b 1 and 8: kernel time against the
   operator model, beside the sync-bracketed time the profile records and the host's issue time.
2. ``dispatch``: host seconds to issue one op (one-element add, 64^3 matmul, ``F.linear`` with autograd,
   layer norm) with the GPU blocked: the floor under a launch-bound layer.
3. ``attention``: ``scaled_dot_product_attention`` alone (causal) at the H100 public runs' per-GPU shapes and at
   the FlashAttention-3 paper's benchmark shape (batch x sequence = 16k tokens, 16 heads of 128), queued,
   forward and forward + backward, on the flash and cuDNN backends, against the shipped attention curves. The
   first run's GPT-3 175B layer spent 0.19 ms in torch's flash forward where the model says 0.087.
4. ``sustained_layer``: the H100 public-run layers (GPT-3 175B, Nemotron-4 15B and 340B) (1/t shard, forward + backward)
   run back to back for ``--sustain-layer-s`` seconds after an idle pause, timed in ~0.1 s chunks with
   ``nvidia-smi`` sampled alongside. The first run's sustained 8192^3 GEMM fell from 780 TFLOP/s (10 GEMMs) to
   670-687 (SM clock 1980 -> ~1330 MHz at the 700 W cap) within the first second; a training step mixes
   GEMMs with memory-bound kernels, so how much of that throttling does a real layer see?
5. ``duty_cycle``: GPT-3 175B's layer in bursts with the GPU idle between them (a step's bubble and exposed
   communication): does the clock recover in the gaps, so that a run with an idle share holds more than the
   busy sustained rate?
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any


def synced_time(dev: Any, issue: Any, reps: int = 5) -> float:
    """What :func:`profiler.timing.time_op` records: synchronise, event, one call, event; the median."""
    from profiler.timing import time_op

    return time_op(lambda: None, lambda _s: issue(), dev, warmup=2, repeats=reps).median


# ------------------------------------------------------------------------------------------------ 1. queued
def queued_check(run: Any, args: argparse.Namespace, dev: Any) -> dict:
    import torch

    from planner.model import PRESETS
    from planner.operators import gemm_seconds
    from profiler.device import model_shapes, square_shapes
    from profiler.run import DTYPES
    from profiler.timing import time_queued

    shipped = _shipped(dev, args)
    dt = DTYPES[args.dtype]
    shapes = sorted(set(square_shapes(args.quick) + model_shapes(
        PRESETS[args.model].with_(seq=min(PRESETS[args.model].seq, 64)) if args.quick else PRESETS[args.model],
        args.micro_batches, args.tensor)), key=lambda s: s[0] * s[1] * s[2] * s[3])
    gemms = []
    for m, n, kk, batch in shapes:
        a = torch.randn(batch, m, kk, device=dev, dtype=dt)
        b = torch.randn(batch, kk, n, device=dev, dtype=dt)
        flops = 2.0 * m * n * kk * batch
        q = time_queued(lambda a=a, b=b: torch.matmul(a, b), dev, calls=20 if not args.quick else 3)
        s = synced_time(dev, lambda a=a, b=b: torch.matmul(a, b), 5 if not args.quick else 2)
        pred = gemm_seconds(shipped, m, n, kk, batch, args.dtype)
        gemms.append({"m": m, "n": n, "k": kk, "batch": batch, "gflop": flops / 1e9, "queued_s": q.gpu_s,
                      "host_s": q.host_s, "valid": q.valid, "synced_s": s, "pred_s": pred,
                      "queued_tflops": flops / q.gpu_s / 1e12, "err_queued": pred / q.gpu_s - 1.0})
        del a, b
    out = {"gemms": gemms, "blocks": _block_rows(run, args, dev, shipped)}
    run.extra["queued"] = out
    return out


def _shipped(dev: Any, args: argparse.Namespace) -> Any:
    """The shipped description at its burst rate: these phases time kernels queued after a rest."""
    from benchmarks.device_check import shipped_for

    return shipped_for(dev, args)


def _block_rows(run: Any, args: argparse.Namespace, dev: Any, shipped: Any) -> list[dict]:
    """One gpt2-medium block (the zoo's, as ``profile`` times it) at t 1 / max t and b 1 / max b: forward +
    backward queued (kernels only), synchronised (as the profile records it), and the host's issue time."""
    import torch

    from benchmarks.device_check import model_config, run_options
    from executor.models import build_layers
    from executor.tensor_parallel import TensorParallelBlock
    from planner.operators import layer_operators, time_operators
    from profiler.layers import make_inputs
    from profiler.run import DTYPES
    from profiler.tensor import without_collectives
    from profiler.timing import time_queued

    config = model_config(args)
    opts, _ = run_options(config, args.dtype)
    dt = DTYPES[args.dtype]
    rows = []
    for t in sorted({1, max(args.tensor)}):
        for b in sorted({min(args.micro_batches), max(args.micro_batches)}):
            block = build_layers(config, 0, 1, 2)[0].to(dev, dt)
            with without_collectives():
                layer = block if t == 1 else TensorParallelBlock.from_block(block, 0, t, None).to(dev, dt)
                layer.train()
                x = make_inputs(config, 1, layer, b, dev, dt)()
                gy = torch.ones(b, config.seq, config.hidden, device=dev, dtype=dt)

                def fwd(layer=layer, x=x) -> Any:
                    return layer(*x)

                def fwd_bwd(layer=layer, x=x, gy=gy) -> None:
                    layer(*x).backward(gy)

                fwd_bwd()  # the backward's first-call set-up; time_queued warms each timed call itself
                qf, qfb = time_queued(fwd, dev, calls=5), time_queued(fwd_bwd, dev, calls=5)
                sf, sfb = synced_time(dev, fwd), synced_time(dev, fwd_bwd)
            pred = time_operators(layer_operators(config.spec(), b, t, opts), shipped, args.dtype)
            rows.append({"t": t, "b": b, "queued_fwd_s": qf.gpu_s, "queued_fwd_bwd_s": qfb.gpu_s,
                         "host_fwd_s": qf.host_s, "host_fwd_bwd_s": qfb.host_s,
                         "valid": qf.valid and qfb.valid, "synced_fwd_s": sf, "synced_fwd_bwd_s": sfb,
                         "pred_fwd_s": pred.fwd, "pred_fwd_bwd_s": pred.fwd + pred.bwd,
                         "err_fwd": pred.fwd / qf.gpu_s - 1.0,
                         "err_fwd_bwd": (pred.fwd + pred.bwd) / qfb.gpu_s - 1.0})
            run.log(f"block t{t} b{b}: queued fwd+bwd {qfb.gpu_s * 1e3:.3f} ms, synced {sfb * 1e3:.3f} ms, "
                    f"host {qfb.host_s * 1e3:.3f} ms, predicted {(pred.fwd + pred.bwd) * 1e3:.3f} ms")
            del layer, block
    return rows


# ---------------------------------------------------------------------------------------------- 2. dispatch
def dispatch_check(run: Any, args: argparse.Namespace, dev: Any) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from profiler.run import DTYPES
    from profiler.timing import time_queued

    dt = DTYPES[args.dtype]
    one = torch.ones(1, device=dev, dtype=dt)
    a = torch.randn(64, 64, device=dev, dtype=dt)
    x = torch.randn(8, 1024, device=dev, dtype=dt)
    w = torch.randn(1024, 1024, device=dev, dtype=dt, requires_grad=True)
    g = torch.ones(1024, device=dev, dtype=dt)
    ops = {"add (1 element)": lambda: torch.add(one, one), "matmul 64^3": lambda: torch.matmul(a, a),
           "linear 8x1024x1024, autograd": lambda: F.linear(x, w),
           "layer_norm 8x1024": lambda: F.layer_norm(x, (1024,), g)}
    rows = []
    for name, op in ops.items():
        q = time_queued(op, dev, calls=200 if not args.quick else 20)
        rows.append({"op": name, "host_s": q.host_s, "gpu_s": q.gpu_s, "valid": q.valid,
                     "synced_s": synced_time(dev, op, 21)})
    run.extra["dispatch"] = rows
    return rows


# --------------------------------------------------------------------------------------------- 3. attention
def attention_shapes(args: argparse.Namespace) -> list[tuple[str, int, int, int, int, int]]:
    """(label, batch, query heads, key/value heads, sequence, head dim) per GPU."""
    if args.quick or args.device_type != "cuda":
        return [("stand-in", 1, 4, 4, 128, 64)]
    from benchmarks.device_check import public_layer_specs

    rows = [("fa3 paper 2k", 8, 16, 16, 2048, 128), ("fa3 paper 4k", 4, 16, 16, 4096, 128)]
    for label, spec, b, t, _ in public_layer_specs(args):
        rows.append((label, b, spec.heads // t, max(spec.k // t, 1), spec.seq, spec.d))
    # the flash kernel's load balance (planner.attention_waves) at other head counts of one sequence: 8 heads
    # (Llama 70B at t = 8) at 4k and 8k, 32 at 2k, 64 at 1k, against the papers' shape's rate at that length
    rows += [("waves 8h 4k", 1, 8, 8, 4096, 128), ("waves 8h 8k", 1, 8, 8, 8192, 128),
             ("waves 32h 2k", 1, 32, 32, 2048, 128), ("waves 64h 1k", 1, 64, 64, 1024, 128)]
    return rows


def attention_check(run: Any, args: argparse.Namespace, dev: Any) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from profiler.run import DTYPES
    from profiler.timing import time_queued

    shipped = _shipped(dev, args)
    dt = DTYPES[args.dtype]
    cuda = dev.type == "cuda"
    backends = [("flash2", SDPBackend.FLASH_ATTENTION), ("cudnn", getattr(SDPBackend, "CUDNN_ATTENTION", None))] \
        if cuda else [("math", SDPBackend.MATH)]
    rows = []
    for label, b, h, kv, s, d in attention_shapes(args):
        q = torch.randn(b, h, s, d, device=dev, dtype=dt, requires_grad=True)
        k = torch.randn(b, kv, s, d, device=dev, dtype=dt, requires_grad=True)
        v = torch.randn(b, kv, s, d, device=dev, dtype=dt, requires_grad=True)
        gy = torch.randn(b, h, s, d, device=dev, dtype=dt)
        fwd_flops = 4.0 * b * h * s * s * d / 2  # causal: half the score matrix (the shipped curves' convention)
        for impl, backend in backends:
            if backend is None:
                continue
            row: dict[str, Any] = {"label": label, "b": b, "heads": h, "kv_heads": kv, "seq": s, "d": d,
                                   "impl": impl}
            try:
                def f(backend=backend, q=q, k=k, v=v, gqa=kv != h) -> Any:
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)

                def fb(f=f, gy=gy) -> None:
                    f().backward(gy)

                tf, tfb = time_queued(f, dev, calls=5), time_queued(fb, dev, calls=5)
                row.update(fwd_s=tf.gpu_s, bwd_s=tfb.gpu_s - tf.gpu_s, valid=tf.valid and tfb.valid,
                           fwd_tflops=fwd_flops / tf.gpu_s / 1e12,
                           bwd_tflops=2.5 * fwd_flops / max(tfb.gpu_s - tf.gpu_s, 1e-12) / 1e12)
                if cuda:
                    pf = shipped.attention_time(fwd_flops, impl, s, backward=False, causal=True, dtype=args.dtype,
                                                heads=b * h)
                    pb = shipped.attention_time(2.5 * fwd_flops, impl, s, backward=True, causal=True,
                                                dtype=args.dtype, heads=b * h)
                    if pf is not None and pb is not None:
                        row.update(pred_fwd_s=pf, pred_bwd_s=pb, err_fwd=pf / row["fwd_s"] - 1.0,
                                   err_bwd=pb / row["bwd_s"] - 1.0 if row["bwd_s"] > 0 else None)
            except Exception as err:  # an unsupported shape or backend keeps the other rows
                row["error"] = f"{type(err).__name__}: {err}"[:300]
            rows.append(row)
        del q, k, v, gy
    run.extra["attention"] = rows
    return rows


def layer_step(args: argparse.Namespace, dev: Any, spec: Any, b: int, t: int, opts: Any) -> tuple[Any, str]:
    """One public-run layer's forward + backward as a call (``device_check.layer_shard``; gradients cleared
    each time), on cuDNN's attention where it takes the shape, else torch's flash (math on the CPU): (the
    call, the backend's name)."""
    import torch
    from torch.nn.attention import SDPBackend

    from benchmarks.device_check import layer_shard
    from profiler.run import DTYPES

    cuda = dev.type == "cuda"
    forward, x, params = layer_shard(spec, b, t, opts.dropout, dev, DTYPES[args.dtype])
    gy = torch.randn_like(x)
    use = [getattr(SDPBackend, "CUDNN_ATTENTION", None) if cuda else SDPBackend.MATH]

    def step() -> None:
        for p in (*params, x):
            p.grad = None
        forward(x, use[0]).backward(gy)

    try:
        step()
    except Exception:  # no cuDNN attention for this shape: torch's flash
        use[0] = SDPBackend.FLASH_ATTENTION if cuda else SDPBackend.MATH
        step()
    return step, str(use[0]).split(".")[-1]


# --------------------------------------------------------------------------------------- 4. sustained layer
def sustained_layer_check(run: Any, args: argparse.Namespace, dev: Any) -> list[dict]:
    import torch

    from benchmarks.device_check import SmiSampler, back_to_back, public_layer_specs, smi_summary
    from profiler.timing import time_queued

    cuda = dev.type == "cuda"
    seconds = args.sustain_layer_s if args.sustain_layer_s is not None else (20.0 if cuda and not args.quick
                                                                               else 1.0)
    cool = 4.0 if cuda and not args.quick else 0.0
    rows = []
    for label, spec, b, t, opts in public_layer_specs(args):
        step, backend_name = layer_step(args, dev, spec, b, t, opts)
        one = time_queued(step, dev, calls=3, tries=1).gpu_s
        per_chunk = max(1, int(round(0.1 / max(one, 1e-6))))
        sampler = SmiSampler().start()
        time.sleep(cool)
        idle = len(sampler.samples)
        chunks = back_to_back(dev, step, per_chunk, seconds)
        samples = sampler.stop()
        row = {"label": label, "t": t, "b": b, "seq": spec.seq, "attention": backend_name,
               "iters_per_chunk": per_chunk, "before_s": one, **chunk_stats(chunks),
               "smi": smi_summary(samples[:idle], samples[idle:]), "smi_samples": samples}
        rows.append(row)
        run.log(f"sustained {label}: first chunk {row['first_chunk_ms']:.3f} ms/iter, first 1 s "
                f"{row['first_1s_ms']:.3f}, last window {row['last_ms']:.3f} ms/iter (last/first chunk "
                f"{row['last_over_first_chunk']:.3f})")
        del step
        if cuda:
            torch.cuda.empty_cache()
    run.extra["sustained_layer"] = rows
    return rows


def chunk_stats(chunks: list[tuple[float, int]]) -> dict[str, Any]:
    """Milliseconds per iteration: first chunk (the burst after the idle pause), first second, last window
    (the last third, at most 5 s) on the device's own timeline; per-second means."""
    at, per_second, timeline = 0.0, {}, []
    for secs, k in chunks:
        timeline.append((at, secs, k))
        sec = int(at + secs / 2)
        tot = per_second.setdefault(sec, [0.0, 0])
        tot[0] += secs
        tot[1] += k
        at += secs

    def window(lo: float, hi: float) -> float:
        sel = [(s, k) for a, s, k in timeline if lo <= a < hi]
        return 1e3 * sum(s for s, _ in sel) / max(sum(k for _, k in sel), 1) if sel else float("nan")

    span = min(5.0, at / 3)
    first = timeline[0][1] / timeline[0][2] * 1e3 if timeline else float("nan")
    last = window(at - span, at + 1)
    return {"run_s": at, "iters": sum(k for _, k in chunks), "first_chunk_ms": first, "first_1s_ms": window(0, 1),
            "last_ms": last, "last_window_s": span, "last_over_first_chunk": last / first if first else float("nan"),
            "per_second_ms": [round(1e3 * s / k, 4) for _, (s, k) in sorted(per_second.items()) if k]}


# ------------------------------------------------------------------------------------------------ 5. duty
#: (label, iterations per burst, milliseconds of gap after each burst, what fills the gap): the idle share of a
#: training step (pipeline bubble) at two granularities, and gaps filled by a collective's stand-in (24 blocks
#: copying 128 MiB buffers: an exposed collective's SMs and memory traffic, what NCCL draws power for)
DUTY_PATTERNS = (("busy", 10, 0.0, "idle"), ("10 it + 10 ms idle", 10, 10.0, "idle"),
                 ("10 it + 20 ms idle", 10, 20.0, "idle"), ("10 it + 45 ms idle", 10, 45.0, "idle"),
                 ("10 it + 90 ms idle", 10, 90.0, "idle"), ("2 it + 4 ms idle", 2, 4.0, "idle"),
                 ("10 it + 20 ms copy", 10, 20.0, "copy"), ("10 it + 45 ms copy", 10, 45.0, "copy"))


def duty_cycle_check(run: Any, args: argparse.Namespace, dev: Any) -> list[dict]:
    """GPT-3 175B's public-run layer (forward + backward) in bursts with the GPU idle between them: the layer's
    time per iteration over the last half of ``--duty-s`` seconds per pattern, against the same layer right
    after a rest. Does a step's idle share (bubble, exposed communication) let the clock recover, so that a
    run with gaps holds more than the busy ``sustained_rate``? (:mod:`planner.power` models it: the patterns
    span 50-100% busy to check its rule, and ``nvidia-smi`` sampled in the rest before each pattern gives the
    board's idle draw, ``idle_w``, which the model's H100 figures estimate.)"""

    from benchmarks.device_check import SmiSampler, events_seconds, public_layer_specs, smi_summary
    from profiler.timing import time_queued

    cuda = dev.type == "cuda"
    seconds = args.duty_s if args.duty_s is not None else (12.0 if cuda and not args.quick else 0.5)
    label, spec, b, t, opts = public_layer_specs(args)[0]
    step, _ = layer_step(args, dev, spec, b, t, opts)
    gap_copy = _copy_gap(dev) if cuda else None
    rows = []
    for name, burst, idle_ms, fill in DUTY_PATTERNS:
        if fill == "copy" and gap_copy is None:
            continue
        sampler = SmiSampler().start()
        time.sleep(3.0 if cuda and not args.quick else 0.0)  # rest: each pattern starts from a cool GPU
        resting = len(sampler.samples)  # the board's draw idle (the first second: right after the last load)
        rested = time_queued(step, dev, calls=3, tries=1).gpu_s
        samples: list[tuple[float, float, int]] = []  # (start on the wall clock, busy seconds, iterations)
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            at = time.monotonic() - t0
            busy = events_seconds(dev, step, burst)
            samples.append((at, busy, burst))
            if idle_ms > 0 and fill == "copy":
                gap_copy(idle_ms / 1e3)
            elif idle_ms > 0:
                time.sleep(idle_ms / 1e3)
        smi = sampler.stop()
        rest, smi = smi[:resting], smi[resting:]
        late = [(bs, k) for at, bs, k in samples if at >= seconds / 2] or [(bs, k) for _, bs, k in samples]
        per_iter = sum(bs for bs, _ in late) / sum(k for _, k in late)
        wall = time.monotonic() - t0
        duty = sum(bs for _, bs, _ in samples) / wall if wall > 0 else float("nan")
        rows.append({"layer": label, "pattern": name, "burst_iters": burst, "idle_ms": idle_ms,
                     "rested_ms": rested * 1e3,
                     "late_ms": per_iter * 1e3, "late_over_rested": per_iter / rested if rested else None,
                     "busy_share": duty, "smi": smi_summary(rest, smi)})
        run.log(f"duty {name}: rested {rested * 1e3:.3f} ms, second half {per_iter * 1e3:.3f} ms per iteration "
                f"(x{per_iter / rested:.3f}), busy {duty:.0%}")
    run.extra["duty_cycle"] = rows
    return rows


def _copy_gap(dev: Any) -> Any:
    """A call that keeps 24 blocks copying a 128 MiB buffer for about ``seconds`` and waits for them
    (device_check's contention stand-in), or None where Triton is missing."""
    import torch

    try:
        from benchmarks.device_check import CONTENTION_BLOCKS, CONTENTION_WARPS, _contention_kernels, events_seconds

        _, copy = _contention_kernels()
    except Exception:
        return None
    src = torch.randn(64 * 2**20, device=dev, dtype=torch.bfloat16)
    dst = torch.empty_like(src)

    def launch(passes: int) -> None:
        copy[(CONTENTION_BLOCKS,)](src, dst, src.numel(), passes, BLOCK=4096, PROGRAMS=CONTENTION_BLOCKS,
                                   num_warps=CONTENTION_WARPS)

    launch(1)
    torch.cuda.synchronize(dev)
    one = events_seconds(dev, lambda: launch(1), 1)

    def gap(seconds: float) -> None:
        launch(max(1, round(seconds / max(one, 1e-6))))
        torch.cuda.synchronize(dev)

    return gap


# ------------------------------------------------------------------------------------------------- summary
PROBES = (("queued", queued_check, 15), ("dispatch", dispatch_check, 5), ("attention", attention_check, 15),
          ("sustained_layer", sustained_layer_check, 60), ("duty_cycle", duty_cycle_check, 60))


def probes_summary(extra: dict[str, Any]) -> list[str]:
    def ms(x: Any) -> str:
        return "-" if x is None else f"{x * 1e3:.4f}"

    def pct(x: Any) -> str:
        return "-" if x is None else f"{x * 100:+.1f}%"

    out: list[str] = []
    q = extra.get("queued")
    if q:
        out += ["QUEUED GEMMs (k issued behind a sleep kernel: kernel time only) vs SYNCED (one op after a "
                "synchronise, as profile-device times it), against the shipped kernel time:",
                f"  {'m':>6} {'n':>6} {'k':>6} {'batch':>5} {'GFLOP':>8} {'queued ms':>10} {'TFLOP/s':>8} "
                f"{'synced ms':>10} {'host ms':>8} {'pred ms':>8} {'err':>7} ok"]
        for g in q["gemms"]:
            out.append(f"  {g['m']:>6} {g['n']:>6} {g['k']:>6} {g['batch']:>5} {g['gflop']:>8.3f} "
                       f"{ms(g['queued_s']):>10} {g['queued_tflops']:>8.1f} {ms(g['synced_s']):>10} "
                       f"{ms(g['host_s']):>8} {ms(g['pred_s']):>8} {pct(g['err_queued']):>7} "
                       f"{'y' if g['valid'] else 'n'}")
        errs = sorted(abs(g["err_queued"]) for g in q["gemms"] if g["valid"])
        big = sorted(abs(g["err_queued"]) for g in q["gemms"] if g["valid"] and g["gflop"] >= 10)
        if errs:
            out.append(f"  median |err| queued: {statistics.median(errs) * 100:.1f}% over {len(errs)}; "
                       f">= 10 GFLOP: {statistics.median(big) * 100 if big else float('nan'):.1f}% over {len(big)}")
        out += ["", "gpt2-medium BLOCK fwd / fwd+bwd: queued (kernels), synced (as the profile records), host issue "
                "time, operator model (shipped):",
                f"  {'t':>2} {'b':>2} {'queued f':>9} {'queued fb':>9} {'synced f':>9} {'synced fb':>9} "
                f"{'host f':>8} {'host fb':>8} {'pred f':>8} {'pred fb':>8} {'err f':>7} {'err fb':>7} ok"]
        for r in q["blocks"]:
            out.append(f"  {r['t']:>2} {r['b']:>2} {ms(r['queued_fwd_s']):>9} {ms(r['queued_fwd_bwd_s']):>9} "
                       f"{ms(r['synced_fwd_s']):>9} {ms(r['synced_fwd_bwd_s']):>9} {ms(r['host_fwd_s']):>8} "
                       f"{ms(r['host_fwd_bwd_s']):>8} {ms(r['pred_fwd_s']):>8} {ms(r['pred_fwd_bwd_s']):>8} "
                       f"{pct(r['err_fwd']):>7} {pct(r['err_fwd_bwd']):>7} {'y' if r['valid'] else 'n'}")
        out.append("")
    d = extra.get("dispatch")
    if d:
        out += ["DISPATCH: host seconds to issue one op with the GPU blocked; synced: one op after a synchronise:"]
        out += [f"  {r['op']:<32} host {r['host_s'] * 1e6:8.1f} us  gpu {r['gpu_s'] * 1e6:8.1f} us  synced "
                f"{r['synced_s'] * 1e6:8.1f} us  {'ok' if r['valid'] else 'queue ran dry'}" for r in d]
        out.append("")
    a = extra.get("attention")
    if a:
        out += ["ATTENTION alone (causal SDPA, queued), against the shipped curves:",
                f"  {'shape':<16} {'b':>2} {'h':>3} {'kv':>3} {'seq':>6} {'impl':<7} {'fwd ms':>8} {'TF/s':>6} "
                f"{'pred':>8} {'err':>7} {'bwd ms':>8} {'TF/s':>6} {'pred':>8} {'err':>7}"]
        for r in a:
            if "error" in r:
                out.append(f"  {r['label']:<16} {r['impl']:<7} {r['error']}")
                continue
            out.append(f"  {r['label']:<16} {r['b']:>2} {r['heads']:>3} {r['kv_heads']:>3} {r['seq']:>6} "
                       f"{r['impl']:<7} {ms(r['fwd_s']):>8} {r['fwd_tflops']:>6.0f} {ms(r.get('pred_fwd_s')):>8} "
                       f"{pct(r.get('err_fwd')):>7} {ms(r['bwd_s']):>8} {r['bwd_tflops']:>6.0f} "
                       f"{ms(r.get('pred_bwd_s')):>8} {pct(r.get('err_bwd')):>7}")
        out.append("")
    dc = extra.get("duty_cycle")
    if dc:
        out += [f"DUTY CYCLE: the {dc[0]['layer']} layer in bursts with the GPU idle between them (ms per iteration, "
                "second half of each pattern, against the layer after a rest):"]
        for r in dc:
            clk = (r.get("smi") or {}).get("busy_clocks.sm")
            pw = (r.get("smi") or {}).get("busy_power.draw")
            rest = (r.get("smi") or {}).get("idle_power.draw")
            out.append(f"  {r['pattern']:<20} rested {r['rested_ms']:.3f}  late {r['late_ms']:.3f}  x"
                       f"{r['late_over_rested']:.3f}  busy {r['busy_share']:.0%}"
                       + (f"  SM clock median {clk['median']:g}" if clk else "")
                       + (f"  power median {pw['median']:g}" if pw else "")
                       + (f"  resting before: {rest['min']:g}-{rest['max']:g} W" if rest else ""))
        out.append("")
    s = extra.get("sustained_layer")
    if s:
        out += ["SUSTAINED LAYER: a public-run layer's fwd+bwd back to back, ms per iteration:"]
        for r in s:
            smi = r.get("smi") or {}
            out.append(f"  {r['label']} t{r['t']} b{r['b']} s{r['seq']} ({r['attention']}): before "
                       f"{r['before_s'] * 1e3:.3f}, first chunk {r['first_chunk_ms']:.3f}, first 1 s "
                       f"{r['first_1s_ms']:.3f}, last {r['last_window_s']:.0f} s {r['last_ms']:.3f}; last/first "
                       f"chunk {r['last_over_first_chunk']:.3f}; {r['iters']} iterations in {r['run_s']:.1f} s")
            out.append(f"    per second: {' '.join(f'{v:.3f}' for v in r['per_second_ms'])}")
            for key, st in smi.items():
                if st:
                    out.append(f"    {key}: {st}")
        out.append("")
    return out
