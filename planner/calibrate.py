"""Calibration from finished jobs (issue 11 item 5): fit a cluster's correction factors to measured runs.

Each finished job is an :class:`Observation`: the profile, request and configuration it was planned with
and its measured iteration time ``y_j``. The factors ``theta = (c, l, o)`` of
:class:`planner.cluster.Calibration` act on the cost model (:mod:`planner.cost`, the hook at its end):
compute times times ``c`` (``compute_scale``), communication times times ``l`` (``link_scale``), plus
``o`` seconds per action of the executor's lists (``action_overhead``).

The predicted iteration time ``f_j(theta)`` is the simulated makespan, the length of a critical chain of
actions; every duration is affine in ``theta``, so ``f_j`` is piecewise affine: on the piece where the
critical chain stays the same, ``f_j(theta) = J_j theta + r_j`` with ``J_j = (compute on the chain,
communication on the chain, actions on the chain)`` and ``r_j`` what no factor scales (the measured
executor overhead). We take ``J_j`` by finite differences of the simulator (exact on the piece), solve
the linear least-squares problem ``min sum_j ((y_j - r_j - J_j theta) / y_j)^2`` (relative errors: jobs of
different sizes count alike) and repeat from the new ``theta`` until the chains stop changing
(Gauss-Newton on a piecewise-linear model; it ends in a few rounds).

Factors the jobs cannot tell apart are not fitted but kept at their prior (1, 1, 0): a factor whose column
adds nothing the others do not explain (the scaled system's condition number would pass ``MAX_COND``),
or a job set smaller than the number of factors. A fitted factor outside its range (``c, l > 0``,
``o >= 0``) is fixed at its bound and the rest refitted. Pure numpy; the simulator is the planner's own
(:func:`planner.search.predict`), so what is fitted is exactly what later plans use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import median

import numpy as np

from planner.cluster import Calibration, Cluster
from planner.profile import ModelProfile
from planner.request import Config, TrainingRequest

FACTORS = ("compute_scale", "action_overhead", "link_scale")  # the order they are admitted in
PRIOR = {"compute_scale": 1.0, "link_scale": 1.0, "action_overhead": 0.0}
LOWER = {"compute_scale": 1e-3, "link_scale": 1e-3, "action_overhead": 0.0}
MAX_COND = 1e4
MAX_ROUNDS = 12


@dataclass
class Observation:
    """One finished job: what it ran and how long an iteration took (seconds, measured)."""

    profile: ModelProfile
    request: TrainingRequest
    config: Config
    measured: float
    job_id: int | None = None


@dataclass
class JobError:
    job_id: int | None
    label: str
    measured: float
    before: float  # predicted without calibration
    after: float  # predicted with the fitted factors

    @property
    def error_before(self) -> float:
        return (self.measured - self.before) / self.before if self.before > 0 else math.inf

    @property
    def error_after(self) -> float:
        return (self.measured - self.after) / self.after if self.after > 0 else math.inf

    def to_dict(self) -> dict[str, object]:
        return {"job_id": self.job_id, "label": self.label, "measured": self.measured,
                "predicted_before": self.before, "predicted_after": self.after,
                "relative_error_before": self.error_before, "relative_error_after": self.error_after}


@dataclass
class CalibrationFit:
    calibration: Calibration
    jobs: list[JobError] = field(default_factory=list)
    rounds: int = 0

    def to_dict(self) -> dict[str, object]:
        return {"calibration": self.calibration.model_dump(mode="json"), "rounds": self.rounds,
                "jobs": [j.to_dict() for j in self.jobs]}


def with_calibration(cluster: Cluster, theta: dict[str, float] | Calibration | None) -> Cluster:
    """``cluster`` with its calibration replaced (None: uncalibrated)."""
    if theta is None or isinstance(theta, Calibration):
        return cluster.model_copy(update={"calibration": theta})
    return cluster.model_copy(update={"calibration": Calibration(**theta)})


def predicted(obs: Observation, cluster: Cluster) -> float:
    """The planner's iteration time of the observation's configuration on ``cluster``."""
    from planner.search import predict  # the search imports the cost model; keep this module light

    cand = predict(obs.profile, cluster, obs.request, obs.config)
    if not math.isfinite(cand.iteration_time) or cand.iteration_time <= 0:
        raise ValueError(f"job {obs.job_id}: configuration {obs.config.label()} cannot be predicted "
                         f"({cand.reason or 'no simulated time'})")
    return cand.iteration_time


def _jacobian(obs: list[Observation], base: Cluster, theta: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """Predictions at ``theta`` and their derivatives by each factor (forward differences; the makespan
    is piecewise affine, so a small step stays on the piece)."""
    f0 = np.array([predicted(o, with_calibration(base, theta)) for o in obs])
    J = np.zeros((len(obs), len(FACTORS)))
    for i, name in enumerate(FACTORS):
        if name == "action_overhead":
            h = max(theta[name] * 1e-3, 1e-9)
        else:
            h = theta[name] * 1e-3
        moved = with_calibration(base, {**theta, name: theta[name] + h})
        J[:, i] = (np.array([predicted(o, moved) for o in obs]) - f0) / h
    return f0, J


def _solve(J: np.ndarray, rhs: np.ndarray, y: np.ndarray,
           theta: dict[str, float]) -> tuple[dict[str, float], list[str]]:
    """One linear least-squares step: the factors that the columns of ``J`` determine, the others fixed."""
    w = 1.0 / y
    free: list[int] = []
    for i in range(len(FACTORS)):
        trial = free + [i]
        if len(trial) > len(y):
            break
        cols = J[:, trial] * w[:, None]
        norms = np.linalg.norm(cols, axis=0)
        if norms[-1] <= 1e-12 * max(1.0, float(np.linalg.norm(rhs * w))):
            continue  # the factor does not move any prediction
        if np.linalg.cond(cols / norms) <= MAX_COND:
            free = trial
    new = dict(theta)
    pinned: list[str] = []
    while True:
        fixed = [i for i in range(len(FACTORS)) if i not in free]
        b = rhs - J[:, fixed] @ np.array([new[FACTORS[i]] for i in fixed]) if fixed else rhs.copy()
        if not free:
            return new, pinned
        sol, *_ = np.linalg.lstsq(J[:, free] * w[:, None], b * w, rcond=None)
        out = [(i, float(v)) for i, v in zip(free, sol, strict=True) if v < LOWER[FACTORS[i]]]
        if not out:
            for i, v in zip(free, sol, strict=True):
                new[FACTORS[i]] = float(v)
            return new, [FACTORS[i] for i in free] + pinned
        i, _ = out[0]
        new[FACTORS[i]] = LOWER[FACTORS[i]]  # out of range: pin it at its bound, refit the rest
        pinned.append(f"{FACTORS[i]} (at its bound)")
        free.remove(i)


def fit(cluster: Cluster, observations: list[Observation], notes: str = "") -> CalibrationFit:
    """Fit ``compute_scale``, ``link_scale`` and ``action_overhead`` of ``cluster`` to the observations
    (module docstring). The cluster's own calibration, if any, is ignored: the fit starts from the
    uncalibrated cost model."""
    if not observations:
        raise ValueError("observations: calibration needs at least one finished job with a measured time")
    for o in observations:
        if not (math.isfinite(o.measured) and o.measured > 0):
            raise ValueError(f"measured: job {o.job_id} has iteration time {o.measured}; it must be > 0")
    base = with_calibration(cluster, None)
    y = np.array([o.measured for o in observations])
    theta = dict(PRIOR)
    before = np.array([predicted(o, base) for o in observations])
    fitted: list[str] = []
    rounds = 0
    for rounds in range(1, MAX_ROUNDS + 1):  # noqa: B007 - reported
        f0, J = _jacobian(observations, base, theta)
        r = f0 - J @ np.array([theta[n] for n in FACTORS])  # what no factor scales
        new, fitted = _solve(J, y - r, y, theta)
        change = max(abs(new[n] - theta[n]) / max(abs(theta[n]), 1e-9 if n == "action_overhead" else 1e-6)
                     for n in FACTORS)
        theta = new
        if change < 1e-7:
            break
    calibrated = with_calibration(base, theta)
    after = np.array([predicted(o, calibrated) for o in observations])
    jobs = [JobError(o.job_id, o.config.label(), o.measured, float(b), float(a))
            for o, b, a in zip(observations, before, after, strict=True)]
    cal = Calibration(**theta, jobs=len(observations), fitted=fitted,
                      error_before=median(abs(j.error_before) for j in jobs),
                      error_after=median(abs(j.error_after) for j in jobs),
                      notes=notes or f"least squares over {len(observations)} finished job(s), {rounds} round(s)")
    return CalibrationFit(cal, jobs, rounds)
