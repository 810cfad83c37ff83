"""``profile_model``: measure every layer of a zoo model and return a :class:`planner.profile.ModelProfile`.

Transformer blocks of one model all have the same shape, so by default only ``block.0`` is measured and
its numbers are reused for the other blocks (PipeDream 3.1 profiles every layer; for a stack of
identical blocks the measurements would differ by noise only). ``all_layers=True`` measures each block.
The profile says which in ``notes`` and ``environment["repeated_blocks"]``.

Layers are built one at a time (``build_layers(config, seed, i, i + 1)``), so profiling a large preset
needs the memory of one layer, not of the model; the tied LM head then holds its copy of the embedding,
reported in ``tied_params``.
"""

from __future__ import annotations

import json
import platform
from collections.abc import Callable

import torch

from executor.models import ModelConfig, build_layers, get_config, layer_kinds, layer_names
from planner.profile import LayerProfile, ModelProfile, ShardTimes, TransformerShape, checkpointed
from profiler.layers import LayerMeasurement, make_inputs, profile_layer

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

Progress = Callable[[str, int], None]
"""Called as ``progress(layer_name, micro_batch)`` after each measured (layer, size)."""


def measured_layers(config: ModelConfig, all_layers: bool) -> list[int]:
    """Indices of the layers that are measured (the others reuse ``block.0``)."""
    n = config.num_profile_layers
    return list(range(n)) if all_layers or config.layers == 1 else [0, 1, n - 1]


def check_device(device: str, option: str = "device") -> torch.device:
    """``device`` as a :class:`torch.device` the profiler can time on: ``cpu``, ``cuda`` or ``cuda:N`` with CUDA
    present and device ``N`` on this machine; otherwise a ValueError in one line naming ``option``
    (torch's own errors were an AssertionError for CUDA on a CPU-only torch and a RuntimeError listing a
    score of device types for ``tpu``)."""
    known = "cpu, cuda or cuda:N"
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(f"{option}: {device!r} is not one of {known}") from None
    if dev.type == "cpu":
        if dev.index not in (None, 0):
            raise ValueError(f"{option}: {device!r} is not one of {known} (the CPU has no index)")
        return dev
    if dev.type != "cuda":
        raise ValueError(f"{option}: {device!r} is not one of {known}")
    if not torch.cuda.is_available():
        why = "torch without CUDA" if torch.version.cuda is None else "no CUDA GPU visible"
        raise ValueError(f"{option}: cuda is not available here ({why}); profile on cpu, or on a machine "
                         "with a GPU")
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise ValueError(f"{option}: {device!r} is not on this machine ({count} CUDA device"
                         f"{'s' if count != 1 else ''}: cuda:0..cuda:{count - 1})")
    return dev


def device_name(device: torch.device) -> str:
    """``torch.cuda.get_device_name`` on GPU, else the CPU's name (``platform.processor``) or ``cpu``."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def transient_per_sample(m: LayerMeasurement) -> int | None:
    """What a layer held beside its stash while it ran, per sample, from its measured CUDA peak (one forward +
    backward at the largest micro-batch ``b``, :func:`profiler.layers._peak_memory`): the peak less its
    parameter gradients, and less ``b`` times its stash, output and input gradient; None where no peak was
    measured (the CPU) or nothing is left (:class:`planner.profile.LayerProfile`'s
    ``transient_bytes_per_sample``)."""
    if m.peak_memory_bytes is None or not m.fwd:
        return None
    b = max(m.fwd)
    per_sample = m.stashed_bytes_per_sample + m.output_bytes_per_sample + m.input_bytes_per_sample
    left = m.peak_memory_bytes - m.param_bytes - b * per_sample
    return int(left // b) if left > 0 else None


def _to_layer_profile(name: str, kind: str, m: LayerMeasurement, tied_params: int,
                      tensor_times: dict[int, ShardTimes] | None = None, expert_params: int = 0) -> LayerProfile:
    return LayerProfile(
        name=name,
        kind=kind,
        fwd_time={b: t.median for b, t in m.fwd.items()},
        bwd_time={b: t.median for b, t in m.bwd.items()},
        recompute_time={b: t.median for b, t in m.recompute.items()} or None,
        fwd_spread={b: t.spread for b, t in m.fwd.items()},
        bwd_spread={b: t.spread for b, t in m.bwd.items()},
        output_bytes_per_sample=m.output_bytes_per_sample,
        stashed_bytes_per_sample=m.stashed_bytes_per_sample,
        transient_bytes_per_sample=transient_per_sample(m),
        input_bytes_per_sample=m.input_bytes_per_sample,
        held_grad_bytes_per_sample=m.held_grad_bytes_per_sample or None,
        params=m.params,
        param_bytes=m.param_bytes,
        tied_params=tied_params,
        tensor_times=tensor_times,
        expert_params=expert_params,
    )


def profile_model(
    model: str | ModelConfig,
    micro_batches: list[int] | None = None,
    device: str = "cpu",
    dtype: str = "fp32",
    all_layers: bool = False,
    repeats: int = 5,
    warmup: int = 2,
    recompute: bool = False,
    seed: int = 0,
    progress: Progress | None = None,
    threads: int | None = None,
    tensor: list[int] | None = None,
) -> ModelProfile:
    """Profile a preset (by name) or a :class:`ModelConfig` on ``device`` in ``dtype`` (fp32/bf16/fp16).

    ``threads`` sets ``torch.set_num_threads`` first (CPU): on a loaded machine intra-op threads that wait
    for each other inflate the timings (the spreads show it); 1 thread gives stable CPU numbers.
    ``tensor`` (e.g. ``[1, 2, 4, 8]``): also time each layer's tensor-parallel shard at every t
    (:mod:`profiler.tensor`) into ``tensor_times``.
    """
    from profiler.timing import cpu_clock

    if threads is not None:
        torch.set_num_threads(threads)
    config = get_config(model)
    sizes = sorted(set(micro_batches or [1, 2, 4, 8]))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"micro-batch sizes must be >= 1, got {micro_batches}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    dev = check_device(device)
    torch_dtype = DTYPES[dtype]
    names, kinds = layer_names(config), layer_kinds(config)
    n = config.num_profile_layers

    if tensor:
        from profiler.tensor import check_tensor_sizes, measure_shards, replicated

        check_tensor_sizes(config, tensor)
    measured: dict[int, LayerMeasurement] = {}
    shards: dict[int, dict[int, ShardTimes]] = {}
    for index in measured_layers(config, all_layers):
        layer = build_layers(config, seed, index, index + 1)[0].to(dev, torch_dtype)
        layer.train()

        def done(b: int, name: str = names[index]) -> None:
            if progress is not None:
                progress(name, b)

        measured[index] = profile_layer(
            layer,
            lambda b, i=index, lay=layer: make_inputs(config, i, lay, b, dev, torch_dtype),
            sizes,
            dev,
            warmup=warmup,
            repeats=repeats,
            recompute=recompute,
            on_size_done=done,
            checkpointed=checkpointed(kinds[index]),
        )
        if tensor:
            shards[index] = (measure_shards(layer, lambda b, i=index, lay=layer: make_inputs(
                config, i, lay, b, dev, torch_dtype), sizes, tensor, dev, torch_dtype, measured[index],
                warmup=warmup, repeats=repeats, recompute=recompute)
                if kinds[index] == "transformer" else replicated(measured[index], tensor))
        del layer

    tied = config.vocab * config.hidden if config.tied_embeddings else 0
    layers = [
        _to_layer_profile(
            names[i], kinds[i], measured.get(i, measured[1]), tied if i == n - 1 and n > 1 else 0,
            shards.get(i, shards.get(1)) if tensor else None,
        )
        for i in range(n)
    ]
    reused = [names[i] for i in range(n) if i not in measured]
    repeated = f"{reused[0]}..{reused[-1]} reuse block.0" if reused else "none: every layer measured"
    environment = {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "device_name": device_name(dev),
        "threads": str(torch.get_num_threads()),
        "micro_batches": ",".join(map(str, sizes)),
        "repeats": str(repeats),
        "warmup": str(warmup),
        "seed": str(seed),
        "config": json.dumps(config.to_dict(), sort_keys=True),
        "repeated_blocks": repeated,
        # what the times are: CUDA events, or on the CPU core time (one thread) or wall (profiler.timing)
        "clock": "cuda events" if dev.type == "cuda" else cpu_clock()[0],
    }
    if tensor:
        environment["tensor"] = ",".join(map(str, sorted(set(tensor))))
    if dev.type == "cuda":
        environment["peak_memory_bytes"] = json.dumps(
            {names[i]: m.peak_memory_bytes for i, m in measured.items()}, sort_keys=True
        )
        environment["cuda"] = str(torch.version.cuda)
    notes = (
        f"Measured with pipeplan's profiler: median of {repeats} repeats after {warmup} warm-up runs. "
        + (
            f"Transformer blocks have identical shapes: only block.0 was measured, {repeated}. "
            if reused
            else "Every layer was measured. "
        )
        + "The LM head includes the loss; with tied embeddings its params include a copy of the token "
        "embedding (tied_params). recompute_time, when present, is the backward of a checkpointed block "
        "(the embedding's and the head's: their plain backward; full recomputation does not checkpoint them)."
        + (f" tensor_times: each block's rank-0 tensor-parallel shard timed alone at t = "
           f"{', '.join(map(str, sorted(set(tensor))))} without its collectives (profiler.tensor); the "
           "embedding and the head are replicated by our executor, so their times repeat at every t."
           if tensor else "")
    )
    return ModelProfile(
        name=config.name,
        layers=layers,
        device=device_name(dev) if dev.type == "cuda" else "cpu",
        dtype=dtype,
        shape=TransformerShape(
            hidden=config.hidden,
            seq=config.seq,
            heads=config.heads,
            vocab=config.vocab,
            layers=config.layers,
            ffn_hidden=config.ffn_hidden,
        ),
        source="measured",
        environment=environment,
        notes=notes,
    )
