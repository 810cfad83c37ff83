"""Profile a model in several processes at once: the per-layer times a CPU device sees while the executor
runs one process per device on fewer cores.

``pipeplan run`` starts D*W*t processes of one torch thread each (``executor/worker.py``); on a machine with
fewer cores than processes they share the cores, so a layer takes longer than it does alone. A profile
measured in one process predicts the run too short by about processes/cores (issue 13: the local plan's
runs took several times their prediction). :func:`profile_concurrently` measures ``processes`` copies at
once, started together behind a barrier, and keeps per layer and micro-batch size the median of the
processes' medians; the profile records it (``environment["concurrent_processes"]``, ``notes``).
"""

from __future__ import annotations

import multiprocessing as mp
import statistics
from typing import Any

from planner.profile import ModelProfile


def _worker(barrier: Any, queue: Any, model: str, sizes: list[int], kw: dict[str, Any]) -> None:
    from profiler.run import profile_model

    try:
        import torch

        torch.set_num_threads(int(kw.get("threads") or 1))
        barrier.wait(timeout=300)
        queue.put(("ok", profile_model(model, sizes, **kw).model_dump(mode="json")))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which raises
        queue.put(("error", f"{type(e).__name__}: {e}"))


def _median(dicts: list[dict[int, float]]) -> dict[int, float]:
    return {b: statistics.median(d[b] for d in dicts) for b in dicts[0]}


def combine(profiles: list[ModelProfile]) -> ModelProfile:
    """The first profile with every layer's times replaced by the median over ``profiles``."""
    first = profiles[0]
    layers = []
    for i, layer in enumerate(first.layers):
        same = [p.layers[i] for p in profiles]
        update: dict[str, Any] = {"fwd_time": _median([x.fwd_time for x in same]),
                                  "bwd_time": _median([x.bwd_time for x in same])}
        if layer.recompute_time is not None:
            update["recompute_time"] = _median([x.recompute_time or {} for x in same])
        layers.append(layer.model_copy(update=update))
    env = {**first.environment, "concurrent_processes": str(len(profiles))}
    notes = (f"{first.notes} Measured in {len(profiles)} processes at once (as many as the executor runs on "
             f"the local cluster's devices); the times are the medians over the processes.")
    return first.model_copy(update={"layers": layers, "environment": env, "notes": notes})


def profile_concurrently(model: str, sizes: list[int], processes: int, **kw: Any) -> ModelProfile:
    """``profiler.run.profile_model(model, sizes, **kw)`` in ``processes`` processes at once, combined."""
    if processes <= 1:
        from profiler.run import profile_model

        return profile_model(model, sizes, **kw)
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(processes), ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(barrier, queue, model, sizes, kw), daemon=True)
             for _ in range(processes)]
    for p in procs:
        p.start()
    try:
        results = [queue.get(timeout=600) for _ in procs]
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    errors = [msg for status, msg in results if status != "ok"]
    if errors:
        raise RuntimeError(f"profiling failed in {len(errors)} of {processes} processes: {errors[0]}")
    return combine([ModelProfile.model_validate(body) for _status, body in results])
