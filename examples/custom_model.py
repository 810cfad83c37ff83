"""A model of your own, profiled with ``pipeplan profile --module examples/custom_model.py:build`` (README, "Your own
model"): a residual MLP classifier on 28x28 images (MNIST-shaped), eight layers the planner may cut between.

The factory returns ``(layers, sample, loss)``: the ordered layers (each takes the previous one's output), a
function making a micro-batch of ``b`` samples ``(inputs, targets)``, and the loss of the last layer's output.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

WIDTH, CLASSES, BLOCKS = 256, 10, 6


class Residual(nn.Module):
    """``x + W2 gelu(W1 norm(x))``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.net(x)


def build() -> tuple[list[nn.Module], object, object]:
    torch.manual_seed(0)
    layers: list[nn.Module] = [
        nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, WIDTH), nn.GELU()),  # stem
        *(Residual(WIDTH) for _ in range(BLOCKS)),
        nn.Sequential(nn.LayerNorm(WIDTH), nn.Linear(WIDTH, CLASSES)),  # classifier head
    ]

    def sample(b: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(b)
        return torch.randn(b, 1, 28, 28, generator=gen), torch.randint(0, CLASSES, (b,), generator=gen)

    return layers, sample, F.cross_entropy
