"""The request's ``shard_parameters`` (ZeRO-3, Rajbhandari et al. 2020 section 5.3; PyTorch FSDP2 as torchtitan
runs it; :mod:`planner.fsdp`): every device keeps ``bytes_per_param / W`` of the model state plus the gathered
weights, each layer's weights are all-gathered and its gradients reduce-scattered among the W replicas (per
micro-batch without a pipeline, once per iteration with one); the search, the CLI, the API and the exports carry
it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from api_support import AUTH, post_plan, tiny_cluster, tiny_profile
from pydantic import ValidationError
from search_support import config_costs
from typer.testing import CliRunner

from pipeplan.cli import app
from planner import fsdp
from planner.analytic import analytic_profile
from planner.cluster import load_cluster
from planner.cost import sharded_collective_time
from planner.model import PRESETS
from planner.request import Config, TrainingRequest
from planner.search import Planner, plan, predict

ROOT = Path(__file__).resolve().parent.parent
A100 = ROOT / "examples" / "clusters" / "dgx-a100-80gb.json"


@pytest.fixture(scope="module")
def gpt2():
    """GPT-2 1.3B (24 layers + embedding + head) on 8 DGX A100 nodes."""
    cl = load_cluster(A100)
    return analytic_profile(PRESETS["gpt2-1.3b"], "A100-SXM4-80GB", micro_batches=(1, 2), tensor_sizes=(1, 2)), cl


def test_all_the_state_is_split_and_incompatible_schedules_are_left_out():
    """ZeRO 5.3's ``(2 + 2 + K) Psi / N_d``: 16/W bytes per parameter; Chimera, GEMS and PipeDream's schedules
    are not planned with it, and a request naming only those is refused naming the field."""
    req = TrainingRequest(global_batch=8, shard_parameters=True)
    assert [req.state_bytes_per_param(w) for w in (1, 2, 4, 8)] == [16.0, 8.0, 4.0, 2.0]
    assert req.sharded_state and not TrainingRequest(global_batch=8).sharded_state
    assert not set(req.allowed()) & set(fsdp.INCOMPATIBLE)
    assert {"1f1b", "interleaved", "zb-h1", "gpipe", "hanayo"} <= set(req.allowed())
    with pytest.raises(ValidationError, match="schedules: none of chimera, gems can shard its weights"):
        TrainingRequest(global_batch=8, shard_parameters=True, schedules=["chimera", "gems"])


def test_prefetch_rules():
    """Compute-bound layers hide every gather but the first; link-bound ones take the link's time; the first
    layer's reduce-scatter is left after the backward; pipelined, what the first forward cannot hide is left."""
    assert fsdp.forward_time(10.0, [1.0, 1.0, 1.0]) == 11.0
    assert fsdp.forward_time(1.0, [2.0, 2.0, 2.0]) == 6.0
    assert fsdp.backward_time(20.0, [1.0, 1.0, 1.0], [1.0, 1.0, 1.0]) == 21.0
    assert fsdp.backward_time(1.0, [2.0, 2.0, 2.0], [3.0, 3.0, 3.0]) == 2 * 2 + 2 * 3 + 3
    assert fsdp.gather_exposed(10.0, [1.0, 2.0, 1.0]) == 2.0
    assert fsdp.gather_exposed(1.0, [1.0, 2.0, 1.0]) == 3.0
    assert fsdp.forward_time(5.0, []) == 5.0 and fsdp.gather_exposed(5.0, []) == 0.0
    # gathers beside the forward hold a share of its compute (planner.contention): what they leave grows by it
    assert fsdp.gather_exposed(10.0, [1.0, 2.0, 1.0], share=0.25) == 2.0  # still at least the largest gather
    assert fsdp.gather_exposed(2.0, [1.0, 2.0, 1.0], share=0.25) == pytest.approx(2.0)  # link-bound: 1 + 3 - 2
    # the first gather, then 6 s of gathers beside 8 s of forward: 3 + (8 + 0.5 x 6) - 8, as forward_time has it
    assert fsdp.gather_exposed(8.0, [3.0, 3.0, 3.0], share=0.5) == pytest.approx(6.0)
    assert fsdp.gather_exposed(8.0, [3.0, 3.0, 3.0], share=0.5) == pytest.approx(
        fsdp.forward_time(8.0, [3.0, 3.0, 3.0], share=0.5) - 8.0)
    assert fsdp.forward_time(10.0, [1.0, 1.0, 1.0], share=0.5) == pytest.approx(1.0 + 10.0 + 0.5 * 2.0)
    # copy-outs run on the compute stream: every gather's forward, all but the last layer's backward
    assert fsdp.forward_time(10.0, [1.0, 2.0, 1.0], copies=[0.5, 0.5, 0.5]) == 1.0 + 11.5
    assert fsdp.backward_time(1.0, [2.0, 2.0, 2.0], [3.0, 3.0, 3.0], copies=[6.0, 6.0, 6.0]) == 13.0 + 3.0


def test_without_a_pipeline_every_microbatch_gathers_and_scatters(gpt2):
    """D = 1: each F and B carries its layers' collectives (prefetched), the ALLREDUCE nothing; on a slow link
    the iteration is at least the collectives' time: N micro-batches each gather every layer twice (less the last
    layer's second gather) and reduce-scatter every gradient in fp32."""
    prof, cl = gpt2
    cfg = Config(tensor=1, pipeline=1, data=64, micro_batch=1, schedule="1f1b")
    req = TrainingRequest(global_batch=256, shard_parameters=True)
    costs = config_costs(prof, cl, cfg, req)
    plain = config_costs(prof, cl, cfg, TrainingRequest(global_batch=256))
    gathers, scatters = costs.fsdp_layers(0)
    assert len(gathers) == len(prof.layers)
    ranks = [costs.rank(0, w) for w in range(64)]
    lay = prof.layers[1]
    assert gathers[1] == pytest.approx(sharded_collective_time(cl, ranks, lay.params * 2, "all_gather"))
    # FSDP2's copies: the reduce-scatter's fp32 copy-in on its stream (read 2, write 4 bytes per parameter), the
    # gathered weights' copy-out on the compute stream (read and write 2 bytes per parameter)
    assert scatters[1] == pytest.approx(sharded_collective_time(cl, ranks, lay.params * 4.0, "reduce_scatter")
                                        + lay.params * 6.0 / cl.memory_bandwidth)
    copies = costs.fsdp_copies(0)
    assert copies[1] == pytest.approx(lay.params * 4.0 / cl.memory_bandwidth) and len(copies) == len(gathers)
    # the collectives beside the compute hold the SMs of their NCCL channels while they run (planner.contention)
    assert costs.comm_share == pytest.approx(24 / 108)
    assert costs.fwd(0) == pytest.approx(fsdp.forward_time(plain.fwd(0), gathers, copies=copies,
                                                           share=costs.comm_share))
    assert costs.bwd(0) == pytest.approx(fsdp.backward_time(plain.bwd(0), gathers, scatters, copies=copies,
                                                            share=costs.comm_share))
    assert costs.allreduce(0, 0, 0) == 0.0
    # the breakdown says how much of the compute is the collectives the layers do not hide
    cand, ref = predict(prof, cl, req, cfg), predict(prof, cl, TrainingRequest(global_batch=256, shard_optimizer=True),
                                                     cfg)
    extra = costs.fsdp_extra("F", 0) + costs.fsdp_extra("B", 0)
    assert extra == pytest.approx(costs.fwd(0) + costs.bwd(0) - plain.fwd(0) - plain.bwd(0)) and extra > 0
    assert cand.breakdown["fsdp_in_compute"] == pytest.approx(4 * extra)
    assert cand.breakdown["compute"] - cand.breakdown["fsdp_in_compute"] == pytest.approx(ref.breakdown["compute"])
    assert "fsdp_in_compute" not in ref.breakdown
    assert cand.breakdown["fsdp_comm_busy"] == pytest.approx(4 * (2 * sum(gathers) - gathers[-1] + sum(scatters)))
    # a network 1000x slower: the link bounds the iteration
    slow = cl.model_copy(update={"inter": cl.inter.model_copy(update={"beta": cl.inter.beta * 1000})})
    c = predict(prof, slow, req, cfg)
    g, s = config_costs(prof, slow, cfg, req).fsdp_layers(0)
    N = 256 // 64
    assert c.iteration_time >= N * (sum(g) + sum(g[:-1]) + sum(s))
    assert c.iteration_time > 3 * predict(prof, slow, TrainingRequest(global_batch=256), cfg).iteration_time / 4


def test_a_shared_cpu_host_gathers_with_its_measured_collective_and_without_overlap():
    """On the local CPU cluster (gloo, collectives on the cores compute runs on: ``host.comm_overlaps_compute``
    false) each layer's gather and reduce-scatter costs the measured all-reduce fit's latency and half its
    bandwidth term, and they add to the compute instead of hiding under it."""
    from api_support import tiny_profile

    from planner.cluster import Cluster
    from planner.profile import ModelProfile

    cl = load_cluster(ROOT / "examples" / "clusters" / "local-cpu-4.json")
    assert cl.host is not None and not cl.host.comm_overlaps_compute and cl.allreduce_fit is not None
    prof = ModelProfile.model_validate(tiny_profile())
    cfg = Config(tensor=1, pipeline=1, data=4, micro_batch=1, schedule="1f1b")
    req = TrainingRequest(global_batch=8, shard_parameters=True)
    costs = config_costs(prof, cl, cfg, req)
    plain = config_costs(prof, cl, cfg, TrainingRequest(global_batch=8))
    gathers, scatters = costs.fsdp_layers(0)
    fit = cl.allreduce_fit.link
    assert gathers[0] == pytest.approx(fit.alpha + fit.beta * prof.layers[0].params * costs.el / 2)
    assert scatters[0] == pytest.approx(fit.alpha + fit.beta * prof.layers[0].params * 4.0 / 2
                                        + prof.layers[0].params * (costs.el + 4.0) / cl.memory_bandwidth)
    copies = costs.fsdp_copies(0)
    assert costs.fwd(0) == pytest.approx(plain.fwd(0) + sum(copies) + sum(gathers))
    assert costs.bwd(0) == pytest.approx(plain.bwd(0) + sum(copies[:-1]) + sum(gathers[:-1]) + sum(scatters))
    # a GPU-like host whose communication overlaps: prefetched as on GPUs
    overlapped = cl.model_copy(update={"host": cl.host.model_copy(update={"comm_overlaps_compute": True})})
    assert config_costs(prof, Cluster.model_validate(overlapped.model_dump()), cfg, req).fwd(0) < costs.fwd(0)


def test_pipelined_stages_gather_once_and_keep_the_gathered_weights(gpt2):
    """D > 1: F and B are the unsharded pipeline's; each stage's ALLREDUCE is its fp32 reduce-scatter plus what
    its first forward leaves of the all-gather; a device holds 16/W bytes per parameter of its stage plus the
    gathered weights (el) and the gradients accumulated in fp32 (FSDP2's reduce dtype)."""
    prof, cl = gpt2
    cfg = Config(tensor=2, pipeline=4, data=8, micro_batch=1, schedule="1f1b")
    req = TrainingRequest(global_batch=256, shard_parameters=True)
    costs = config_costs(prof, cl, cfg, req)
    plain = config_costs(prof, cl, cfg, TrainingRequest(global_batch=256))
    for s in range(4):
        assert costs.fwd(s) == plain.fwd(s) and costs.bwd(s) == plain.bwd(s)
        # the step reads and writes the stage's shard of the state, and reads its fp32 gradients for their norm
        # (no copy into fp32 main gradients: planner.fsdp.step_grad_pass_bytes)
        assert costs.step_per_stage()[s] == pytest.approx(
            costs.stages[s].params * (2 * 16 / 8 + 4 / 8) / cl.memory_bandwidth / 2)
        gathers, scatters = costs.fsdp_layers(s)
        assert costs.allreduce(s, 0, s) == pytest.approx(
            sum(scatters) + fsdp.gather_exposed(costs.fwd(s), gathers, costs.comm_share) + sum(costs.fsdp_copies(s)))
    cand = predict(prof, cl, req, cfg)
    ref = predict(prof, cl, TrainingRequest(global_batch=256), cfg)
    assert cand.fits and cand.to_dict()["shard_parameters"] is True and cand.to_dict()["shard_optimizer"] is True
    for d, (i, j) in enumerate(cand.partition):
        own = sum(lay.params - (lay.tied_params if i == 0 and lay.kind == "lm_head" else 0)
                  for lay in prof.layers[i:j])
        assert cand.state[d] == pytest.approx(own * (16 / 8 + 2 + 4) / 2, rel=1e-9)  # bf16 weights, fp32 grads
        assert cand.state[d] < ref.state[d]


def test_sharded_weights_fit_what_the_optimizer_alone_does_not(gpt2):
    """Without a pipeline or tensor parallelism, 64 replicas of GPT-2 1.3B at 16 bytes per parameter plus
    activations: FSDP's state is a fraction of ZeRO-1's (4 + 12/W), by about 16/W + the gathered layers."""
    prof, cl = gpt2
    cfg = Config(tensor=1, pipeline=1, data=64, micro_batch=2, schedule="1f1b")
    zero1 = predict(prof, cl, TrainingRequest(global_batch=256, shard_optimizer=True), cfg)
    zero3 = predict(prof, cl, TrainingRequest(global_batch=256, shard_parameters=True), cfg)
    assert zero3.state[0] < zero1.state[0] / 3
    biggest = max(lay.params for lay in prof.layers)
    assert zero3.state[0] == pytest.approx(prof.total_params * 16 / 64 + biggest * (3 * 2 + 4), rel=1e-9)


def test_search_is_exact_and_agrees_with_predict(gpt2):
    """Every listed candidate is a schedule FSDP can shard, the pruned search equals the exhaustive one, and
    each candidate's time is ``predict``'s."""
    prof, cl = gpt2
    req = TrainingRequest(global_batch=128, gpus=32, top=12, shard_parameters=True)
    pruned = plan(prof, cl, req)
    full = Planner(prof, cl, req).search(prune=False)
    assert pruned.candidates
    assert [(c.config, round(c.iteration_time, 12)) for c in pruned.candidates] == \
        [(c.config, round(c.iteration_time, 12)) for c in full.candidates]
    for c in pruned.candidates:
        assert c.config.schedule not in fsdp.INCOMPATIBLE and c.shard_parameters
        assert predict(prof, cl, req, c.config).iteration_time == pytest.approx(c.iteration_time, rel=1e-12)
    assert any(c.config.pipeline == 1 for c in pruned.candidates)
    assert any("FSDP" in w for w in pruned.warnings)
    refused = predict(prof, cl, req, Config(tensor=1, pipeline=2, data=16, micro_batch=1, schedule="chimera",
                                            pipelines=1, concat="direct"))
    assert refused.reason.startswith("schedule: chimera keeps two copies")


def test_cli_plan_and_predict_take_it(tmp_path):
    prof = tmp_path / "gpt2.json"
    runner = CliRunner()
    r = runner.invoke(app, ["profile-analytic", "--preset", "gpt2-1.3b", "--device", "a100-80gb", "--out", str(prof)])
    assert r.exit_code == 0, r.output
    args = ["--profile", str(prof), "--cluster", str(A100), "--global-batch", "128", "--gpus", "16", "--top", "4"]
    r = runner.invoke(app, ["plan", *args, "--shard-parameters", "--processes", "1"])
    assert r.exit_code == 0, r.output
    assert "all split over the W replicas, weights gathered where they compute (--shard-parameters: FSDP)" in r.output
    assert "data-parallel all-reduce" not in r.output  # (the profile's runtime words: no all-reduce under FSDP)
    r = runner.invoke(app, ["plan", *args, "--shard-parameters", "--processes", "1", "--json"])
    doc = json.loads(r.stdout)
    assert doc["candidates"] and all(c["shard_parameters"] and c["schedule"] not in fsdp.INCOMPATIBLE
                                     for c in doc["candidates"])
    one = ["predict", "--profile", str(prof), "--cluster", str(A100), "--global-batch", "128", "--tensor", "1",
           "--pipeline", "1", "--data", "16", "--micro-batch", "1", "--schedule", "1f1b", "--json"]
    a, b = (json.loads(runner.invoke(app, one + extra).stdout) for extra in ([], ["--shard-parameters"]))
    assert b["state_bytes_per_param"] == 1.0 and max(b["memory"]) < max(a["memory"])
    r = runner.invoke(app, ["plan", *args, "--shard-parameters", "--schedules", "chimera"])
    assert r.exit_code == 2 and "chimera" in r.output and "shard" in r.output


def test_exports_carry_it():
    """torchtitan: FSDP with no ZeRO-1 note; DeepSpeed: ZeRO stage 3 without a pipeline, refused with one;
    Megatron-LM: its FSDP2 flags without a pipeline, refused with one."""
    from planner.export import deepspeed, megatron, torchtitan
    from planner.export.common import ExportError, ExportInput
    from planner.runspec import RunSpec

    def inp(D: int, W: int) -> ExportInput:
        cfg = Config(tensor=2, pipeline=D, data=W, micro_batch=1, schedule="1f1b")
        part = [(0, 6)] if D == 1 else [(0, 3), (3, 6)]
        return ExportInput(spec=RunSpec(config=cfg, microbatches=4, partition=part), model=PRESETS["gpt-tiny"],
                           shard_parameters=True, dp_allreduce="after-backward")

    sharded = torchtitan.export(inp(2, 4))
    assert "data_parallel_shard_degree = 4" in sharded.files[0].content
    assert not any("ZeRO-1" in n for n in sharded.notes)
    assert deepspeed.config(inp(1, 4))["zero_optimization"] == {"stage": 3}
    assert deepspeed.config(inp(1, 1))["zero_optimization"] == {"stage": 0}
    with pytest.raises(ExportError, match="ZeRO stage 1 at most"):
        deepspeed.config(inp(2, 4))
    args = megatron.arguments(inp(1, 4))
    assert "--use-torch-fsdp2" in args and "--use-distributed-optimizer" not in args
    with pytest.raises(ExportError, match="without pipeline parallelism"):
        megatron.arguments(inp(2, 4))
    head = [line for line in sharded.files[0].content.splitlines() if line.startswith("#")]
    assert any("FSDP" in line for line in head) and not any("all-reduce" in line for line in head)
    assert deepspeed.config(inp(1, 4))["communication_data_type"] == "fp32"


def test_api_plans_and_exports_with_it(client) -> None:  # type: ignore[no-untyped-def]
    p = client.post("/profiles", json=tiny_profile(), headers=AUTH).json()
    cl = client.post("/clusters", json=tiny_cluster(4, 2), headers=AUTH).json()
    body = {"profile_id": p["id"], "cluster_id": cl["id"], "global_batch": 32, "top": 5, "shard_parameters": True}
    for bad, field in (({"shard_parameters": "yes"}, "shard_parameters"),
                       ({"schedules": ["chimera"]}, "schedules")):
        r = client.post("/plans", json={**body, **bad}, headers=AUTH)
        assert r.status_code == 422 and field in r.json()["detail"], r.text
    plan_doc = post_plan(client, body)
    assert plan_doc["status"] == "done" and plan_doc["candidates"], plan_doc
    # what the profile's times assume, for the plan page: no data-parallel all-reduce under sharded weights
    from planner.analytic import analytic_profile

    gpt = analytic_profile(PRESETS["gpt-tiny"], "A100-SXM4-80GB", micro_batches=(1,), tensor_sizes=(1,))
    gid = client.post("/profiles", json=gpt.model_dump(mode="json"), headers=AUTH).json()["id"]
    words = client.get(f"/profiles/{gid}/assumes", headers=AUTH).json()["assumes"]
    fsdp_words = client.get(f"/profiles/{gid}/assumes?sharded_weights=true", headers=AUTH).json()["assumes"]
    assert "the data-parallel all-reduce after the backward" in words
    assert fsdp_words == [w for w in words if not w.startswith("the data-parallel all-reduce")]
    cands = plan_doc["candidates"]
    assert all(c["shard_parameters"] and c["schedule"] not in fsdp.INCOMPATIBLE for c in cands)
    rank = next(i for i, c in enumerate(cands) if c["data"] > 1)
    r = client.get(f"/plans/{plan_doc['id']}/candidates/{rank}/export", params={"format": "torchtitan"},
                   headers=AUTH)
    assert r.status_code == 200, r.text
    assert f"data_parallel_shard_degree = {cands[rank]['data']}" in r.text
    # a job of it: its comparison says the executor runs it unsharded (an unsharded W = 1 one says nothing)
    job = client.post("/jobs", json={"plan_id": plan_doc["id"], "candidate_index": rank, "emulate": True},
                      headers=AUTH)
    assert job.status_code in (200, 201), job.text
    note = client.get(f"/jobs/{job.json()['id']}/comparison", headers=AUTH).json()["note"]
    assert "shards the weights, gradients and optimizer state (FSDP)" in note and "executor does not" in note


def test_a_run_of_a_sharded_plan_says_the_executor_does_not_shard(tmp_path):
    """``pipeplan run --plan`` of a candidate whose plan shards (FSDP or ZeRO-1, W > 1) says that pipeplan's
    executor runs it unsharded (what it measured and compared); nothing for W = 1 or an unsharded plan."""
    from executor.plan import planned_sharding

    path = tmp_path / "plan.json"
    docs = [{"data": 4, "shard_parameters": True, "shard_optimizer": True}, {"data": 4, "shard_optimizer": True},
            {"data": 1, "shard_parameters": True}, {"data": 4}]
    path.write_text(json.dumps({"candidates": docs}))
    got = [planned_sharding(path, i) for i in range(4)]
    assert "shards the weights, gradients and optimizer state (FSDP)" in got[0]
    assert "shards the optimizer state (ZeRO-1)" in got[1] and got[2:] == [None, None]
    assert "pipeplan's executor does not" in got[0]


def test_a_merged_schedule_on_a_shared_host_takes_its_core_share_from_its_full_lists():
    """On the local CPU cluster a Hanayo candidate's core-sharing slowdown (planner.cost.host_share, a fixed point
    over the simulated schedule) is that of the lists it is timed with, not of the partial lists the search
    refined its bound with (a new user saw FSDP Hanayo rows predicted faster than unsharded: 3.24 against 3.97)."""
    from api_support import tiny_profile

    from planner.cost import host_share
    from planner.profile import ModelProfile

    cl = load_cluster(ROOT / "examples" / "clusters" / "local-cpu-4.json")
    prof = ModelProfile.model_validate(tiny_profile())
    cfg = Config(tensor=1, pipeline=2, data=2, micro_batch=1, schedule="hanayo", waves=1)
    for req in (TrainingRequest(global_batch=8), TrainingRequest(global_batch=8, shard_parameters=True)):
        cand = predict(prof, cl, req, cfg)
        assert cand.costs is not None and cand.refined
        stored = cand.costs.share
        assert host_share(cand.costs) == pytest.approx(stored, rel=2e-3)


def test_an_export_runs_the_same_schedule_the_framework_has():
    """A D = 1 ZB-H1 row is 1F1B's forward and backward per micro-batch (its alternatives say so): Megatron-LM and
    DeepSpeed, which have no ZB-H1, export it as 1F1B with a note; with no such alternative the refusal stands."""
    from planner.export import deepspeed, megatron
    from planner.export.common import ExportInput, UnsupportedSchedule, export_same_run
    from planner.runspec import RunSpec

    cfg = Config(tensor=2, pipeline=1, data=4, micro_batch=1, schedule="zb-h1")
    inp = ExportInput(spec=RunSpec(config=cfg, microbatches=4, partition=[(0, 6)]), model=PRESETS["gpt-tiny"],
                      shard_parameters=True)
    for module in (megatron, deepspeed):
        out = export_same_run(module, inp, ["1f1b"])
        assert out.notes[0].startswith("t=2 D=1 W=4 b=1 zb-h1 runs the same as 1f1b")
        assert module.parse(out.files[0].content).config.schedule == "1f1b"
        with pytest.raises(UnsupportedSchedule):
            export_same_run(module, inp, ["gpipe(order)", "zb-h1"])
