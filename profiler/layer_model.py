"""Profiling any model given as an ordered list of layers: a user's own (``pipeplan profile --module
pkg.mod:build``) or one built by ``transformers`` from a Hugging Face config (:mod:`profiler.hf_model`).

The contract of a factory ``build()`` (README, "Your own model"): it returns ``(layers, sample, loss)``, or a
:class:`LayerModel`:

* ``layers``: ``list[torch.nn.Module]``, in order; layer ``i + 1`` takes the output of layer ``i`` (one tensor in,
  one tensor out). These are the units the planner may cut between.
* ``sample(b)``: a micro-batch of ``b`` samples, ``(inputs, targets)``; ``inputs`` go into ``layers[0]``.
* ``loss(output, targets)``: a scalar from the last layer's output; it is timed with the last layer, as the
  zoo's heads hold their loss.

Each layer is measured as the zoo's are (:func:`profiler.layers.profile_layer`: forward, backward, bytes saved for
backward, output and input bytes per sample, per micro-batch size) on the input it really gets: the sample run
through the layers before it. ``repeat`` lets a model built with fewer identical layers than it has (a
transformer's blocks) stand for the whole: layer ``i`` of the profile reuses measured layer ``repeat[i]``.
"""

from __future__ import annotations

import importlib
import importlib.util
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from planner.profile import ModelProfile, TransformerShape, checkpointed
from profiler.layers import Inputs, LayerMeasurement, profile_layer

Sample = Callable[[int], tuple[torch.Tensor, torch.Tensor]]
Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class LayerModel:
    """An ordered list of layers, a sample micro-batch maker and the loss (module docstring)."""

    layers: list[nn.Module]
    sample: Sample
    loss: Loss
    name: str = "custom"
    names: list[str] = field(default_factory=list)  # default layer.0, layer.1, ...
    kinds: list[str] = field(default_factory=list)  # default "layer"
    repeat: list[int] = field(default_factory=list)  # profile layer -> measured layer (default: identity)
    shape: TransformerShape | None = None
    tied_params: dict[int, int] = field(default_factory=dict)  # profile layer -> parameters shared with another
    #: profile layer -> of its parameters, a mixture of experts' experts (what expert parallelism splits)
    expert_params: dict[int, int] = field(default_factory=dict)
    #: profile layer -> of its parameters, those every tensor-parallel rank holds whole (latent attention's
    #: down-projections: :attr:`planner.profile.LayerProfile.replicated_params`)
    replicated_params: dict[int, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.layers or not all(isinstance(m, nn.Module) for m in self.layers):
            raise ValueError("layers: give a non-empty list of torch.nn.Module")
        if not callable(self.sample) or not callable(self.loss):
            raise ValueError("sample and loss must be callables: sample(b) -> (inputs, targets), loss(out, targets)")
        self.repeat = self.repeat or list(range(len(self.layers)))
        n = len(self.repeat)
        if sorted(set(self.repeat)) != list(range(len(self.layers))):
            raise ValueError("repeat must use every measured layer")
        self.names = self.names or [f"layer.{i}" for i in range(n)]
        self.kinds = self.kinds or ["layer"] * n
        if len(self.names) != n or len(self.kinds) != n:
            raise ValueError(f"names and kinds need one entry per profile layer ({n})")


class _WithLoss(nn.Module):
    """The last layer followed by the loss: ``(x, targets) -> scalar`` (a zoo head's interface)."""

    takes_targets = True

    def __init__(self, layer: nn.Module, loss: Loss) -> None:
        super().__init__()
        self.layer = layer
        self.loss = loss

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss(self.layer(x), targets)


class ContractError(ValueError):
    """The user's model breaks the factory's contract (module docstring): what it returned or what its code raised,
    in one line (the CLI names the option before it)."""


def raised(e: BaseException) -> str:
    """``TypeError: loads() missing 1 required positional argument: 's'``: an exception in one line."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__


def is_out_of_memory(e: BaseException) -> bool:
    """Whether ``e`` is torch's allocator failing (CUDA's ``OutOfMemoryError``, the CPU's ``can't allocate
    memory``): not the model's fault but the sizes', reported as such (profiler.cli)."""
    text = str(e)
    return isinstance(e, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower())


def _what(value: object) -> str:
    """A returned value in a few words: ``a dict``, ``a tuple of 2``, ``None``."""
    if value is None:
        return "None"
    kind = type(value).__name__
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    return f"{article} {kind} of {len(value)}" if isinstance(value, tuple | list) else f"{article} {kind}"


def load_factory(target: str) -> Callable[[], Any]:
    """``"pkg.module:build"`` (imported) or ``"path/to/file.py:build"`` (loaded from the file)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"--module must look like pkg.module:build or file.py:build, got {target!r}")
    if module_name.endswith(".py"):
        path = Path(module_name)
        if not path.is_file():
            raise ValueError(f"--module: no such file {path}")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - the user's file: whatever it raises, in one line
            raise ValueError(f"--module: loading {path} raised {raised(e)}") from None
    else:
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise ValueError(f"--module: cannot import {module_name}: {e}") from None
        except Exception as e:  # noqa: BLE001 - the user's module: whatever its import raises, in one line
            raise ValueError(f"--module: importing {module_name} raised {raised(e)}") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"--module: {module_name} has no callable {attr!r}")
    return factory


def from_factory(target: str, name: str | None = None) -> LayerModel:
    """Call the factory named by ``target`` and check what it returns against the contract; what the factory
    raises, or a return that breaks the contract, is a ValueError in one line naming ``--module`` and the factory
    (``json:loads`` was a TypeError traceback)."""
    factory = load_factory(target)
    try:
        built = factory()
    except Exception as e:  # noqa: BLE001 - the user's code: whatever it raises, in one line
        raise ValueError(f"--module: the factory {target} raised {raised(e)}") from None
    if isinstance(built, LayerModel):
        return built
    if not isinstance(built, tuple | list) or len(built) != 3:
        raise ValueError(f"--module: the factory {target} returned {_what(built)}; it must return "
                         "(layers, sample, loss) or a profiler.layer_model.LayerModel")
    layers, sample, loss = built
    if not isinstance(layers, list | tuple | nn.ModuleList | nn.Sequential):
        raise ValueError(f"--module: the factory {target} returned layers that are {_what(layers)}; give a "
                         "non-empty list of torch.nn.Module")
    module = target.partition(":")[0]
    default = Path(module).stem if module.endswith(".py") else module.rsplit(".", 1)[-1]
    try:
        return LayerModel(list(layers), sample, loss, name=name or default)
    except ValueError as e:
        raise ValueError(f"--module: the factory {target} returned {e}") from None


def check_contract(model: LayerModel, device: torch.device, dtype: torch.dtype) -> None:
    """A micro-batch of two through the layers and the loss, before any timing (two: a loss per sample is not one
    number): ``sample(2)`` gives two tensors, each layer
    takes the previous one's output and returns one tensor, the loss is a scalar tensor; otherwise a
    :class:`ContractError` naming the part and what it raised or returned (a shape mismatch between two layers
    was torch's RuntimeError traceback from inside the timing loop). Running out of memory is raised as it is."""
    try:
        got = model.sample(2)
    except Exception as e:  # noqa: BLE001 - the user's code
        raise ContractError(f"sample(2) raised {raised(e)}") from None
    if not (isinstance(got, tuple | list) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)):
        raise ContractError(f"sample(2) returned {_what(got)}; it must return (inputs, targets), two tensors")
    x, targets = got[0].to(device), got[1].to(device)
    x = x.to(dtype) if x.is_floating_point() else x
    first_name = {m: model.names[model.repeat.index(m)] for m in range(len(model.layers))}
    with torch.no_grad():
        for i, layer in enumerate(model.layers):
            what = f"{first_name[i]} ({type(layer).__name__})"
            try:
                y = layer(x)
            except Exception as e:  # noqa: BLE001 - the user's code
                if is_out_of_memory(e):
                    raise
                before = f"{first_name[i - 1]}'s output" if i else "sample(2)'s inputs"
                raise ContractError(f"{what} failed on {before} of shape {tuple(x.shape)}: {raised(e)}") from None
            if not isinstance(y, torch.Tensor):
                raise ContractError(f"{what} returned {_what(y)}; a layer returns one tensor (the next one's input)")
            x = y
        try:
            loss = model.loss(x, targets)
        except Exception as e:  # noqa: BLE001 - the user's code
            if is_out_of_memory(e):
                raise
            raise ContractError(f"loss failed on the last layer's output of shape {tuple(x.shape)} and targets of "
                                f"shape {tuple(targets.shape)}: {raised(e)}") from None
    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
        shape = f"a tensor of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else _what(loss)
        raise ContractError(f"loss returned {shape} for a micro-batch of 2; it must return a scalar tensor")


def _inputs_for(model: LayerModel, index: int, device: torch.device,
                dtype: torch.dtype) -> Callable[[int], Callable[[], Inputs]]:
    """Inputs of measured layer ``index`` at micro-batch ``b``: the sample through the layers before it."""

    def make(b: int) -> Callable[[], Inputs]:
        inputs, targets = model.sample(b)
        x = inputs.to(device)
        x = x.to(dtype) if x.is_floating_point() else x
        with torch.no_grad():
            for layer in model.layers[:index]:
                x = layer(x)
        last = index == len(model.layers) - 1
        targets = targets.to(device)

        def fresh() -> Inputs:
            arg = x.detach().requires_grad_() if x.is_floating_point() else x
            return (arg, targets) if last else (arg,)

        return fresh

    return make


def profile_layer_model(model: LayerModel, micro_batches: list[int], device: str = "cpu", dtype: str = "fp32",
                        repeats: int = 5, warmup: int = 2, recompute: bool = False,
                        progress: Callable[[str, int], None] | None = None, notes: str = "",
                        environment: dict[str, str] | None = None) -> ModelProfile:
    """Measure every layer of ``model`` at every micro-batch size; a :class:`ModelProfile` of its profile layers."""
    from profiler.run import DTYPES, _to_layer_profile, check_device, device_name

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    sizes = sorted(set(micro_batches))
    if not sizes or sizes[0] < 1:
        raise ValueError(f"micro-batch sizes must be >= 1, got {micro_batches}")
    dev, torch_dtype = check_device(device), DTYPES[dtype]
    layers = [m.to(dev, torch_dtype).train() for m in model.layers]
    model.layers = layers
    check_contract(model, dev, torch_dtype)
    n = len(layers)
    first_name = {m: model.names[model.repeat.index(m)] for m in range(n)}
    measured: dict[int, LayerMeasurement] = {}
    for i, layer in enumerate(layers):
        unit = _WithLoss(layer, model.loss) if i == n - 1 else layer

        def done(b: int, name: str = first_name[i]) -> None:
            if progress is not None:
                progress(name, b)

        measured[i] = profile_layer(unit, _inputs_for(model, i, dev, torch_dtype), sizes, dev, warmup=warmup,
                                    repeats=repeats, recompute=recompute, on_size_done=done,
                                    checkpointed=checkpointed(model.kinds[model.repeat.index(i)]))
    out = [_to_layer_profile(model.names[j], model.kinds[j], measured[m], model.tied_params.get(j, 0),
                             expert_params=model.expert_params.get(j, 0),
                             replicated_params=model.replicated_params.get(j, 0))
           for j, m in enumerate(model.repeat)]
    reused = [model.names[j] for j, m in enumerate(model.repeat) if model.repeat.index(m) != j]
    env = {"torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
           "device_name": device_name(dev), "threads": str(torch.get_num_threads()),
           "micro_batches": ",".join(map(str, sizes)), "repeats": str(repeats), "warmup": str(warmup),
           "repeated_blocks": f"{len(reused)} layers reuse a measured identical layer" if reused else "none",
           **(environment or {})}
    return ModelProfile(
        name=model.name, layers=out, device=device_name(dev) if dev.type == "cuda" else "cpu", dtype=dtype,
        shape=model.shape, source="measured", environment=env,
        notes=(f"Measured with pipeplan's profiler (layer list): median of {repeats} repeats after {warmup} "
               f"warm-up runs; the last layer includes the loss. {notes}").strip())
