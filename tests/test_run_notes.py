"""What `pipeplan run --plan ... --emulate` says about its prediction: the run is compared with the simulator on
its own terms, which a new user took for a wrong prediction (12.56 ms against the plan's 24.03 ms, unexplained)."""

from __future__ import annotations

import json
from pathlib import Path

from executor.cli import planned_note


def _plan(tmp_path: Path, seconds: float) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({"candidates": [{"iteration_time": seconds}]}))
    return str(path)


def test_an_emulated_run_says_the_plans_prediction_and_why_its_own_differs(tmp_path: Path) -> None:
    result = {"emulated": True, "predicted": {"iteration_time": 0.01256}}
    note = planned_note(result, _plan(tmp_path, 0.02403), 0, None)
    assert note.startswith("note: the plan predicted 24.03 ms for this candidate; this emulated run is compared "
                           "with 12.56 ms"), note
    assert "no --cluster given" in note and "emulated compute waits instead of sharing the cores" in note
    assert "--cluster c.json" in planned_note(result, _plan(tmp_path, 0.02403), 0, "c.json")
    assert planned_note(result, _plan(tmp_path, 0.0126), 0, None) == "the plan predicted the same for this candidate"
