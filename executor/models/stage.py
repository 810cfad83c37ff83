"""The layer interface and :class:`Stage`, a consecutive slice of layers run as one module.

Every layer is an ``nn.Module`` with a class attribute ``takes_targets``:

* ``takes_targets = False``: ``layer(x) -> y``; ``x`` is the activation tensor (token ids for the
  embedding layer, ``(b, s, hidden)`` hidden states otherwise).
* ``takes_targets = True`` (only the last layer, the head that holds the loss):
  ``layer(x, targets) -> loss``, the mean cross-entropy, a scalar.

So only activations cross stage boundaries; the targets come from the data loader straight to the stage
that holds the head (every process can regenerate or read the same batch, see
:mod:`executor.models.data`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


def takes_targets(layer: nn.Module) -> bool:
    """Whether ``layer`` is a loss layer, called as ``layer(x, targets)``."""
    return bool(getattr(layer, "takes_targets", False))


class Stage(nn.Module):
    """Layers ``layers[i:j]`` of a model chained: ``Stage(layers[i:j])(x, targets=None)``."""

    def __init__(self, layers: Sequence[nn.Module]) -> None:
        super().__init__()
        if not layers:
            raise ValueError("a stage needs at least one layer")
        self.layers = nn.ModuleList(layers)
        for layer in list(layers)[:-1]:
            if takes_targets(layer):
                raise ValueError("a loss layer must be the last layer of a stage")

    @property
    def computes_loss(self) -> bool:
        """True for the last stage: its output is the loss."""
        return takes_targets(self.layers[-1])

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        for layer in self.layers:
            if takes_targets(layer):
                if targets is None:
                    raise ValueError("this stage computes the loss: pass targets")
                x = layer(x, targets)
            else:
                x = layer(x)
        return x
