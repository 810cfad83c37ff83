"""The request's ``shard_optimizer`` (ZeRO-1, Rajbhandari et al. 2020 section 5.1; Megatron-LM's
``--use-distributed-optimizer``; DeepSpeed ZeRO stage 1): a device keeps ``4 + 12/W`` bytes of model state per
parameter instead of mixed-precision Adam's 16 and steps its shard; the search, the CLI, the API and the exports
carry it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from api_support import AUTH, post_plan, tiny_cluster, tiny_profile
from pydantic import ValidationError
from typer.testing import CliRunner

from pipeplan.cli import app
from planner.analytic import analytic_profile
from planner.cluster import load_cluster
from planner.model import PRESETS
from planner.request import Config, TrainingRequest
from planner.search import plan, predict

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "examples" / "clusters" / "dgx-h100-80gb.json"


@pytest.fixture(scope="module")
def gpt3():
    cl = load_cluster(H100)
    return analytic_profile(PRESETS["gpt3-175b"], "H100-SXM5-80GB", micro_batches=(1,), tensor_sizes=(1, 4, 8)), cl


def test_state_per_parameter_is_zero_1s():
    """ZeRO 5.1's ``4 Psi + K Psi / N_d`` with K = 12: 16, 10, 7, 5.5 bytes at W = 1, 2, 4, 8; unchanged without
    sharding; the optimizer's share can be stated and cannot exceed the whole state."""
    sharded = TrainingRequest(global_batch=8, shard_optimizer=True)
    assert [sharded.state_bytes_per_param(w) for w in (1, 2, 4, 8)] == [16.0, 10.0, 7.0, 5.5]
    assert TrainingRequest(global_batch=8).state_bytes_per_param(8) == 16.0
    # an SGD-like state of 8 bytes: Adam's default share is capped at the state
    assert TrainingRequest(global_batch=8, bytes_per_param=8, shard_optimizer=True).state_bytes_per_param(4) == 2.0
    stated = TrainingRequest(global_batch=8, bytes_per_param=18, optimizer_bytes_per_param=12, shard_optimizer=True)
    assert stated.state_bytes_per_param(4) == 9.0  # Megatron's bf16 weights + fp32 gradients: 6 + 12/d
    with pytest.raises(ValidationError, match="optimizer_bytes_per_param: 20 is more than bytes_per_param"):
        TrainingRequest(global_batch=8, optimizer_bytes_per_param=20)


def test_a_sharded_optimizer_shrinks_each_devices_state_and_its_step(gpt3):
    """The same configuration: every device's model state is (4 + 12/W) / 16 of the unsharded one and its
    optimizer step shorter; the pipeline's compute is the same."""
    prof, cl = gpt3
    cfg = Config(tensor=8, pipeline=16, data=8, micro_batch=1, schedule="1f1b")
    plain = predict(prof, cl, TrainingRequest(global_batch=512), cfg)
    zero1 = predict(prof, cl, TrainingRequest(global_batch=512, shard_optimizer=True), cfg)
    assert plain.simulation is not None and zero1.simulation is not None
    ratio = (4 + 12 / 8) / 16
    assert zero1.state == pytest.approx([s * ratio for s in plain.state], rel=1e-9)
    assert max(zero1.memory) < max(plain.memory) - 0.5 * max(plain.state)
    assert zero1.breakdown["step"] < plain.breakdown["step"] / 2
    assert zero1.iteration_time < plain.iteration_time
    assert zero1.breakdown["compute"] == pytest.approx(plain.breakdown["compute"])
    doc = zero1.to_dict()
    assert doc["shard_optimizer"] is True and doc["state_bytes_per_param"] == pytest.approx(5.5)
    assert plain.to_dict()["shard_optimizer"] is False and plain.to_dict()["state_bytes_per_param"] == 16.0


def test_the_search_finds_plans_that_fit_only_sharded(gpt3):
    """GPT-3 175B on 256 H100s: configurations whose whole Adam state does not fit do with a sharded one, and
    the search ranks them (the best sharded plan is at least as fast as the best unsharded one)."""
    prof, cl = gpt3
    base = dict(global_batch=512, gpus=256, top=5, micro_batches=[1], schedules=["1f1b", "interleaved"])
    plain = plan(prof, cl, TrainingRequest(**base))
    zero1 = plan(prof, cl, TrainingRequest(**base, shard_optimizer=True))
    state_key = "weights, gradients and optimizer state do not fit"
    assert zero1.rejected[state_key] < plain.rejected[state_key]
    assert zero1.candidates and zero1.candidates[0].iteration_time <= plain.candidates[0].iteration_time
    labels = {c.config.label() for c in plain.candidates}
    assert any(c.config.label() not in labels for c in zero1.candidates)
    assert all(c.shard_optimizer for c in zero1.candidates)


def test_cli_plan_and_predict_take_it(tmp_path):
    prof = tmp_path / "gpt3.json"
    runner = CliRunner()
    r = runner.invoke(app, ["profile-analytic", "--preset", "gpt3-175b", "--device", "h100", "--out", str(prof)])
    assert r.exit_code == 0, r.output
    args = ["--profile", str(prof), "--cluster", str(H100), "--global-batch", "512", "--gpus", "256", "--top", "3",
            "--schedules", "1f1b"]
    r = runner.invoke(app, ["plan", *args, "--shard-optimizer", "--processes", "1"])
    assert r.exit_code == 0, r.output
    assert "the optimizer's 12 of them split over the W replicas (--shard-optimizer)" in r.output
    r = runner.invoke(app, ["plan", *args, "--shard-optimizer", "--processes", "1", "--json"])
    doc = json.loads(r.stdout)
    assert all(c["shard_optimizer"] and c["state_bytes_per_param"] < 16 for c in doc["candidates"])
    one = ["predict", "--profile", str(prof), "--cluster", str(H100), "--global-batch", "512", "--tensor", "8",
           "--pipeline", "16", "--data", "2", "--micro-batch", "1", "--schedule", "1f1b", "--json"]
    a, b = (json.loads(runner.invoke(app, one + extra).stdout) for extra in ([], ["--shard-optimizer"]))
    assert b["state_bytes_per_param"] == 10.0 and max(b["memory"]) < max(a["memory"])


def test_exports_carry_it():
    """Megatron-LM gets ``--use-distributed-optimizer``, DeepSpeed ZeRO stage 1, torchtitan FSDP (it has no
    ZeRO-1: said in a note); nothing where W = 1 or the plan does not shard."""
    from planner.export import deepspeed, megatron, torchtitan
    from planner.export.common import ExportInput
    from planner.runspec import RunSpec

    def inp(W: int, shard: bool) -> ExportInput:
        cfg = Config(tensor=2, pipeline=2, data=W, micro_batch=1, schedule="1f1b")
        return ExportInput(spec=RunSpec(config=cfg, microbatches=4, partition=[(0, 3), (3, 6)]),
                           model=PRESETS["gpt-tiny"], shard_optimizer=shard)

    assert "--use-distributed-optimizer" in megatron.arguments(inp(4, True))
    assert "--use-distributed-optimizer" not in megatron.arguments(inp(4, False))
    assert "--use-distributed-optimizer" not in megatron.arguments(inp(1, True))
    assert deepspeed.config(inp(4, True))["zero_optimization"] == {"stage": 1}
    assert deepspeed.config(inp(4, False))["zero_optimization"] == {"stage": 0}
    sharded = torchtitan.export(inp(4, True))
    assert "data_parallel_shard_degree = 4" in sharded.files[0].content
    assert "data_parallel_replicate_degree = 1" in sharded.files[0].content
    assert any("torchtitan has no ZeRO-1" in n for n in sharded.notes)
    for fmt in (megatron, deepspeed, torchtitan):  # read back: the same configuration
        back = fmt.parse(fmt.export(inp(4, True)).files[0].content)
        assert back.config.data == 4 and back.config.tensor == 2


def test_api_plans_and_exports_with_it(client) -> None:  # type: ignore[no-untyped-def]
    p = client.post("/profiles", json=tiny_profile(), headers=AUTH).json()
    cl = client.post("/clusters", json=tiny_cluster(4, 2), headers=AUTH).json()
    body = {"profile_id": p["id"], "cluster_id": cl["id"], "global_batch": 32, "top": 5, "schedules": ["1f1b"],
            "shard_optimizer": True}
    for bad, field in (({"shard_optimizer": "yes"}, "shard_optimizer"),
                       ({"optimizer_bytes_per_param": 17}, "optimizer_bytes_per_param"),
                       ({"optimizer_bytes_per_param": -1}, "optimizer_bytes_per_param")):
        r = client.post("/plans", json={**body, **bad}, headers=AUTH)
        assert r.status_code == 422 and field in r.json()["detail"], r.text
    plan_doc = post_plan(client, body)
    assert plan_doc["status"] == "done" and plan_doc["candidates"], plan_doc
    cands = plan_doc["candidates"]
    assert all(c["shard_optimizer"] for c in cands)
    rank = next(i for i, c in enumerate(cands) if c["data"] > 1)
    r = client.get(f"/plans/{plan_doc['id']}/candidates/{rank}/export", params={"format": "megatron"},
                   headers=AUTH)
    assert r.status_code == 200 and "--use-distributed-optimizer" in r.json()["files"][0]["content"], r.text


def test_cli_bytes_per_param(tmp_path):
    """``--bytes-per-param`` states the model state (Megatron-LM's bf16 runs: 18, fp32 gradients); with
    ``--shard-optimizer`` Adam's 12 of them are split: Megatron's ``6 + 12/d``. A bad value names the field."""
    prof = tmp_path / "gpt3.json"
    runner = CliRunner()
    assert runner.invoke(app, ["profile-analytic", "--preset", "gpt3-175b", "--device", "h100", "--out",
                               str(prof)]).exit_code == 0
    one = ["predict", "--profile", str(prof), "--cluster", str(H100), "--global-batch", "512", "--tensor", "8",
           "--pipeline", "16", "--data", "4", "--micro-batch", "1", "--schedule", "1f1b", "--json"]
    docs = [json.loads(runner.invoke(app, one + extra).stdout) for extra in
            ([], ["--bytes-per-param", "18"], ["--bytes-per-param", "18", "--shard-optimizer"])]
    assert [d["state_bytes_per_param"] for d in docs] == [16.0, 18.0, 9.0]
    assert max(docs[1]["memory"]) > max(docs[0]["memory"]) > max(docs[2]["memory"])
    for bad, msg in (("0", "greater than 0"), ("inf", "finite number")):
        r = runner.invoke(app, [*one[:-1], "--bytes-per-param", bad])
        assert r.exit_code == 2 and "--bytes-per-param" in r.output and msg in r.output, r.output


def test_a_sharded_optimizer_synchronises_by_reduce_scatter_and_all_gather(gpt3):
    """ZeRO-1's gradient sync is a reduce-scatter and, after the step, an all-gather (section 7.2.1: the bytes
    of an all-reduce): NCCL rings over all the data-parallel ranks, whose latency grows with W where the
    all-reduce's tree grows with log W. On a one-stage pipeline overlapping them (dp_allreduce overlapped), at
    least one bucket of each is left."""
    from planner.cost import allreduce_time, sharded_collective_time

    _, cl = gpt3
    cl = cl.model_copy(update={"gpus": 8 * 512})
    nbytes = 2e9
    for W in (8, 64, 512):
        ranks = [8 * i for i in range(W)]  # one per node
        pair = sum(sharded_collective_time(cl, ranks, nbytes, op) for op in ("reduce_scatter", "all_gather"))
        ar = allreduce_time(cl, ranks, nbytes)
        assert 0.9 < pair / ar < 1.25, (W, pair, ar)  # the same bytes
    small = [8 * i for i in range(512)]
    assert sharded_collective_time(cl, small, 1e6, "reduce_scatter") > 3 * allreduce_time(cl, small, 1e6) / 2
    # one stage, overlapped: the exposed sync is at least a bucket of each and less than the whole pair
    from planner.analytic import analytic_profile
    from planner.model import PRESETS

    prof = analytic_profile(PRESETS["gpt2-1.3b"], "H100-SXM5-80GB", micro_batches=(4,), tensor_sizes=(1,),
                            dp_allreduce="overlapped")
    cfg = Config(tensor=1, pipeline=1, data=64, micro_batch=4, schedule="1f1b")
    zero1 = predict(prof, cl, TrainingRequest(global_batch=64 * 16, shard_optimizer=True), cfg)
    plain = predict(prof, cl, TrainingRequest(global_batch=64 * 16), cfg)
    assert zero1.simulation is not None and plain.simulation is not None
    assert 0 < zero1.breakdown["allreduce_exposed"] < 0.05 * zero1.iteration_time
    # at least one Megatron-Core bucket of each is left after the compute (its bucket grows with the replicas)
    from planner.cost import megatron_core_bucket_bytes

    ranks = list(range(64))
    bucket = megatron_core_bucket_bytes(64, 2)
    left = sum(sharded_collective_time(cl, ranks, bucket, op) for op in ("reduce_scatter", "all_gather"))
    assert zero1.breakdown["allreduce_exposed"] > left > 0


def test_a_sharded_plan_says_pipeplans_executor_does_not_shard(gpt3):
    prof, cl = gpt3
    base = dict(global_batch=512, gpus=256, top=1, micro_batches=[1], schedules=["1f1b"])
    assert not any("ZeRO-1" in w for w in plan(prof, cl, TrainingRequest(**base)).warnings)
    (w,) = [w for w in plan(prof, cl, TrainingRequest(**base, shard_optimizer=True)).warnings if "ZeRO-1" in w]
    assert "pipeplan's executor runs plain SGD" in w


def test_the_pruned_search_is_exact_with_a_sharded_optimizer():
    """The bounds (planner.bounds, the replicated plans' own) use the same W-dependent step and sync as the
    simulated candidates: the pruned search returns what the exhaustive one does."""
    from planner.profile import load_profile
    from planner.search import Planner

    prof = load_profile(ROOT / "examples" / "profiles" / "gpt2-medium-a100-80gb-analytic.json")
    cl = load_cluster(ROOT / "examples" / "clusters" / "dgx-a100-80gb.json")
    req = TrainingRequest(global_batch=64, gpus=16, top=8, shard_optimizer=True, allow_async=True)
    pruned, full = (Planner(prof, cl, req).search(prune=p) for p in (True, False))
    assert [(c.config.label(), c.iteration_time) for c in pruned.candidates] == \
        [(c.config.label(), c.iteration_time) for c in full.candidates]
    assert pruned.simulated < full.simulated


def test_the_exposed_sharded_bucket_is_megatron_cores_and_grows_with_the_replicas(gpt3):
    """Megatron-Core sizes its gradient buckets max(40M, 1M x DP) parameters: at 512 replicas a 512M-parameter
    bucket, where PyTorch DDP's is 25 MB. What a one-stage pipeline has left after its backward is at least
    that bucket's reduce-scatter and all-gather (it failed with the 25 MB bucket)."""
    from planner.cost import ConfigCosts, megatron_core_bucket_bytes, sharded_collective_time
    from planner.schedules import build

    assert megatron_core_bucket_bytes(8, 2) == 80e6
    assert megatron_core_bucket_bytes(512, 2) == 1024e6
    _, cl = gpt3
    cl = cl.model_copy(update={"gpus": 8 * 512})
    prof = analytic_profile(PRESETS["gpt2-1.3b"], "H100-SXM5-80GB", micro_batches=(1,), tensor_sizes=(1,),
                            dp_allreduce="overlapped")
    n = len(prof.layers)
    for W in (8, 512):
        cfg = Config(tensor=1, pipeline=1, data=W, micro_batch=1, schedule="1f1b")
        costs = ConfigCosts(prof, cl, TrainingRequest(global_batch=W, shard_optimizer=True), cfg,
                            build("1f1b", 1, 1), [(0, n)])
        ranks = [costs.rank(0, w) for w in range(W)]
        nbytes = costs.stages[0].param_bytes
        bucket = min(nbytes, megatron_core_bucket_bytes(W, 2))
        floor = sum(sharded_collective_time(cl, ranks, bucket, op) for op in ("reduce_scatter", "all_gather"))
        assert costs.allreduce(0, 0, 0) >= floor * (1 - 1e-9)
        if W == 512:
            assert bucket > 30 * 2**20 and costs.allreduce(0, 0, 0) > sum(
                sharded_collective_time(cl, ranks, 25 * 2**20, op) for op in ("reduce_scatter", "all_gather"))
