"""A profile whose layers tensor parallelism is not known to split (a model of your own, ``pipeplan profile
--module``: kind ``layer``, no shard times) is planned at t = 1 only (:attr:`planner.profile.ModelProfile.
tensor_split_problem`). A new user's plan of ``examples/custom_model.py`` on local-cpu-4 ranked a t = 4 row
first -- the t = 1 times divided by t, a guess -- which ``pipeplan run --module`` then refused ("tensor
parallelism needs the zoo's blocks")."""

from __future__ import annotations

from pathlib import Path

from planner.cluster import load_cluster
from planner.profile import LayerProfile, ModelProfile
from planner.request import Config, TrainingRequest
from planner.search import plan, predict

CPU4 = load_cluster(Path(__file__).resolve().parent.parent / "examples" / "clusters" / "local-cpu-4.json")
SIZES = (1, 2, 4)


def _profile(kind: str) -> ModelProfile:
    lays = [LayerProfile(name=f"layer.{i}", kind=kind, fwd_time={b: 1e-3 * b for b in SIZES},
                         bwd_time={b: 2e-3 * b for b in SIZES}, output_bytes_per_sample=1024,
                         stashed_bytes_per_sample=8192, input_bytes_per_sample=1024, params=500_000,
                         param_bytes=2_000_000) for i in range(8)]
    return ModelProfile(name="mine", layers=lays, device="cpu", dtype="float32", source="measured")


def test_a_model_of_your_own_is_planned_at_t_1() -> None:
    res = plan(_profile("layer"), CPU4, TrainingRequest(global_batch=16, top=50))
    assert res.candidates and {c.config.tensor for c in res.candidates} == {1}
    assert res.rejected["t > 1: the profile's layers are none tensor parallelism is known to split"] > 0


def test_transformer_layers_keep_tensor_parallel_candidates() -> None:
    prof = _profile("transformer")
    assert prof.tensor_split_problem is None
    res = plan(prof, CPU4, TrainingRequest(global_batch=16, top=200))
    assert max(c.config.tensor for c in res.candidates) > 1


def test_predict_says_why_t_2_is_not_planned() -> None:
    cand = predict(_profile("layer"), CPU4, TrainingRequest(global_batch=8),
                   Config(tensor=2, pipeline=2, data=1, micro_batch=1, schedule="1f1b"))
    assert cand.simulation is None
    assert cand.reason.startswith("tensor: no layer of profile 'mine'") and "kinds: layer" in cand.reason
    ok = predict(_profile("layer"), CPU4, TrainingRequest(global_batch=8),
                 Config(tensor=1, pipeline=2, data=1, micro_batch=1, schedule="1f1b"))
    assert ok.simulation is not None
