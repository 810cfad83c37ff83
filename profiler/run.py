"""``profile_model``: measure every layer of a zoo model and return a :class:`planner.profile.ModelProfile`.

Transformer blocks of one kind have the same shape, so by default only the first block of each kind is measured
and its numbers are reused for the other blocks of that kind (PipeDream 3.1 profiles every layer; for a stack of
identical blocks the measurements would differ by noise only). A model has one kind of block, or with experts two:
the blocks whose MLP is the mixture of experts and its ``dense_layers`` (:meth:`planner.model.ModelSpec.moe_layer`;
DeepSeek-V3's first three, Qwen2 MoE's ``mlp_only_layers``), each timed apart (:func:`kind_firsts`).
``all_layers=True`` measures each block. The profile says which in ``notes`` and
``environment["repeated_blocks"]``. Each block's ``params`` are those of the block built (its kind's,
:meth:`planner.model.ModelSpec.block_params`), its ``expert_params`` the routed experts' of a block with experts
(``experts x expert_params()``: what expert parallelism splits; not the shared expert, which it does not), 0 for a
dense block.

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
from planner.profile import LayerProfile, ModelProfile, ShardTimes, checkpointed, shape_of
from profiler.layers import LayerMeasurement, make_inputs, profile_layer

DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

Progress = Callable[[str, int], None]
"""Called as ``progress(layer_name, micro_batch)`` after each measured (layer, size)."""


def kind_firsts(config: ModelConfig) -> dict[bool, int]:
    """The first transformer block (0-based) of each kind, keyed by whether its MLP is a mixture of experts
    (:meth:`planner.model.ModelSpec.moe_layer`): ``{False: 0}`` for a dense model, ``{True: 0}`` for one whose every
    layer routes to experts, ``{False: 0, True: 3}`` for DeepSeek-V3's three dense layers first."""
    out: dict[bool, int] = {}
    for i in range(config.layers):
        out.setdefault(config.moe_layer(i), i)
    return out


def measured_layers(config: ModelConfig, all_layers: bool) -> list[int]:
    """Indices (profile layers) of the layers that are measured: the embedding, the first block of each kind
    (:func:`kind_firsts`) and the head; every layer with ``all_layers``. The other blocks reuse their kind's
    (:func:`source_layer`)."""
    n = config.num_profile_layers
    if all_layers or config.layers == 1:
        return list(range(n))
    return sorted({0, *(1 + i for i in kind_firsts(config).values()), n - 1})


def source_layer(config: ModelConfig, index: int, measured: list[int] | set[int] | dict[int, object]) -> int:
    """The measured profile layer whose numbers profile layer ``index`` takes: itself where measured, else the first
    measured block of its kind (:func:`kind_firsts`)."""
    if index in measured:
        return index
    return 1 + kind_firsts(config)[config.moe_layer(index - 1)]


def block_expert_params(config: ModelConfig, block: int) -> int:
    """Of transformer block ``block``'s parameters, its routed experts' (``experts x expert_params()``: what expert
    parallelism splits, :mod:`planner.expert_parallel`); 0 for a dense block (a model without experts, or one of
    its ``dense_layers``). The shared expert is not among them: every rank keeps it whole."""
    return int(config.experts) * config.expert_params() if config.moe_layer(block) else 0  # type: ignore[arg-type]


def repeated_words(config: ModelConfig, measured: list[int] | set[int] | dict[int, object]) -> str:
    """Which blocks reuse which measured one (``environment["repeated_blocks"]``): ``block.1..block.7 reuse
    block.0``, or per kind ``block.1..block.2 (dense) reuse block.0; block.4..block.7 (experts) reuse block.3``;
    ``none: every layer measured``."""
    names = layer_names(config)
    reused: dict[int, list[int]] = {}
    for i in range(1, config.num_profile_layers - 1):
        src = source_layer(config, i, measured)
        if src != i:
            reused.setdefault(src, []).append(i)
    if not reused:
        return "none: every layer measured"
    kinds = len(kind_firsts(config)) > 1
    parts = []
    for src, users in sorted(reused.items()):
        span = names[users[0]] if len(users) == 1 else f"{names[users[0]]}..{names[users[-1]]}"
        contiguous = users == list(range(users[0], users[-1] + 1))
        listed = span if contiguous else ", ".join(names[i] for i in users)
        kind = f" ({'experts' if config.moe_layer(src - 1) else 'dense'})" if kinds else ""
        parts.append(f"{listed}{kind} reuse{'s' if len(users) == 1 else ''} {names[src]}")
    return "; ".join(parts)


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
                      tensor_times: dict[int, ShardTimes] | None = None, expert_params: int = 0,
                      replicated_params: int = 0) -> LayerProfile:
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
        replicated_params=replicated_params,
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
            names[i], kinds[i], measured[source_layer(config, i, measured)], tied if i == n - 1 and n > 1 else 0,
            shards[source_layer(config, i, measured)] if tensor else None,
            expert_params=block_expert_params(config, i - 1) if kinds[i] == "transformer" else 0,
            replicated_params=config.replicated_attention_params() if kinds[i] == "transformer" else 0,
        )
        for i in range(n)
    ]
    reused = [names[i] for i in range(n) if i not in measured]
    repeated = repeated_words(config, measured)
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
        # the model as planner.model.ModelSpec (what an export writes out: its experts, shared expert, dense layers)
        "model_spec": config.spec().model_dump_json(),
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
            (f"Transformer blocks of one kind have identical shapes: only the first block of each kind "
             f"(a mixture of experts, or dense) was measured, {repeated}. " if len(kind_firsts(config)) > 1 else
             f"Transformer blocks have identical shapes: only block.0 was measured, {repeated}. ")
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
        shape=shape_of(config.spec()),
        source="measured",
        environment=environment,
        notes=notes,
    )
