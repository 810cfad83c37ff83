"""The clock a GPU holds under its power limit, by how busy a training step keeps it.

A GPU at its board power limit lowers its SM clock until its draw, averaged by the power controller over a
window far longer than a pipeline action, is at the limit (measured on a lent H100 SXM5 at 700 W:
benchmarks/DEVICE_CHECK.md, 'Runs'). Busy throughout, the matrix engines then run at
:attr:`planner.device.DeviceSpec.sustained_rate` of their burst rate (0.86 on the H100, clock 1980 -> ~1400
MHz). A training step is not busy throughout: its pipeline bubble, its exposed data-parallel reduction and its
optimizer step leave the matrix engines idle, the board draws less there, and the clock recovers for the busy
part. The same H100 ran GPT-3 175B's layer in bursts with idle gaps between them: 82% busy x1.066 / x1.075 of
its rested time, 66-67% x1.000 / x1.060, against x1.171 / x1.127 busy throughout (two calls); gaps filled by a
collective's stand-in (24 thread blocks copying, as an NCCL collective's channels do) recovered about half as
much as idle ones (x1.100 at 82%).

The rule (:func:`held_rate`): a GPU busy a share ``u`` of the step, idle (drawing ``idle_w``) the rest, may draw
``(limit_w - (1 - u) idle_w) / u`` while busy; its matrix rate rises linearly with that allowance from
``sustained_rate`` (busy throughout: the limit) to 1 (the burst draw ``burst_w``, where the clock is no longer
held down). With the H100's figures (:class:`PowerLimit`) it gives 0.94 at 82% busy, 0.95 at 80% and 1.0 at
67%, against 0.93-0.94, 0.94-0.96 and 0.94-1.0 measured.

:func:`busy_share` reads ``u`` off a simulated step: per device, its compute (the communication inside it --
tensor-parallel collectives, a blocking runtime's sends -- counts half, as the stand-in's gaps did) and its
exposed data-parallel reduction at half, over the makespan; the pipeline's mean. The cost model applies the rate
as a relief of the matrix part of each layer's time (:attr:`planner.cost.ConfigCosts.relief`), and the search
finds it as a fixed point: simulate, read the busy share, set the rate, simulate again
(:meth:`planner.search.Planner.evaluate`).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: how much of an idle gap's clock recovery a gap filled by a collective gets (a collective's NCCL channels
#: keep SMs and the links busy): measured about half on the lent H100 (module docstring)
COLLECTIVE_IDLE = 0.5
#: the fixed point stops when the rate moves less than this (a few tenths of a percent of the matrix time)
RATE_TOLERANCE = 2e-3
#: at most this many re-simulations per candidate
MAX_PASSES = 3


class PowerLimit(BaseModel):
    """A GPU's board power: its limit, what it draws idle inside a training step (clocks up, matrix engines
    waiting), and what its matrix-heavy work would draw at the burst clock (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    limit_w: float = Field(gt=0, allow_inf_nan=False, description="board power limit, W")
    idle_w: float = Field(ge=0, allow_inf_nan=False, description="draw while waiting inside a step, W")
    burst_w: float = Field(gt=0, allow_inf_nan=False, description="draw of matrix-heavy work unthrottled, W")

    @model_validator(mode="after")
    def _check(self) -> PowerLimit:
        if not self.idle_w < self.limit_w < self.burst_w:
            raise ValueError(f"power: needs idle_w < limit_w < burst_w, got {self.idle_w:g} / {self.limit_w:g} / "
                             f"{self.burst_w:g} W")
        return self


def held_rate(power: PowerLimit, sustained_rate: float, busy: float) -> float:
    """The matrix rate (a fraction of the burst rate) a GPU holds when busy a share ``busy`` of the time:
    ``sustained_rate`` at ``busy`` 1, rising linearly in the allowed busy draw to 1 (module docstring)."""
    if busy >= 1.0:
        return sustained_rate
    if busy <= 0.0:
        return 1.0
    allowed = (power.limit_w - (1.0 - busy) * power.idle_w) / busy
    lift = (allowed - power.limit_w) / (power.burst_w - power.limit_w)
    return min(1.0, sustained_rate + (1.0 - sustained_rate) * lift)


def busy_share(makespan: float, devices: list[tuple[float, float, float]]) -> float:
    """The pipeline's mean busy share of a simulated step: per device ``(compute, collectives_inside,
    exposed_reduction)`` seconds, where ``compute`` holds ``collectives_inside`` (tensor-parallel collectives
    charged on the compute stream); collectives count :data:`COLLECTIVE_IDLE` idle."""
    if makespan <= 0 or not devices:
        return 1.0
    shares = [(c - COLLECTIVE_IDLE * inside + (1 - COLLECTIVE_IDLE) * exposed) / makespan
              for c, inside, exposed in devices]
    return max(0.0, min(1.0, sum(shares) / len(shares)))
