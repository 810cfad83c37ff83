"""What the second fuzzing pass of the command line (session 27) found accepted but wrong: a plan or an export
that no framework runs (t past the attention heads, a hand-edited candidate whose partition has gaps, a
schedule parameter its schedule does not take, ``"false"`` read as true), option values a launcher would choke
on later, and files with factors past any measurement. Each is now refused with the field and its rule."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_support import refused as _refused
from cli_support import run as _run
from pydantic import ValidationError

from planner.cluster import Calibration, HostCpu
from planner.device import load_device
from planner.jsondoc import refuse_duplicate_keys
from planner.limits import MAX_CALIBRATION_RUNS
from planner.model import tensor_split_error
from planner.request import Config
from planner.runspec import RunSpec, partition_error

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parent.parent
DGX = ROOT / "examples" / "clusters" / "dgx-a100-80gb.json"
CPU4 = ROOT / "examples" / "clusters" / "local-cpu-4.json"
#: a run the gpt-tiny profile (embedding, 4 blocks, head: 6 layers) supports: 1F1B over 2 stages
GOOD = {"config": {"tensor": 1, "pipeline": 2, "data": 1, "micro_batch": 1, "schedule": "1f1b", "recompute": False},
        "microbatches": 8, "partition": [[0, 3], [3, 6]]}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("wrong")
    prof = d / "tiny.json"
    r = _run(["profile-analytic", "--preset", "gpt-tiny", "--out", prof])
    assert r.exit_code == 0, r.output
    plan = d / "plan.json"
    r = _run(["plan", "--profile", prof, "--cluster", CPU4, "--global-batch", "8", "--json", "--top", "1"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    doc["candidates"][0]["run_spec"] = GOOD
    plan.write_text(json.dumps(doc))
    return {"dir": d, "profile": prof, "plan": plan}


def _candidate(files: dict[str, Path], name: str, **edits: Any) -> Path:
    """The plan with its candidate's run_spec (``run_spec=``), configuration fields (``config=``) or document
    fields (the rest) replaced."""
    doc = json.loads(files["plan"].read_text())
    cand = doc["candidates"][0]
    spec = json.loads(json.dumps(GOOD))
    spec.update(edits.pop("run_spec", {}))
    spec["config"].update(edits.pop("config", {}))
    cand["run_spec"] = spec
    cand.update(edits)
    out = files["dir"] / f"{name}.json"
    out.write_text(json.dumps(doc))
    return out


def test_the_rule_of_heads_and_t() -> None:
    assert tensor_split_error(32, 8) is None
    assert "does not divide the model's 4 attention heads" in (tensor_split_error(4, 8) or "")


def test_plan_leaves_out_t_past_the_heads_and_predict_refuses_it(files: dict[str, Path]) -> None:
    """gpt-tiny has 4 heads: on 8 GPUs of a node the search planned (and ranked) t = 8, timed as t = 1's
    layer divided by 8; Megatron-LM refuses it."""
    r = _run(["plan", "--profile", files["profile"], "--cluster", DGX, "--global-batch", "16", "--gpus", "8",
              "--json", "--top", "1000"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert {c["tensor"] for c in doc["candidates"]} == {1, 2, 4}
    assert doc["rejected"]["t does not divide the model's 4 attention heads"] == 1
    _refused(["predict", "--profile", files["profile"], "--cluster", DGX, "--global-batch", "16", "--tensor", "8",
              "--pipeline", "1", "--data", "1", "--micro-batch", "2", "--schedule", "1f1b"],
             "t = 8 does not divide the model's 4 attention heads")


def test_export_checks_a_hand_edited_candidate(files: dict[str, Path]) -> None:
    prof = ["--profile", files["profile"]]
    r = _run(["export", "--plan", files["plan"], "--format", "megatron", *prof])
    assert r.exit_code == 0, r.output  # the unedited candidate exports
    cases = [
        ("gap", {"run_spec": {"partition": [[0, 2], [3, 6]]}}, "stage 1 is [3, 6), expected to start at 2"),
        ("reversed", {"run_spec": {"partition": [[3, 6], [0, 3]]}}, "stage 0 is [3, 6), expected to start at 0"),
        ("empty", {"run_spec": {"partition": [[0, 0], [0, 6]]}}, "stage 0 is [0, 0)"),
        ("stages", {"run_spec": {"partition": [[0, 6]]}}, "partition has 1 ranges but the schedule has 2 stages"),
        ("chunks", {"config": {"chunks": 2}}, "does not take 'chunks'"),
        ("heads", {"config": {"tensor": 8}}, "t = 8 does not divide the model's 4 attention heads"),
        ("flag", {"shard_optimizer": "false"}, "shard_optimizer: true or false, got 'false'"),
    ]
    for name, edits, needle in cases:
        path = _candidate(files, name, **edits)
        _refused(["export", "--plan", path, "--format", "megatron", *prof], f"--plan {path}: candidate 0", needle)
    short = _candidate(files, "short", run_spec={"partition": [[0, 3], [3, 5]]})
    _refused(["export", "--plan", short, "--format", "torchtitan", *prof], "has 6 layers, but candidate 0",
             "partitions 5")
    # without the profile the layer count is not known; the partition's shape still is
    _refused(["export", "--plan", _candidate(files, "gap2", run_spec={"partition": [[0, 2], [3, 6]]}),
              "--format", "deepspeed"], "expected to start at 2")


def test_runspec_check_and_partition_error() -> None:
    spec = RunSpec.model_validate(GOOD)
    assert spec.check(6, 4).stages == 2
    assert partition_error([(0, 3), (3, 6)], 2, 6) is None
    assert partition_error([(0, 3), (3, 6)], 2, None) is None
    assert "ends at layer 6, the model has 7" in (partition_error([(0, 3), (3, 6)], 2, 7) or "")
    with pytest.raises(ValueError, match="stages but the model has only 1 layers"):
        RunSpec(config=Config(tensor=1, pipeline=2, data=1, micro_batch=1, schedule="1f1b"), microbatches=4).check(1)


def test_slurm_option_values_are_checked(files: dict[str, Path]) -> None:
    base = ["export", "--plan", files["plan"], "--format", "slurm", "--gpus-per-node", "4"]
    assert _run(base).exit_code == 0
    _refused([*base, "--option", "rdzv-port=70000"], "option rdzv-port: an integer from 1 to 65535")
    _refused([*base, "--option", "iterations=10000000"], "option iterations: an integer from 1 to 1000000")
    _refused([*base, "--option", "nodes-max=０"], "option nodes-max")  # a full-width digit is no ASCII digit
    _refused([*base, "--option", "backend=mpi"], "option backend: nccl or gloo")


def test_calibrate_takes_at_most_the_runs_the_api_fits(files: dict[str, Path]) -> None:
    runs = files["dir"] / "runs.json"
    entry = {"profile": files["profile"].name, "candidate": GOOD["config"] | {"global_batch": 8}, "measured": 1.0}
    runs.write_text(json.dumps([entry] * (MAX_CALIBRATION_RUNS + 1)))
    _refused(["calibrate", "--cluster", CPU4, "--runs", runs], f"101 runs, at most {MAX_CALIBRATION_RUNS}")


def test_stored_factors_stay_in_their_range() -> None:
    """A cluster file's calibration factors are held to the fit's [1/4, 4]; a host's effective cores to its
    cores (a hand-edited 1e300 made every CPU prediction free)."""
    Calibration(compute_scale=4.0, link_scale=0.25)
    for field, value in (("compute_scale", 10.0), ("link_scale", 0.01)):
        with pytest.raises(ValidationError, match=rf"{field}\n.*a correction factor within \[0.25, 4\]"):
            Calibration(**{field: value})
    with pytest.raises(ValidationError, match="effective_cores: 8 is more than the host's 4 cores"):
        HostCpu(cores=4, effective_cores=8)
    with pytest.raises(ValidationError, match="slowdown"):
        HostCpu(cores=4, effective_cores=2, slowdown=1e300)


def test_a_profile_names_a_known_dtype_and_its_shape_its_layers(files: dict[str, Path]) -> None:
    """An unknown dtype was costed as 2 bytes an element; a shape that disagrees with the layers sized the
    tensor-parallel collectives and an export's layer counts of another model."""
    from planner.dtypes import DTYPE_BYTES
    from planner.profile import ModelProfile

    doc = json.loads(files["profile"].read_text())
    ModelProfile.model_validate(doc)
    with pytest.raises(ValidationError, match="'int7' is not one of bf16"):
        ModelProfile.model_validate({**doc, "dtype": "int7"})
    with pytest.raises(ValidationError, match="shape.layers: 3, but the profile has 4 layers of kind 'transformer'"):
        ModelProfile.model_validate({**doc, "shape": {**doc["shape"], "layers": 3}})
    assert DTYPE_BYTES["float"] == DTYPE_BYTES["float32"] == 4 and DTYPE_BYTES["bfloat16"] == 2


def test_calibrate_reads_pipedream_replication(files: dict[str, Path]) -> None:
    """A run of a replicated PipeDream plan was predicted as its plain schedule: the configuration fields the
    calibration read left out ``replication``."""
    from planner.runspec import config_of

    runs = files["dir"] / "rr-runs.json"
    rr = {"tensor": 1, "pipeline": 4, "data": 1, "micro_batch": 1, "schedule": "1f1b-rr", "replication": "2,1,1"}
    runs.write_text(json.dumps([
        {"profile": files["profile"].name, "candidate": rr | {"global_batch": 8}, "measured": 0.05},
        {"profile": files["profile"].name, "candidate": rr | {"schedule": "1f1b", "replication": None,
                                                              "global_batch": 8}, "measured": 0.04}]))
    r = _run(["calibrate", "--cluster", CPU4, "--runs", runs])
    assert r.exit_code == 0, r.output
    assert "1f1b-rr(replication=2,1,1)" in r.output
    assert config_of({"run_spec": {"config": rr}}).replication == "2,1,1"
    assert config_of(rr).replication == "2,1,1"


def test_options_a_shape_or_a_schedule_would_ignore(files: dict[str, Path]) -> None:
    """--encoder beside a preset was dropped (the preset's architecture won); a replication with an empty count
    ('2,,1,1' ran as 2,1,1) or none at all ('' ran unreplicated)."""
    _refused(["profile-analytic", "--preset", "gpt-tiny", "--encoder", "--out", files["dir"] / "e.json"],
             "--encoder: not with --preset")
    r = _run(["profile-analytic", "--layers", "2", "--hidden", "64", "--heads", "4", "--seq", "32", "--vocab", "100",
              "--encoder", "--out", files["dir"] / "e.json"])
    assert r.exit_code == 0, r.output
    assert json.loads((files["dir"] / "e.json").read_text())["environment"]["family"] == "bert"
    sim = ["simulate", "-s", "1f1b-rr", "-D", "4", "-N", "4", "--replication"]
    _refused([*sim, "2,,1,1"], "replica counts separated by commas", "'2,,1,1'")
    _refused([*sim, "2,1,1,"], "'2,1,1,'")
    _refused([*sim, ""], "--replication: replica counts per stage")
    assert _run([*sim, "2, 1,1"]).exit_code == 0


def test_counts_in_profiles_and_devices_are_json_integers(files: dict[str, Path]) -> None:
    """``true`` was read as 1 and ``"49984"`` as 49984 (a profile's bytes and parameters, a device's memory
    and GEMM shapes), where a cluster's counts were already strict."""
    from planner.device import GemmPoint, get_device
    from planner.profile import ModelProfile

    doc = json.loads(files["profile"].read_text())
    for value in (True, "49984", 4.0):
        bad = json.loads(json.dumps(doc))
        bad["layers"][1]["params"] = value
        with pytest.raises(ValidationError, match="params"):
            ModelProfile.model_validate(bad)
    dev = get_device("a100-80gb").model_dump(mode="json")
    with pytest.raises(ValidationError, match="memory_bytes"):
        type(get_device("a100-80gb")).model_validate({**dev, "memory_bytes": "85899345920"})
    with pytest.raises(ValidationError, match="m"):
        GemmPoint(m=True, n=8, k=8, dtype="bf16", seconds=1e-3)


def test_messages_name_what_the_user_gave(files: dict[str, Path]) -> None:
    """A shape too large for a profile was reported as a profile field (``stashed_bytes_per_sample: Input should
    be ...``); a device file's own check repeated its path; a device's launch overhead of 1e300 s surfaced as a
    layer's forward time."""
    out = _refused(["profile-analytic", "--layers", "2", "--hidden", "65536", "--heads", "512", "--seq", "16000000",
                    "--vocab", "100", "--out", files["dir"] / "x.json"],
                   "the block0 layer's activations kept per sample (bytes) would be",
                   "this shape (sequence 16000000, hidden 65536, 2 layers, vocabulary 100) is too large")
    assert "stashed_bytes_per_sample" not in out
    dev = files["dir"] / "dev.json"
    dev.write_text(json.dumps({"name": "x", "like": "a100-80gb", "sources": []}))
    out = _refused(["profile-analytic", "--preset", "gpt-tiny", "--device", dev, "--out", files["dir"] / "x.json"],
                   "sources: an object of field")
    assert out.count(str(dev)) == 1, out
    dev.write_text(json.dumps({"name": "x", "like": "a100-80gb", "kernel_overhead_s": 1e300}))
    _refused(["profile-analytic", "--preset", "gpt-tiny", "--device", dev, "--out", files["dir"] / "x.json"],
             "kernel_overhead_s")


def test_export_refuses_options_of_the_other_way_and_lays_out_uneven_nodes(files: dict[str, Path]) -> None:
    """``export --plan`` ignored -s/-N and the rest; a schedule export ignored --profile/--cluster; Megatron's
    launch line put 4 processes on one node of 3 GPUs."""
    from planner.cluster import node_layout

    _refused(["export", "--plan", files["plan"], "--format", "megatron", "-N", "8"],
             "--microbatches: not with --plan")
    _refused(["export", "-s", "1f1b", "-D", "2", "-N", "4", "--profile", files["profile"]],
             "--profile: only with --plan")
    _refused(["export", "--plan", files["plan"], "--format", "json", "--cluster", CPU4],
             "--cluster: not with --format json")
    four = _candidate(files, "four", run_spec={"config": GOOD["config"] | {"pipeline": 4}, "partition": []})
    r = _run(["export", "--plan", four, "--format", "megatron", "--gpus-per-node", "3"])
    assert r.exit_code == 0, r.output
    assert "torchrun --nnodes 2 --nproc-per-node 2 " in r.output
    assert [node_layout(p, g) for p, g in ((4, 3), (6, 4), (5, 4), (8, 8), (16, 8))] == [
        (2, 2), (2, 3), (5, 1), (1, 8), (2, 8)]


def test_plain_json_files_are_read_one_way_and_a_key_twice_is_refused(files: dict[str, Path]) -> None:
    """``--plan`` and ``--runs`` each read JSON with their own wording, and a key given twice in one object was
    read as its last value."""
    dup = files["dir"] / "dup.json"
    dup.write_text('{"candidates": [{"schedule": "1f1b", "schedule": "gpipe"}]}')
    _refused(["export", "--plan", dup, "--format", "megatron"], f"--plan {dup}: key 'schedule' appears twice")
    bad = files["dir"] / "bad.json"
    bad.write_text("[1,")
    _refused(["calibrate", "--cluster", CPU4, "--runs", bad], f"--runs {bad}: not JSON")
    _refused(["export", "--plan", bad, "--format", "megatron"], f"--plan {bad}: not JSON")


def test_a_layers_t1_shard_is_the_layer(files: dict[str, Path]) -> None:
    """At t = 1 the planner reads ``tensor_times[1]``: a hand-edited ``fwd_time`` beside it was silently ignored."""
    from planner.profile import ModelProfile

    doc = json.loads(files["profile"].read_text())
    lay = doc["layers"][1]
    assert "1" in lay["tensor_times"]
    b = next(iter(lay["fwd_time"]))
    lay["fwd_time"][b] *= 2
    with pytest.raises(ValidationError, match="tensor_times.1.fwd_time must be the layer's own fwd_time"):
        ModelProfile.model_validate(doc)


def test_export_with_its_cluster_refuses_a_candidate_wider_than_it(files: dict[str, Path]) -> None:
    wide = _candidate(files, "wide", run_spec={"config": GOOD["config"] | {"data": 8}, "partition": []})
    _refused(["export", "--plan", wide, "--format", "megatron", "--cluster", CPU4],
             "t*D*W = 1*2*8 = 16 CPU processes, more than --cluster")
    assert _run(["export", "--plan", wide, "--format", "megatron"]).exit_code == 0  # (no cluster: not known)


def test_a_profiles_model_spec_describes_its_layers(files: dict[str, Path]) -> None:
    from planner.profile import ModelProfile

    doc = json.loads(files["profile"].read_text())
    spec = json.loads(doc["environment"]["model_spec"])
    for key, value in (("layers", 12), ("heads", 8), ("hidden", 128)):
        env = {**doc["environment"], "model_spec": json.dumps({**spec, key: value})}
        with pytest.raises(ValidationError, match=f"environment.model_spec: {key} {value}, but the profile's is"):
            ModelProfile.model_validate({**doc, "environment": env})


def test_framework_exports_need_t_to_divide_the_key_value_heads(files: dict[str, Path]) -> None:
    """Grouped-query attention: Megatron-LM and torchtitan split the key/value groups over t as whole groups;
    pipeplan's executor replicates them, so the search keeps such a t and the framework exports refuse it."""
    from planner.model import tensor_split_error

    assert tensor_split_error(16, 8, 4) is not None and tensor_split_error(16, 4, 4) is None
    cfg = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 16,
           "num_key_value_heads": 4, "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 128}
    (files["dir"] / "gqa.json").write_text(json.dumps(cfg))
    prof = files["dir"] / "gqa-profile.json"
    assert _run(["profile-analytic", "--hf-config", files["dir"] / "gqa.json", "--out", prof]).exit_code == 0
    r = _run(["predict", "--profile", prof, "--cluster", DGX, "--global-batch", "8", "--tensor", "8", "--pipeline",
              "1", "--data", "1", "--micro-batch", "1", "--schedule", "1f1b", "--json"])
    assert r.exit_code == 0, r.output  # (planned: the executor runs it)
    plan = files["dir"] / "gqa-plan.json"
    plan.write_text(json.dumps({"candidates": [json.loads(r.output)]}))
    for fmt in ("megatron", "torchtitan"):
        _refused(["export", "--plan", plan, "--format", fmt, "--profile", prof],
                 f"{fmt}: t = 8 does not divide the model's 4 key/value heads")


def test_the_unsharded_run_note_reads_booleans_and_counts_only() -> None:
    from planner.mismatch import sharded_words

    assert sharded_words({"data": 2, "shard_optimizer": True}) == "the optimizer state (ZeRO-1)"
    assert sharded_words({"data": 2, "shard_optimizer": "false"}) is None  # ("false" was read as true)
    assert sharded_words({"data": "abc", "shard_optimizer": True}) is None  # (was a ValueError)


def test_run_reads_a_hand_edited_plan_without_a_traceback(files: dict[str, Path]) -> None:
    """``pipeplan run --plan``: a non-numeric global_batch was a ValueError traceback, candidates given as an
    object a KeyError, and a run_spec that is no object was reported against an empty field name."""
    doc = json.loads(files["plan"].read_text())
    cases = [("gb", lambda d: d["candidates"][0].update(global_batch="abc"), "global_batch: a positive integer"),
             ("obj", lambda d: d.update(candidates={"a": 1}), "candidates must be a list"),
             ("rs", lambda d: d["candidates"][0].update(run_spec=None), "plan: run_spec: Input should be")]
    for name, edit, needle in cases:
        bad = json.loads(json.dumps(doc))
        edit(bad)
        path = files["dir"] / f"run-{name}.json"
        path.write_text(json.dumps(bad))
        _refused(["run", "--plan", path, "--emulate", files["profile"]], needle)


def test_calibrate_names_a_run_spec_that_is_no_object(files: dict[str, Path]) -> None:
    """A run's candidate with ``run_spec: [1]`` was read as flat fields and reported as four missing ones."""
    runs = files["dir"] / "rs-runs.json"
    runs.write_text(json.dumps([{"profile": files["profile"].name, "candidate": {"run_spec": [1], "global_batch": 8},
                                 "measured": 0.05}]))
    _refused(["calibrate", "--cluster", CPU4, "--runs", runs], "runs[0].candidate.run_spec: an object {config")


def test_profile_cluster_and_device_files_refuse_a_key_twice(files: dict[str, Path]) -> None:
    """Profiles, clusters and devices were read by pydantic, which keeps the last of a key given twice."""
    d = files["dir"]
    text = files["profile"].read_text()
    prof = d / "dup-profile.json"
    prof.write_text(text.replace('"dtype":', '"dtype": "fp32", "dtype":', 1))
    _refused(["plan", "--profile", prof, "--cluster", CPU4, "--global-batch", "8"],
             f"invalid profile {prof}", "key 'dtype' appears twice")
    cl = d / "dup-cluster.json"
    cl.write_text(CPU4.read_text().replace('"nodes":', '"nodes": 2, "nodes":', 1))
    _refused(["plan", "--profile", files["profile"], "--cluster", cl, "--global-batch", "8"],
             f"invalid cluster {cl}", "key 'nodes' appears twice")
    dev = d / "dup-device.json"
    h100 = ROOT / "planner" / "devices" / "h100-sxm5-80gb.json"
    dev.write_text(h100.read_text().replace('"name":', '"name": "other", "name":', 1))
    with pytest.raises(ValueError, match="key 'name' appears twice"):
        load_device(dev)
    nested = d / "dup-nested.json"  # inside a nested object too
    nested.write_text(CPU4.read_text().replace('"alpha":', '"alpha": 1e-6, "alpha":', 1))
    _refused(["plan", "--profile", files["profile"], "--cluster", nested, "--global-batch", "8"],
             "key 'alpha' appears twice")
    broken = d / "broken-cluster.json"  # not JSON: pydantic's own words, as before
    broken.write_text("{")
    _refused(["plan", "--profile", files["profile"], "--cluster", broken, "--global-batch", "8"],
             f"invalid cluster {broken}")
    for path in [*ROOT.glob("examples/**/*.json"), *(ROOT / "planner" / "devices").glob("*.json")]:
        refuse_duplicate_keys(path.read_text())  # every shipped file reads as it did
