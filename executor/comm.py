"""Point-to-point exchange of activations and gradients with ``torch.distributed.batch_isend_irecv``.

* **Receives are posted ahead of time** (Hanayo section 4.2, prefetching): at the start of an iteration
  every receive of the rank's lowered list is posted in one ``batch_isend_irecv`` call, into buffers whose
  shapes come from the model config and the micro-batch size (shapes are never sent); the ``RECV_*``
  action only waits for its handle, so communication overlaps the computation before it.
* **Sends** are posted right after their producer (the ``SEND_*`` action) and waited for before the
  optimizer step.
* **Matching**: every message carries a tag unique within the iteration (kind, replica, stage,
  micro-batch; gloo honours tags), and the receives from one peer are posted in the order that peer's
  list sends them (derived from the sender's list, :func:`receive_order`), so a backend that matches by
  order (NCCL ignores tags) pairs the same messages.
* :func:`warm_up` runs one batched ring exchange over the whole world first (NCCL creates its
  communicators lazily at the first batched call, which must involve every rank).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from planner.schedules.ir import RECV_B, RECV_F, SEND_B, SEND_F, Action, Schedule

_SENDER_KIND = {RECV_F: SEND_F, RECV_B: SEND_B}


def tag(schedule: Schedule, kind: str, replica: int, stage: int, mb: int) -> int:
    """Unique per message within an iteration: forward (0) / backward (1) x replica x stage x mb."""
    bit = 0 if kind in (SEND_F, RECV_F) else 1
    return 1 + ((bit * schedule.replicas + replica) * schedule.stages + stage) * schedule.microbatches + mb


def message_key(a: Action) -> tuple[str, int, int, int]:
    """The message a send or receive moves: (SEND kind, replica, producing stage, first mb)."""
    if a.kind in (SEND_F, SEND_B):
        return a.kind, a.replica, a.stage, a.mb
    if a.kind == RECV_F:
        return SEND_F, a.replica, a.stage - 1, a.mb
    return SEND_B, a.replica, a.stage + 1, a.mb


def receive_order(schedule: Schedule, device: int) -> list[Action]:
    """``device``'s receives ordered per peer as the peer's list sends them (peers in device order)."""
    recvs = [a for a in schedule.actions[device] if a.kind in (RECV_F, RECV_B)]
    by_peer: dict[int, list[Action]] = {}
    for a in recvs:
        by_peer.setdefault(a.peer, []).append(a)
    out: list[Action] = []
    for peer in sorted(by_peer):
        pos = {message_key(a): i for i, a in enumerate(schedule.actions[peer]) if a.kind in (SEND_F, SEND_B)}
        out += sorted(by_peer[peer], key=lambda a: pos[message_key(a)])
    return out


class P2P:
    """Posts this rank's receives and sends for one iteration (see the module docstring)."""

    def __init__(self, schedule: Schedule, device: int, peer_rank: Callable[[int], int],
                 shape_of: Callable[[Action], tuple[tuple[int, ...], torch.dtype]]) -> None:
        self.schedule, self.device, self.peer_rank, self.shape_of = schedule, device, peer_rank, shape_of
        self.order = receive_order(schedule, device)
        self.recv: dict[Action, tuple[torch.Tensor, Any]] = {}
        self.sends: list[Any] = []

    def post_receives(self) -> None:
        ops, bufs = [], []
        for a in self.order:
            shape, dtype = self.shape_of(a)
            buf = torch.empty(shape, dtype=dtype)
            src, stage = self.peer_rank(a.peer), message_key(a)
            ops.append(dist.P2POp(dist.irecv, buf, src, tag=tag(self.schedule, a.kind, a.replica, stage[2], a.mb)))
            bufs.append((a, buf))
        works = dist.batch_isend_irecv(ops) if ops else []
        # batch_isend_irecv returns one handle per op (gloo) or a single one for the batch (NCCL)
        for i, (a, buf) in enumerate(bufs):
            self.recv[a] = (buf, works[i] if len(works) == len(ops) else (works[0] if i == 0 else None))

    def wait_receive(self, a: Action) -> torch.Tensor:
        buf, work = self.recv.pop(a)
        if work is not None:
            work.wait()
        return buf

    def send(self, a: Action, tensor: torch.Tensor) -> None:
        op = dist.P2POp(dist.isend, tensor.contiguous(), self.peer_rank(a.peer),
                        tag=tag(self.schedule, a.kind, a.replica, a.stage, a.mb))
        self.sends += dist.batch_isend_irecv([op])

    def finish(self) -> None:
        for w in self.sends:
            w.wait()
        self.sends.clear()
        for a in list(self.recv):
            self.wait_receive(a)


def warm_up(rank: int, world: int) -> None:
    """One batched ring exchange involving every rank (module docstring)."""
    if world < 2:
        return
    out, into = torch.zeros(1), torch.zeros(1)
    ops = [dist.P2POp(dist.isend, out, (rank + 1) % world), dist.P2POp(dist.irecv, into, (rank - 1) % world)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
