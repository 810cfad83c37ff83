"""On the CPU a layer is profiled as a pipeline stage runs it: its forwards timed while earlier micro-batches'
activations are alive, its backwards those of the oldest alive forward (profiler.layers, "In flight")."""

from __future__ import annotations

import weakref

import torch
from torch import nn

from profiler.layers import IN_FLIGHT, IN_FLIGHT_BYTES, LayerMeasurement, _measure_size, in_flight


class Counting(nn.Module):
    """A linear layer that records, at each forward, how many of its earlier outputs are still alive, and at
    each backward which forward (by number) it backpropagates."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.live = 0
        self.calls = 0
        self.seen_alive: list[int] = []
        self.backwarded: list[int] = []

    def _gone(self) -> None:
        self.live -= 1

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen_alive.append(self.live)
        n = self.calls
        self.calls += 1
        y = self.lin(x)
        y.register_hook(lambda g, n=n: self.backwarded.append(n) or g)
        self.live += 1
        weakref.finalize(y, self._gone)
        return y


def test_in_flight_count_by_device_and_size() -> None:
    assert in_flight(torch.device("cpu"), 1024) == IN_FLIGHT
    assert in_flight(torch.device("cpu"), IN_FLIGHT_BYTES // 3) == 3  # what the byte budget holds
    assert in_flight(torch.device("cpu"), IN_FLIGHT_BYTES * 4) == 1  # at least one
    assert in_flight(torch.device("cuda"), 1024) == 0  # a GPU: the layer timed alone


def test_forwards_are_timed_among_alive_ones_and_backwards_first_in_first_out() -> None:
    layer = Counting()
    m = LayerMeasurement()
    _measure_size(layer, lambda: (torch.randn(2, 4),), 2, torch.device("cpu"), 1, 4, False, m, alive=3)
    # the window is filled first (untimed: 0, 1, 2 alive), then every timed forward (warm-up 1 + repeats 4)
    # runs with 3 earlier forwards alive
    assert layer.seen_alive[:8] == [0, 1, 2, 3, 3, 3, 3, 3]
    # backward timings: each fills the window to 3 + 1 and backpropagates the oldest
    assert layer.backwarded == sorted(layer.backwarded)  # first in, first out
    first_bwd_forward = 8
    assert layer.backwarded[0] == first_bwd_forward
    assert len(layer.backwarded) == 5 and m.fwd[2].median >= 0 and m.bwd[2].median >= 0


def test_alone_is_the_old_measurement() -> None:
    layer = Counting()
    _measure_size(layer, lambda: (torch.randn(2, 4),), 2, torch.device("cpu"), 1, 3, False, LayerMeasurement(), alive=0)
    assert set(layer.seen_alive) == {0}  # nothing kept: every forward alone
