"""Where a run's layers and batches come from: the zoo (a preset or a ModelSpec, :class:`ZooSource`) or a user's
factory (``pipeplan run --module pkg.mod:build``, :class:`ModuleSource`, the contract of
:mod:`profiler.layer_model`: ``(layers, sample, loss)``).

The executor (:mod:`executor.interpreter`, :mod:`executor.reference`, :mod:`executor.worker`) asks a source for

* ``num_layers``: the layers the partition covers;
* ``build(seed, start, stop)``: layers ``start:stop``, the same weights on every process (a user factory is
  called under ``torch.manual_seed(seed)`` and every process keeps its slice; the last layer is wrapped with the
  loss, the zoo heads' interface);
* ``batch(global_batch, seed, step)``: ``(inputs, targets)`` of a step, the same on every process (a user's
  ``sample`` is called under ``torch.manual_seed`` of ``(seed, step)``, so it must draw from torch's global
  generator or seed its own from it);
* ``message_shape(rows, layer)``: the shape of the activation entering ``layer`` for ``rows`` samples (a user
  model's boundary shapes are found by running one sample through the layers);
* ``tied()``: groups of parameters holding one weight (zoo embeddings only);
* ``kinds(start, stop)``: the profile kinds of layers ``start:stop`` (``embedding``, ``transformer``,
  ``lm_head``; a user's :class:`profiler.layer_model.LayerModel` kinds, ``layer`` otherwise), which say what full
  recomputation checkpoints (:func:`planner.profile.checkpointed`);
* ``mean_of_micro_batches``: whether the loss of a batch is the mean of its micro-batches' losses (BERT's
  masked LM; a user's loss too, as its reduction is unknown) rather than one forward over the batch.
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import torch
from torch import nn

from executor.models import build_layers, layer_kinds, tied_parameters
from executor.models.config import ModelConfig
from executor.models.data import synthetic_batch


class ZooSource:
    """The zoo's GPT, BERT and Llama families from a :class:`ModelConfig`."""

    def __init__(self, config: ModelConfig) -> None:
        self.config = config

    @property
    def num_layers(self) -> int:
        return self.config.num_profile_layers

    @property
    def mean_of_micro_batches(self) -> bool:
        return self.config.family == "bert"

    def build(self, seed: int, start: int, stop: int | None = None) -> list[nn.Module]:
        return build_layers(self.config, seed, start, stop)

    def batch(self, global_batch: int, seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return synthetic_batch(self.config, global_batch, seed, step)

    def message_shape(self, rows: int, layer: int) -> tuple[int, ...]:
        return (rows, self.config.seq, self.config.hidden)

    def tied(self) -> list[list[tuple[int, str]]]:
        return tied_parameters(self.config)

    def kinds(self, start: int, stop: int) -> list[str]:
        return layer_kinds(self.config)[start:stop]


class _WithLoss(nn.Module):
    """The user's last layer and loss, ``(x, targets) -> loss``."""

    takes_targets = True

    def __init__(self, layer: nn.Module, loss: Any) -> None:
        super().__init__()
        self.layer = layer
        self.loss = loss

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss(self.layer(x), targets)


class ModuleSource:
    """A user's factory ``target`` (``pkg.module:build`` or ``file.py:build``)."""

    mean_of_micro_batches = True

    def __init__(self, target: str) -> None:
        self.target = target
        self._sample: Any = None
        self._kinds: list[str] | None = None

    def _built(self, seed: int) -> tuple[list[nn.Module], Any, Any]:
        from profiler.layer_model import LayerModel, load_factory

        factory = load_factory(self.target)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            built = factory()
        if isinstance(built, LayerModel):
            self._sample = built.sample
            # the kind of each layer built: that of the first profile layer it stands for
            self._kinds = [built.kinds[built.repeat.index(m)] for m in range(len(built.layers))]
            return built.layers, built.sample, built.loss
        if not isinstance(built, tuple | list) or len(built) != 3:
            raise ValueError("the --module factory must return (layers, sample, loss)")
        layers, sample, loss = built
        self._sample = sample
        if not layers or not all(isinstance(m, nn.Module) for m in layers):
            raise ValueError("the --module factory's layers must be a non-empty list of torch.nn.Module")
        return list(layers), sample, loss

    @cached_property
    def _probe(self) -> tuple[int, list[tuple[int, ...]]]:
        """Number of layers and the per-sample shape of each layer's input (one sample run through them)."""
        layers, sample, _ = self._built(0)
        x, _ = self.batch(1, 0, 0)
        shapes = []
        with torch.no_grad():
            for layer in layers:
                shapes.append(tuple(x.shape[1:]))
                x = layer(x)
        return len(layers), shapes

    @property
    def num_layers(self) -> int:
        return self._probe[0]

    def build(self, seed: int, start: int, stop: int | None = None) -> list[nn.Module]:
        layers, _, loss = self._built(seed)
        stop = len(layers) if stop is None else stop
        if not 0 <= start < stop <= len(layers):
            raise ValueError(f"need 0 <= start < stop <= {len(layers)}, got start={start} stop={stop}")
        out = layers[start:stop]
        if stop == len(layers):
            out[-1] = _WithLoss(out[-1], loss)
        return out

    def batch(self, global_batch: int, seed: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self._sample is None:
            self._built(seed)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed * 1_000_003 + step)
            return self._sample(global_batch)

    def message_shape(self, rows: int, layer: int) -> tuple[int, ...]:
        return (rows, *self._probe[1][layer])

    def kinds(self, start: int, stop: int) -> list[str]:
        n = self.num_layers  # builds the factory once (its kinds, when it returns a LayerModel)
        return (self._kinds or ["layer"] * n)[start:stop]

    def tied(self) -> list[list[tuple[int, str]]]:
        return []
