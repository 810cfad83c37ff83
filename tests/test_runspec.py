"""RunSpec: the record planner, API and executor share (planner/runspec.py)."""

from __future__ import annotations

import pytest

from executor.plan import RunPlan
from planner.request import Config
from planner.runspec import RunSpec, schedule_microbatches, schedule_samples
from planner.schedules import SCHEDULE_PARAMETERS, parameters
from planner.schedules.ir import builder_eager

HALVING = Config(tensor=1, pipeline=2, data=1, micro_batch=2, schedule="chimera", pipelines=1,
                 concat="backward-halving")


def test_backward_halving_runs_2n_microbatches_of_half_b() -> None:
    spec = RunSpec(config=HALVING, microbatches=4)
    assert (spec.schedule_microbatches, spec.schedule_samples, spec.global_batch) == (8, 1.0, 8)
    assert spec.schedule().microbatches == 8
    doubling = HALVING.model_copy(update={"concat": "forward-doubling"})
    assert (schedule_microbatches(doubling, 4), schedule_samples(doubling)) == (4, 2)


def test_lowered_uses_the_builders_eager_choice() -> None:
    spec = RunSpec(config=HALVING, microbatches=4)
    sched = spec.schedule()
    assert sorted(spec.lowered().params["eager"]) == sorted(builder_eager(sched))
    one = RunSpec(config=Config(tensor=1, pipeline=2, data=1, micro_batch=1, schedule="1f1b"), microbatches=2)
    assert one.lowered().params["eager"] == [] and one.lowered().lowered


def test_config_fields_are_the_declared_schedule_parameters() -> None:
    fixed = {"tensor", "pipeline", "data", "expert", "expert_tensor", "order", "micro_batch", "schedule", "recompute"}
    assert set(Config.model_fields) - fixed == set(SCHEDULE_PARAMETERS)
    for name, p in SCHEDULE_PARAMETERS.items():
        for schedule in p.schedules:
            assert name in parameters(schedule)


def test_candidate_document_round_trip_and_old_documents() -> None:
    spec = RunSpec(config=HALVING, microbatches=4, partition=[(0, 3), (3, 6)])
    doc = {"run_spec": spec.model_dump(mode="json"), "schedule": "ignored-when-run_spec-is-there"}
    assert RunSpec.from_document(doc) == spec
    old = {**HALVING.model_dump(), "microbatches": 4, "partition": [[0, 3], [3, 6]], "global_batch": 8,
           "label": "x", "iteration_time": 1.0}
    assert RunSpec.from_document(old) == spec
    plan = RunPlan.from_candidate(doc, iterations=2)
    assert plan.spec == spec and plan.iterations == 2 and plan.rows == 1
    assert RunPlan.from_dict(plan.to_dict()) == plan


def test_planner_candidate_carries_its_run_spec() -> None:
    from planner.analytic import analytic_profile
    from planner.cluster import load_cluster
    from planner.device import device_for_cluster
    from planner.model import PRESETS
    from planner.request import TrainingRequest
    from planner.search import predict

    cl = load_cluster("examples/clusters/dgx-a100-80gb.json")
    prof = analytic_profile(PRESETS["gpt3-175b"], device_for_cluster(cl))
    cfg = Config(tensor=8, pipeline=16, data=2, micro_batch=2, schedule="chimera", pipelines=1,
                 concat="backward-halving")
    cand = predict(prof, cl, TrainingRequest(global_batch=512), cfg)
    doc = cand.to_dict()
    spec = RunSpec.from_document(doc)
    assert spec.config == cfg and spec.microbatches == 128 and spec.global_batch == 512
    assert [list(p) for p in spec.partition] == doc["partition"]


def test_bad_spec_is_a_plan_error() -> None:
    from executor.plan import PlanError

    with pytest.raises(PlanError, match="pipeline"):
        RunPlan.direct("1f1b", 0, 2)
