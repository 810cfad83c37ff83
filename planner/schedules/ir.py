"""The schedule IR: one description of a pipeline schedule, shared by the simulator and the executor.

A :class:`Schedule` holds

* ``devices`` -- the number of devices of one pipeline group (data-parallel copies run the same lists);
* ``stages`` -- the number of stages, contiguous slices of the model numbered from the input;
* ``replicas`` -- how many copies of every stage the group holds (Chimera: ``2f``, GEMS: 2, else 1);
* ``placement[r][s]`` -- the device that holds stage ``s`` of replica ``r``;
* ``microbatches`` -- the micro-batches of one iteration; ``mb_replica[m]`` is the replica (pipeline)
  that micro-batch ``m`` runs through;
* ``actions[d]`` -- device ``d``'s ordered action list.

Action kinds follow ``torch.distributed.pipelining`` (``_ComputationType``): ``F`` forward, ``B`` full
backward, ``I`` backward for the input only and ``W`` backward for the weights only (zero-bubble
splits ``B`` into ``I`` + ``W``), ``SEND_F``/``RECV_F`` activations, ``SEND_B``/``RECV_B`` gradients.
Ours add ``ALLREDUCE`` (gradients of one stage replica across all its replicas -- Chimera's 2f
pipelines and the W data-parallel copies) and ``STEP`` (optimizer step).

A builder produces the *compute-only* form (F/B/I/W); :func:`lower` adds the communication and the
gradient synchronisation, deterministically, so the lowered form is a pure function of the compute-only
one. The simulator and the executor both run the lowered lists.

Text form: ``{stage}{KIND}{mb}`` as torch writes it (``0F1``, ``3B0``, ``2SEND_F5``), with two
extensions: ``r{replica}:`` in front when the replica is not 0 (``r1:0F2``), and ``{mb}-{last}`` for a
forward that runs several consecutive micro-batches at once (Chimera's forward doubling: ``1F2-3``).
``ALLREDUCE`` and ``STEP`` are written ``{stage}ALLREDUCE`` / ``STEP``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

F, B, I, W = "F", "B", "I", "W"  # noqa: E741 - the names torch uses
SEND_F, RECV_F, SEND_B, RECV_B = "SEND_F", "RECV_F", "SEND_B", "RECV_B"
ALLREDUCE, STEP = "ALLREDUCE", "STEP"

COMPUTE_KINDS = frozenset({F, B, I, W})
BACKWARD_KINDS = frozenset({B, I})  # the actions that produce the gradient w.r.t. the stage input
COMM_KINDS = frozenset({SEND_F, RECV_F, SEND_B, RECV_B})
ALL_KINDS = COMPUTE_KINDS | COMM_KINDS | {ALLREDUCE, STEP}


class Action(NamedTuple):
    """One step of a device's list.

    ``mb`` is the first micro-batch and ``span`` how many consecutive ones the action covers (only a
    forward may cover several, for Chimera's forward doubling). ``peer`` is the other device of a
    send/receive (-1 otherwise).
    """

    kind: str
    stage: int = -1
    mb: int = -1
    replica: int = 0
    span: int = 1
    peer: int = -1

    @property
    def mbs(self) -> range:
        return range(self.mb, self.mb + self.span)

    def __str__(self) -> str:  # compact text form
        if self.kind == STEP:
            return STEP
        prefix = f"r{self.replica}:" if self.replica else ""
        if self.kind == ALLREDUCE:
            return f"{prefix}{self.stage}{ALLREDUCE}"
        mb = f"{self.mb}-{self.mb + self.span - 1}" if self.span > 1 else f"{self.mb}"
        return f"{prefix}{self.stage}{self.kind}{mb}"


_ACTION_RE = re.compile(
    r"^(?:r(?P<rep>\d+):)?(?:(?P<stage>\d+)(?P<kind>SEND_F|RECV_F|SEND_B|RECV_B|ALLREDUCE|F|B|I|W)"
    r"(?P<mb>\d+)?(?:-(?P<last>\d+))?)?(?P<step>STEP)?$"
)


def parse_action(text: str) -> Action:
    """Inverse of ``str(action)`` (the peer of a send/receive is not part of the text)."""
    m = _ACTION_RE.match(text.strip())
    if not m or (m["step"] and m["stage"]) or not (m["step"] or m["stage"]):
        raise ValueError(f"cannot parse action {text!r}: expected e.g. '0F1', 'r1:2B3', '1F2-3', 'STEP'")
    if m["step"]:
        return Action(STEP)
    kind, stage, rep = m["kind"], int(m["stage"]), int(m["rep"] or 0)
    if kind == ALLREDUCE:
        return Action(ALLREDUCE, stage, -1, rep)
    if m["mb"] is None:
        raise ValueError(f"cannot parse action {text!r}: {kind} needs a micro-batch number")
    mb = int(m["mb"])
    span = int(m["last"]) - mb + 1 if m["last"] is not None else 1
    if span < 1:
        raise ValueError(f"cannot parse action {text!r}: empty micro-batch range")
    return Action(kind, stage, mb, rep, span)


#: placements of at least this many (replica, stage) entries are read with numpy by
#: :meth:`Schedule.stages_by_device` (below it, the Python loop is as fast)
_PAIRS_WITH_NUMPY = 4096


def _stages_by_device(placement: list[list[int]], devices: int) -> list[list[tuple[int, int]]] | None:
    """:meth:`Schedule.stages_by_device` of a rectangular ``placement`` with numpy: the first (replica, stage)
    placing each (stage, device), in placement order (replica by replica), grouped by device in that order.
    Chimera with f pipelines places 2f replicas of D stages (65536 entries at D = 256, f = 128), where the
    loop took ~70 ms per call, once per schedule shape and once per simulation. None where a device number
    is outside ``range(devices)`` (the loop's error is the caller's)."""
    place = np.array(placement, dtype=np.int64)
    if not place.size or place.min() < 0 or place.max() >= devices:
        return None
    S = place.shape[1]
    flat = place.ravel()
    # first occurrence of each (stage, device) in r-major order, back in that order
    _, first = np.unique(np.arange(S) * devices + place, return_index=True)
    first.sort()
    dev = flat[first]
    order = np.argsort(dev, kind="stable")  # grouped by device, placement order kept within a device
    pairs = list(zip((first[order] // S).tolist(), (first[order] % S).tolist(), strict=True))
    out: list[list[tuple[int, int]]] = []
    start = 0
    for n in np.bincount(dev, minlength=devices).tolist():
        out.append(pairs[start:start + n])
        start += n
    return out


@dataclass
class Schedule:
    """A pipeline schedule as plain data (see the module docstring)."""

    name: str
    devices: int
    stages: int
    microbatches: int
    placement: list[list[int]]
    actions: list[list[Action]]
    mb_replica: list[int] = field(default_factory=list)
    params: dict[str, Any] = field(default_factory=dict)
    #: asynchronous schedules (PipeDream, 2BW) keep several weight versions per stage
    weight_versions: list[int] = field(default_factory=list)
    synchronous: bool = True
    lowered: bool = False

    def __post_init__(self) -> None:
        if not self.mb_replica:
            self.mb_replica = [0] * self.microbatches

    @property
    def replicas(self) -> int:
        return len(self.placement)

    def device_of(self, stage: int, replica: int = 0) -> int:
        return self.placement[replica][stage]

    def stages_on(self, device: int) -> list[tuple[int, int]]:
        """(replica, stage) pairs that ``device`` holds, in order: one per stage copy (weights), named by
        the first replica placing the stage there (:meth:`stages_by_device`)."""
        out: list[tuple[int, int]] = []
        seen: set[int] = set()
        for r, row in enumerate(self.placement):
            for s, d in enumerate(row):
                if d == device and s not in seen:
                    seen.add(s)
                    out.append((r, s))
        return out

    def stages_by_device(self) -> list[list[tuple[int, int]]]:
        """:meth:`stages_on` of every device, in one pass over the placement. Weights belong to a (stage,
        device): replicas that place the same stage on the same device share one copy of it (PipeDream's
        replicated stages, :mod:`planner.schedules.one_f_one_b_rr`, whose micro-batches take routes through
        the stage replicas), named by the first such replica; every other schedule places a stage at most
        once per device."""
        R = len(self.placement)
        S = len(self.placement[0]) if R else 0
        if R * S >= _PAIRS_WITH_NUMPY and all(len(row) == S for row in self.placement):
            got = _stages_by_device(self.placement, self.devices)
            if got is not None:
                return got
        out: list[list[tuple[int, int]]] = [[] for _ in range(self.devices)]
        seen: set[tuple[int, int]] = set()
        for r, row in enumerate(self.placement):
            for s, d in enumerate(row):
                if (s, d) not in seen:
                    seen.add((s, d))
                    out[d].append((r, s))
        return out

    def copy_of(self, device: int) -> dict[int, int]:
        """Per stage ``device`` holds, the replica naming its copy there (:meth:`stages_by_device`); an
        action of another replica on the same (stage, device) uses that copy."""
        return {s: r for r, s in self.stages_on(device)}

    def compute_only(self) -> Schedule:
        """The same schedule with only F/B/I/W actions."""
        acts = [[a for a in row if a.kind in COMPUTE_KINDS] for row in self.actions]
        return Schedule(self.name, self.devices, self.stages, self.microbatches, self.placement, acts,
                        list(self.mb_replica), dict(self.params), list(self.weight_versions),
                        self.synchronous, False)

    # ---- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "devices": self.devices,
            "stages": self.stages,
            "microbatches": self.microbatches,
            "placement": self.placement,
            "mb_replica": self.mb_replica,
            "params": self.params,
            "weight_versions": self.weight_versions,
            "synchronous": self.synchronous,
            "lowered": self.lowered,
            "actions": [[_action_to_text(a) for a in row] for row in self.actions],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Schedule:
        for key in ("name", "devices", "stages", "microbatches", "placement", "actions"):
            if key not in data:
                raise ValueError(f"schedule JSON lacks the field '{key}'")
        acts = [[_action_from_text(t) for t in row] for row in data["actions"]]
        return cls(
            name=str(data["name"]), devices=int(data["devices"]), stages=int(data["stages"]),
            microbatches=int(data["microbatches"]), placement=[list(map(int, r)) for r in data["placement"]],
            actions=acts, mb_replica=list(data.get("mb_replica") or []),
            params=dict(data.get("params") or {}),
            weight_versions=list(data.get("weight_versions") or []),
            synchronous=bool(data.get("synchronous", True)), lowered=bool(data.get("lowered", False)),
        )

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        return cls.from_dict(json.loads(text))

    def to_text(self) -> str:
        """One line per device: ``d: a1 a2 ...`` (peers of sends/receives as ``>peer`` / ``<peer``)."""
        return "\n".join(f"{d}: " + " ".join(_action_to_text(a) for a in row)
                         for d, row in enumerate(self.actions))


def _action_to_text(a: Action) -> str:
    if a.kind in (SEND_F, SEND_B):
        return f"{a}>{a.peer}"
    if a.kind in (RECV_F, RECV_B):
        return f"{a}<{a.peer}"
    return str(a)


def _action_from_text(t: str) -> Action:
    for sep in (">", "<"):
        if sep in t:
            body, peer = t.split(sep, 1)
            return parse_action(body)._replace(peer=int(peer))
    return parse_action(t)


# ---- lowering: compute-only -> with communication and gradient synchronisation -------------------

def _producer_stage(kind: str, stage: int) -> int:
    return stage + 1 if kind == F else stage - 1


def builder_eager(schedule: Schedule) -> Iterable[int] | str:
    """The eager all-reduces a compute-only schedule's builder chose (``params["eager"]``), as :func:`lower`
    takes them: a collection of stages, ``"all"`` or ``"none"``. A schedule without the parameter, or with
    an unresolved ``"auto"`` (Chimera resolves it when it builds, :mod:`planner.schedules.chimera`),
    all-reduces at the end: ``"none"``. The one place this mapping is written (the simulator, the
    validator and :meth:`planner.runspec.RunSpec.lowered` read it)."""
    eager = schedule.params.get("eager", "none")
    return "none" if eager == "auto" else eager


def lower(schedule: Schedule, eager: Iterable[int] | str = "none") -> Schedule:
    """Add SEND/RECV, ALLREDUCE and STEP to a compute-only schedule.

    * After ``F(s, m)`` whose next stage ``s+1`` sits on another device: ``SEND_F(s, m) -> dev(s+1)``;
      just before ``F(s+1, m)`` on that device: ``RECV_F(s+1, m) <- dev(s)``. Gradients likewise:
      after ``B``/``I`` of stage ``s`` a ``SEND_B`` to ``dev(s-1)``, and a ``RECV_B`` before the
      ``B``/``I`` of stage ``s-1``. A multi-micro-batch forward sends one message.
    * One ``ALLREDUCE(replica, stage)`` for every stage copy the device holds (:meth:`Schedule.stages_on`;
      a replica that ran no micro-batch contributes zero gradients, so all replicas end with the same
      weights): right after
      its last backward (``B``, or ``W`` when split) when the stage is in ``eager`` (Chimera 3.2, eager
      gradient synchronisation), otherwise at the end of the list in stage order. ``eager`` is
      ``"all"``, ``"none"`` or a collection of stage numbers; it is decided per stage, for all replicas
      alike, so every device meets a stage's all-reduce at the same point of its work.
    * One ``STEP`` last.

    Receives are placed just before their consumer; the executor posts them ahead of time (Hanayo 4.2,
    prefetching) in list order. All-reduces are posted asynchronously and waited for by ``STEP``.
    """
    if schedule.lowered:
        raise ValueError("schedule is already lowered")
    S = schedule.stages
    place = schedule.placement
    eager_set = eager_stages(eager, S)

    out: list[list[Action]] = []
    for d, row in enumerate(schedule.actions):
        eager_at, at_end = allreduce_points(schedule, d, eager_set)
        new = list(lowered_row(row, d, S, place, eager_at, at_end))
        out.append(new)
    return Schedule(schedule.name, schedule.devices, schedule.stages, schedule.microbatches,
                    schedule.placement, out, list(schedule.mb_replica),
                    {**schedule.params, "eager": sorted(eager_set)}, list(schedule.weight_versions),
                    schedule.synchronous, True)


def lowered_row(row: Sequence[Action], device: int, stages: int, placement: Sequence[Sequence[int]],
                eager_at: dict[int, list[tuple[int, int]]],
                at_end: Sequence[tuple[int, int]]) -> Iterable[Action]:
    """``device``'s lowered list (see :func:`lower`) from its compute-only ``row`` and the all-reduce
    points of :func:`allreduce_points`."""
    d, place, last = device, placement, stages - 1
    for i, a in enumerate(row):
        k, s, r = a.kind, a.stage, a.replica
        if k == F and s > 0 and place[r][s - 1] != d:
            yield Action(RECV_F, s, a.mb, r, a.span, place[r][s - 1])
        elif k in BACKWARD_KINDS and s < last and place[r][s + 1] != d:
            yield Action(RECV_B, s, a.mb, r, 1, place[r][s + 1])
        yield a
        if k == F and s < last and place[r][s + 1] != d:
            yield Action(SEND_F, s, a.mb, r, a.span, place[r][s + 1])
        elif k in BACKWARD_KINDS and s > 0 and place[r][s - 1] != d:
            yield Action(SEND_B, s, a.mb, r, 1, place[r][s - 1])
        for rr, ss in eager_at.get(i, ()):
            yield Action(ALLREDUCE, ss, -1, rr)
    for r, s in at_end:
        yield Action(ALLREDUCE, s, -1, r)
    yield Action(STEP)


def eager_stages(eager: Iterable[int] | str, stages: int) -> set[int]:
    """The stages :func:`lower` all-reduces eagerly: ``"all"``, ``"none"`` or a collection of stages."""
    if eager == "all":
        return set(range(stages))
    if eager == "none":
        return set()
    if isinstance(eager, str):
        raise ValueError(f"eager must be 'all', 'none' or a list of stages, got {eager!r}")
    return {int(x) for x in eager}


def allreduce_points(schedule: Schedule, device: int, eager_set: set[int],
                     held: Sequence[tuple[int, int]] | None = None
                     ) -> tuple[dict[int, list[tuple[int, int]]], list[tuple[int, int]]]:
    """Where :func:`lower` puts ``device``'s all-reduces: ``(eager_at, at_end)``, with ``eager_at[i]`` the
    (replica, stage) pairs all-reduced right after compute action ``i`` of the device's (compute-only)
    list, and ``at_end`` the pairs all-reduced at the end of the list, in that order. ``held``: the
    device's (replica, stage) pairs when the caller has them (:meth:`Schedule.stages_by_device`)."""
    row = schedule.actions[device]
    if held is None:
        held = schedule.stages_on(device)
    copy = {s: r for r, s in held}  # replicas sharing a stage copy all-reduce it once, under its name
    # index of the last gradient-producing action per (replica, stage) copy on this device
    last_grad: dict[tuple[int, int], int] = {}
    split = {(a.replica, a.stage) for a in row if a.kind == W}
    for i, a in enumerate(row):
        if a.kind == W or (a.kind in BACKWARD_KINDS and (a.replica, a.stage) not in split):
            last_grad[(copy.get(a.stage, a.replica), a.stage)] = i
    eager_at: dict[int, list[tuple[int, int]]] = {}
    for key, i in last_grad.items():
        if key[1] in eager_set:
            eager_at.setdefault(i, []).append(key)
    done_eager = {key for keys in eager_at.values() for key in keys}
    at_end = [(r, s) for r, s in sorted(held, key=lambda rs: (rs[1], rs[0])) if (r, s) not in done_eager]
    return eager_at, at_end


def replica_placement(devices: int, stages: int, order: Sequence[int] | None = None) -> list[list[int]]:
    """Helper for one-replica schedules: ``placement[0][s] = order[s]`` (default: device = stage)."""
    order = list(order) if order is not None else list(range(stages))
    if len(order) != stages:
        raise ValueError("placement order must name one device per stage")
    if any(not 0 <= d < devices for d in order):
        raise ValueError(f"placement names a device outside 0..{devices - 1}")
    return [order]
