"""Interleaved 1F1B (Narayanan et al., "Efficient Large-Scale Language Model Training on GPU Clusters
Using Megatron-LM", SC'21, section 2.2.2, figure 4 bottom).

* **Placement** (2.2.2): the model is cut into ``S = D*v`` stages ("model chunks"); device ``d`` holds
  the chunks ``d, d+D, d+2D, ...``, i.e. ``placement[0][s] = s mod D`` ("looped" placement in torch).
* **Micro-batches** (2.2.2): "this schedule requires the number of microbatches in a batch to be an
  integer multiple of the degree of pipeline parallelism": ``N mod D == 0`` when ``v > 1``, else
  ValueError (``v = 1`` is plain 1F1B, which takes any ``N``).
* **Order** -- Megatron-LM's ``forward_backward_pipelining_with_interleaving`` and torch's
  ``ScheduleInterleaved1F1B`` (identical for ``N mod D == 0``). Device ``d`` runs ``N*v`` forward and
  ``N*v`` backward "virtual" steps. Virtual forward step ``k`` runs chunk ``(k mod D*v) // D`` on
  micro-batch ``(k // D*v)*D + k mod D`` (groups of ``D`` micro-batches per chunk, "depth first");
  virtual backward step ``k`` runs chunk ``v-1-(k mod D*v)//D`` on the same micro-batch numbering.
  Warm-up: ``min((D-d-1)*2 + (v-1)*D, N*v)`` forwards; then one forward, one backward; then the
  remaining backwards.
* ``v = 1`` is Megatron's non-interleaved path (``forward_backward_pipelining_without_interleaving``),
  i.e. plain 1F1B with ``D-d-1`` warm-up forwards; torch's ``ScheduleInterleaved1F1B`` with one local
  stage would warm up with ``2(D-d-1)`` forwards instead (same makespan, more activations alive).

Bubble (2.2.2): with ``t_f``, ``t_b`` the forward/backward time of a micro-batch on a device's share of
the model, each chunk takes ``t_f/v`` and ``t_b/v`` and the bubble shrinks from ``(D-1)(t_f+t_b)`` to
``(D-1)(t_f+t_b)/v``: bubble fraction ``(D-1)/(v*N)`` of the ideal time ``N(t_f+t_b)``.
Peak activations: device ``d`` keeps at most ``warm-up + 1`` chunk activations alive.
"""

from __future__ import annotations

import numpy as np

from planner.schedules.common import check_positive, no_lists
from planner.schedules.ir import Action, B, F, Schedule
from planner.schedules.one_f_one_b import stage_inflight, stage_order

#: :func:`inflight` is the exact peak of the lists, not only a lower bound
INFLIGHT_EXACT = True


def placement(devices: int, chunks: int) -> list[list[int]]:
    """``placement[0][s] = s mod D`` for the ``D*v`` stages (section 2.2.2)."""
    return [[s % devices for s in range(devices * chunks)]]


def warmup_forwards(device: int, devices: int, microbatches: int, chunks: int) -> int:
    """Megatron-LM's ``num_warmup_microbatches`` for ``v > 1``: ``(D-d-1)*2 + (v-1)*D``, capped at
    ``N*v``; for ``v = 1`` the non-interleaved 1F1B's ``D-d-1`` (capped at ``N``)."""
    if chunks == 1:
        return min(devices - device - 1, microbatches)
    return min((devices - device - 1) * 2 + (chunks - 1) * devices, microbatches * chunks)


def device_order(device: int, devices: int, microbatches: int, chunks: int, kind_b: str = B) -> list[Action]:
    """Device ``d``'s list: warm-up forwards, steady 1F1B over virtual steps, cool-down backwards."""
    D, N, v = devices, microbatches, chunks
    if v == 1:
        return stage_order(device, D, N, kind_b)
    total = N * v
    warm = warmup_forwards(device, D, N, v)

    def mb(k: int) -> int:
        return (k // (D * v)) * D + k % D

    new = tuple.__new__  # Action(kind, stage, mb) without its keyword-handling constructor

    def fwd(k: int) -> Action:
        return new(Action, (F, ((k % (D * v)) // D) * D + device, mb(k), 0, 1, -1))

    def bwd(k: int) -> Action:
        return new(Action, (kind_b, (v - 1 - (k % (D * v)) // D) * D + device, mb(k), 0, 1, -1))

    out = [fwd(k) for k in range(warm)]
    for i in range(total - warm):
        out.append(fwd(warm + i))
        out.append(bwd(i))
    out.extend(bwd(k) for k in range(total - warm, total))
    return out


def shape(devices: int, microbatches: int, chunks: int = 2) -> Schedule:
    """The schedule without its action lists (what the planner needs before building them)."""
    check_positive(devices=devices, microbatches=microbatches, chunks=chunks)
    D, N, v = devices, microbatches, chunks
    if v > 1 and N % D:
        raise ValueError(f"interleaved: microbatches (N={N}) must be a multiple of devices (D={D}) "
                         f"when chunks > 1 (Megatron-LM 2.2.2: micro-batches run in groups of D per chunk)")
    return Schedule("interleaved", D, D * v, N, placement(D, v), no_lists(D), params={"chunks": v})


def _steps_of_chunk(steps: np.ndarray, chunk: int, devices: int, chunks: int) -> np.ndarray:
    """How many of the virtual forward steps ``0..steps-1`` run ``chunk``: ``D`` per period of ``D*v``
    steps, and within a period the steps ``chunk*D .. chunk*D+D-1``."""
    period = devices * chunks
    return (steps // period) * devices + np.clip(steps % period - chunk * devices, 0, devices)


def forwards_first(devices: int, microbatches: int, chunks: int = 2) -> list[list[int]]:
    """Per device and chunk (its stages in order), the forwards of :func:`device_order` before its first
    backward -- the warm-up and the first steady forward, all alive when that backward starts: a lower bound
    of the device's activation peak the memory check reads without building the lists."""
    shape(devices, microbatches, chunks)
    D, N, v = devices, microbatches, chunks
    out = []
    for d in range(D):
        first = min(warmup_forwards(d, D, N, v) + 1, N * v)
        if v == 1:
            out.append([first])
            continue
        out.append([int(_steps_of_chunk(np.array(first), c, D, v)) for c in range(v)])
    return out


def inflight(devices: int, microbatches: int, chunks: int = 2) -> dict[tuple[int, int], int]:
    """Per (replica, stage), the most micro-batches alive at once in :func:`device_order`, without
    building it. On device ``d`` with ``w`` warm-up forwards, the steady phase's ``i``-th forward
    (virtual step ``w+i``) comes before the ``i``-th backward, so chunk ``c`` then has
    ``fwd_c(w+i+1) - bwd_c(i)`` alive, where backward steps visit the chunks in the reverse order
    (``bwd_c = fwd_{v-1-c}``); both counts grow by ``D`` per ``D*v`` steps, so one period of ``i``
    gives the peak. Before the steady phase the count only grows (to ``fwd_c(w)``), after it only falls."""
    shape(devices, microbatches, chunks)
    D, N, v = devices, microbatches, chunks
    if v == 1:
        return stage_inflight(D, N)
    total = N * v
    # every device, chunk and step at once: axes (device, chunk, step); device d's steady phase has
    # min(total - w_d, D*v) steps of the one period that gives its peak
    w = np.array([warmup_forwards(d, D, N, v) for d in range(D)])[:, None, None]
    c = np.arange(v)[None, :, None]
    i = np.arange(D * v)[None, None, :]
    peak = _steps_of_chunk(w[:, :, 0], c[:, :, 0], D, v)  # (device, chunk): the warm-up's forwards
    alive = _steps_of_chunk(w + i + 1, c, D, v) - _steps_of_chunk(i, v - 1 - c, D, v)
    steady = np.where(i < np.minimum(total - w, D * v), alive, np.iinfo(np.int64).min).max(axis=2)
    peak = np.maximum(peak, steady).tolist()
    return {(0, k * D + d): int(peak[d][k]) for d in range(D) for k in range(v)}


def build(devices: int, microbatches: int, chunks: int = 2) -> Schedule:
    sched = shape(devices, microbatches, chunks)
    sched.actions = [device_order(d, devices, microbatches, chunks) for d in range(devices)]
    return sched
