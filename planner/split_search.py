"""The search on two cores: a forked child searches one part of the configurations, this process the other,
and the two ranked parts are merged (:func:`planner.search._merge`) into the result a single process gives.

Why it is exact. The configurations are split by (D, N) (:func:`split_parts`): candidates that run the same
thing (twins, :mod:`planner.equivalence`) share those, so a class of twins never crosses parts.
Each part searches its configurations best first, as the single process does, and skips a candidate only
when its lower bound exceeds a threshold ``T`` that is never below the final k-th best time over classes of
the whole search: the k-th smallest of the best times of k distinct classes found so far -- this part's own,
and the other part's as it last published them (:class:`Board`). Any k distinct classes found have a k-th
best time at least the whole search's final one, so every candidate that can be among the k best rows (and
every twin of one, with its equal time) is simulated by its part, and :func:`planner.search._merge` takes
the k best rows of the two parts: the rows, times, memory and order of one process. The k best candidates
that do not fit are those of the two parts' k best (twins collapsed as one process does).

What may differ from one process: the counts decided in the search's loop. Each part's threshold falls at
its own pace (the other part's best times arrive when they are found), so a candidate one process skips by
its bound may be simulated by its part, or the other way round: ``simulated``, the bound's count ("bound:
cannot reach the top k") and what simulating finds ("out of memory"; for PipeDream's replicated plans, which
are prepared when they come up, their rejections and ``considered`` too) may differ; for the same reason the
candidates that do not fit may include one that one process skipped by its bound. Rejections before the loop
(the enumeration, the model state) and ``evaluated`` are the same.

The board: an anonymous shared mapping (``mmap``) of k doubles per part, each part's k best class times in
ascending order. A sorted list of the k smallest of a set of class times can only fall position by position
as classes are found or improve, so a reader that sees one position's old value and another's new one still
reads values at least the current ones: a threshold computed from them is a safe one (each double is one
aligned 8-byte store).

Where: only where ``os.fork`` exists (not Windows; macOS forks, though its default for multiprocessing is
spawn), the search is large enough to gain from it (:data:`MIN_ACTIONS`, measured) and a core is idle
(:func:`spare_core`). The child inherits the
planner and its caches, searches its part, sends its :class:`planner.search.Ranked` (the k best rows with
their simulations, and the k best that do not fit) pickled once through a pipe, and exits with ``os._exit``
(no atexit handlers, no buffers of the parent flushed twice). A child that fails, dies or sends something
unreadable is reported as such by the pipe (end of file before a whole message) and by its exit status; this
process then searches the child's part itself, so nothing is dropped. Not for a process with other threads
(the API server): a fork copies the locks other threads hold; :func:`search_split` refuses there.
"""

from __future__ import annotations

import heapq
import math
import mmap
import os
import pickle
import signal
import struct
import threading
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from planner import cpuidle
from planner.equivalence import TopDistinct

if TYPE_CHECKING:
    from planner.candidate import Candidate
    from planner.request import Config
    from planner.search import Ranked

#: below this much work -- the actions of every configuration's schedule, the sum of D x N -- one process: the
#: second saves next to nothing (measured in CPU seconds on the longer of the two processes, at load 5.9: 300
#: actions, bert-tiny on 2 A100s, 0.034 -> 0.030; 1,682 actions, on 4, 0.065 -> 0.048; GPT-3 175B on 1024 A100s,
#: 6.7M actions, 2.39 -> 1.39), and the fork's latency is not in those figures
MIN_ACTIONS = 1000


def work(configs: list[Config], global_batch: int) -> int:
    """The search's size: the sum over ``configs`` of D x N (a schedule's compute actions per replica)."""
    return sum(c.pipeline * (global_batch // (c.data * c.micro_batch)) for c in configs)


def split_parts(configs: list[Config], global_batch: int) -> dict[tuple[int, int], int]:
    """The part (0 or 1) of each (D, N) of ``configs``: candidates that run the same thing (twins) share
    those, and so do the schedules' shapes and merged warm-ups the search caches (:mod:`planner.shapes`: the
    costly part of a merged schedule, computed once per part). The (D, N) groups go to the parts greedily,
    largest first, each to the part with less work so far (Graham's LPT rule), work measured as :func:`work`
    does (the sum of D x N of the group's configurations; ties by (D, N)). On GPT-3 175B / 1024 GPUs the
    parts' search times, measured per group in one process (0.98 and 1.40 s with the earlier rule, D's and
    N's bit lengths' parity), are 1.24 and 1.14 s."""
    size: dict[tuple[int, int], int] = {}
    for c in configs:
        N = global_batch // (c.data * c.micro_batch)
        size[(c.pipeline, N)] = size.get((c.pipeline, N), 0) + c.pipeline * N
    load = [0, 0]
    out: dict[tuple[int, int], int] = {}
    for group in sorted(size, key=lambda g: (-size[g], g)):
        part = 0 if load[0] <= load[1] else 1
        out[group] = part
        load[part] += size[group]
    return out


class Board:
    """Each part's k best class times, shared between the processes (module docstring)."""

    def __init__(self, k: int, parts: int = 2) -> None:
        self.k, self.parts = k, parts
        self._map = mmap.mmap(-1, 8 * k * parts)
        self._view = memoryview(self._map).cast("d")
        for i in range(k * parts):
            self._view[i] = math.inf

    def publish(self, part: int, times: list[float]) -> None:
        """Write ``part``'s k best class times (ascending; missing ones infinite)."""
        base = part * self.k
        for i in range(self.k):
            self._view[base + i] = times[i] if i < len(times) else math.inf

    def others(self, part: int) -> list[float]:
        """Every other part's published times."""
        return [self._view[q * self.k + i] for q in range(self.parts) if q != part for i in range(self.k)]

    def close(self) -> None:
        self._view.release()
        self._map.close()


class SharedTop(TopDistinct):
    """:class:`planner.equivalence.TopDistinct` of one part whose threshold ``kth`` also counts the other
    part's published best times, and which publishes its own as they change."""

    def __init__(self, k: int, board: Board, part: int) -> None:
        self.board, self.part = board, part
        self._own = math.inf
        self._mine: list[float] = []
        super().__init__(k)

    @property  # type: ignore[override]
    def kth(self) -> float:
        merged = sorted(self._mine + self.board.others(self.part))
        return min(self._own, merged[self.k - 1]) if len(merged) >= self.k else self._own

    @kth.setter
    def kth(self, value: float) -> None:
        self._own = value

    def add(self, cand: Any) -> None:
        before = dict(self.best)
        super().add(cand)
        if self.best != before:
            self._mine = heapq.nsmallest(self.k, self.best.values())
            self.board.publish(self.part, self._mine)


def spare_core() -> bool:
    """Whether a core is idle: where the command marked the CPU counters at its start
    (:func:`planner.cpuidle.mark`), at least :data:`planner.cpuidle.SPARE_CORE` of a core sat idle since then
    (this process keeps one busy);
    else the 1-minute load average (this process's search counts one) under the cores this process may use
    less a half. On a busy machine a second process only competes with the other work and adds its own
    (measured at load 4.5-5.8 on the 2-core machine: 0.7-1.1x the wall time of one process,
    ``benchmarks/plan_cli_bench.py --split``); the sample answers for now, where the load average lags by
    tens of seconds (:mod:`planner.cpuidle`)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    if cores < 2:
        return False
    idle = cpuidle.idle_cores(os.cpu_count() or cores)
    if idle is not None:
        return idle >= cpuidle.SPARE_CORE
    try:
        load = os.getloadavg()[0]
    except OSError:  # no load figure: assume the cores are free
        return True
    return load < cores - 0.5


def can_fork() -> bool:
    """``os.fork`` exists and this process runs no other thread (a forked child inherits the locks others
    hold, and none of their work)."""
    return hasattr(os, "fork") and threading.active_count() == 1


def search_split(planner: Any, configs: list[Config], rr_keys: list[tuple[int, int, int, int, bool]],
                 auto: bool = False) -> list[Ranked] | None:
    """The two parts of the search, one ranked by a forked child; None where not worth it or not possible
    (then the caller searches in one process). ``auto``: only where a core is idle (:func:`spare_core`)."""
    if work(configs, planner.request.global_batch) < MIN_ACTIONS or not can_fork() or (auto and not spare_core()):
        return None
    from planner.search import Planner

    k = planner.request.top
    board = Board(k)

    part_of = split_parts(configs, planner.request.global_batch)

    def mine(part: int) -> Callable[[int, int], bool]:
        return lambda D, N: part_of.get((D, N), 0) == part

    def rank(part: int) -> Ranked:
        return planner._rank(configs, rr_keys, True, mine(part), SharedTop(k, board, part))

    try:
        read_end, write_end = os.pipe()
        pid = os.fork()
    except OSError:
        board.close()
        return None
    if pid == 0:  # the child: part 1
        os.close(read_end)
        code = 1
        try:
            data = pickle.dumps(_slim(rank(1)), protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(write_end, "wb") as out:
                out.write(struct.pack("<Q", len(data)))
                out.write(data)
            code = 0
        except BaseException:  # noqa: BLE001 - whatever it was, the parent searches this part itself
            pass
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        own = rank(0)
    except BaseException:  # (Ctrl-C, or a bug): the child is of no more use; nothing is left behind
        os.close(read_end)
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        board.close()
        raise
    try:
        theirs = _receive(read_end, pid)
    finally:
        board.close()
    if theirs is None:  # the child failed: its part, here (the board's figures from it stay valid bounds)
        return [own, planner._rank(configs, rr_keys, True, mine(1))]
    again = partial(Planner, planner.profile, planner.cluster, planner.request)
    for cand in theirs.rows + theirs.infeasible:
        if cand.simulation is not None:
            cand.simulation._timeline = partial(_timeline_again, again, cand)
    return [own, theirs]


def _slim(part: Ranked) -> Ranked:
    """What crosses to the parent: the candidates with their figures (times, memory, breakdown, closed forms,
    per-device statistics), without the lowered timeline of each simulation (built on demand: 20 MB and 1.6 s
    to pickle for GPT-3's ten rows, where the command line prints figures only) nor the full action lists
    of their costs: a timeline asked for in the parent is simulated again (:func:`_timeline_again`)."""
    for cand in part.rows + part.infeasible:
        if cand.simulation is not None:
            cand.simulation._timeline = None  # type: ignore[assignment]
        if cand.costs is not None:
            cand.costs.schedule = None  # type: ignore[assignment]
    return part


def _timeline_again(planner: Callable[[], Any], cand: Candidate) -> Any:
    """The timeline of ``cand`` (a row found by the child), simulated again by a new planner of the same
    request: deterministic, the same timeline; its costs get their full lists back."""
    p = planner()
    again, costs = p.prepare(cand.config)
    if costs is None:
        raise RuntimeError(f"{cand.config.label()}: no longer prepared: {again.reason}")
    p.evaluate(again, costs)
    if again.simulation is None:
        raise RuntimeError(f"{cand.config.label()}: not simulated again: {again.reason}")
    if cand.costs is not None:
        cand.costs.schedule = again.costs.schedule if again.costs is not None else None  # type: ignore[assignment]
    return again.simulation.timeline


def _receive(fd: int, pid: int) -> Ranked | None:
    """The child's part from the pipe, or None when it failed (a short message or a non-zero exit)."""
    with os.fdopen(fd, "rb") as f:
        head = f.read(8)
        data = f.read(struct.unpack("<Q", head)[0]) if len(head) == 8 else b""
    _, status = os.waitpid(pid, 0)
    if len(head) != 8 or len(data) != struct.unpack("<Q", head)[0] or os.waitstatus_to_exitcode(status) != 0:
        return None
    try:
        return pickle.loads(data)  # type: ignore[no-any-return]
    except Exception:  # noqa: BLE001 - unreadable: searched again here
        return None
