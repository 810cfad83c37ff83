"""``python -m executor.runguard FD -- COMMAND...``: run COMMAND so that it dies with the agent.

The agent starts this guard in a new process group with the read end ``FD`` of a pipe whose write end only
the agent holds. The guard runs COMMAND in its own group and waits; when ``FD`` reads end-of-file the agent
is gone (it exited, or was killed with ``kill -9``, which no signal handler sees) and the guard kills the
whole group, COMMAND and everything it started there (``pipeplan run``, its supervisor and the ranks, which
also die with the supervisor through ``PR_SET_PDEATHSIG``, :func:`die_with_parent`).

SIGTERM/SIGINT reach the guard when the agent stops a run (``killpg``): the guard passes them on to COMMAND
and keeps waiting, so it exits only after COMMAND did, with COMMAND's status.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading

PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int | None = None, sig: int = signal.SIGKILL) -> bool:
    """Linux: have the kernel send ``sig`` to this process when its parent exits (``prctl``); elsewhere
    nothing. With ``parent`` (the pid the parent had before this process started): False when the parent is no
    longer it -- it exited before the death signal was armed, which then never comes -- else True."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    return parent is None or os.getppid() == parent


def _watch(fd: int) -> None:
    while True:
        try:
            data = os.read(fd, 1024)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if not data:
            os.killpg(os.getpgrp(), signal.SIGKILL)  # the agent is gone: the run goes with it (and this guard)
            return


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m executor.runguard FD -- COMMAND...", file=sys.stderr)
        return 2
    fd, cmd = int(argv[0]), argv[2:]
    proc = subprocess.Popen(cmd)

    def forward(signum: int, _frame: object) -> None:
        if proc.poll() is None:
            proc.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    threading.Thread(target=_watch, args=(fd,), name="lifeline", daemon=True).start()
    rc = proc.wait()
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
