"""What a fuzzing pass of the command line found (session 26: a helper fed every command malformed files and
extreme options), each now one ``error:`` line naming the option or field and its rule, exit code 2: files that
are folders, JSON integers no float holds, sizes that hung a command for minutes or hours, options that were
accepted and ignored. The bounds are :mod:`planner.limits`, the same the API holds its uploads to."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from cli_support import refused as _refused
from typer.testing import CliRunner

from pipeplan.cli import app
from planner.limits import MAX_GLOBAL_BATCH, MAX_KEPT, MAX_SCHEDULE_UNITS, MAX_STAGES

pytestmark = pytest.mark.timeout(120)  # a refusal that became a hang again fails here instead of hanging CI

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
CPU4 = ROOT / "examples" / "clusters" / "local-cpu-4.json"
HUGE = "1" + "0" * 400  # a JSON integer that no float holds (float(10**400) raises OverflowError)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("cli-fuzz")
    prof = d / "tiny.json"
    r = runner.invoke(app, ["profile-analytic", "--preset", "gpt-tiny", "--out", str(prof)])
    assert r.exit_code == 0, r.output
    plan = d / "plan.json"
    r = runner.invoke(app, ["plan", "--profile", str(prof), "--cluster", str(CPU4), "--global-batch", "8", "--json",
                            "--top", "2"])
    assert r.exit_code == 0, r.output
    plan.write_text(r.output)
    return {"dir": d, "profile": prof, "plan": plan}


def _edited(path: Path, out: Path, edit: Any) -> Path:
    """``path``'s JSON with ``edit(doc)`` applied, written to ``out`` as text (``HUGE`` as a bare integer)."""
    doc = json.loads(path.read_text())
    edit(doc)
    out.write_text(json.dumps(doc).replace('"__HUGE__"', HUGE))
    return out


def test_a_folder_given_as_a_file_is_named(files: dict[str, Path]) -> None:
    """A folder as --profile, --cluster or --plan was an IsADirectoryError traceback."""
    folder = files["dir"]
    _refused(["plan", "--profile", folder, "--cluster", CPU4, "--global-batch", "8"],
             f"--profile {folder}: is a folder; give a file")
    _refused(["plan", "--profile", files["profile"], "--cluster", folder, "--global-batch", "8"],
             f"--cluster {folder}: is a folder")
    _refused(["export", "--plan", folder, "--format", "megatron"], f"--plan {folder}: is a folder")
    _refused(["export", "--plan", files["plan"], "--format", "megatron", "--profile", folder],
             f"--profile {folder}: is a folder")
    _refused(["calibrate", "--cluster", folder, "--runs", files["plan"]], f"--cluster {folder}: is a folder")


def test_json_integers_past_any_float_are_refused_by_name(files: dict[str, Path]) -> None:
    """10**400 in a cluster's memory, a layer's parameter count, a profile's size key or its shape was an
    OverflowError traceback deep in the cost model; now the file's own field is named with its bound."""
    d, prof = files["dir"], files["profile"]

    def memory(doc: dict[str, Any]) -> None:
        doc["memory_bytes"] = "__HUGE__"
    cl = _edited(CPU4, d / "cl-huge.json", memory)
    _refused(["plan", "--profile", prof, "--cluster", cl, "--global-batch", "8"],
             f"invalid cluster {cl}: memory_bytes: Input should be less than or equal to")

    def params(doc: dict[str, Any]) -> None:
        doc["layers"][1]["params"] = "__HUGE__"
    p = _edited(prof, d / "p-params.json", params)
    _refused(["plan", "--profile", p, "--cluster", CPU4, "--global-batch", "8"], "layers.1.params")

    def size_key(doc: dict[str, Any]) -> None:
        layer = doc["layers"][1]
        layer["fwd_time"][HUGE] = layer["bwd_time"][HUGE] = 1.0
    p = _edited(prof, d / "p-key.json", size_key)
    _refused(["plan", "--profile", p, "--cluster", CPU4, "--global-batch", "8"], "micro-batch size", "at most")

    def seq(doc: dict[str, Any]) -> None:
        doc["shape"]["seq"] = "__HUGE__"
    p = _edited(prof, d / "p-seq.json", seq)
    _refused(["plan", "--profile", p, "--cluster", CPU4, "--global-batch", "8"], "shape.seq")

    def link(doc: dict[str, Any]) -> None:
        doc["intra"]["beta"] = 1e308  # was taken, and every iteration time came out null
    cl = _edited(CPU4, d / "cl-beta.json", link)
    _refused(["plan", "--profile", prof, "--cluster", cl, "--global-batch", "8"], "intra.beta")


def test_counts_that_are_not_integers_and_sizes_that_hung(files: dict[str, Path]) -> None:
    d, prof = files["dir"], files["profile"]

    def nodes(doc: dict[str, Any]) -> None:
        doc["nodes"] = 10**15  # the divisors of the GPU count were found by trial division: hours
    cl = _edited(CPU4, d / "cl-nodes.json", nodes)
    _refused(["plan", "--profile", prof, "--cluster", cl, "--global-batch", "8"], "nodes: Input should be less")

    def boolean(doc: dict[str, Any]) -> None:
        doc["gpus_per_node"] = True  # was read as 1
    cl = _edited(CPU4, d / "cl-bool.json", boolean)
    _refused(["plan", "--profile", prof, "--cluster", cl, "--global-batch", "8"], "gpus_per_node")


def test_schedules_too_large_to_build_are_refused_before_building() -> None:
    """-N 10**400 was an OverflowError, -N or -D 10**9 and --waves/--chunks 10**9 ran until killed (Hanayo with
    1000 waves: 46 s); a schedule is held to MAX_STAGES stages and MAX_SCHEDULE_UNITS stage passes."""
    _refused(["simulate", "-s", "1f1b", "-D", "4", "-N", HUGE], "--microbatches about 10**400",
             f"at most {MAX_SCHEDULE_UNITS}")
    _refused(["show", "-s", "1f1b", "-D", "4", "-N", "1000000000"], "--microbatches 1000000000")
    _refused(["simulate", "-s", "1f1b", "-D", "1000000000", "-N", "4"], f"at most {MAX_STAGES}")
    _refused(["simulate", "-s", "hanayo", "-D", "4", "-N", "8", "--waves", "1000"], "--waves 1000",
             "8000 pipeline stages")
    _refused(["export", "-s", "interleaved", "-D", "4", "-N", "8", "--chunks", "1000000000"], "--chunks 1000000000")
    # Chimera's and GEMS's lists cost more per unit: 1024 x 1024 ran past a minute, with 512 pipeline pairs
    # growing past 0.6 GB; show printed 4 MB (second pass)
    _refused(["simulate", "-s", "gems", "-D", "1024", "-N", "1024"], f"at most {MAX_SCHEDULE_UNITS}")
    _refused(["simulate", "-s", "chimera", "-D", "1024", "-N", "1024", "--pipelines", "512"],
             "x 2 x --pipelines 512", "Chimera's stage replicas")
    _refused(["show", "-s", "1f1b", "-D", "1024", "-N", "1024"], f"at most {MAX_SCHEDULE_UNITS}")
    # the largest allowed still builds
    r = runner.invoke(app, ["simulate", "-s", "hanayo", "-D", "4", "-N", "4", "--waves", str(MAX_STAGES // 8)])
    assert r.exit_code == 0, r.output


def test_stage_times_must_be_finite_times() -> None:
    """``--fwd inf`` printed a bare Infinity in --json (not JSON), 1e308 overflowed the timeline's grid."""
    for opt, bad in (("--fwd", "inf"), ("--bwd", "nan"), ("--comm", "-1"), ("--fwd", "1e308")):
        _refused(["simulate", "-s", "1f1b", "-D", "2", "-N", "2", opt, bad, "--json"], f"{opt}: a time from 0 to")
    _refused(["show", "-s", "1f1b", "-D", "2", "-N", "2", "--fwd", "1e308"], "--fwd: a time from 0 to")


def test_plan_options_past_their_bounds(files: dict[str, Path]) -> None:
    prof = files["profile"]
    base = ["plan", "--profile", prof, "--cluster", CPU4, "--global-batch", "8"]
    # --top 10**30 was an mmap OverflowError, 10**9 a search keeping a billion candidates
    for top in ("1000000000000000000000000000000", "1000000000"):
        _refused([*base, "--top", top], "--top", str(MAX_KEPT))
    _refused([*base, "--processes", "3"], "--processes: 1 or 2")
    _refused([*base, "--memory-reserve", "1e308"], "--memory-reserve")


def test_predict_with_a_schedule_parameter_past_the_stages(files: dict[str, Path]) -> None:
    """--chunks or --waves 10**9 on predict built the schedule until killed."""
    args = ["predict", "--profile", files["profile"], "--cluster", CPU4, "--global-batch", "8", "--tensor", "1",
            "--pipeline", "2", "--data", "1", "--micro-batch", "1"]
    _refused([*args, "--schedule", "interleaved", "--chunks", "1000000000"], "chunks")
    _refused([*args, "--schedule", "hanayo", "--waves", "1000000000"], "waves")


def test_hand_edited_plans_and_export_options(files: dict[str, Path]) -> None:
    d, plan = files["dir"], files["plan"]
    for i, bad in enumerate(([1], [None], [[]])):  # a list of candidates that are not objects: a TypeError
        p = d / f"plan-bad-{i}.json"
        p.write_text(json.dumps(bad))
        _refused(["export", "--plan", p, "--format", "megatron"], "candidates[0]", "not a candidate object")

    def microbatches(doc: dict[str, Any]) -> None:
        doc["candidates"][0]["run_spec"]["microbatches"] = 10**9  # built a billion micro-batches' lists
    p = _edited(plan, d / "plan-n.json", microbatches)
    _refused(["export", "--plan", p, "--format", "json"], "microbatches", str(MAX_GLOBAL_BATCH))
    for bad in ({}, [1], "fast"):  # a predicted time that is no number was a TypeError in the header's format
        def predicted(doc: dict[str, Any], bad: object = bad) -> None:
            doc["candidates"][0]["iteration_time"] = bad
        p = _edited(plan, d / "plan-t.json", predicted)
        r = runner.invoke(app, ["export", "--plan", str(p), "--format", "megatron"])
        assert r.exit_code == 0 and "# pipeplan export" in r.output and "predicted" not in r.output, r.output
    _refused(["export", "--plan", plan, "--format", "slurm", "--gpus-per-node", "-4"],
             "--gpus-per-node: devices per node, 1 to")
    # --option was accepted and dropped by the framework formats: only slurm's script takes options
    _refused(["export", "--plan", plan, "--format", "torchtitan", "--option", "foo=bar"],
             "--option: --format torchtitan takes none")


def test_calibrate_files(files: dict[str, Path]) -> None:
    d, prof = files["dir"], files["profile"]
    cand = {"tensor": 1, "pipeline": 2, "data": 1, "micro_batch": 1, "schedule": "1f1b", "global_batch": 8}
    runs = d / "runs-huge.json"
    runs.write_text(json.dumps([{"profile": str(prof), "candidate": cand, "measured": "__HUGE__"}])
                    .replace('"__HUGE__"', HUGE))
    _refused(["calibrate", "--cluster", CPU4, "--runs", runs], "runs[0].measured: seconds per iteration")
    runs = d / "runs-bad.json"
    runs.write_text(json.dumps([{"profile": str(prof), "candidate": {**cand, "tensor": "two"}, "measured": 1.0}]))
    out = _refused(["calibrate", "--cluster", CPU4, "--runs", runs], "runs[0].candidate: tensor:")
    assert "ValidationError" not in out and "\n  " not in out.strip()  # pydantic's own text, several lines
    # a candidate of `plan --json` with its run spec's D edited (its partition still of 4 stages) was fitted as D = 3
    planned = next(c for c in json.loads(files["plan"].read_text())["candidates"] if c["pipeline"] > 1)
    edited = copy.deepcopy(planned)
    edited["run_spec"]["config"]["pipeline"] = planned["pipeline"] + 1
    runs = d / "runs-edited.json"
    runs.write_text(json.dumps([{"profile": str(prof), "candidate": edited, "measured": 1.0}]))
    _refused(["calibrate", "--cluster", CPU4, "--runs", runs], "runs[0].candidate.run_spec: partition has")
    runs.write_text(json.dumps([{"profile": str(prof), "candidate": planned, "measured": 1.0}]))
    assert runner.invoke(app, ["calibrate", "--cluster", str(CPU4), "--runs", str(runs)]).exit_code == 0
    runs = d / "runs-ok.json"
    runs.write_text(json.dumps([{"profile": str(prof), "candidate": cand, "measured": 1.0}]))
    _refused(["calibrate", "--cluster", CPU4, "--runs", runs, "--out", d / "no-such-folder" / "c.json"],
             "the folder", "does not exist")


def test_device_and_model_descriptions(files: dict[str, Path]) -> None:
    d = files["dir"]
    dev = d / "dev.json"
    dev.write_text(json.dumps({"name": "x"}))
    _refused(["profile-analytic", "--preset", "gpt-tiny", "--device", dev, "--out", d / "o.json"],
             f"invalid device description {dev}")
    spec = json.loads((ROOT / "planner" / "devices" / "a100-sxm4-80gb.json").read_text())
    spec.update(name="tiles-zero", aliases=[], sm_count=108, tiles=[[0, 0]])  # was a ZeroDivisionError
    dev.write_text(json.dumps(spec))
    _refused(["profile-analytic", "--preset", "gpt-tiny", "--device", dev, "--out", d / "o.json"], "tiles")
    _refused(["profile-analytic", "--layers", "1000000", "--hidden", "64", "--heads", "2", "--seq", "16",
              "--vocab", "100", "--out", d / "o.json"], "--layers: Input should be less than or equal to 1022")
    cfg = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 688, "num_attention_heads": 4,
           "num_hidden_layers": 2, "vocab_size": 1000, "max_position_embeddings": 128, "rope_theta": "x"}
    hf = d / "config.json"
    hf.write_text(json.dumps(cfg))  # a ValueError traceback from float("x")
    _refused(["profile-analytic", "--hf-config", hf, "--out", d / "o.json"], "rope_theta: a number above 0")


def test_second_pass_files_and_names(files: dict[str, Path]) -> None:
    """Found by a second pass over the fixes above: tracebacks from a name too long for the file system, a config
    that is not UTF-8 or nested past Python's recursion limit, a device description whose ``like`` is no name."""
    d = files["dir"]
    _refused(["export", "-s", "1f1b", "-D", "2", "-N", "2", "--out", "a" * 300], "--out", "File name too long")
    _refused(["calibrate", "--cluster", CPU4, "--runs", files["plan"], "--out", "b" * 300], "File name too long")
    cand = {"tensor": 1, "pipeline": 2, "data": 1, "micro_batch": 1, "schedule": "1f1b", "global_batch": 8}
    runs = d / "runs-full.json"
    runs.write_text(json.dumps([{"profile": str(files["profile"]), "candidate": cand, "measured": 1.0}]))
    if Path("/dev/full").exists():  # a write that fails after the fit (ENOSPC)
        _refused(["calibrate", "--cluster", CPU4, "--runs", runs, "--out", "/dev/full"],
                 "--out /dev/full: cannot write")
    hf = d / "binary.json"
    hf.write_bytes(b"\xff\xfe\x00garbage")
    _refused(["profile-analytic", "--hf-config", hf, "--out", d / "o.json"], "not a text file (UTF-8)")
    hf = d / "deep.json"
    hf.write_text("[" * 100_000 + "]" * 100_000)
    _refused(["profile-analytic", "--hf-config", hf, "--out", d / "o.json"], "nested too deep")
    dev = d / "like-int.json"
    dev.write_text(json.dumps({"name": "X", "like": 5}))
    _refused(["profile-analytic", "--preset", "gpt-tiny", "--device", dev, "--out", d / "o.json"],
             "like: the name of a shipped device, got 5")


def test_calibrate_out_over_its_own_cluster_says_so(files: dict[str, Path]) -> None:
    """--out naming the --cluster file wrote over it and then said the file was unchanged (second pass)."""
    d = files["dir"]
    cl = d / "own.json"
    cl.write_text(CPU4.read_text())
    cand = {"tensor": 1, "pipeline": 2, "data": 1, "micro_batch": 1, "schedule": "1f1b", "global_batch": 8}
    runs = d / "runs-own.json"
    runs.write_text(json.dumps([{"profile": str(files["profile"]), "candidate": cand, "measured": 1.0}]))
    r = runner.invoke(app, ["calibrate", "--cluster", str(cl), "--runs", str(runs), "--out", str(cl)])
    assert r.exit_code == 0, r.output
    assert f"it replaced the uncalibrated {cl}" in r.output and "is unchanged" not in r.output, r.output
    assert json.loads(cl.read_text())["calibration"]["jobs"] == 1
