"""The action walker: each rank runs its lowered list of the schedule IR (:func:`planner.schedules.ir.lower`),
the same list the simulator times -- there is no second description of a schedule here.

Per action (Hanayo section 4, "action list" runtime; kinds as in ``torch.distributed.pipelining``):

Before each action, the point-to-point groups the posting policy puts there are posted (:mod:`executor.comm`,
:mod:`executor.p2p_order`: all receives at the start with ``prefetch``, a run's sends and receives together
with ``grouped``).

* ``RECV_F``/``RECV_B`` -- wait for the receive (posted by an earlier group).
* ``F`` -- forward of the stage replica on its micro-batch(es) with autograd; the first stage reads token
  ids, the last computes the loss, scaled by ``1/(W N)`` so the gradients are those of the *global*
  batch mean. A forward with ``span = 2`` (Chimera 3.5, forward doubling) concatenates its micro-batches
  and runs them at once; each of them is backpropagated by its own ``B`` (through its half of the
  output; the graph is kept until the last one).
* ``B`` -- full backward: parameter gradients accumulate, the input gradient is kept for ``SEND_B``.
* ``I``/``W`` -- zero-bubble's split backward (Qi et al., ICLR'24, section 2): ``I`` computes the input
  gradient only and keeps the gradient arriving where each weight's branch joins the graph; ``W`` later
  runs only those branches (:mod:`executor.split_backward`).
* ``SEND_F``/``SEND_B`` -- nothing left to do: the send went out with its group (:meth:`executor.comm.P2P.post`),
  which takes the tensor the producer left in the outbox.
* ``ALLREDUCE`` -- the stage's gradients (summed over the replicas of the stage the rank holds) are
  all-reduced asynchronously over the stage group (:mod:`executor.groups`): eager where the lowering put it
  (Chimera 3.2), at the end otherwise. The collective is issued at the rank's last ``ALLREDUCE`` of the
  stage, once per stage and iteration. With expert parallelism (``e > 1``, :mod:`executor.expert_parallel`) the
  experts' gradients are all-reduced apart, over the stage's expert-data group (the holders whose copy has this
  rank's EP rank), and the rest over the stage group: both sums.
* ``STEP`` -- wait for sends and all-reduces, all-reduce the tied embedding copies (Megatron-LM), step the
  optimizer (plain SGD, :mod:`executor.sgd`, so pipelined and single-process training can be compared exactly);
  with DeepSeek-V3's routing (``router_bias``) move each router's bias by the experts' loads of the iteration, summed
  over every copy of the stage (:meth:`RankRuntime._update_expert_bias`, one int64 all-reduce per stage).

Activation recomputation: each transformer layer runs under its own ``torch.utils.checkpoint`` (Chen et al.
2016; Megatron-LM section 3.5, ``--recompute-method uniform --recompute-num-layers 1``); the embedding and the
LM head are not checkpointed (:class:`StageModule`, :func:`planner.profile.checkpointed`); a recomputation adds
nothing to the routers' loads (:func:`executor.models.llama.not_counted`).
Asynchronous schedules (``synchronous = False``): PipeDream (Harlap et al.,
section 3.3) -- weight stashing: a forward runs on a snapshot of the newest weights (``functional_call``)
that its backward reuses, and the optimizer steps after every backward (PipeDream-RR, replicated stages: each
replica steps on its own micro-batches and adds the other replicas' updates of the window at its ALLREDUCE,
:mod:`planner.schedules.pipedream_rr`; checked against :mod:`executor.stash_reference`); PipeDream-2BW
(Narayanan et al.,
ICML'21, section 3.1) -- double buffering: forwards use the current version, gradients accumulate onto
the live weights and the update at ``STEP`` creates the next version; at most two versions are alive.

Devices: on CPU (gloo) every tensor lives in host memory and actions are timed with ``time.perf_counter``.
With NCCL each rank runs on ``cuda:LOCAL_RANK`` (model, batch, buffers) and actions are timed by
``torch.cuda.Event`` pairs on the current stream, resolved after the iteration with one synchronisation
(:class:`CudaClock`) -- this GPU path has not been run on a GPU yet (no GPU where it was written).

Emulated compute (:mod:`executor.emulate`): compute actions wait for their predicted duration instead
(``time.sleep``, clearly labelled); messages and all-reduces are real, with the profile's sizes, when the
cluster's links are this machine's, else tokens that wait for their predicted durations
(``Emulator.comm``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call
from torch.utils.checkpoint import checkpoint

from executor.comm import P2P
from executor.expert_parallel import ExpertParallelMoE, expert_parameters
from executor.groups import Groups, Layout
from executor.models import takes_targets
from executor.models.blocks import Block
from executor.models.llama import LlamaBlock, apply_expert_loads, expert_bias_state, expert_loads, not_counted
from executor.p2p_order import action_label
from executor.plan import RunPlan
from executor.sgd import SGD
from executor.split_backward import Split, split_input
from executor.tensor_parallel import TensorParallelBlock, TensorParallelLlamaBlock
from planner.profile import checkpointed, stage_splits_backward
from planner.schedules.ir import (
    ALLREDUCE,
    RECV_B,
    RECV_F,
    SEND_B,
    SEND_F,
    STEP,
    Action,
    B,
    F,
    I,
    Schedule,
    W,
)

DTYPES = {"float32": torch.float32, "float64": torch.float64}

Record = tuple[str, str, float, float]


class HostClock:
    """``time.perf_counter`` stamps: on CPU an action's work is done when its call returns."""

    def begin(self) -> None:
        """Start of an iteration (nothing to do on the host)."""

    def stamp(self) -> Any:
        return time.perf_counter()

    def resolve(self, records: Sequence[tuple[str, str, Any, Any]]) -> list[Record]:
        return [(n, k, float(s), float(e)) for n, k, s, e in records]


class CudaClock:
    """``torch.cuda.Event`` stamps on the current stream (a GPU runs the work after the call returns).

    :meth:`begin` synchronises the device (idle after the barrier) and records a base event at a known host
    time; :meth:`resolve` synchronises once after the iteration and places every event at that host time plus
    its elapsed time from the base, so ranks stay comparable on the shared host clock. Not yet run on a GPU.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.t0 = 0.0
        self.base: Any = None

    def begin(self) -> None:
        torch.cuda.synchronize(self.device)
        self.t0 = time.perf_counter()
        self.base = self.stamp()

    def stamp(self) -> Any:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def resolve(self, records: Sequence[tuple[str, str, Any, Any]]) -> list[Record]:
        torch.cuda.synchronize(self.device)
        at = self.base.elapsed_time  # milliseconds from the base event
        return [(n, k, self.t0 + at(s) / 1e3, self.t0 + at(e) / 1e3) for n, k, s, e in records]


def _recomputed_uncounted() -> tuple[Any, Any]:
    """A checkpoint's contexts (``context_fn``): its forward as it is, its recomputation during the backward not
    counted in the routers' loads (:func:`executor.models.llama.not_counted`: the forward counted those tokens)."""
    return nullcontext(), not_counted()


class StageModule(nn.Module):
    """Layers ``[start, stop)`` of the model as one stage: ``forward(x, targets) -> list`` of per-micro-batch
    outputs (the losses on the last stage). When recomputing, each layer whose kind full recomputation
    checkpoints (``kinds``; :func:`planner.profile.checkpointed`: the transformer blocks, not the embedding nor
    the LM head) runs under its own non-reentrant ``torch.utils.checkpoint``: a micro-batch in flight keeps
    each such layer's input and the other layers' stash, and the backward re-runs one layer at a time."""

    def __init__(self, layers: list[nn.Module], start: int, rows: int, recompute: bool,
                 kinds: list[str] | None = None) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)
        self.start, self.rows, self.recompute = start, rows, recompute
        kinds = kinds if kinds is not None else ["layer"] * len(layers)
        if len(kinds) != len(layers):
            raise ValueError(f"kinds: one per layer ({len(layers)}), got {len(kinds)}")
        #: per layer, whether it runs checkpointed
        self.checkpointed = [recompute and checkpointed(k) for k in kinds]
        #: whether zero-bubble's I/W split is made on this stage (planner.profile.stage_splits_backward)
        self.splits_backward = stage_splits_backward(kinds, recompute)
        self.has_head = takes_targets(layers[-1])
        self.body_layers = list(range(len(layers) - 1 if self.has_head else len(layers)))

    def forward(self, x: torch.Tensor, targets: list[torch.Tensor] | None = None,
                cut: list[tuple[torch.Tensor, torch.Tensor]] | None = None) -> list[torch.Tensor]:
        """``cut`` (a list): when the stage's input needs no gradient (the first stage reads token ids), the
        first layer's output continues as a new leaf and ``(output, leaf)`` is appended to ``cut``: the rest of
        the stage's graph then starts from a tensor with a gradient, which zero-bubble's ``I`` computes
        (:mod:`executor.split_backward`), and ``W`` carries it on into the first layer's weights."""
        y = x
        for i in self.body_layers:
            layer = self.layers[i]
            y = checkpoint(layer, y, use_reentrant=False, context_fn=_recomputed_uncounted) if self.checkpointed[i] \
                else layer(y)
            if cut is not None and i == 0 and not x.requires_grad and y.requires_grad:
                leaf = y.detach().requires_grad_(True)
                cut.append((y, leaf))
                y = leaf
        chunks = list(y.split(self.rows))
        if not self.has_head:
            return chunks
        assert targets is not None
        head = self.layers[-1]
        if self.checkpointed[-1]:
            return [checkpoint(head, c, t, use_reentrant=False, context_fn=_recomputed_uncounted)
                    for c, t in zip(chunks, targets, strict=True)]
        return [head(c, t) for c, t in zip(chunks, targets, strict=True)]


@dataclass
class _Fwd:
    """What a forward leaves for its backward(s)."""

    x: torch.Tensor
    outs: list[torch.Tensor]
    uses: int  # graph traversals left (backwards, or I + W each)
    #: saved by I for W: the output gradient and what I kept for the weights' branches (None: W does all)
    grads: dict[int, tuple[torch.Tensor | None, Split | None]] = field(default_factory=dict)
    version: int = 0
    params: dict[str, torch.Tensor] | None = None  # stashed weights (asynchronous schedules)
    #: the first stage's graph cut after its first layer (StageModule.forward): (that layer's output, the leaf
    #: the rest of the stage ran from)
    cut: tuple[torch.Tensor, torch.Tensor] | None = None


class _Stash:
    """Weight versions of one stage replica (PipeDream 3.3 weight stashing; 2BW double buffering)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.version = 0
        self.snaps: dict[int, list[Any]] = {}  # version -> [params, refcount]
        self.max_alive = 0

    def acquire(self) -> tuple[int, dict[str, torch.Tensor]]:
        v = self.version
        if v not in self.snaps:
            params = {n: p.detach().clone().requires_grad_(True) for n, p in self.module.named_parameters()}
            self.snaps[v] = [params, 0]
        self.snaps[v][1] += 1
        self.max_alive = max(self.max_alive, len(self.snaps))
        return v, self.snaps[v][0]

    def release(self, v: int) -> None:
        self.snaps[v][1] -= 1
        if self.snaps[v][1] == 0 and v != self.version:
            del self.snaps[v]

    def bump(self) -> None:
        self.version += 1
        for v in [v for v, (_, n) in self.snaps.items() if n == 0]:
            del self.snaps[v]


def _checksum(params: dict[str, torch.Tensor]) -> float:
    return float(sum(p.detach().double().sum() for p in params.values()))


class RankRuntime:
    """One rank's state: its stage replicas, optimizers, buffers; :meth:`iteration` walks the list."""

    def __init__(self, plan: RunPlan, schedule: Schedule, rank: int, groups: Groups,
                 emulator: Any = None, policy: str = "prefetch", tensor_device: torch.device | None = None) -> None:
        self.plan, self.sched, self.rank, self.groups, self.emu = plan, schedule, rank, groups, emulator
        self.tdev = tensor_device or torch.device("cpu")
        cuda = self.tdev.type == "cuda"
        # emulated compute sleeps on the host: time it there, with waits that block the host too
        self.clock: HostClock | CudaClock = CudaClock(self.tdev) if cuda and emulator is None else HostClock()
        self.host_waits = cuda and emulator is not None
        self.layout: Layout = groups.layout
        self.device, self.data_copy, self.tp = self.layout.coords(rank)
        self.ep = self.layout.ep_rank(self.data_copy)
        d = self.device
        self.actions = schedule.actions[d]
        self.held = schedule.stages_on(d)
        #: per stage held, the replica naming its copy: replicas sharing a (stage, device) share its weights
        #: (PipeDream's replicated stages, whose micro-batches take routes through the stage replicas)
        self.copy = {s: r for r, s in self.held}
        self.S = schedule.stages
        self.source = plan.source()
        self.dtype = DTYPES[plan.dtype]
        self.bounds = plan.bounds(self.S)
        self.rows = plan.rows
        self.N = schedule.microbatches
        self.scale = 1.0 / (plan.spec.config.data * self.N)
        self.split = {(a.replica, a.stage) for a in self.actions if a.kind == W}
        self.update = schedule.params.get("update", "step")
        #: PipeDream-RR (planner.schedules.pipedream_rr): the replicas of a stage step on their own micro-batches
        #: and, at the window's ALLREDUCE, add the other replicas' updates of the window (the sum of the
        #: gradients each applied, plain SGD); ``window_grads`` holds this replica's sum per stage copy
        self.window_sync = self.update == "per-microbatch" and schedule.params.get("replica_sync") == "per-window"
        self.window_grads: dict[tuple[int, int], dict[str, torch.Tensor]] = {}
        self.modules: dict[tuple[int, int], StageModule] = {}
        self.optims: dict[tuple[int, int], SGD] = {}
        self.stash: dict[tuple[int, int], _Stash] = {}
        if emulator is None:
            for r, s in self.held:
                self.modules[(r, s)] = self._build(s)
                self.optims[(r, s)] = SGD(self.modules[(r, s)].parameters(), lr=plan.lr)
                if not plan.synchronous:
                    self.stash[(r, s)] = _Stash(self.modules[(r, s)])
        #: the experts' parameters of each stage replica, reduced over the expert-data group (e > 1; else none)
        self.expert_ids = {key: {id(p) for p in expert_parameters(mod)} for key, mod in self.modules.items()}
        # tied embedding copies on the first and last stages (names inside the StageModule)
        self.tied: dict[tuple[int, int], list[str]] = {}
        if self.S > 1 and emulator is None:
            for group in self.source.tied():
                for layer, pname in group:
                    for r, s in self.held:
                        a, b = self.bounds[s]
                        if a <= layer < b:
                            self.tied.setdefault((r, s), []).append(f"layers.{layer - a}.{pname}")
        # the last ALLREDUCE of each stage in the list issues the collective
        self.last_ar: dict[int, int] = {}
        for i, a in enumerate(self.actions):
            if a.kind == ALLREDUCE:
                self.last_ar[a.stage] = i
        self.p2p = P2P(schedule, d, self._peer_rank, self._shape_of, policy, self.tdev, blocking=self.host_waits)
        self.send_free = 0.0  # emulated communication: when this device's send stream is free
        self.coll_free = 0.0  # ... and its collective stream
        self.version_log: list[dict[str, Any]] = []
        self.peak_alive = 0
        self._post_names: dict[int, str] = {}  # per action index, the label of the groups posted before it

    # ---- construction --------------------------------------------------------------------------------
    def _build(self, stage: int) -> StageModule:
        a, b = self.bounds[stage]
        layers = [self._parallel(m) for m in self.source.build(self.plan.seed, a, b)]
        mod = StageModule(layers, a, self.rows, self.plan.spec.config.recompute, self.source.kinds(a, b))
        return mod.to(device=self.tdev, dtype=self.dtype)

    def _parallel(self, m: nn.Module) -> nn.Module:
        """A layer split over this rank's tensor-parallel group (t > 1) and, a mixture of experts' block, its experts
        over the expert group (e > 1: :class:`~executor.expert_parallel.ExpertParallelMoE`, of the whole block's
        experts, each one this tensor rank's slice)."""
        moe = m.moe if isinstance(m, LlamaBlock) else None
        if self.layout.t > 1:
            m = self._tensor_parallel(m)
        if moe is not None and self.layout.e > 1:
            m.moe = ExpertParallelMoE(moe, self.ep, self.layout.e, self.groups.expert, self.tp, self.layout.t,
                                      self.groups.tensor)
        return m

    def _tensor_parallel(self, m: nn.Module) -> nn.Module:
        """A block split over this rank's tensor-parallel group; embedding, head and norms stay replicated."""
        if isinstance(m, Block):
            return TensorParallelBlock.from_block(m, self.tp, self.layout.t, self.groups.tensor)
        if isinstance(m, LlamaBlock):
            return TensorParallelLlamaBlock.from_block(m, self.tp, self.layout.t, self.groups.tensor)
        return m

    def _peer_rank(self, device: int) -> int:
        return self.layout.rank(device, self.data_copy, self.tp)

    def _shape_of(self, a: Action) -> tuple[tuple[int, ...], torch.dtype]:
        span = a.span if a.kind == RECV_F else 1
        if self._comm_tokens:
            return (1,), torch.float64
        if self.emu is not None:
            return (self.emu.message_bytes(a.kind, a.stage, span),), torch.uint8
        a_, b_ = self.bounds[a.stage]
        return self.source.message_shape(self.rows * span, a_ if a.kind == RECV_F else b_), self.dtype

    @property
    def _comm_tokens(self) -> bool:
        """Emulated communication: messages and all-reduces are time tokens (:mod:`executor.emulate`)."""
        return self.emu is not None and self.emu.comm == "emulated"

    def _token(self) -> torch.Tensor:
        """An emulated message's token, stamped with its predicted arrival when its send is posted
        (:meth:`_take_send`)."""
        return torch.zeros(1, dtype=torch.float64, device=self.tdev)

    # ---- data ----------------------------------------------------------------------------------------
    def load_batch(self, step: int) -> None:
        inputs, targets = self.source.batch(self.plan.spec.global_batch, self.plan.seed, step)
        per_copy = self.N * self.rows
        off = self.data_copy * per_copy
        self.inputs = inputs[off:off + per_copy].to(self.tdev)
        if self.inputs.is_floating_point():  # a user model's features (the zoo's inputs are token ids)
            self.inputs = self.inputs.to(self.dtype)
        self.targets = targets[off:off + per_copy].to(self.tdev)

    def _rows(self, t: torch.Tensor, mb: int, span: int = 1) -> torch.Tensor:
        return t[mb * self.rows:(mb + span) * self.rows]

    # ---- the walk ------------------------------------------------------------------------------------
    def iteration(self, step: int) -> list[Record]:
        """Run the list once; returns ``(action, kind, start, end)`` on the ``time.perf_counter`` clock."""
        if self.emu is None:
            self.load_batch(step)
        self.fwd: dict[tuple[int, int, int], tuple[_Fwd, int]] = {}
        self.inbox: dict[tuple[str, int, int, int], torch.Tensor] = {}
        self.outbox: dict[tuple[str, int, int, int], torch.Tensor] = {}
        #: the all-reduces in flight: (work, buffer, stage replicas, their parameters in the buffer)
        self.pending_ar: list[tuple[Any, torch.Tensor, list[tuple[int, int]],
                                    Callable[[tuple[int, int]], list[nn.Parameter]]]] = []
        self.own_window: dict[int, torch.Tensor] = {}  # per stage: this replica's part of the window's sum
        self.send_free = self.coll_free = 0.0
        self.alive = 0
        record: list[tuple[str, str, Any, Any]] = []
        self.records = record
        self.clock.begin()
        now = self.clock.stamp
        cpu = time.thread_time
        #: this thread's CPU seconds per action kind in the iteration (compute runs here with one torch
        #: thread; gloo's own threads are not in it): beside the wall time, what the action cost a core
        self.cpu_by_kind: dict[str, float] = {}
        for i, a in enumerate(self.actions):
            start, c0 = now(), cpu()
            posted = self.p2p.post(i, self._take_send)
            if posted:
                names = self._post_names.get(i)
                if names is None:
                    names = self._post_names[i] = " ".join(action_label(o) for g in posted for o in g.ops)
                posted_at, c1 = now(), cpu()
                record.append((f"post {names}", "POST", start, posted_at))
                self.cpu_by_kind["POST"] = self.cpu_by_kind.get("POST", 0.0) + c1 - c0
                start, c0 = posted_at, c1
            self._run(i, a)
            record.append((str(a), a.kind, start, now()))
            self.cpu_by_kind[a.kind] = self.cpu_by_kind.get(a.kind, 0.0) + cpu() - c0
        return self.clock.resolve(record)

    def _take_send(self, a: Action) -> torch.Tensor:
        """The tensor a send moves, left in the outbox by its producer. Emulated communication stamps the
        token with its predicted arrival here, as the send starts: the simulator's send stream, from the
        later of now (after the producing action) and the previous send's end, for ``costs.p2p``."""
        t = self.outbox.pop((a.kind, a.replica, a.stage, a.mb))
        if self._comm_tokens:
            self.send_free = max(time.perf_counter(), self.send_free) + self.emu.p2p_time(a, self.device)
            t.fill_(self.send_free)
        return t

    def _run(self, i: int, a: Action) -> None:
        k = a.kind
        if k in (RECV_F, RECV_B):
            got = self.inbox[(k, a.replica, a.stage, a.mb)] = self.p2p.wait_receive(a)
            if self._comm_tokens:
                self.emu.wait_until(float(got[0]))  # the message's predicted arrival
        elif k in (SEND_F, SEND_B):
            pass  # posted with its group before this action (P2P.post)
        elif self.emu is not None:
            self._emulated(i, a)
        elif k == F:
            self._forward(a)
        elif k in (B, I, W):
            self._backward(a)
        elif k == ALLREDUCE:
            if self.last_ar[a.stage] == i:
                self._allreduce(a.stage)
        elif k == STEP:
            self._step()
        else:
            raise ValueError(f"unknown action kind {k!r}")

    # ---- compute -------------------------------------------------------------------------------------
    def _forward(self, a: Action) -> None:
        r, s = a.replica, a.stage
        key = (self.copy[s], s)
        mod = self.modules[key]
        if s == 0:
            x = self._rows(self.inputs, a.mb, a.span)
        else:
            x = self.inbox.pop((RECV_F, r, s, a.mb)).requires_grad_(True)
        targets = [self._rows(self.targets, m) for m in a.mbs] if mod.has_head else None
        version, params = 0, None
        cut: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        if key in self.stash:
            version, params = self.stash[key].acquire()
            outs = functional_call(mod, params, (x, targets))
            self.version_log.append({"stage": s, "mb": a.mb, "event": "F", "version": version,
                                     "checksum": _checksum(params)})
        else:
            # a stage whose backward zero-bubble splits, of the first stage and without checkpoints, cuts its
            # graph after the embedding so that I has an input gradient to compute (StageModule.forward)
            cut = [] if (r, s) in self.split and s == 0 and mod.splits_backward else None
            outs = mod(x, targets, cut)
        if mod.has_head:
            outs = [loss * self.scale for loss in outs]
        uses = a.span * (2 if (r, s) in self.split else 1)
        rec = _Fwd(x, outs, uses, version=version, params=params)
        if cut:
            rec.cut = cut[0]
        for j, m in enumerate(a.mbs):
            self.fwd[(r, s, m)] = (rec, j)
        if s < self.S - 1:  # one micro-batch: its output as it is (no copy); several: concatenated
            y = outs[0].detach() if len(outs) == 1 else torch.cat([o.detach() for o in outs])
            self._deliver(SEND_F, r, s, a.mb, y)
        self.alive += a.span
        self.peak_alive = max(self.peak_alive, self.alive)

    def _deliver(self, kind: str, r: int, s: int, mb: int, t: torch.Tensor) -> None:
        """Output of stage ``s``: to the outbox for its SEND action, or straight to the consumer's inbox
        when the neighbouring stage sits on this device (the lowering adds no message then)."""
        nxt = s + 1 if kind == SEND_F else s - 1
        if self.sched.placement[r][nxt] == self.device:
            self.inbox[(RECV_F if kind == SEND_F else RECV_B, r, nxt, mb)] = t
        else:
            self.outbox[(kind, r, s, mb)] = t

    def _params(self, r: int, s: int, rec: _Fwd) -> list[torch.Tensor]:
        if rec.params is not None:
            return list(rec.params.values())
        return list(self.modules[(self.copy[s], s)].parameters())

    def _backward(self, a: Action) -> None:
        r, s, m, k = a.replica, a.stage, a.mb, a.kind
        key = (r, s, m)
        rec, j = self.fwd[key] if k == I else self.fwd.pop(key)
        out = rec.outs[j]
        split: Split | None = None
        if k == W:
            grad, split = rec.grads.pop(j)
        else:
            grad = self.inbox.pop((RECV_B, r, s, m)) if s < self.S - 1 else None
        rec.uses -= 1
        want_dx = s > 0 and rec.x.requires_grad
        sl = slice(j * self.rows, (j + 1) * self.rows)
        params = self._params(r, s, rec)
        if k == I:
            # the input gradient alone; W later runs only the weights' branches from what I kept
            # (executor.split_backward: asking autograd for the weights from the output again would redo
            # every input gradient on the way)
            if rec.cut is not None:  # the first stage: the gradient at its cut, carried on by W
                split = split_input(out, grad, rec.cut[1], params, tail=rec.cut[0])[1]
            elif want_dx:
                if self.modules[(self.copy[s], s)].splits_backward:
                    dx, split = split_input(out, grad, rec.x, params)
                else:
                    # a checkpointed layer recomputes its forward in every backward call (non-reentrant
                    # checkpoints keep recomputed tensors per graph task): one whole backward in W is cheaper
                    # than a call per join (executor.split_backward)
                    dx = torch.autograd.grad(out, rec.x, grad, retain_graph=True)[0]
                self._deliver(SEND_B, r, s, m, dx if len(rec.outs) == 1 else dx[sl].clone())
            rec.grads[j] = (grad, split)  # the activations stay for W (it frees them)
            return
        if rec.params is not None:
            self.version_log.append({"stage": s, "mb": m, "event": "B", "version": rec.version,
                                     "checksum": _checksum(rec.params),
                                     "live_version": self.stash[(self.copy[s], s)].version})
        if split is not None:
            split.weights(out, grad, retain_graph=rec.uses > 0)
        else:
            inputs = params + ([rec.x] if (k == B and want_dx) else [])
            torch.autograd.backward(out, grad, retain_graph=rec.uses > 0, inputs=inputs)
        if k == B and want_dx:  # the whole input gradient when the forward ran one micro-batch
            assert rec.x.grad is not None
            self._deliver(SEND_B, r, s, m, rec.x.grad if len(rec.outs) == 1 else rec.x.grad[sl].clone())
        self.alive -= 1  # B, or W: what the forward stored is freed
        if rec.params is not None:
            self._async_update(r, s, rec)

    def _async_update(self, r: int, s: int, rec: _Fwd) -> None:
        """Weight stashing: move the stashed version's gradients onto the live weights."""
        key = (self.copy[s], s)
        mod, stash = self.modules[key], self.stash[key]
        assert rec.params is not None
        for (_, p), q in zip(mod.named_parameters(), rec.params.values(), strict=True):
            if q.grad is not None:
                p.grad = q.grad.clone() if p.grad is None else p.grad + q.grad
                q.grad = None
        stash.release(rec.version)
        if self.update == "per-microbatch" and rec.uses == 0:  # PipeDream: step after every backward
            if self.window_sync and self.groups.stage.get(s) is not None:
                acc = self.window_grads.setdefault(key, {})
                for n, p in mod.named_parameters():
                    if p.grad is not None:
                        acc[n] = p.grad.clone() if n not in acc else acc[n] + p.grad
            self.optims[key].step()
            self.optims[key].zero_grad()
            stash.bump()

    # ---- gradient synchronisation and step -----------------------------------------------------------
    def _grad_params(self, key: tuple[int, int]) -> list[nn.Parameter]:
        """The parameters reduced over the stage group: all but the tied ones and the experts (e > 1)."""
        tied, experts = set(self.tied.get(key, [])), self.expert_ids.get(key, set())
        return [p for n, p in self.modules[key].named_parameters() if n not in tied and id(p) not in experts]

    def _expert_params(self, key: tuple[int, int]) -> list[nn.Parameter]:
        """The experts' parameters (e > 1), reduced over the expert-data group."""
        experts = self.expert_ids.get(key, set())
        return [p for p in self.modules[key].parameters() if id(p) in experts]

    def _flat_grads(self, keys: list[tuple[int, int]],
                    params: Callable[[tuple[int, int]], list[nn.Parameter]]) -> torch.Tensor:
        """The gradients of ``params(key)`` flat, summed over the stage replicas ``keys`` this rank holds."""
        flat = None
        for key in keys:
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params(key)]
            f = (torch.cat([g.reshape(-1) for g in grads]) if grads
                 else torch.zeros(0, dtype=self.dtype, device=self.tdev))
            flat = f if flat is None else flat + f
        assert flat is not None
        return flat

    def _allreduce(self, s: int) -> None:
        keys = [(r, ss) for r, ss in self.held if ss == s]
        group = self.groups.stage.get(s)
        if self.emu is None and any(self.expert_ids.get(key) for key in keys):
            # expert parallelism: the experts' gradients over the expert-data group (the copies holding the same
            # experts; None when this rank's are the only ones), the rest over the stage group, both summed
            egroup = self.groups.expert_data.get(s)
            if egroup is not None or len(keys) > 1:
                flat = self._flat_grads(keys, self._expert_params)
                work = dist.all_reduce(flat, group=egroup, async_op=True) if egroup is not None else None
                self.pending_ar.append((work, flat, keys, self._expert_params))
        if group is None and len(keys) == 1:
            return  # one copy of the stage in the whole job: its gradients are already the sum
        if self._comm_tokens:  # the holders' post times, MAX-reduced: the collective starts after the last
            flat = torch.tensor([max(time.perf_counter(), self.send_free)], dtype=torch.float64, device=self.tdev)
            if group is not None:
                self.pending_ar.append((dist.all_reduce(flat, op=dist.ReduceOp.MAX, group=group, async_op=True),
                                        flat, keys, self._grad_params))
            else:
                self.pending_ar.append((None, flat, keys, self._grad_params))
            return
        if self.emu is not None:  # (a stage no other rank holds all-reduces nothing: no buffer either)
            n = self.emu.allreduce_elements(s) if group is not None else 0
            flat = torch.zeros(n, dtype=torch.float32, device=self.tdev)
            egroup = self.groups.expert_data.get(s)
            if egroup is not None and self.emu.expert_elements(s):  # the experts' over their W/e replicas
                experts = torch.zeros(self.emu.expert_elements(s), dtype=torch.float32, device=self.tdev)
                self.pending_ar.append((dist.all_reduce(experts, group=egroup, async_op=True), experts, keys,
                                        self._grad_params))
        elif self.window_sync:
            if group is None:
                return  # an unreplicated stage: its own per-micro-batch steps are all its updates
            flat = torch.cat([self._window_flat(key) for key in keys])
            self.own_window[s] = flat.clone()
        else:
            flat = self._flat_grads(keys, self._grad_params)
        work = dist.all_reduce(flat, group=group, async_op=True) if group is not None else None
        self.pending_ar.append((work, flat, keys, self._grad_params))

    def _window_flat(self, key: tuple[int, int]) -> torch.Tensor:
        """This replica's applied gradients of the window (every parameter, tied ones too: under
        per-micro-batch updates each stage's copy is its own), flat, in ``named_parameters`` order."""
        acc = self.window_grads.get(key, {})
        return torch.cat([acc.get(n, torch.zeros_like(p)).reshape(-1) for n, p in self.modules[key].named_parameters()])

    def _window_update(self, flat: torch.Tensor, s: int, keys: list[tuple[int, int]]) -> None:
        """PipeDream-RR: apply the other replicas' updates of the window (all-reduced sum minus this one's),
        then start the next window with a new weight version."""
        delta = flat - self.own_window.pop(s)
        off = 0
        for key in keys:
            for p in self.modules[key].parameters():
                n = p.numel()
                p.grad = delta[off:off + n].view_as(p).clone()
                off += n
            self.optims[key].step()
            self.optims[key].zero_grad()
            self.stash[key].bump()
            self.window_grads.pop(key, None)

    def _step(self) -> None:
        self.p2p.finish()
        for work, flat, keys, reduced in self.pending_ar:
            if work is not None:
                work.wait()
            if self.emu is not None:
                if self.host_waits:
                    torch.cuda.synchronize(self.tdev)
                if self._comm_tokens:  # the collective stream: after the last post and the previous one
                    r, s = keys[0]
                    self.coll_free = (max(float(flat[0]), self.coll_free)
                                      + self.emu.allreduce_time(s, r, self.device))
                continue
            if self.window_sync:
                self._window_update(flat, keys[0][1], keys)
                continue
            for key in keys:  # views into the reduced buffer (copies when several replicas share it)
                off = 0
                for p in reduced(key):
                    n = p.numel()
                    g = flat[off:off + n].view_as(p)
                    p.grad = g if len(keys) == 1 else g.clone()
                    off += n
        self.pending_ar.clear()
        if self.emu is not None:
            if self._comm_tokens:  # STEP after the device's last send and all-reduce (the simulator's rule)
                self.emu.wait_until(max(self.send_free, self.coll_free))
            t = self.clock.stamp()
            self.emu.sleep_step(self.device)
            self.records.append(("optimizer (emulated)", "OPT", t, self.clock.stamp()))
            return
        if self.tied and self.update != "per-microbatch":
            local = None
            for key, names in self.tied.items():
                params = dict(self.modules[key].named_parameters())
                for n in names:
                    g = params[n].grad if params[n].grad is not None else torch.zeros_like(params[n])
                    local = g.clone() if local is None else local + g
            assert local is not None
            if self.groups.tied is not None:
                dist.all_reduce(local, group=self.groups.tied)
            for key, names in self.tied.items():
                params = dict(self.modules[key].named_parameters())
                for n in names:
                    params[n].grad = local.clone()
        self._update_expert_bias()
        if self.update == "per-microbatch":
            return
        t = self.clock.stamp()
        for key, opt in self.optims.items():
            opt.step()
            opt.zero_grad()
            if key in self.stash:
                self.stash[key].bump()
        self.records.append(("optimizer", "OPT", t, self.clock.stamp()))

    def _update_expert_bias(self) -> None:
        """DeepSeek-V3's bias update at the step's end (:func:`executor.models.llama.update_expert_bias`, the plan's
        ``expert_bias_rate``), asynchronous schedules' too (once per iteration): per stage held, the loads its
        biased routers counted, summed over this rank's replicas of the stage and all-reduced (int64) over the stage
        group -- every holder of the stage in every data-parallel copy, of this tensor rank: the data-parallel and
        expert-parallel copies and the schedule's replicas route tokens of their own, whose loads add up; the tensor
        ranks of one copy route the same tokens, and each sums over its own group -- then every replica's biases
        moved alike. With rate 0 the loads are only reset."""
        rate = self.plan.expert_bias_rate
        pending = []
        for s in sorted({s for _, s in self.held}):  # (ascending on every rank: no two ranks wait on each other)
            copies = [self.modules[key] for key in sorted(self.modules) if key[1] == s]
            total = expert_loads(copies)
            if total is None:
                continue
            group = self.groups.stage.get(s)
            work = dist.all_reduce(total, group=group, async_op=True) if group is not None and rate else None
            pending.append((work, total, copies))
        for work, total, copies in pending:
            if work is not None:
                work.wait()
            apply_expert_loads(copies, total, rate)

    def _emulated(self, i: int, a: Action) -> None:
        if a.kind in (F, B, I, W):
            self.emu.sleep_compute(a.kind, a.stage, a.span, self.device)
            if a.kind == F and a.stage < self.S - 1:
                self._deliver(SEND_F, a.replica, a.stage, a.mb, self._token()
                              if self._comm_tokens else torch.empty(
                    self.emu.message_bytes(RECV_F, a.stage + 1, a.span), dtype=torch.uint8, device=self.tdev))
            elif a.kind in (B, I) and a.stage > 0:
                self._deliver(SEND_B, a.replica, a.stage, a.mb, self._token()
                              if self._comm_tokens else torch.empty(
                    self.emu.message_bytes(RECV_B, a.stage - 1, 1), dtype=torch.uint8, device=self.tdev))
        elif a.kind == ALLREDUCE:
            if self.last_ar[a.stage] == i:
                self._allreduce(a.stage)
        elif a.kind == STEP:
            self._step()

    # ---- results -------------------------------------------------------------------------------------
    def full_parameters(self) -> dict[str, list[torch.Tensor]]:
        """``"{layer}.{name}" -> [copies]`` under the full model's names (tensor shards gathered), on the CPU; the
        routers' biases (buffers that training changes) with them."""
        out: dict[str, list[torch.Tensor]] = {}
        for key in sorted(self.modules):
            mod = self.modules[key]
            for li, layer in enumerate(mod.layers):
                idx = mod.start + li
                if isinstance(layer, TensorParallelBlock | TensorParallelLlamaBlock):
                    items = layer.full_state().items()
                else:
                    items = ((n, p.detach().clone()) for n, p in layer.named_parameters())
                for n, p in (*items, *expert_bias_state(layer).items()):  # (DeepSeek-V3's bias: a buffer)
                    out.setdefault(f"{idx}.{n}", []).append(p.cpu())
        return out
