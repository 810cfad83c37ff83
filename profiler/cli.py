"""CLI commands ``profile`` and ``profile-links``; the main CLI adds them with ``register(app)``.

pipeplan profile --model gpt-tiny --micro-batches 1,2,4,8 --out profile.json [--upload http://host:port]
pipeplan profile --hf-config examples/models/llama-3.1-8b/config.json --seq 1024 --micro-batches 1,2 --out llama.json
pipeplan profile --module my_pkg.my_model:build --micro-batches 1,2,4 --out mine.json   # or file.py:build
torchrun --nproc-per-node 2 -m pipeplan profile-links --out cluster.json
pipeplan profile-links --local-procs 2          # spawns 2 gloo processes itself (no torchrun)
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from planner.outpath import out_problem
from planner.profile import ModelProfile, save_profile

console = Console(stderr=True)

#: profile-links' --timeout at most (a day): longer than any wait for peers, far below timedelta's overflow
MAX_TIMEOUT_S = 86400


def _bad(message: str) -> typer.Exit:
    """One line, ``error: ...``, exit status 2, as the other commands refuse bad options (typer's BadParameter
    printed its three-line usage box); raised by the caller: ``raise _bad(...)``."""
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(code=2)


def _parse_ints(text: str, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise _bad(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise _bad(f"{what} must be positive integers, got {text!r}")
    return values


def _check_device(device: str) -> None:
    """Refuse a ``--device`` the profiler cannot time on (:func:`profiler.run.check_device`) before any work."""
    from profiler.run import check_device

    try:
        check_device(device, "--device")
    except ValueError as err:
        raise _bad(str(err)) from None


def upload_profile(profile: ModelProfile, url: str) -> str:
    """POST the profile JSON to ``url + "/profiles"``; returns the server's reply text."""
    import httpx  # optional dependency, checked by the command before profiling

    response = httpx.post(
        url.rstrip("/") + "/profiles",
        content=profile.model_dump_json(),
        headers={"content-type": "application/json"},
        timeout=30.0,
    )
    response.raise_for_status()
    return response.text


def _require_httpx() -> None:
    try:
        import httpx  # noqa: F401
    except ImportError:
        console.print("[red]--upload needs the httpx package: pip install httpx[/red]")
        raise typer.Exit(code=2) from None


def profile(
    model: str | None = typer.Option(None, "--model", help="preset name (gpt-tiny, gpt2-medium, bert-48, ...)"),
    hf_config: Path | None = typer.Option(None, "--hf-config", help="a Hugging Face config.json: the model is "
                                          "built by transformers with random weights (nothing is downloaded)"),
    hf_layers: int = typer.Option(1, "--hf-layers", min=1, help="decoder layers built and measured with "
                                  "--hf-config (the others are identical and reuse the last)"),
    module: str | None = typer.Option(None, "--module", help="your model: pkg.module:build or file.py:build "
                                      "returning (layers, sample, loss); see the README"),
    micro_batches: str = typer.Option("1,2,4,8", help="comma-separated micro-batch sizes"),
    device: str = typer.Option("cpu", help="cpu, cuda or cuda:N"),
    dtype: str = typer.Option("fp32", help="fp32, bf16 or fp16"),
    out: Path = typer.Option(Path("profile.json"), help="where to write the profile JSON"),
    upload: str | None = typer.Option(None, help="API base URL: POST the profile to URL/profiles"),
    all_layers: bool = typer.Option(False, help="measure every block instead of reusing block.0"),
    repeats: int = typer.Option(5, min=1, help="timed repeats per measurement (median kept)"),
    warmup: int = typer.Option(2, min=0, help="untimed warm-up runs per measurement"),
    recompute: bool = typer.Option(False, help="also measure the backward with recomputation"),
    seq: int | None = typer.Option(None, help="override the preset's sequence length"),
    threads: int | None = typer.Option(None, min=1, help="torch CPU threads (default on the CPU: 1, as each rank "
                                                          "of `pipeplan run` runs; elsewhere torch's choice)"),
    tensor: str = typer.Option("", help="also time each layer's tensor-parallel shard at these t (1,2,4,8)"),
) -> None:
    """Profile a model layer by layer (a zoo preset, a Hugging Face config or your own module) and write a
    ModelProfile JSON."""
    if problem := out_problem(out):
        raise _bad(problem)
    from executor.models import get_config  # torch: only when a model is profiled
    from profiler.run import measured_layers, profile_model

    sizes = _parse_ints(micro_batches, "--micro-batches")
    given = [n for n, v in (("--model", model), ("--hf-config", hf_config), ("--module", module)) if v is not None]
    if len(given) != 1:
        got = ", ".join(given) or "none"
        raise _bad(f"give exactly one of --model, --hf-config, --module (got {got})")
    _check_device(device)
    if threads is None and device == "cpu":
        # the executor's ranks run one torch thread each (executor.launch), and one thread is timed in the thread's
        # CPU time, which the machine's load does not lengthen (profiler.timing); torch's choice here (2 on the
        # 2-core machine) was timed on the wall clock: a new user's README profile of gpt-tiny at load 3.4 gave
        # block.0 forwards of 4.7/70/25/87 ms for b = 1/2/4/8 where a rerun gave 0.7-1.2 ms
        threads = 1
    if seq is not None and seq < 1:  # (0 was taken as no --seq by --hf-config, a ValidationError by --model)
        raise _bad(f"--seq must be a positive integer, got {seq}")
    if model is None and (tensor or all_layers):  # (they were ignored: a profile without tensor_times)
        raise _bad(f"{'--tensor' if tensor else '--all-layers'}: only with --model (the zoo's blocks are what "
                   "profiler.tensor shards; --hf-config measures --hf-layers decoder layers, --module every layer)")
    if seq is not None and module is not None:
        raise _bad("--seq: not with --module (its sample(b) makes the micro-batches, their sequence with them)")
    if upload:
        _require_httpx()
    if model is None:
        prof = _profile_layer_model(hf_config, hf_layers, module, seq, sizes, device, dtype, repeats, warmup,
                                    recompute, threads)
        _finish(prof, out, upload)
        return
    try:
        config = get_config(model)
    except ValueError as err:
        raise _bad(str(err)) from None
    if seq is not None:
        from pydantic import ValidationError

        try:
            config = config.with_(seq=seq)
        except ValidationError as err:  # beyond planner.limits' sequence: one line, as the option
            from pipeplan.options import validation_summary

            raise _bad(validation_summary(err, options=True)) from None
    total = len(measured_layers(config, all_layers)) * len(sizes)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task(f"profiling {config.name}", total=total)

        def advance(layer: str, b: int) -> None:
            bar.update(task, advance=1, description=f"{config.name}: {layer} b={b}")

        try:
            prof = profile_model(
                config,
                sizes,
                device=device,
                dtype=dtype,
                all_layers=all_layers,
                repeats=repeats,
                warmup=warmup,
                recompute=recompute,
                progress=advance,
                threads=threads,
                tensor=_parse_ints(tensor, "--tensor") if tensor else None,
            )
        except ValueError as err:
            raise _bad(str(err)) from None
        except RuntimeError as err:
            raise _out_of_memory(err, f"--seq {config.seq}, --micro-batches up to {max(sizes)}") from None
    _finish(prof, out, upload)


def _profile_layer_model(hf_config: Path | None, hf_layers: int, module: str | None, seq: int | None,
                         sizes: list[int], device: str, dtype: str, repeats: int, warmup: int, recompute: bool,
                         threads: int | None) -> ModelProfile:
    """``--hf-config`` (transformers' model) or ``--module`` (the user's factory): a layer list, measured."""
    import torch

    from profiler.layer_model import ContractError, from_factory, profile_layer_model

    if threads is not None:
        torch.set_num_threads(threads)
    try:
        if hf_config is not None:
            from profiler.hf_config import HFConfigError, SeqError
            from profiler.hf_model import built_layers, read_hf_layer_model, repeated_blocks, timing_caveats

            try:
                from pipeplan.options import warn_option

                lm, spec = read_hf_layer_model(hf_config, seq=seq, measure_layers=hf_layers, warn=warn_option)
            except SeqError as err:  # "seq: ...": the option's
                raise _bad(f"--{err}") from None
            except HFConfigError as err:
                raise _bad(f"--hf-config {hf_config}: {err}") from None
            measured = len(built_layers(spec, hf_layers))
            reuse = repeated_blocks(spec, hf_layers)
            env = {"hf_config": str(hf_config), "model_spec": spec.model_dump_json(),
                   "measured_decoder_layers": str(measured), "repeated_blocks": reuse}
            kind = " and ".join([*(["experts or dense"] if spec.dense_layers else []),
                                 *(["with rotary positions or without"] if spec.nope_layers else [])])
            kinds = f"the first of each kind among them, {kind}; " if kind else ""
            notes = (f"Built by transformers from {hf_config} with random weights; {measured} of {spec.layers} "
                     f"decoder layers measured ({kinds}reused: {reuse}).")
            # what the measured layers leave out, warned of and kept in the notes
            for sentence in timing_caveats(spec, lm):
                warn_option(sentence)
                said = sentence.removeprefix("hf-config: ")
                notes += " " + said[:1].upper() + said[1:] + "."  # (not capitalize(): it lowercases the rest)
        else:
            assert module is not None
            lm = from_factory(module)  # (its ValueErrors name --module themselves)
            env, notes = {"module": module}, f"User model from --module {module}."
        total = len(set(lm.repeat)) * len(sizes)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console, transient=True) as bar:
            task = bar.add_task(f"profiling {lm.name}", total=total)

            def advance(layer: str, b: int) -> None:
                bar.update(task, advance=1, description=f"{lm.name}: {layer} b={b}")

            return profile_layer_model(lm, sizes, device=device, dtype=dtype, repeats=repeats, warmup=warmup,
                                       recompute=recompute, progress=advance, notes=notes, environment=env)
    except ContractError as err:  # what the model's own code raised or returned, named after where it came from
        raise _bad(f"--module {module}: {err}" if module is not None else f"--hf-config {hf_config}: {err}") from None
    except ValueError as err:
        raise _bad(str(err)) from None
    except RuntimeError as err:
        raise _out_of_memory(err, (f"--seq {seq}, " if seq is not None else "")
                             + f"--micro-batches up to {max(sizes)}") from None


def _out_of_memory(err: RuntimeError, sizes: str) -> BaseException:
    """A layer that did not fit in memory (torch's allocator: ``DefaultCPUAllocator: can't allocate memory`` on
    the CPU, ``torch.OutOfMemoryError`` on CUDA; the traceback of a many-line C++ message) as one error line
    naming the sizes asked for; any other RuntimeError is returned as it is, to be raised."""
    from profiler.layer_model import is_out_of_memory

    if not is_out_of_memory(err):
        return err
    text = " ".join(str(err).split())
    tried = text[text.find("you tried to allocate"):].split(".")[0] if "you tried to allocate" in text else ""
    return _bad(f"out of memory timing a layer at {sizes}{f' ({tried})' if tried else ''}: give a smaller "
                "--seq or smaller --micro-batches")


def _finish(prof: ModelProfile, out: Path, upload: str | None) -> None:
    """Write the profile, print its first layers, upload it when asked."""
    save_profile(prof, out)
    table = Table(title=f"{prof.name} on {prof.device} ({prof.dtype})")
    for col in ("layer", "b", "fwd ms", "bwd ms", "stash KiB/sample"):
        table.add_column(col)
    shown = {prof.layers[0].name, prof.layers[min(1, len(prof.layers) - 1)].name, prof.layers[-1].name}
    for layer in prof.layers:
        if layer.name in shown:
            for b in layer.micro_batch_sizes:
                fwd, bwd = layer.fwd_time[b] * 1e3, layer.bwd_time[b] * 1e3
                stash = layer.stashed_bytes_per_sample / 1024
                table.add_row(layer.name, str(b), f"{fwd:.3f}", f"{bwd:.3f}", f"{stash:.1f}")
    console.print(table)
    typer.echo(f"wrote {out} (content hash {prof.content_hash()[:12]})")
    if upload:
        reply = upload_profile(prof, upload)
        typer.echo(f"uploaded to {upload.rstrip('/')}/profiles: {reply[:200]}")


def profile_links(
    out: Path = typer.Option(Path("cluster.json"), help="where rank 0 writes the link description"),
    sizes: str = typer.Option("", help="comma-separated message sizes in bytes (default 1 KiB..4 MiB)"),
    repeats: int = typer.Option(5, min=1),
    warmup: int = typer.Option(2, min=0),
    backend: str | None = typer.Option(None, help="gloo or nccl (default: nccl if CUDA, else gloo)"),
    timeout: float = typer.Option(60.0, help="seconds init_process_group waits for the peers"),
    local_procs: int = typer.Option(0, help="spawn this many local gloo processes instead of torchrun"),
    executor_overhead: bool = typer.Option(  # a flag alone (no --no- twin): the help's option column fits 80 columns
        False, "--executor-overhead",
        help="with --local-procs: also measure our executor's per-action overhead (profiler.overhead) "
        "on that many processes; written as executor_overhead (a cluster's `executor` field)"),
) -> None:
    """Measure point-to-point and all-reduce alpha/beta; run under torchrun (or with --local-procs N)."""
    if problem := out_problem(out):
        raise _bad(problem)
    if executor_overhead and not local_procs:
        raise _bad("--executor-overhead needs --local-procs N (it launches the executor itself)")
    if local_procs and local_procs < 2:  # (before any process starts, as every check here)
        raise _bad(f"--local-procs needs at least 2 processes, got {local_procs}")
    if not (math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT_S):  # 0: the ranks' init failed (a traceback)
        raise _bad(f"--timeout must be a number of seconds above 0 and at most {MAX_TIMEOUT_S} (a day), "
                   f"got {timeout:g}")
    if backend is not None and backend not in ("gloo", "nccl"):
        raise _bad(f"--backend must be gloo or nccl, got {backend!r}")
    if backend == "nccl" and local_procs:  # (they ran gloo and wrote "backend": "gloo")
        raise _bad("--backend nccl: not with --local-procs, whose processes measure gloo on this machine "
                   "(run under torchrun for NCCL)")
    import torch
    import torch.distributed as dist

    if backend == "nccl" and not torch.cuda.is_available():
        why = "torch without CUDA" if torch.version.cuda is None else "no CUDA GPU visible"
        raise _bad(f"--backend nccl needs CUDA GPUs ({why}); use gloo")

    from profiler.links import DEFAULT_SIZES, benchmark_links, init_from_env

    message_sizes = _parse_ints(sizes, "--sizes") if sizes else None
    if local_procs:
        from profiler.local_cluster import measure_links

        result = measure_links(local_procs, message_sizes or DEFAULT_SIZES, repeats, warmup, timeout)
    else:
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
            console.print(
                "[red]profile-links: run under torchrun (RANK/WORLD_SIZE unset) or pass --local-procs 2"
            )
            raise typer.Exit(code=2)
        init_from_env(backend, timeout)
        try:
            result = benchmark_links(message_sizes, repeats, warmup)
        finally:
            dist.destroy_process_group()
        if int(os.environ["RANK"]) != 0:
            return
    if executor_overhead:
        from profiler.overhead import measure_overhead

        ex, raw = measure_overhead(procs=local_procs, timeout=timeout * 2)
        result["executor_overhead"] = ex.model_dump(mode="json")
        result["executor_overhead_raw"] = raw
        console.print("executor overhead per action: " + ", ".join(
            f"{k} {getattr(ex, k) * 1e6:.0f} us" for k in ("compute", "send", "recv", "allreduce", "step")))
    out.write_text(json.dumps(result, indent=2) + "\n")
    for key in ("intra_node", "inter_node", "allreduce"):
        if key in result:
            fit = result[key]
            bandwidth = 1 / fit["beta"] / 1e9 if fit["beta"] > 0 else float("inf")
            console.print(
                f"{key}: alpha {fit['alpha'] * 1e6:.1f} us, beta {fit['beta']:.3e} s/B ({bandwidth:.2f} GB/s)"
            )
    typer.echo(f"wrote {out}")


def profile_device_cmd(
    out: Path = typer.Option(Path("device.json"), help="where to write the device description"),
    device: str | None = typer.Option(None, help="cpu or cuda[:i] (default: cuda if present, else cpu)"),
    dtype: str | None = typer.Option(None, help="fp32, bf16 or fp16 (default: bf16 on CUDA, fp32 on CPU)"),
    model: str | None = typer.Option(None, help="also the GEMM shapes of this preset's layers"),
    micro_batches: str = typer.Option("", help="with --model: micro-batch sizes (default 1,2,4)"),
    tensor: str = typer.Option("", help="with --model: tensor-parallel sizes (default 1,2,4,8)"),
    quick: bool = typer.Option(False, help="a few small shapes: seconds (CI)"),
    repeats: int | None = typer.Option(None, min=1, help="timed repeats per shape (default 7, quick 3)"),
    threads: int | None = typer.Option(None, min=1, help="torch.set_num_threads first (CPU)"),
    name: str | None = typer.Option(None, help="the device's name in the description (default: detected)"),
) -> None:
    """Measure this machine's device description with torch (GEMM and memory-copy sweeps).

    Written in planner.device's schema (kernel overhead too): a cluster's `device` may then name the file."""
    if problem := out_problem(out):
        raise _bad(problem)
    import torch

    from planner.device import save_device
    from profiler.device import profile_device

    dev = device or ("cuda" if torch.cuda.is_available() else "cpu")
    _check_device(dev)
    try:
        spec = profile_device(dev, dtype, model, _parse_ints(micro_batches, "--micro-batches") if micro_batches
                              else None, _parse_ints(tensor, "--tensor") if tensor else None, quick, repeats,
                              threads=threads, name=name)
    except ValueError as err:
        raise _bad(str(err)) from None
    save_device(spec, out)
    dt = next(iter(spec.peak_flops))
    big = spec.memory_bandwidth * spec.mem_eff(512e6)  # a copy of 512 MB: past any cache
    console.print(f"{spec.name} ({spec.kind}, {dt}): peak {spec.peak_flops[dt] / 1e9:.1f} GFLOP/s "
                  f"({spec.sources['peak_flops']}), memory {spec.memory_bandwidth / 1e9:.1f} GB/s at best "
                  f"({big / 1e9:.1f} GB/s for 512 MB copies: the efficiency curve below the best), "
                  f"kernel overhead {spec.kernel_overhead_s * 1e6:.1f} us", highlight=False)
    console.print("GEMM efficiency by GFLOP: " + ", ".join(
        f"{g:.3g}: {e:.2f}" for g, e in spec.gemm_efficiency[dt].points))
    typer.echo(f"wrote {out} ({len(spec.gemm_points)} GEMM shapes)")


def register(app: typer.Typer) -> None:
    """Add ``profile``, ``profile-links`` and ``profile-device`` to ``app``."""
    app.command("profile")(profile)
    app.command("profile-links")(profile_links)
    app.command("profile-device")(profile_device_cmd)


if __name__ == "__main__":  # pragma: no cover - manual use: python -m profiler.cli profile --model gpt-tiny
    _app = typer.Typer()
    register(_app)
    _app(sys.argv[1:])
