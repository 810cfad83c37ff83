"""Profile one layer: forward, backward and recompute times per micro-batch size, and its byte sizes.

* forward: ``layer(x)`` with autograd recording (the training forward);
* backward: ``out.backward(grad)`` after an untimed forward (``loss.backward()`` for the loss layer);
* recompute (optional): the backward pass of the layer wrapped in non-reentrant
  ``torch.utils.checkpoint`` (forward re-run + backward), i.e. the backward of a recomputed layer
  (Chen et al. 2016; Megatron-LM 3.5) -- for a layer full recomputation checkpoints
  (:func:`planner.profile.checkpointed`: not the embedding nor the LM head, whose backward under
  recomputation is their plain backward, recorded as such; the executor's :class:`executor.interpreter.
  StageModule` runs the same rule).

**In flight, on the CPU** (issue 11, cpufid3): a pipeline stage keeps each micro-batch's activations from its
forward to its backward, so its forward writes them into memory other micro-batches' activations have not just
freed and left warm in the caches, and its backward reads activations written several micro-batches ago. The
profile times a layer that way (:func:`in_flight`): each timed forward runs while the outputs (with their
autograd graphs) of the ``k`` previous forwards are alive, and each timed backward is that of the oldest of
``k + 1`` alive forwards (first in, first out, as GPipe and 1F1B backpropagate). Measured on the 2-core
development machine (Xeon, 2 MiB L2 per core), a gpt-small block (hidden 256, seq 64, b=2), thread CPU time,
medians of 8 alternating rounds: forward 1.08x with 2 alive and 1.16x with 8 alive of the forward timed alone;
backward 1.01x (2) and 1.24x (8) of the backward right after its forward; inside a stage run in GPipe order
the blocks' forwards took 1.09-1.15x their one-layer profile. ``k`` is :data:`IN_FLIGHT` (a pipeline's 8
micro-batches), fewer when that many would not fit :data:`IN_FLIGHT_BYTES`. A GPU's caching allocator and its
kernels' working sets are another matter: on CUDA ``k`` is 0 (the layer timed alone, as before).

Sizes per sample are the slope of the measured bytes between the smallest and the largest micro-batch
size (with one size: bytes / b), so per-micro-batch constants (position ids, the causal mask) drop out.
The sizes are those of PipeDream 3.1 (``a_l`` output activations, ``w_l`` parameters) plus the tensors
autograd stashes (:func:`profiler.memory.saved_bytes`) and the layer input (what a recomputed layer
keeps).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from executor.models import ModelConfig, takes_targets
from profiler.memory import param_counts, saved_bytes
from profiler.timing import Timing, time_op

Inputs = tuple[torch.Tensor, ...]

#: forwards kept alive around a timed one on the CPU (module docstring, "In flight")
IN_FLIGHT = 8
#: at most this many bytes of alive activations for it (fewer forwards kept for a large layer)
IN_FLIGHT_BYTES = 2 * 2**30


def in_flight(device: torch.device, bytes_per_forward: int) -> int:
    """How many earlier forwards are kept alive around a timed forward or backward (module docstring): 0 on
    CUDA; on the CPU :data:`IN_FLIGHT`, or as many as :data:`IN_FLIGHT_BYTES` holds of ``bytes_per_forward``
    (what autograd saves plus the output), at least 1."""
    if device.type != "cpu":
        return 0
    return max(1, min(IN_FLIGHT, IN_FLIGHT_BYTES // max(bytes_per_forward, 1)))


@dataclass
class LayerMeasurement:
    """What :func:`profile_layer` measured (the fields of ``planner.profile.LayerProfile`` but names)."""

    fwd: dict[int, Timing] = field(default_factory=dict)
    bwd: dict[int, Timing] = field(default_factory=dict)
    recompute: dict[int, Timing] = field(default_factory=dict)
    output_bytes_per_sample: int = 0
    stashed_bytes_per_sample: int = 0
    input_bytes_per_sample: int = 0
    #: the output gradients a split backward's I keeps for its W (:func:`_held_grad_bytes`), per sample
    held_grad_bytes_per_sample: int = 0
    params: int = 0
    param_bytes: int = 0
    peak_memory_bytes: int | None = None


def make_inputs(
    config: ModelConfig, index: int, layer: nn.Module, b: int, device: torch.device, dtype: torch.dtype
) -> Callable[[], Inputs]:
    """A factory of fresh inputs for layer ``index`` at micro-batch ``b``: ids, hidden states (+ targets)."""
    gen = torch.Generator().manual_seed(1000 + b)
    if index == 0:
        ids = torch.randint(0, config.vocab, (b, config.seq), generator=gen).to(device)
        return lambda: (ids,)
    hidden = torch.randn(b, config.seq, config.hidden, generator=gen).to(device, dtype)
    if takes_targets(layer):
        targets = torch.randint(0, config.vocab, (b, config.seq), generator=gen).to(device)
        return lambda: (hidden.detach().requires_grad_(), targets)
    return lambda: (hidden.detach().requires_grad_(),)


def _backward(out: torch.Tensor) -> None:
    if out.dim() == 0:
        out.backward()
    else:
        out.backward(torch.ones_like(out))


def _per_sample(by_b: dict[int, int]) -> int:
    bs = sorted(by_b)
    if len(bs) == 1:
        return round(by_b[bs[0]] / bs[0])
    return max(0, round((by_b[bs[-1]] - by_b[bs[0]]) / (bs[-1] - bs[0])))


def profile_layer(
    layer: nn.Module,
    inputs_for: Callable[[int], Callable[[], Inputs]],
    micro_batches: list[int],
    device: torch.device,
    warmup: int = 2,
    repeats: int = 5,
    recompute: bool = False,
    on_size_done: Callable[[int], None] | None = None,
    checkpointed: bool = True,
) -> LayerMeasurement:
    """Measure ``layer`` (on ``device``) at every micro-batch size; ``inputs_for(b)`` makes its inputs.
    ``checkpointed=False`` (the embedding, the LM head): with ``recompute`` its recompute time is its plain
    backward (full recomputation does not checkpoint it)."""
    m = LayerMeasurement()
    m.params, m.param_bytes = param_counts(layer)
    saved: dict[int, int] = {}
    outputs: dict[int, int] = {}
    inputs_bytes: dict[int, int] = {}
    held: dict[int, int] = {}
    for b in micro_batches:
        sizes = _measure_bytes(layer, inputs_for(b))
        inputs_bytes[b], saved[b], outputs[b] = sizes
        held[b] = _held_grad_bytes(layer, inputs_for(b))
        _measure_size(layer, inputs_for(b), b, device, warmup, repeats, recompute and checkpointed, m,
                      in_flight(device, sizes[1] + sizes[2]))
        if recompute and not checkpointed:
            m.recompute[b] = m.bwd[b]
        if device.type == "cuda" and b == max(micro_batches):
            m.peak_memory_bytes = _peak_memory(layer, inputs_for(b), device)
        if on_size_done is not None:
            on_size_done(b)
    layer.zero_grad(set_to_none=True)
    m.stashed_bytes_per_sample = _per_sample(saved)
    m.output_bytes_per_sample = _per_sample(outputs)
    m.input_bytes_per_sample = _per_sample(inputs_bytes)
    m.held_grad_bytes_per_sample = _per_sample(held)
    return m


def _measure_size(
    layer: nn.Module,
    new_inputs: Callable[[], Inputs],
    b: int,
    device: torch.device,
    warmup: int,
    repeats: int,
    recompute: bool,
    m: LayerMeasurement,
    alive: int = 0,
) -> None:
    """Forward, backward (and recompute) timings at micro-batch ``b`` into ``m``; ``alive`` earlier forwards
    kept alive around each timed forward and backward (module docstring, "In flight")."""
    kept: deque[torch.Tensor] = deque()

    def inputs_among_alive() -> Inputs:
        while len(kept) < alive:  # the window filled before the first timed forward (untimed)
            kept.append(layer(*new_inputs()))
        while len(kept) > alive:  # the oldest freed before the timed forward, as its backward frees it
            kept.popleft()
        return new_inputs()

    def forward(inputs: Inputs) -> torch.Tensor:
        out = layer(*inputs)
        if alive:
            kept.append(out)
        return out

    def oldest_alive() -> torch.Tensor:
        while len(kept) < alive + 1:
            kept.append(layer(*new_inputs()))
        return kept.popleft()

    def forward_for_backward() -> torch.Tensor:
        return layer(*new_inputs())

    def checkpointed_forward() -> torch.Tensor:
        return checkpoint(layer, *new_inputs(), use_reentrant=False)

    m.fwd[b] = time_op(inputs_among_alive, forward, device, warmup, repeats)
    kept.clear()
    m.bwd[b] = time_op(oldest_alive if alive else forward_for_backward, _backward, device, warmup, repeats)
    kept.clear()
    if recompute:
        m.recompute[b] = time_op(checkpointed_forward, _backward, device, warmup, repeats)


def _measure_bytes(layer: nn.Module, new_inputs: Callable[[], Inputs]) -> tuple[int, int, int]:
    """(input bytes, saved-for-backward bytes, output bytes) of one forward; a scalar loss outputs 0."""
    first = new_inputs()[0]
    input_bytes = first.numel() * first.element_size()
    stashed = saved_bytes(layer, lambda: layer(*new_inputs()))
    with torch.no_grad():
        out = layer(*new_inputs())
    return input_bytes, stashed, 0 if out.dim() == 0 else out.numel() * out.element_size()


def _held_grad_bytes(layer: nn.Module, new_inputs: Callable[[], Inputs]) -> int:
    """Bytes of the gradients zero-bubble's split backward keeps from I to W for one forward of ``layer``
    (:mod:`executor.split_backward`: at each node where a weight's branch joins the graph), the way the executor
    splits it; for a layer whose input needs no gradient (the embedding, whose input is token ids) the gradient of
    its output, which the executor keeps at its cut after that layer for W."""
    from executor.split_backward import split_input

    inputs = new_inputs()
    x = inputs[0]
    out = layer(*inputs)
    if out.grad_fn is None:
        return 0
    if not x.requires_grad:
        return 0 if out.dim() == 0 else out.numel() * out.element_size()
    params = [p for p in layer.parameters() if p.requires_grad]
    _, split = split_input(out, None if out.dim() == 0 else torch.ones_like(out), x, params)
    layer.zero_grad(set_to_none=True)
    return sum(g.numel() * g.element_size() for grads in split.captured.values() for g in grads if g is not None)


def _peak_memory(layer: nn.Module, new_inputs: Callable[[], Inputs], device: torch.device) -> int:
    """Peak CUDA memory allocated during one forward + backward, above what was allocated before."""
    inputs = new_inputs()
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    _backward(layer(*inputs))
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device) - base)
