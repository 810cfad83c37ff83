"""Cutting a model's layers into pipeline stages.

Two partitioners:

* :func:`pipedream_partition` -- PipeDream's dynamic program (Harlap et al., SOSP'19, section 3.2), for
  its asynchronous pipelines whose stages may be replicated. With ``T_l`` the forward + backward time of
  layer ``l``, ``C_l`` the time to send layer ``l``'s output activations, ``w_l`` its parameter bytes and
  ``W^m_l = 4 (m-1) |w_l| / m`` bytes of weight synchronisation per worker (a parameter server, turned
  into time by the caller's bandwidth), a stage of layers ``i..j`` replicated over ``m`` machines takes

      T(i -> j, m) = (1/m) * max( sum_{l=i..j} T_l , sum_{l=i..j} W^m_l )

  and the slowest stage of the best pipeline over layers ``1..j`` and ``m`` machines is

      A(j, m) = min( T(1 -> j, m),
                     min_{1<=i<j} min_{1<=m'<m} max( A(i, m - m'), 2 C_i, T(i+1 -> j, m') ) ).

  The number of micro-batches the input stage admits (NOAM) is ``ceil(M / m_input)``.
  Our names: ``layer_time`` = T_l, ``comm_time`` = C_l, ``sync_time(i, j, m)`` = the time of
  sum W^m_l over the stage, ``machines`` = M.

* :func:`balance_by_cost` -- for synchronous schedules: ``S`` contiguous, non-empty stages (S = D,
  D*v interleaved, 2*W*D Hanayo) minimising the slowest stage, subject to per-stage memory capacities.
  Exact: binary search over the candidate bottleneck values (the sums of contiguous layer ranges) with a
  feasibility test. Without memory the test is greedy (pack each stage as far as the bound allows; with
  non-negative costs that never leaves a longer remainder than a feasible partition does). With memory
  the capacities differ per stage (1F1B keeps D-s micro-batches on stage s), and greedy is no longer
  exact (a heavy layer may fit only a later stage), so the test is a dynamic program over (stage, cut)
  in numpy: ``reach[k+1][j'] = OR_j reach[k][j] AND stage k fits on layers [j, j')``. That test passes at a
  bound exactly when the least bottleneck over the partitions that fit -- one min-max pass of the same program,
  ``best[k+1][j'] = min_j max(best[k][j], cost of [j, j'))`` -- is within it, so the search's answer is read
  from that optimum and the test runs once, for the partition at that bound.
  Non-uniform layers (embedding, LM head) are just layers with other costs, so a transformer's first
  and last stages come out with fewer blocks.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np


class PartitionError(ValueError):
    """No partition satisfies the constraints; the message says which."""


@dataclass(frozen=True)
class Partition:
    bounds: list[tuple[int, int]]  # per stage, layers [start, end)
    bottleneck: float  # cost of the slowest stage

    @property
    def stages(self) -> int:
        return len(self.bounds)

    def to_dict(self) -> dict:
        return {"bounds": [list(b) for b in self.bounds], "bottleneck": self.bottleneck}


def prefix_sums(xs: Sequence[float]) -> np.ndarray:
    """Running sums with a leading 0: ``out[j] - out[i]`` is the sum of ``xs[i:j]``."""
    return np.concatenate([[0.0], np.cumsum(np.asarray(xs, dtype=float))])


def balance_by_cost(cost: Sequence[float], stages: int,
                       memory: Sequence[float] | None = None,
                       capacity: Sequence[float] | float | None = None,
                       memory_scale: Sequence[float] | None = None,
                       memory_fixed: Sequence[float] | None = None,
                       fits: Callable[[int], np.ndarray] | None = None) -> Partition:
    """Split layers with per-layer ``cost`` into ``stages`` contiguous non-empty stages minimising the
    largest stage cost.

    Memory (optional): stage ``k`` holding layers ``i..j`` needs
    ``memory_fixed[k] + memory_scale[k] * sum(memory[i..j])`` bytes, at most ``capacity[k]``
    (scale defaults to 1, fixed to 0; a scalar capacity applies to every stage). Or, for any other
    memory model, ``fits(k)``: an ``(L+1) x (L+1)`` boolean array whose ``[i, j]`` says whether stage ``k``
    fits on layers ``[i, j)``. Raises :class:`PartitionError` when no partition fits.
    """
    L = len(cost)
    if stages < 1:
        raise PartitionError(f"stages must be >= 1, got {stages}")
    if L < stages:
        raise PartitionError(f"cannot cut {L} layers into {stages} non-empty stages")
    if any(c < 0 or not math.isfinite(c) for c in cost):
        raise PartitionError("layer costs must be finite and >= 0")
    pc = prefix_sums(cost)
    pc_list = pc.tolist()  # (greedy bisects a list: a numpy search per stage costs more than the search)
    if memory is not None:
        pm = prefix_sums(memory)
        caps = [float(capacity)] * stages if isinstance(capacity, (int, float)) else (
            list(capacity) if capacity is not None else [math.inf] * stages)
        scale = list(memory_scale) if memory_scale is not None else [1.0] * stages
        fixed = list(memory_fixed) if memory_fixed is not None else [0.0] * stages
        if not (len(caps) == len(scale) == len(fixed) == stages):
            raise PartitionError("capacity, memory_scale and memory_fixed need one value per stage")
    else:
        pm = None
    if fits is not None and memory is not None:
        raise PartitionError("give either memory (with capacity) or fits, not both")

    def greedy(limit: float) -> list[tuple[int, int]] | None:
        """Maximal-prefix packing under ``limit`` (no memory constraint); None if it needs more than
        ``stages`` stages. :func:`_fill` pads it to exactly ``stages``."""
        out: list[tuple[int, int]] = []
        i = 0
        for k in range(stages):
            if i == L:
                break
            j = bisect.bisect_right(pc_list, pc_list[i] + limit * (1 + 1e-12)) - 1
            j = min(j, L - (stages - k - 1))  # leave at least one layer for each later stage
            if j <= i:
                return None
            out.append((i, j))
            i = j
        return out if i == L else None

    if pm is not None or fits is not None:
        span_cost = pc[None, :] - pc[:, None]  # [j, j']: cost of layers j..j'-1
        upper = np.triu(np.ones((L + 1, L + 1), dtype=bool), 1)
        if pm is not None:
            span_mem = pm[None, :] - pm[:, None]
            mem_ok = [upper & (fixed[k] + scale[k] * span_mem <= caps[k] * (1 + 1e-12)) for k in range(stages)]
        else:
            assert fits is not None
            mem_ok = [upper & np.asarray(fits(k), dtype=bool) for k in range(stages)]

    def dp(limit: float) -> list[tuple[int, int]] | None:
        """Exact feasibility with per-stage memory capacities, and a partition when feasible."""
        cost_ok = span_cost <= limit * (1 + 1e-12)
        reach = np.zeros(L + 1, dtype=bool)
        reach[0] = True
        parents = []
        for k in range(stages):
            ok = cost_ok & mem_ok[k] & reach[:, None]
            parents.append(np.argmax(ok, axis=0))
            reach = ok.any(axis=0)
        if not reach[L]:
            return None
        out, j = [], L
        for k in range(stages - 1, -1, -1):
            i = int(parents[k][j])
            out.append((i, j))
            j = i
        return out[::-1]

    def optimum() -> float:
        """The smallest largest stage cost over the partitions that fit (inf: none fits), in one pass:
        ``best[k+1][j'] = min_j max(best[k][j], cost of [j, j'))`` where stage k fits on [j, j'). Max and min
        round nothing, so it is exactly the least bottleneck :func:`dp` could find feasible."""
        best = np.full(L + 1, math.inf)
        best[0] = 0.0
        for k in range(stages):
            best = np.where(mem_ok[k], np.maximum(best[:, None], span_cost), math.inf).min(axis=0)
        return float(best[L])

    # candidate bottlenecks: every contiguous sum; search over sorted unique values
    # (sorted and deduplicated as np.unique does, without its first-call import of numpy.ma: ~15 ms of
    # ``pipeplan plan``'s start)
    sums = np.sort((pc[None, :] - pc[:, None])[np.triu_indices(L + 1, 1)])
    sums = sums[np.concatenate(([True], sums[1:] != sums[:-1]))]
    lo, hi = bisect.bisect_left(sums.tolist(), max(cost) if cost else 0.0), len(sums) - 1
    if pm is None and fits is None:
        best = greedy(float(sums[hi]))
        if best is None:  # pragma: no cover - one stage per layer range always packs
            raise PartitionError(f"no partition of {L} layers into {stages} stages fits")
        while lo < hi:
            mid = (lo + hi) // 2
            got = greedy(float(sums[mid]))
            if got is None:
                lo = mid + 1
            else:
                hi, best = mid, got
    else:
        # with memory: the feasibility test at a candidate ``x`` is ``optimum() <= x (1 + 1e-12)`` (what dp
        # compares), so the binary search's answer -- the first candidate at or above ``lo`` that passes -- is
        # found from the optimum directly, and dp runs once, for its partition (the same one: 6-12x fewer
        # passes over the stages than one dp per step of the search)
        opt = optimum()
        if not math.isfinite(opt):
            raise PartitionError(f"no partition of {L} layers into {stages} stages fits the memory capacity")
        first = int(np.searchsorted(sums * (1 + 1e-12), opt, side="left"))
        got = dp(float(sums[max(lo, first)]))
        if got is None:  # pragma: no cover - the optimum's own partition passes
            raise PartitionError(f"no partition of {L} layers into {stages} stages fits the memory capacity")
        best = got
    bounds = _fill(best, stages)
    return Partition(bounds, max(pc[j] - pc[i] for i, j in bounds))


def _fill(bounds: list[tuple[int, int]], stages: int) -> list[tuple[int, int]]:
    """Greedy may use fewer stages than asked: split the largest-ranged stages until there are
    ``stages`` (a sub-range of a feasible stage is feasible, and the bottleneck cannot grow)."""
    out = list(bounds)
    while len(out) < stages:
        k = max(range(len(out)), key=lambda x: out[x][1] - out[x][0])
        i, j = out[k]
        if j - i < 2:
            raise PartitionError("not enough layers to fill every stage")
        out[k:k + 1] = [(i, j - 1), (j - 1, j)]
    return out


@dataclass(frozen=True)
class PipeDreamPlan:
    bounds: list[tuple[int, int]]  # per stage, layers [start, end)
    replicas: list[int]  # machines per stage
    slowest: float  # A(L, M)
    noam: int  # ceil(M / replicas of the input stage)

    def to_dict(self) -> dict:
        return {"bounds": [list(b) for b in self.bounds], "replicas": self.replicas,
                "slowest": self.slowest, "noam": self.noam}


def pipedream_partition(layer_time: Sequence[float], comm_time: Sequence[float], machines: int,
                        sync_time: Callable[[int, int, int], float] | None = None) -> PipeDreamPlan:
    """PipeDream's A(j, m) dynamic program (module docstring). ``sync_time(i, j, m)`` gives the weight
    synchronisation time of layers ``i..j-1`` replicated on ``m`` machines (default 0).

    Layers are 0-based here: a stage is ``[i, j)``; ``comm_time[i-1]`` is the activation time at the
    boundary before layer ``i``.
    """
    L, M = len(layer_time), machines
    if L < 1 or M < 1:
        raise PartitionError("need at least one layer and one machine")
    pt = prefix_sums(layer_time)
    sync = sync_time or (lambda i, j, m: 0.0)

    def T(i: int, j: int, m: int) -> float:
        return max(pt[j] - pt[i], sync(i, j, m) if m > 1 else 0.0) / m

    INF = math.inf
    A = [[INF] * (M + 1) for _ in range(L + 1)]
    choice: list[list[tuple[int, int] | None]] = [[None] * (M + 1) for _ in range(L + 1)]
    for j in range(1, L + 1):
        for m in range(1, M + 1):
            best, arg = T(0, j, m), None
            for i in range(1, j):
                two_c = 2 * comm_time[i - 1]
                if two_c >= best:
                    continue
                for mp in range(1, m):
                    sub = A[i][m - mp]
                    if sub >= best:
                        continue
                    v = max(sub, two_c, T(i, j, mp))
                    if v < best:
                        best, arg = v, (i, mp)
            A[j][m], choice[j][m] = best, arg
    m_best = M  # PipeDream's goal is A(N, M): every machine is used
    bounds: list[tuple[int, int]] = []
    reps: list[int] = []
    j, m = L, m_best
    while True:
        c = choice[j][m]
        if c is None:
            bounds.append((0, j))
            reps.append(m)
            break
        i, mp = c
        bounds.append((i, j))
        reps.append(mp)
        j, m = i, m - mp
    bounds.reverse()
    reps.reverse()
    return PipeDreamPlan(bounds, reps, A[L][m_best], math.ceil(M / reps[0]))


def _program(layer_time: Sequence[float], comm_time: Sequence[float], machines: int,
             sync_time: np.ndarray | None, fits: np.ndarray | None,
             sync_adds: bool, choices: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The tables of :func:`pipedream_partition_arrays`: ``A[j, m]`` and its choices (``choices=False``: the
    values alone, the choice tables left at 0 -- :func:`pipedream_slowest`, the same minima)."""
    L, M = len(layer_time), machines
    if L < 1 or M < 1:
        raise PartitionError("need at least one layer and one machine")
    pt = prefix_sums(layer_time)
    INF = math.inf
    fit = np.ones((L + 1, L + 1), dtype=bool) if fits is None else np.asarray(fits, dtype=bool)
    # the last stage of layers [j - k, j) by its width k = 1..K, K the widest stage that fits
    gap = np.arange(L + 1)[None, :] - np.arange(L + 1)[:, None]  # [i, j]: j - i
    K = int(np.where(fit & (gap > 0), gap, 0).max()) if fits is not None else L
    K = max(K, 1)
    jj = np.arange(L + 1)
    first = jj[None, :] - np.arange(1, K + 1)[:, None]  # [k-1, j]: first layer of the last stage
    ok = first >= 1  # (a stage after at least one layer)
    Ic = np.clip(first, 0, L)
    ms = np.arange(M + 1, dtype=float)
    ms[0] = 1.0

    def stage_time(i: np.ndarray, j: np.ndarray) -> np.ndarray:
        """T[m, ...] for stages [i, j) (arrays of one shape), INF where they do not fit."""
        t = np.repeat((pt[j] - pt[i])[None], M + 1, axis=0)
        if sync_time is not None:
            sy = np.asarray(sync_time, dtype=float)[:, i, j]
            if sync_adds:
                t[1:] = t[1:] + sy[1:]
            else:
                t[2:] = np.maximum(t[2:], sy[2:])
        t = t / ms.reshape((-1,) + (1,) * i.ndim)
        return np.where(fit[i, j][None], t, INF)

    T0 = stage_time(np.zeros(L + 1, dtype=np.int64), jj)  # [m, j]: one stage of layers [0, j)
    Tb = np.transpose(stage_time(Ic, np.broadcast_to(jj, Ic.shape)), (1, 2, 0))  # [k-1, j, m]
    A = np.full((L + 1, M + 1), INF)
    arg_i = np.zeros((L + 1, M + 1), dtype=np.int64)  # 0: one stage
    arg_m = np.zeros((L + 1, M + 1), dtype=np.int64)
    two_c = np.full(L + 1, INF)
    two_c[1:L] = 2 * np.asarray(comm_time, dtype=float)[:L - 1]  # boundary before layer i
    edge = np.where(ok, two_c[Ic], INF)[:, :, None]  # [k-1, j, 1]
    for m in range(1, M + 1):
        A[1:, m] = T0[m, 1:]
        if m == 1 or L == 1:
            continue
        mp = np.arange(1, m)
        sub = A[Ic][:, :, m - mp]  # [k-1, j, m'-1]: A(j - k, m - m')
        cand = np.maximum(np.maximum(sub, edge), Tb[:, :, 1:m])
        if not choices:
            np.minimum(A[:, m], cand.min(axis=(0, 2)), out=A[:, m])
            continue
        flat = cand.transpose(1, 0, 2).reshape(L + 1, -1)  # [j, (k-1) * (m-1) + m'-1]
        best = flat.argmin(axis=1)
        val = flat[jj, best]
        better = val < A[:, m]
        A[better, m] = val[better]
        arg_i[better, m] = jj[better] - (best[better] // (m - 1) + 1)
        arg_m[better, m] = best[better] % (m - 1) + 1
    return A, arg_i, arg_m


def pipedream_slowest(layer_time: Sequence[float], comm_time: Sequence[float], machines: int,
                      fits: np.ndarray | None = None) -> np.ndarray:
    """``A(L, m)`` for every ``m = 0..machines`` (``inf`` where nothing fits; entry 0 unused): one run of
    :func:`pipedream_partition_arrays`' program answers every smaller machine count too."""
    A, _, _ = _program(layer_time, comm_time, machines, None, fits, False, choices=False)
    return A[len(layer_time)]


def pipedream_partition_arrays(layer_time: Sequence[float], comm_time: Sequence[float], machines: int,
                               sync_time: np.ndarray | None = None, fits: np.ndarray | None = None,
                               sync_adds: bool = False) -> PipeDreamPlan:
    """:func:`pipedream_partition`'s program, vectorised with numpy (the search runs it; the tests check that
    both give the same ``slowest``). ``sync_time[m, i, j]``: the weight synchronisation time of layers
    ``[i, j)`` replicated on ``m`` machines (shape ``(M + 1, L + 1, L + 1)``; default 0). ``fits[i, j]``
    (optional): whether a stage of layers ``[i, j)`` fits a device's memory (PipeDream's program has no
    memory; ours leaves out the stages whose model state does not fit). ``sync_adds``: the synchronisation
    adds to the computation instead of overlapping it, ``T(i -> j, m) = (sum T_l + sync[m, i, j]) / m`` for
    every ``m`` (a flush: the all-reduce and the step follow the last backward). Raises :class:`PartitionError`
    when no partition fits.

    For each ``m`` in turn, every ``A(j, m)`` at once: ``A(i, m - m')`` is known for every ``m' >= 1``, so
    the candidates form an array over ``(i, j, m')``, reduced by ``min`` (ties go to the smallest ``i``,
    then ``m'``, as in the loops)."""
    L, M = len(layer_time), machines
    A, arg_i, arg_m = _program(layer_time, comm_time, machines, sync_time, fits, sync_adds)
    if not math.isfinite(A[L, M]):
        raise PartitionError(f"no partition of {L} layers over {M} machines fits the memory")
    bounds: list[tuple[int, int]] = []
    reps: list[int] = []
    j, m = L, M
    while True:
        i = int(arg_i[j, m])
        if i == 0:
            bounds.append((0, j))
            reps.append(m)
            break
        mp = int(arg_m[j, m])
        bounds.append((i, j))
        reps.append(mp)
        j, m = i, m - mp
    bounds.reverse()
    reps.reverse()
    return PipeDreamPlan(bounds, reps, float(A[L, M]), math.ceil(M / reps[0]))


def weighted_partition(costs: list[float], reps: tuple[int, ...]) -> list[tuple[int, int]]:
    """Contiguous ranges for stages of ``reps`` replicas minimising the largest per-replica work
    ``sum(costs[i:j]) / r`` (a dynamic program over (stage, cut))."""
    L, S = len(costs), len(reps)
    pc = prefix_sums(costs)
    best = np.full((S + 1, L + 1), np.inf)
    arg = np.zeros((S + 1, L + 1), dtype=np.int64)
    best[0, 0] = 0.0
    span = pc[None, :] - pc[:, None]
    span[np.tril_indices(L + 1)] = np.inf  # [i, j] with i < j only
    for k in range(1, S + 1):
        cand = np.maximum(best[k - 1][:, None], span / reps[k - 1])
        arg[k] = cand.argmin(axis=0)
        best[k] = cand.min(axis=0)
    out, j = [], L
    for k in range(S, 0, -1):
        i = int(arg[k, j])
        out.append((i, j))
        j = i
    return out[::-1]
