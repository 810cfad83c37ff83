"""Analytical model profiles from the operator-level layer model, for when no measured profile exists.

:func:`analytic_profile` turns a :class:`planner.model.ModelSpec` and a :class:`planner.device.DeviceSpec`
into a :class:`planner.profile.ModelProfile`: per layer (embedding, each transformer block, the LM head with
its final norm and loss) the times of the operator list of :mod:`planner.operators` at every micro-batch
size ``b`` and, in ``tensor_times``, at every tensor-parallel size ``t`` (the ``1/t`` shard's kernels, so
sharded GEMMs run at their own, lower, efficiency instead of the whole layer's time divided by ``t``).
The t = 1 times are the layer's ``fwd_time``/``bwd_time``/``recompute_time``.

* FLOPs: the GEMMs of the operator list; for GPT shapes they sum to Megatron-LM's (Narayanan et al. SC'21,
  appendix) ``24 s h^2 (1 + s/(6h))`` per layer and sample forward, twice that backward, ``2 s h V`` for
  the LM head.
* Stashed activations: the sum of what each operator saves (Korthikanti et al. 2022, eq. 1/2/4 for GPT
  shapes: ``s h (34 + 5 a s / h)`` bytes per layer and sample at 16 bits, t = 1, unfused attention with
  dropout); the layer output ``el s h`` (what a stage boundary sends) and its input ``el s h`` (all a
  recomputed layer keeps).
* Recomputation: full recomputation re-runs each transformer layer's forward before its backward
  (Megatron-LM 2021-22 ``--checkpoint-activations``: ``ParallelTransformer._checkpointed_forward`` wraps the
  layers only); the embedding and the LM head with its final norm and loss are not checkpointed, so their
  ``recompute_time`` is their plain backward.
* Selective recomputation (``OperatorOptions.recompute = "selective"``, Megatron-LM's
  ``--recompute-granularity selective``; Korthikanti et al. 2022, section 5): a property of the profile,
  like the attention kernel, not a choice of the search (whose space is unchanged: each candidate still
  recomputes fully or not, its ``rc`` column). Without full recomputation a layer re-runs its unfused
  attention core in the backward (in ``bwd_time`` and ``bwd_input_time``) and stashes ``s b h (10 + 24/t)``
  bytes (``34 s b h / t`` with sequence parallelism) instead of eq. 2/4; with full recomputation it re-runs
  its whole forward once, the core included, so ``recompute_time`` is the forward plus the backward
  without the core's re-run (:attr:`planner.operators.PassTimes.recompute`). The environment records it
  (``recompute_granularity: selective``; absent otherwise, so profiles made without it are unchanged).
  torchtitan's selective op checkpointing (``OperatorOptions.recompute = "op"``, ``[activation_checkpoint]
  mode = "selective"``, ``selective_ac_option = "op"``) is the same kind of property: each layer keeps the
  output of every other GEMM and of the attention kernel and re-runs the rest in the backward
  (:func:`planner.operators.checkpoint_ops`); the environment records ``recompute_granularity: op``.
* Kernels (``OperatorOptions.kernels``): Megatron-LM's and Transformer Engine's fused kernels (the default,
  absent from the environment) or eager PyTorch's (``kernels: eager``: torchtitan and Hugging Face code
  without ``torch.compile``, each norm, rotary embedding, activation and residual add as separate ATen
  kernels: :mod:`planner.operators`, "Kernels").
* Attention: the profile's environment records the kernel (``attention``: unfused or flash) and, for the
  flash kernel, its implementation (``attention_impl``: flash2, flash3 or cudnn, timed at its published
  rate on the device where the device has one: :mod:`planner.operators`).
* Mixture of experts (:mod:`planner.moe`): the router, the dispatch, the experts (``OperatorOptions.expert_gemm``,
  recorded as ``expert_gemm``) and the combine in place of the dense MLP, split over t as the dense MLP is, balanced
  routing (said in the notes); a layer's ``expert_params`` (what expert parallelism splits) and, in
  ``expert_times``, its times at every expert-parallel size ``e`` dividing ``E`` (each rank's ``E/e`` experts on the
  tokens routed to them: :mod:`planner.expert_parallel`). A shared expert is a dense MLP beside them (not in
  ``expert_params``: expert parallelism does not split it); the ``dense_layers`` get the dense MLP: one profile per
  kind of layer (window, experts or not).
* Parameters: :meth:`ModelSpec.layer_params` etc.; the LM head's ``V h`` is a copy of the word embedding
  when the model ties them.
"""

from __future__ import annotations

from functools import partial

from pydantic import ValidationError

from planner.device import DeviceSpec, find_device, generic_device, get_device
from planner.dtypes import DTYPE_BYTES, canonical_dtype, dtype_error
from planner.expert_parallel import expert_sizes
from planner.model import ModelSpec, tensor_split_error
from planner.operators import (
    OperatorOptions,
    PassTimes,
    embedding_operators,
    head_operators,
    layer_operators,
    time_operators,
)
from planner.profile import (
    EAGER_WORDS,
    LayerProfile,
    ModelProfile,
    ShardTimes,
    checkpointed,
    other_runtime,
    shape_of,
)

MICRO_BATCHES = (1, 2, 4, 8, 16, 32, 64)
#: the t the search tries: divisors of the GPUs per node (up to 8 on the clusters we ship), then powers of two
TENSOR_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64)


def _times(builder, spec: ModelSpec, device: DeviceSpec, dtype: str, t: int, opts: OperatorOptions,
           micro_batches: tuple[int, ...]) -> dict[int, PassTimes]:
    return {b: time_operators(builder(spec, b, t, opts), device, dtype) for b in micro_batches}


def _matrix_share(held: dict[int, PassTimes], burst: dict[int, PassTimes], rate: float) -> dict[int, float]:
    """Per micro-batch size, the share of the forward + backward time at the held ``rate`` that the matrix
    engines' rate divides: with ``T = R + M / r``, ``M / (r T) = (T(r) - T(1)) / (T(r) (1 - r))``."""
    out = {}
    for b, p in held.items():
        t_r, t_1 = p.fwd + p.bwd, burst[b].fwd + burst[b].bwd
        out[b] = min(1.0, max(0.0, (t_r - t_1) / (t_r * (1.0 - rate)))) if t_r > 0 else 0.0
    return out


def _shard(times: dict[int, PassTimes], recomputed: bool = True,
           matrix_share: dict[int, float] | None = None) -> ShardTimes:
    """``recomputed=False``: a layer full recomputation does not re-run (its backward is the plain one).
    ``bwd_time`` includes a selective re-run of the attention core where the options ask for one; the
    full-recomputation time does not pay it twice (:attr:`PassTimes.recompute`). ``matrix_share``: where the
    device has a power limit (:func:`_matrix_share`)."""
    return ShardTimes(matrix_share=matrix_share,
        fwd_time={b: p.fwd for b, p in times.items()}, bwd_time={b: p.bwd for b, p in times.items()},
        recompute_time={b: (p.recompute if recomputed else p.bwd) for b, p in times.items()},
        bwd_input_time={b: p.bwd_i for b, p in times.items()},
        bwd_weight_time={b: p.bwd_w for b, p in times.items()},
        stashed_bytes_per_sample=int(round(times[min(times)].saved_bytes / min(times))),
        transient_bytes_per_sample=_transient(times),
        held_grad_bytes_per_sample=int(round(times[min(times)].held_grad_bytes / min(times))), source="operators")


def _transient(times: dict[int, PassTimes]) -> int | None:
    """Transient bytes per sample of a list of operators (None where none of them holds any)."""
    b = min(times)
    return int(round(times[b].transient_bytes / b)) if times[b].transient_bytes > 0 else None


#: how the training runtime the profile is for posts its pipeline sends (``environment["p2p"]``, read by
#: :mod:`planner.cost`, "Blocking p2p"): "overlapped" -- posted without waiting, so they overlap compute
#: (pipeplan's executor; Megatron-Core with ``overlap_p2p_comm``, the interleaved schedule's default) -- or
#: "blocking" -- the sender waits for its sends and synchronizes the device (Megatron-LM 2021-22
#: ``p2p_communication``: ``req.wait(); torch.cuda.synchronize()``; Megatron-Core with ``batch_p2p_comm``, its
#: default for non-interleaved pipelines: it waits on the batched requests, then ``batch_p2p_sync``)
P2P_RUNTIMES = ("overlapped", "blocking")
#: when the runtime all-reduces the data-parallel gradients (``environment["dp_allreduce"]``, read by
#: :mod:`planner.cost`, "Gradient all-reduce"): "after-backward" -- once a stage's backward is done (pipeplan's
#: executor; Megatron-LM's local DDP, 2021) -- or "overlapped" -- in buckets during the last backward of a
#: one-stage pipeline (PyTorch DDP; Megatron-Core's ``overlap_grad_reduce``)
DP_ALLREDUCE_RUNTIMES = ("after-backward", "overlapped")


def runtime_environment(p2p: str = "overlapped", dp_allreduce: str = "after-backward",
                        p2p_scatter_gather: bool = False) -> dict[str, str]:
    """The profile environment entries of a training runtime (:data:`P2P_RUNTIMES`,
    :data:`DP_ALLREDUCE_RUNTIMES`; ``p2p_scatter_gather``: Megatron-LM's scatter/gather of the pipeline sends,
    SC'21 section 4.1, its default in 2021-22 -- each tensor-parallel rank sends 1/t of the boundary tensor and
    the receivers all-gather it, where pipeplan's executor and Megatron-Core send it whole: :mod:`planner.cost`,
    "Pipeline p2p"): only what differs from the defaults, so profiles made without them are unchanged. A
    ``ValueError`` names the field and its choices."""
    if p2p not in P2P_RUNTIMES:
        raise ValueError(f"p2p must be one of {', '.join(P2P_RUNTIMES)}, got {p2p!r}")
    if dp_allreduce not in DP_ALLREDUCE_RUNTIMES:
        raise ValueError(f"dp_allreduce must be one of {', '.join(DP_ALLREDUCE_RUNTIMES)}, got {dp_allreduce!r}")
    return other_runtime({"p2p": p2p, "dp_allreduce": dp_allreduce,
                          "p2p_scatter_gather": "on" if p2p_scatter_gather else "off"})


def analytic_profile(spec: ModelSpec, device: DeviceSpec | str, dtype: str = "bf16",
                     micro_batches: tuple[int, ...] = MICRO_BATCHES,
                     tensor_sizes: tuple[int, ...] | None = None,
                     options: OperatorOptions | None = None, name: str | None = None,
                     p2p: str = "overlapped", dp_allreduce: str = "after-backward",
                     p2p_scatter_gather: bool = False, caveats: tuple[str, ...] | list[str] = ()) -> ModelProfile:
    """The operator-model profile of ``spec`` on ``device`` (a :class:`DeviceSpec` or a device name).
    ``caveats``: what reading the model left out or took as given (a multimodal config's vision tower, a sequence
    past its positions: :mod:`profiler.hf_config`'s warnings), kept in the profile's notes.

    ``tensor_sizes`` default: those of :data:`TENSOR_SIZES` that divide the heads. ``options`` default:
    unfused attention with dropout, no sequence parallelism (the 2021 Megatron-LM runs); their ``causal`` is
    replaced by the architecture's (a decoder's flash kernel is causal, an encoder's is not). ``p2p`` and
    ``dp_allreduce`` (and ``p2p_scatter_gather``): the runtime the profile is for (:func:`runtime_environment`;
    default pipeplan's executor)."""
    runtime = runtime_environment(p2p, dp_allreduce, p2p_scatter_gather)
    dev = device if isinstance(device, DeviceSpec) else get_device(device)
    if (why := dtype_error(dtype)) is not None:
        raise ValueError(why)
    dev.peak(dtype)  # fails early, naming the device and dtype, when the device has no such peak
    # the mask is the model's, not a choice: a decoder's flash kernel is the causal one (it skips the masked
    # blocks, planner.operators), an encoder's is not; the unfused core computes all s x s scores either way
    opts = OperatorOptions(**{**(options.__dict__ if options else {}), "dtype": dtype, "causal": not spec.encoder})
    have = dev.attention_efficiency
    if opts.attention == "flash" and have and opts.attention_impl not in have:
        # a GPU with published kernel figures but none of this kernel: it does not run there (FlashAttention-3
        # is Hopper's); a device without any figures (CPU, V100, P100) times the kernel on its GEMM curve
        raise ValueError(f"attention_impl: {dev.name} has no figures for {opts.attention_impl} (it does not run "
                         f"there); it has {', '.join(sorted(have))}")
    sizes = (tuple(tensor_sizes) if tensor_sizes else
             tuple(t for t in TENSOR_SIZES if tensor_split_error(spec.heads, t) is None))
    if 1 not in sizes:
        sizes = (1, *sizes)
    for t in sizes:
        if (why := tensor_split_error(spec.heads, t)) is not None:
            raise ValueError(f"tensor_sizes: {why}")
    el = DTYPE_BYTES[dtype.lower()]
    s, h, V = spec.seq, spec.hidden, spec.vocab
    # a power-limited device: the same operators at the burst rate tell each shard's matrix share (planner.power)
    burst = dev.model_copy(update={"sustained_rate": 1.0}) if dev.power_limited else None

    def shards(builder, recomputed: bool, at: tuple[int, ...] = sizes) -> dict[int, ShardTimes]:
        per_t = {}
        for t in at:
            held = _times(builder, spec, dev, dtype, t, opts, micro_batches)
            share = _matrix_share(held, _times(builder, spec, burst, dtype, t, opts, micro_batches),
                                  dev.sustained_rate) if burst is not None else None
            per_t[t] = _shard(held, recomputed, share)
        return per_t

    ep_sizes = expert_sizes(spec.experts, int(spec.experts or 1))  # (every divisor of E)

    def layer(lname: str, kind: str, builder, params: int, tied: int, out_bytes: int, in_bytes: int,
              expert_params: int = 0, replicated: int = 0) -> LayerProfile:
        recomputed = checkpointed(kind)  # full recomputation checkpoints each block, not the embedding nor the head
        try:
            per_t = shards(builder, recomputed)
            # a mixture of experts' layer: its times at every expert-parallel size too (planner.expert_parallel)
            # (every divisor e > 1 of E: planner.expert_parallel.expert_sizes at W = E)
            per_e = ({e: shards(partial(builder, expert=e), recomputed) for e in ep_sizes if e > 1}
                     if expert_params else {})
            # and with the experts whole at each t > 1 (expert tensor parallelism 1; sequence parallelism only)
            split_t = tuple(t for t in sizes if t > 1)
            unsplit = ({e: shards(partial(builder, expert=e, expert_tensor=1), recomputed, split_t) for e in ep_sizes}
                       if expert_params and opts.sequence_parallel and split_t else {})
            one = per_t[1]
            return LayerProfile(
                name=lname, kind=kind, fwd_time=one.fwd_time, bwd_time=one.bwd_time,
                recompute_time=one.recompute_time, output_bytes_per_sample=out_bytes,
                stashed_bytes_per_sample=int(one.stashed_bytes_per_sample or 0),
                transient_bytes_per_sample=one.transient_bytes_per_sample, input_bytes_per_sample=in_bytes,
                held_grad_bytes_per_sample=one.held_grad_bytes_per_sample,
                params=params, param_bytes=el * params, tied_params=tied, tensor_times=per_t,
                expert_params=expert_params, expert_times=per_e or None, unsplit_expert_times=unsplit or None,
                replicated_params=replicated)
        except ValidationError as e:  # a figure past planner.limits: said of the shape, not of a profile field
            err = e.errors()[0]
            field = str(err["loc"][0]) if err["loc"] else ""
            raise ValueError(f"the {lname} layer's {LAYER_WORDS.get(field, field)} would be {err['input']!r}, "
                             f"past what a profile holds ({str(err['msg']).lower()}): this shape (sequence {s}, "
                             f"hidden {h}, {spec.layers} layers, vocabulary {V}) is too large") from None

    emb = layer("embedding", "embedding", embedding_operators, spec.embedding_params(), 0, el * s * h, 8 * s)
    # one profile per kind of layer the model has: its attention window (a sliding window, and the global layers
    # between) and its MLP (a mixture of experts, or dense: ModelSpec.dense_layers)
    # (and Llama 4's: rotary positions or none, and the attention chunk of the rotary layers)
    kinds = [(spec.layer_window(i), spec.moe_layer(i), spec.rotary_layer(i), spec.layer_chunk(i))
             for i in range(spec.layers)]
    experts = int(spec.experts or 0) * spec.expert_params()  # of a layer's parameters, its routed experts'
    blocks = {(w, moe, rot, chunk): layer("block0", "transformer",
                                          partial(layer_operators, window=w, moe=moe, rotary=rot, chunk=chunk),
                                          spec.layer_params(moe), 0, el * s * h, el * s * h, experts if moe else 0,
                                          spec.replicated_attention_params())
              for w, moe, rot, chunk in dict.fromkeys(kinds)}
    head = layer("lm_head", "lm_head", head_operators, spec.head_params(),
                 V * h if spec.tied_embeddings else 0, 4, el * s * h)
    layers = [emb] + [blocks[k].model_copy(update={"name": f"block{i}"}) for i, k in enumerate(kinds)] + [head]
    return ModelProfile(
        name=name or spec.name, layers=layers, device=dev.name, dtype=dtype, source="analytical",
        shape=shape_of(spec),
        environment={"device": dev.name, "peak_flops": f"{dev.peak(dtype):g}", "attention": opts.attention,
                     "dropout": str(opts.dropout).lower(), "sequence_parallel": str(opts.sequence_parallel).lower(),
                     "family": "bert" if spec.encoder else "gpt", "model": spec.name,
                     # the whole shape (GQA, gated MLP, norm, positions, ...): what exports write out
                     "model_spec": spec.model_dump_json(exclude={"source"}),
                     **({"attention_impl": opts.attention_impl} if opts.attention == "flash" else {}),
                     **({"recompute_granularity": opts.recompute} if opts.recompute != "none" else {}),
                     **({"kernels": "eager"} if opts.kernels == "eager" else {}),
                     **({"expert_gemm": opts.expert_gemm} if spec.moe else {}),
                     **runtime},
        notes=(f"analytical profile (planner.analytic): operator-level model of {spec.name} on {dev.name} "
               f"({opts.attention}{f' ({opts.attention_impl})' if opts.attention == 'flash' else ''} attention"
               f"{', dropout' if opts.dropout else ''}"
               f"{', sequence parallel' if opts.sequence_parallel else ''}{_selective_note(opts)}"
               f"{EAGER_NOTE if opts.kernels == 'eager' else ''}"
               f"{', blocking pipeline sends' if 'p2p' in runtime else ''}"
               f"{', scatter/gather pipeline sends' if 'p2p_scatter_gather' in runtime else ''}"
               f"{', data-parallel all-reduce overlapped with the backward' if 'dp_allreduce' in runtime else ''}); "
               "GEMM and memory efficiency from the device description"
               f"{f' ({dev.notes})' if dev.notes.startswith('generic description') else ''}; "
               "compute per tensor-parallel size in tensor_times; "
               "replace with a measured profile" + _moe_note(spec, opts) + "".join(f"; {c}" for c in caveats)),
    )


EAGER_NOTE = ", " + EAGER_WORDS
#: a layer profile's fields in words (the message of a shape too large for a profile)
LAYER_WORDS = {"stashed_bytes_per_sample": "activations kept per sample (bytes)",
               "transient_bytes_per_sample": "transient activations per sample (bytes)",
               "held_grad_bytes_per_sample": "output gradients held per sample (bytes)",
               "output_bytes_per_sample": "output per sample (bytes)",
               "input_bytes_per_sample": "input per sample (bytes)",
               "params": "parameters", "param_bytes": "parameter bytes", "fwd_time": "forward time",
               "bwd_time": "backward time", "recompute_time": "recomputation time", "tensor_times": "per-t times"}


def _moe_note(spec: ModelSpec, opts: OperatorOptions) -> str:
    """What the times of a mixture of experts assume (:mod:`planner.moe`); nothing for a dense model."""
    if not spec.moe:
        return ""
    gemms = ("one grouped GEMM over the experts" if opts.expert_gemm == "grouped"
             else "the experts' kernels launched one expert at a time")
    return (f"; mixture of experts: {spec.experts} experts, {spec.experts_per_token} per token, balanced routing "
            f"(T k / E tokens per expert), {gemms}; times at every expert-parallel size dividing {spec.experts} "
            "(planner.expert_parallel: the experts split over that many data-parallel replicas)"
            + (f"; a shared expert of width {spec.shared_expert_ffn_hidden}"
               f"{' (gated)' if spec.shared_expert_gate else ''} beside them, split over t as a dense MLP"
               if spec.shared_expert_ffn_hidden is not None else "")
            + (f"; {len(spec.dense_layers)} of {spec.layers} layers dense" if spec.dense_layers else ""))


def _selective_note(opts: OperatorOptions) -> str:
    if opts.recompute == "op":
        return (", selective op checkpointing (torchtitan): layers not fully recomputed keep every other GEMM's "
                "output" + (" and the flash kernel's" if opts.attention == "flash" else "")
                + ", and re-run the rest in the backward")
    if opts.recompute != "selective":
        return ""
    if opts.attention == "flash":
        return (", selective recomputation: layers not fully recomputed re-run the flash kernel's forward in the "
                "backward (Megatron-Core checkpoints the core attention whatever its kernel)")
    return (", selective recomputation: layers not fully recomputed re-run the attention core in the "
            "backward and stash no s x s tensors")


def transformer_profile(name: str, layers: int, hidden: int, heads: int, seq: int, vocab: int,
                        peak_flops: float, device: str, dtype: str | None = None, encoder: bool = False,
                        micro_batches: tuple[int, ...] = MICRO_BATCHES) -> ModelProfile:
    """:func:`analytic_profile` of a GPT-2/3-shaped model (or BERT, ``encoder=True``) given by its sizes, on
    the shipped device named ``device`` or, when none matches, a generic device with ``peak_flops`` and the
    A100's FLOP-to-byte ratio (:func:`planner.device.generic_device`). ``dtype`` defaults to bf16, or to the
    device's only dtype where it has no 16-bit entry (the CPU: fp32)."""
    spec = ModelSpec(name=name, layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab,
                     architecture="encoder" if encoder else "decoder")
    found = find_device(device)
    if dtype is None:
        sixteen = found is None or any(canonical_dtype(k) in ("bf16", "fp16") for k in found.gemm_efficiency)
        dtype = "bf16" if sixteen or found is None else sorted(found.gemm_efficiency)[0]
    dev = found or generic_device(device, peak_flops, peak_flops * 2039e9 / 312e12, 80 * 2**30, dtype=dtype)
    return analytic_profile(spec, dev, dtype=dtype, micro_batches=micro_batches, name=name)
