"""Point-to-point exchange of activations and gradients with ``torch.distributed.batch_isend_irecv``.

* **Posting policy** (:mod:`executor.p2p_order`): which sends and receives go into one ``batch_isend_irecv``
  group, and before which action of the list the group is posted. ``prefetch`` (the gloo default; Hanayo
  section 4.2) posts every receive of the iteration in one group at the start, into buffers whose shapes come
  from the model config and the micro-batch size (shapes are never sent), and every send in its own group
  right after its producer; communication then overlaps all computation before it. That deadlocks on NCCL,
  which serialises the groups of a rank in posting order and completes a send only once the peer has posted
  the matching receive: rank A posting ``[send s1 to B]`` then ``[recv r1 from B]`` while B posts
  ``[send s2 to A]`` then ``[recv r2 from A]`` never completes unless each send shares a group with the
  adjacent receive. ``grouped`` (the NCCL default) posts each run of consecutive sends/receives of the list
  as one group, cut in one global message order so that no rank waits on another in a cycle.
* A ``RECV_*`` action waits for its receive (just before the consumer); sends are waited for before the
  optimizer step. With NCCL ``batch_isend_irecv`` returns one handle for the whole group, so waiting for a
  receive waits for its group.
* **Matching**: every message carries a tag unique within the iteration (kind, replica, stage, micro-batch;
  gloo honours tags), and under every policy the receives from one peer are posted in the order that peer
  sends them, so a backend that matches by order (NCCL ignores tags) pairs the same messages.
* :func:`warm_up` runs one batched ring exchange over the whole world first (NCCL creates its communicators
  lazily at the first batched call, which must involve every rank); :func:`warm_up_pairs` then one tiny
  exchange per pair of neighbouring ranks, in one global order of the pairs (deadlock-free: the smallest
  pair not yet done has both its ranks at it), so NCCL connects every pair before the first iteration.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from executor.p2p_order import Group, message_key, posting_plan, receive_order
from planner.schedules.ir import RECV_B, RECV_F, SEND_B, SEND_F, Action, Schedule

__all__ = ["P2P", "message_key", "neighbour_pairs", "receive_order", "tag", "warm_up", "warm_up_pairs"]


def tag(schedule: Schedule, kind: str, replica: int, stage: int, mb: int) -> int:
    """Unique per message within an iteration: forward (0) / backward (1) x replica x stage x mb."""
    bit = 0 if kind in (SEND_F, RECV_F) else 1
    return 1 + ((bit * schedule.replicas + replica) * schedule.stages + stage) * schedule.microbatches + mb


class P2P:
    """Posts this rank's sends and receives for one iteration under a posting policy (module docstring).

    ``peer_rank`` maps a pipeline device to the global rank of this rank's copy, ``shape_of`` gives the
    receive buffer of an action, ``tensor_device`` is where buffers live (``cuda:LOCAL_RANK`` with NCCL; not
    yet run on a GPU), and ``blocking`` makes a receive wait also wait on the host (emulated compute on a GPU,
    timed on the host).
    """

    def __init__(self, schedule: Schedule, device: int, peer_rank: Callable[[int], int],
                 shape_of: Callable[[Action], tuple[tuple[int, ...], torch.dtype]], policy: str = "prefetch",
                 tensor_device: torch.device | None = None, blocking: bool = False) -> None:
        self.schedule, self.device, self.peer_rank, self.shape_of = schedule, device, peer_rank, shape_of
        self.policy = policy
        self.tensor_device = tensor_device or torch.device("cpu")
        self.blocking = blocking
        #: post homogeneous groups op by op (gloo only: the NCCL deadlock analysis takes a group as one call)
        self.direct = self.tensor_device.type == "cpu"
        self.groups: dict[int, list[Group]] = {}
        plan = posting_plan(schedule, device, policy)
        for g in plan:
            self.groups.setdefault(g.at, []).append(g)
        self.expected, self.posted = len(plan), 0  # groups per iteration, groups posted in this one
        self.recv: dict[Action, tuple[torch.Tensor, list[Any]]] = {}
        self.works: dict[int, Any] = {}  # handles not waited for yet (by id; gloo's cannot be waited twice)
        self.keep: list[torch.Tensor] = []  # send tensors, alive until their sends complete

    def post(self, index: int, payload: Callable[[Action], torch.Tensor]) -> list[Group]:
        """Post the groups due before action ``index`` (``payload(send)`` gives a send's tensor); returns them."""
        due = self.groups.get(index, [])
        self.posted += len(due)
        for group in due:
            ops, recvs = [], []
            for a in group.ops:
                if a.kind in (SEND_F, SEND_B):
                    t = payload(a).contiguous()
                    self.keep.append(t)
                    ops.append(dist.P2POp(dist.isend, t, self.peer_rank(a.peer),
                                          tag=tag(self.schedule, a.kind, a.replica, a.stage, a.mb)))
                else:
                    shape, dtype = self.shape_of(a)
                    buf = torch.empty(shape, dtype=dtype, device=self.tensor_device)
                    ops.append(dist.P2POp(dist.irecv, buf, self.peer_rank(a.peer),
                                          tag=tag(self.schedule, a.kind, a.replica, message_key(a)[2], a.mb)))
                    recvs.append((len(ops) - 1, a, buf))
            if self.direct and len({o.op for o in ops}) == 1:
                # gloo, all sends or all receives: each op posted on its own, as torch's pipelining
                # schedules do (``_batch_p2p``); ``batch_isend_irecv``'s coalescing adds ~40 us a message
                works = [o.op(o.tensor, o.peer, tag=o.tag) for o in ops]
            else:
                works = list(dist.batch_isend_irecv(ops))
            self.works.update((id(w), w) for w in works)
            # gloo: one handle per op; NCCL: one for the whole group
            for j, a, buf in recvs:
                self.recv[a] = (buf, [works[j]] if len(works) == len(ops) else works)
        return due

    def wait_receive(self, a: Action) -> torch.Tensor:
        """The received tensor of ``a`` (posted by an earlier group), once its receive has completed."""
        try:
            buf, works = self.recv.pop(a)
        except KeyError:
            raise RuntimeError(f"{a} was not posted before its RECV action (posting policy {self.policy})") from None
        for w in works:
            if self.works.pop(id(w), None) is not None:
                w.wait()
        if self.blocking and buf.is_cuda:
            torch.cuda.current_stream(buf.device).synchronize()
        return buf

    def finish(self) -> None:
        """Wait for everything posted in the iteration (before the optimizer step)."""
        if self.posted != self.expected:
            raise RuntimeError(f"device {self.device} posted {self.posted} of its {self.expected} p2p groups by STEP")
        self.posted = 0
        for w in self.works.values():
            w.wait()
        self.works.clear()
        self.keep.clear()
        self.recv.clear()


def neighbour_pairs(schedule: Schedule, ranks_of: Callable[[int, int], Iterable[tuple[int, int]]]) -> list[
        tuple[int, int]]:
    """The sorted pairs ``(a, b)``, ``a < b``, of global ranks that exchange point-to-point messages;
    ``ranks_of(d, peer)`` gives the rank pairs of every copy/tensor rank for devices ``d`` and ``peer``."""
    pairs: set[tuple[int, int]] = set()
    for d, row in enumerate(schedule.actions):
        for peer in {a.peer for a in row if a.kind in (SEND_F, SEND_B, RECV_F, RECV_B)}:
            for a, b in ranks_of(d, peer):
                pairs.add((min(a, b), max(a, b)))
    return sorted(pairs)


def warm_up(rank: int, world: int, device: torch.device | None = None) -> None:
    """One batched ring exchange involving every rank (module docstring)."""
    if world < 2:
        return
    out, into = torch.zeros(1, device=device), torch.zeros(1, device=device)
    ops = [dist.P2POp(dist.isend, out, (rank + 1) % world), dist.P2POp(dist.irecv, into, (rank - 1) % world)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()


def warm_up_pairs(rank: int, pairs: list[tuple[int, int]], device: torch.device | None = None) -> None:
    """One tiny send + receive per pair this rank belongs to, the pairs taken in the given global order."""
    for a, b in pairs:
        if rank not in (a, b):
            continue
        peer = b if rank == a else a
        out, into = torch.zeros(1, device=device), torch.zeros(1, device=device)
        ops = [dist.P2POp(dist.isend, out, peer), dist.P2POp(dist.irecv, into, peer)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
