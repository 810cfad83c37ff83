"""How many cores sat idle while this process started: a sample of ``/proc/stat`` (Linux) taken at the top of
the command line, read again when the search decides whether to fork a second process
(:func:`planner.split_search.spare_core`).

Why not the load average alone: ``os.getloadavg()[0]`` is an exponentially decaying 1-minute average, so it
lags what the cores do now by tens of seconds. Measured on the 2-core development machine (session 9), right
after the test suite had finished and the machine was idle: the 1-minute load read 1.5-3.3, the default
``pipeplan plan`` for GPT-3 175B on 1024 A100s therefore searched in one process and took 1.74 s (median of
5) where two processes took 1.03 s; and the other way round, work started a few seconds ago is not in the
average yet. The command's own start-up (interpreter, imports: ~0.25 s) is a window in which the kernel's
per-CPU counters say how busy the cores really were: ``idle + iowait`` jiffies over all jiffies of the
``cpu`` line, times the cores (proc(5): the fields of ``/proc/stat`` are in USER_HZ, 1/100 s). This process
itself keeps one core busy in that window, and numpy's import starts OpenBLAS's thread pool, whose threads
spin for a while: measured on the idle 2-core machine over the plan command's imports, 0.46-0.63 cores idle
(1.00-1.03 with ``OPENBLAS_NUM_THREADS=1``), and 0.00-0.04 with another process keeping the other core busy.
A second core is spare when at least :data:`SPARE_CORE` was idle, between the two.

Nothing here imports beyond ``time``: :func:`mark` runs before the command's heavy imports.
"""

from __future__ import annotations

import time

#: the sample :func:`mark` took: (monotonic seconds, idle jiffies, all jiffies), or None
_MARK: tuple[float, int, int] | None = None

#: idle cores in the start-up window that make the second core spare (module docstring: 0.46-0.63 idle, 0.00-0.04
#: busy, measured)
SPARE_CORE = 0.25

#: shortest window worth reading (USER_HZ is 100: shorter windows hold a handful of jiffies per core)
MIN_WINDOW_S = 0.1


def _read() -> tuple[int, int] | None:
    """(idle + iowait, all) jiffies of the aggregate ``cpu`` line of ``/proc/stat``; None where unreadable."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            first = f.readline().split()
    except OSError:
        return None
    if not first or first[0] != "cpu" or len(first) < 5:
        return None
    try:
        vals = [int(x) for x in first[1:]]
    except ValueError:
        return None
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return idle, sum(vals[:8])  # user nice system idle iowait irq softirq steal (guest is inside user)


def mark() -> None:
    """Take the sample at the start of a command (cheap: one small read)."""
    global _MARK
    got = _read()
    _MARK = None if got is None else (time.monotonic(), *got)


def idle_cores(cores: int) -> float | None:
    """Cores idle on average since :func:`mark`; None without a mark, a readable ``/proc/stat``, or a window
    of at least :data:`MIN_WINDOW_S`."""
    if _MARK is None or time.monotonic() - _MARK[0] < MIN_WINDOW_S:
        return None
    got = _read()
    if got is None:
        return None
    d_idle, d_all = got[0] - _MARK[1], got[1] - _MARK[2]
    if d_all <= 0:
        return None
    return cores * d_idle / d_all


def reset() -> None:
    """Forget the sample (tests)."""
    global _MARK
    _MARK = None


