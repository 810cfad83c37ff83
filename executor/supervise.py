"""``python -m executor.supervise SPEC.json``: start this node's ranks and watch them (what torchrun did for
us until session 31, without its elastic agent).

One import for the node: the supervisor imports the ranks' code once (torch, the executor, and what torch
imports lazily in a rank that runs a model recomputing activations: :func:`preload`; 3-6 s of CPU on the
2-core CI machine) and forks
each rank from it, copy-on-write. Nothing has run a parallel region, started a thread (``launch`` sets
``OMP_NUM_THREADS``; ``tests/test_supervise.py`` counts them) or touched CUDA by then, so each rank starts
clean, as with ``torch.multiprocessing``'s ``fork`` start method. Measured on that machine
(``benchmarks/launch_bench.py``: a 1-iteration run of a tiny model, median of 3): under torchrun 9.6 s wall
and 14.1 s of CPU for 2 ranks, 14.4 s and 23.8 s for 4 (torchrun's own import, then every rank's); under this
supervisor 6.8 s and 6.8 s for 2, 7.5 s and 7.6 s for 4.

The spec (written by :func:`executor.launch.launch`) says ``nproc`` (ranks of this node), ``nnodes`` and
``node_rank``: global ranks are ``node_rank * nproc + local`` out of ``nnodes * nproc``, each told through
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` and ``LOCAL_WORLD_SIZE`` as torchrun told them; the ranks meet
through the spec's ``rendezvous`` (:func:`executor.rank.rendezvous_store`).

Watching: the first rank to exit non-zero fails the node -- the other ranks of the node are killed at once
(their work is lost with the failed rank's anyway), the supervisor exits 1, and when that rank wrote no error
of its own (it died of a signal: the OOM killer, a segmentation fault) the supervisor writes its
``error-rank{r}.json`` naming the signal, so the launcher still names the rank. Ranks of other nodes fail on
their next exchange with this one. Each rank dies with the supervisor (``PR_SET_PDEATHSIG``,
:func:`executor.runguard.die_with_parent`), and the supervisor with the process that launched it (the spec's
``launcher``), so killing either, by any signal, ends the run.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from executor.runguard import die_with_parent
from executor.trace import write_json_atomic


def _rank(rank_module: ModuleType, spec_path: str, rank: int, local: int, nproc: int, world: int,
          supervisor: int) -> None:
    """The forked child: become rank ``rank`` and run it; never returns."""
    code = 1
    try:
        if not die_with_parent(supervisor):
            return
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(local), WORLD_SIZE=str(world),
                          LOCAL_WORLD_SIZE=str(nproc))
        code = rank_module.main([spec_path])
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    except BaseException:  # noqa: BLE001 - the rank wrote its error file; the traceback goes to stderr
        traceback.print_exc()
    finally:
        # the results are written and the process group destroyed: end without the interpreter's finalization,
        # whose C++ static destructors have aborted a gloo rank now and then after a finished run ("terminate
        # called without an active exception", SIGABRT: CI of session 8, test_cli_run_hf_config_check)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def describe(status: int) -> str:
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            return f"killed by signal {-code}"
        if name == "SIGKILL":  # what Linux's out-of-memory killer sends (and nothing in the executor does)
            return ("killed by SIGKILL (most likely the machine ran out of memory: the kernel's out-of-memory "
                    "killer sends it; see `dmesg`, or try a smaller --seq, --micro-batch or model)")
        return f"killed by {name}"
    return f"exited with status {code}"


def note_failure(workdir: Path, rank: int, status: int) -> None:
    """``error-rank{rank}.json`` for a rank that failed without writing one."""
    path = workdir / f"error-rank{rank}.json"
    if not path.exists():
        write_json_atomic(str(path), {"rank": rank, "time": time.time(),
                                      "error": f"the rank's process {describe(status)}", "traceback": ""})


def preload(plans: list[dict[str, Any]]) -> None:
    """What every rank would import on its own after the fork (no thread started): the model families
    ``build_layers`` imports; the FX symbolic shapes (sympy), which ``torch.autograd.backward`` imports on its
    first call with an output gradient, i.e. in every stage but the last (0.3 s of CPU per process on the CI
    machine); and, where one of the spec's ``plans`` runs a model with activation recomputation,
    ``torch._dynamo``, which ``torch.utils.checkpoint`` imports on its first call (``torch._disable_dynamo``;
    0.8 s more). The executor's optimizer does not import it (:mod:`executor.sgd`), so a run without
    recomputation, or emulated, does not pay it."""
    import torch.fx.experimental.symbolic_shapes  # noqa: F401

    from executor.models import bert, data, gpt, llama, source  # noqa: F401

    if any(p["spec"]["config"]["recompute"] and not p.get("emulate") for p in plans):
        import torch._dynamo  # noqa: F401


def supervise(spec: dict[str, Any], spec_path: str) -> int:
    """Fork the node's ranks, wait for them; 0 when every rank succeeded, 1 when one failed."""
    from executor import rank as rank_module  # torch and the executor, once for every rank of the node

    preload(spec["plans"])

    nproc, nnodes, node_rank = int(spec["nproc"]), int(spec["nnodes"]), int(spec["node_rank"])
    world, me = nnodes * nproc, os.getpid()
    children: dict[int, int] = {}
    for local in range(nproc):
        rank = node_rank * nproc + local
        pid = os.fork()
        if pid == 0:
            _rank(rank_module, spec_path, rank, local, nproc, world, me)
        children[pid] = rank
    failed = False
    try:
        while children:
            pid, status = os.wait()
            rank = children.pop(pid, -1)
            if rank < 0 or status == 0 or failed:
                continue
            failed = True
            note_failure(Path(spec["workdir"]), rank, status)
            kill(children)
    except KeyboardInterrupt:  # Ctrl-C: the ranks got it too; whichever did not end goes now
        kill(children)
        return 130
    return 1 if failed else 0


def kill(pids: Iterable[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m executor.supervise SPEC.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    if not die_with_parent(spec["launcher"]):  # the launch is gone (even by kill -9): so is the run
        return 1
    return supervise(spec, argv[0])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
