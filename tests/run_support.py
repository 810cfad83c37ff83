"""The executor's multi-process ``--check`` runs the model tests share: plans of one spec, launched in groups by
world size (gloo, float64), their results by name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from executor.plan import RunPlan
from planner.model import ModelSpec


def direct(spec: ModelSpec, schedule: str, D: int, N: int, **kw: Any) -> RunPlan:
    """A run of ``spec`` with ``schedule`` on ``D`` stages and ``N`` micro-batches, two iterations (``kw``: tensor,
    data, expert, ...)."""
    return RunPlan.direct(schedule, D, N, model=spec.name, model_spec=spec.model_dump(), iterations=2, **kw)


def plans_of(default: ModelSpec) -> Callable[..., RunPlan]:
    """``P(schedule, D, N, spec=default, **kw)``: :func:`direct` of ``spec``, ``default`` unless another is named."""

    def plan(schedule: str, D: int, N: int, spec: ModelSpec = default, **kw: Any) -> RunPlan:
        return direct(spec, schedule, D, N, **kw)

    return plan


def launched(groups: list[tuple[dict[str, RunPlan], int]], timeout: float = 180) -> dict[str, Any]:
    """Each group's plans launched with ``--check`` on its world size; every run's result under its name."""
    from executor.launch import launch

    out: dict[str, Any] = {}
    for plans, world in groups:
        res = launch(list(plans.values()), world, check=True, timeout=timeout)
        out |= dict(zip(plans, res["runs"], strict=True))
    return out


def launched_fixture(*groups: tuple[dict[str, RunPlan], int], timeout: float = 180) -> Any:
    """A module-scoped pytest fixture of :func:`launched` ``groups`` (launched once, on the first test that asks):
    a test module assigns it to ``runs``."""
    import pytest

    @pytest.fixture(scope="module")
    def runs() -> dict[str, Any]:
        return launched(list(groups), timeout)

    return runs


def tp_block_errors(specs: dict[str, tuple[dict[str, Any], int]], timeout: float = 120) -> list[dict[str, Any]]:
    """Each rank's figures of ``tests/tp_block_probe.py`` for ``specs`` (name -> (model spec, layer)): a block against
    its t = 2 shard on two gloo processes."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}
        # one interpreter: it imports torch and forks its second rank (tests/tp_block_probe.py); the group is
        # killed whole if it hangs
        proc = subprocess.Popen([sys.executable, str(repo / "tests" / "tp_block_probe.py"), str(Path(tmp) / "store"),
                                 json.dumps(specs), tmp], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=repo, env=env, start_new_session=True)
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
        assert proc.returncode == 0, err
        return [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(2)]


def assert_whole_block(name: str, e: dict[str, Any]) -> None:
    """One rank's figures of :func:`tp_block_errors` for the probed block ``name``: the t = 2 shard computes what the
    whole block does (output, input gradient and parameter gradients to 1e-12), every gradient nonzero."""
    assert e["min grad norm"] > 1e-6, (name, e)
    for what in ("output", "input grad", "grads"):
        assert e[what] < 1e-12, (name, what, e)
