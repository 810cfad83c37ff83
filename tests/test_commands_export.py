"""``pipeplan export`` on a fresh Typer application."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from pipeplan.commands_export import register
from planner.schedules import build
from planner.schedules.ir import Schedule
from planner.schedules.torch_csv import export_torch_csv, import_torch_csv


@pytest.fixture
def app():
    app = typer.Typer()

    @app.callback()
    def main() -> None:  # a group, so that "export" is a subcommand as in the real CLI
        pass

    register(app)
    return app


def run(app, *args):
    return CliRunner().invoke(app, ["export", *args])


def test_torch_csv_to_stdout(app):
    res = run(app, "--schedule", "interleaved", "--devices", "4", "--microbatches", "8", "--chunks", "2",
              "--format", "torch-csv")
    assert res.exit_code == 0, res.output
    assert res.stdout == export_torch_csv(build("interleaved", 4, 8, chunks=2))
    assert import_torch_csv(res.stdout).actions == build("interleaved", 4, 8, chunks=2).actions


def test_json_to_file(app, tmp_path):
    out = tmp_path / "s.json"
    res = run(app, "--schedule", "chimera", "--devices", "4", "--microbatches", "8", "--pipelines", "1",
              "--concat", "forward-doubling", "--format", "json", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert res.stdout == ""
    s = Schedule.from_json(out.read_text())
    assert s.actions == build("chimera", 4, 8, pipelines=1, concat="forward-doubling").actions
    assert json.loads(out.read_text())["params"]["concat"] == "forward-doubling"


def test_text(app):
    res = run(app, "--schedule", "hanayo", "--devices", "2", "--microbatches", "2", "--waves", "1",
              "--format", "text")
    assert res.exit_code == 0, res.output
    assert res.stdout == build("hanayo", 2, 2, waves=1).to_text() + "\n"


@pytest.mark.parametrize("name", ["chimera", "gems", "pipedream", "pipedream-2bw"])
def test_torch_cannot_express(app, name):
    res = run(app, "--schedule", name, "--devices", "4", "--microbatches", "4", "--format", "torch-csv")
    assert res.exit_code == 2
    assert "cannot express" in res.stderr and res.stdout == ""


@pytest.mark.parametrize("args,msg", [
    (["--schedule", "nope", "--devices", "4", "--microbatches", "4"], "unknown schedule"),
    (["--schedule", "1f1b", "--devices", "4", "--microbatches", "4", "--chunks", "2"], "--chunks does not apply"),
    (["--schedule", "interleaved", "--devices", "4", "--microbatches", "6", "--chunks", "2"],
     "multiple of devices"),
])
def test_errors_exit_2(app, args, msg):
    res = run(app, *args)
    assert res.exit_code == 2
    assert msg in res.stderr


# ---- a planned candidate in a framework's terms (--plan) ----------------------------------------------

def _plan_file(tmp_path, schedules, **request):
    from planner.analytic import analytic_profile
    from planner.cluster import load_cluster
    from planner.model import PRESETS
    from planner.profile import save_profile
    from planner.request import TrainingRequest
    from planner.search import plan

    prof = analytic_profile(PRESETS["gpt2-medium"], "A100-SXM4-80GB")
    save_profile(prof, tmp_path / "p.json")
    cluster = "examples/clusters/dgx-a100-80gb.json"
    res = plan(prof, load_cluster(cluster), TrainingRequest(global_batch=64, gpus=16, top=20, schedules=schedules,
                                                            **request))
    (tmp_path / "plan.json").write_text(json.dumps(res.to_dict()))
    return res, ["--plan", str(tmp_path / "plan.json"), "--profile", str(tmp_path / "p.json"), "--cluster", cluster]


def test_plan_candidate_to_megatron_and_back(app, tmp_path):
    from planner.export import megatron

    res, args = _plan_file(tmp_path, ["1f1b", "interleaved"])
    for i, cand in enumerate(res.candidates[:5]):
        r = run(app, *args, "--candidate", str(i), "--format", "megatron")
        assert r.exit_code == 0, r.output
        back = megatron.parse(r.stdout)
        assert (back.config, back.microbatches) == (cand.config, cand.microbatches)
        assert "--num-layers 24" in r.stdout and "torchrun --nnodes" in r.stdout


def test_torchtitan_files_to_a_directory(app, tmp_path):
    from planner.export import torchtitan

    res, args = _plan_file(tmp_path, ["zb-h1"])
    r = run(app, *args, "--format", "torchtitan", "--out", str(tmp_path / "tt"))
    assert r.exit_code == 0, r.output
    toml = (tmp_path / "tt" / "job_config.toml").read_text()
    csv = (tmp_path / "tt" / "pipeline_schedule.csv").read_text()
    back = torchtitan.parse(toml, csv)
    assert back.config == res.candidates[0].config and back.config.schedule == "zb-h1"
    r = run(app, *args, "--format", "torchtitan")  # stdout: the TOML, and which file it leaves out
    assert r.exit_code == 0 and r.stdout == toml and "pipeline_schedule.csv" in r.stderr


def test_one_file_export_to_a_directory_given_with_a_slash(app, tmp_path):
    """The README's `--out tt/` on a 1F1B candidate (one TOML, no CSV) is the directory tt/, not a file named tt;
    a plain path is the file itself."""
    from planner.export import torchtitan

    res, args = _plan_file(tmp_path, ["1f1b"])
    r = run(app, *args, "--format", "torchtitan", "--out", str(tmp_path / "tt") + "/")
    assert r.exit_code == 0, r.output
    back = torchtitan.parse((tmp_path / "tt" / "job_config.toml").read_text(), None)
    assert back.config == res.candidates[0].config and sorted(p.name for p in (tmp_path / "tt").iterdir()) == [
        "job_config.toml"]
    r = run(app, *args, "--format", "torchtitan", "--out", str(tmp_path / "tt"))  # an existing directory: into it
    assert r.exit_code == 0 and (tmp_path / "tt").is_dir(), r.output
    r = run(app, *args, "--format", "megatron", "--out", str(tmp_path / "launch.sh"))
    assert r.exit_code == 0 and (tmp_path / "launch.sh").read_text().startswith("#!/usr/bin/env bash"), r.output


def test_a_refusal_costs_both_under_the_plans_own_request(app, tmp_path):
    """A plan made with --shard-optimizer: the refusal quoted the candidate and the closest at their unsharded
    times (11.32 s against the plan's 11.30 s in a new user's Llama plan); it now predicts both under the
    candidate's own request (sharded optimizer, state per parameter, reserve)."""
    from planner.cluster import load_cluster
    from planner.profile import load_profile
    from planner.request import TrainingRequest
    from planner.search import predict

    res, args = _plan_file(tmp_path, ["chimera", "1f1b"], shard_optimizer=True, memory_reserve_bytes=3 * 2**30)
    i = next(k for k, c in enumerate(res.candidates) if c.config.schedule == "chimera" and c.config.data > 1)
    cand = res.candidates[i]
    r = run(app, *args, "--candidate", str(i), "--format", "deepspeed")
    assert r.exit_code == 2, r.output
    assert f"against {cand.iteration_time:.4g} s for chimera" in r.stderr, (cand.iteration_time, r.stderr)
    prof, cl = load_profile(tmp_path / "p.json"), load_cluster("examples/clusters/dgx-a100-80gb.json")
    closest = cand.config.model_copy(update={"schedule": "1f1b", "pipelines": None, "concat": None})
    sharded = predict(prof, cl, TrainingRequest(global_batch=64, shard_optimizer=True), closest).iteration_time
    assert f"predicted {sharded:.4g} s per iteration" in r.stderr, (sharded, r.stderr)


def test_refused_schedule_names_the_closest_and_its_cost(app, tmp_path):
    from planner.export import deepspeed

    res, args = _plan_file(tmp_path, ["chimera", "1f1b"])
    i = next(k for k, c in enumerate(res.candidates) if c.config.schedule == "chimera")
    r = run(app, *args, "--candidate", str(i), "--format", "deepspeed")
    assert r.exit_code == 2 and r.stdout == ""
    assert "DeepSpeed cannot run schedule 'chimera'" in r.stderr and "closest it has is '1f1b'" in r.stderr
    assert "s per iteration against" in r.stderr and "fastest candidate that DeepSpeed runs is --candidate" in r.stderr
    r = run(app, *args, "--candidate", str(i), "--format", "deepspeed", "--closest")
    assert r.exit_code == 0, r.output
    back = deepspeed.parse(r.stdout)
    assert back.config.schedule == "1f1b" and back.config.pipeline == res.candidates[i].config.pipeline
    # without the profile and cluster: the closest, and how to get the cost
    r = run(app, "--plan", str(tmp_path / "plan.json"), "--candidate", str(i), "--format", "megatron")
    assert r.exit_code == 2 and "give the profile and cluster to predict" in r.stderr


def test_plan_candidate_schedule_as_torch_csv(app, tmp_path):
    res, args = _plan_file(tmp_path, ["1f1b"])
    r = run(app, "--plan", str(tmp_path / "plan.json"), "--format", "torch-csv")
    assert r.exit_code == 0 and r.stdout == export_torch_csv(res.candidates[0].run_spec.schedule())


@pytest.mark.parametrize("args,msg", [
    (["--format", "megatron", "--schedule", "1f1b", "-D", "2", "-N", "2"], "give --plan plan.json"),
    (["--format", "nope", "--schedule", "1f1b", "-D", "2", "-N", "2"], "unknown format 'nope'"),
    (["--format", "json"], "give --plan, or --schedule, --devices, --microbatches"),
    (["--format", "megatron", "--plan", "/no/such/plan.json"], "no such file"),
])
def test_plan_errors_exit_2(app, args, msg):
    res = run(app, *args)
    assert res.exit_code == 2 and msg in res.stderr, res.output


def test_candidate_out_of_range(app, tmp_path):
    _, args = _plan_file(tmp_path, ["1f1b"])
    r = run(app, *args, "--candidate", "99", "--format", "megatron")
    assert r.exit_code == 2 and "--candidate: 99 is out of range" in r.stderr


def test_model_preset_without_a_profile_and_format_options(app, tmp_path):
    _, args = _plan_file(tmp_path, ["1f1b"])
    plan = ["--plan", str(tmp_path / "plan.json")]
    r = run(app, *plan, "--format", "megatron", "--model", "gpt2-medium")
    assert r.exit_code == 0 and "--num-layers 24" in r.stdout and "--hidden-size 1024" in r.stdout
    r = run(app, *plan, "--format", "megatron")  # no model: the parallelism only, and a note saying so
    assert r.exit_code == 0 and "    --num-layers" not in r.stdout and "no model shape known" in r.stderr
    r = run(app, *plan, "--format", "megatron", "--model", "no-such-model")
    assert r.exit_code == 2 and "unknown model 'no-such-model'" in r.stderr
    r = run(app, *plan, "--format", "megatron", "--option", "partition=gpu")  # a framework's file takes none
    assert r.exit_code == 2 and "--option: --format megatron takes none" in r.stderr, r.stderr


@pytest.mark.parametrize("fmt", ["megatron", "deepspeed", "torchtitan"])
def test_model_preset_of_other_layers_than_the_plan_is_refused(app, tmp_path, fmt):
    """A gpt2-medium plan (26 layers) exported with --model gpt2-1.3b (50) wrote the other model's --num-layers
    under the plan's partition and predicted time, exit 0 (with --profile too: the preset replaced the profile's
    model unchecked); refused now naming both layer counts, as the Slurm export's --option model is."""
    _, args = _plan_file(tmp_path, ["1f1b"])
    plan = ["--plan", str(tmp_path / "plan.json"), "--format", fmt]
    for extra in ([], args[2:4], args[2:]):  # alone, with --profile, with --profile and --cluster
        r = run(app, *plan, *extra, "--model", "gpt2-1.3b")
        assert r.exit_code == 2 and r.stdout == "", r.output
        assert r.stderr.startswith("error: --model gpt2-1.3b: 50 layers") and "partitions 26 layers" in r.stderr
        assert "(of 26 layers: gpt2-medium)" in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert run(app, *plan, *args[2:], "--model", "gpt2-medium").exit_code == 0
    # a candidate without a partition: the plan document's profile says what it was planned on (as plan --json
    # writes it)
    doc = json.loads((tmp_path / "plan.json").read_text()) | {"profile": {"name": "gpt2-medium", "layers": 26}}
    del doc["candidates"][0]["run_spec"]["partition"]
    (tmp_path / "bare.json").write_text(json.dumps(doc))
    r = run(app, "--plan", str(tmp_path / "bare.json"), "--format", fmt, "--model", "gpt-tiny")
    assert r.exit_code == 2 and "--model gpt-tiny: 6 layers" in r.stderr and "of 26 layers" in r.stderr, r.output


def test_unknown_model_is_refused_first_and_notes_print_once(app, tmp_path, monkeypatch):
    """`--model nosuch` is refused before the plan is read (here: a plan file that is not there) and before any
    note; a note is printed once even where an export lists it twice (the QA walkthrough saw the 'no GPUs per
    node known' note twice above an error)."""
    import pipeplan.commands_export as ce

    r = run(app, "--plan", str(tmp_path / "missing.json"), "--format", "megatron", "--model", "nosuch")
    assert r.exit_code == 2 and r.stderr.startswith("error: unknown model 'nosuch'") and "note" not in r.stderr, \
        r.output
    (tmp_path / "plan.json").write_text("{}")
    twice = "no GPUs per node known (give --gpus-per-node G or --cluster)"
    monkeypatch.setitem(ce.PLAN_FORMATS, "megatron", lambda a: ([("launch.sh", "#!/bin/sh\n")], [twice, twice]))
    r = run(app, "--plan", str(tmp_path / "plan.json"), "--format", "megatron")
    assert r.exit_code == 0 and r.stderr.count(twice) == 1, r.stderr


def test_framework_exports_import_no_torch(tmp_path):
    """``pipeplan export --format megatron|torchtitan|deepspeed`` runs without torch (issue 13's light CLI)."""
    import subprocess
    import sys
    import textwrap

    _, args = _plan_file(tmp_path, ["chimera", "1f1b"])
    code = textwrap.dedent(f"""
        import sys
        from typer.testing import CliRunner
        from pipeplan.cli import app
        for fmt in ("megatron", "torchtitan", "deepspeed"):
            for i in (0, 1):
                r = CliRunner().invoke(app, ["export", *{args!r}, "--candidate", str(i), "--format", fmt,
                                             "--out", {str(tmp_path)!r} + f"/{{fmt}}{{i}}"])
                assert r.exit_code in (0, 2), r.output
        print("torch loaded:", "torch" in sys.modules)
    """)
    from pathlib import Path

    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parent.parent)
    assert res.returncode == 0, res.stderr
    assert "torch loaded: False" in res.stdout


def test_closest_prefers_a_configuration_that_fits(app, tmp_path):
    """GPT-3 175B's Hanayo (t8 D16 W8, the plan's best on 1024 A100s) on Megatron-LM: --closest wrote the first of its
    stand-ins, interleaved(chunks=2), which the planner predicts out of memory (100.21 GiB of 80), though 1F1B on the
    same t, D, W fits at 21.3 s, and the script's header said neither. The stand-in now is one that fits, the
    fastest; where none fits, the header says so."""
    from planner.analytic import analytic_profile
    from planner.cluster import load_cluster
    from planner.export import megatron
    from planner.model import PRESETS
    from planner.profile import save_profile
    from planner.request import Config, TrainingRequest
    from planner.search import predict

    prof = analytic_profile(PRESETS["gpt3-175b"], "A100-SXM4-80GB")
    save_profile(prof, tmp_path / "p.json")
    cluster = "examples/clusters/dgx-a100-80gb.json"
    cl, req = load_cluster(cluster), TrainingRequest(global_batch=1536)
    cfg = Config(tensor=8, pipeline=16, data=8, micro_batch=1, schedule="hanayo", waves=1)
    cand = predict(prof, cl, req, cfg)
    assert cand.fits
    inter = predict(prof, cl, req, cfg.model_copy(update={"schedule": "interleaved", "waves": None, "chunks": 2}))
    assert not inter.fits  # what --closest wrote before
    (tmp_path / "plan.json").write_text(json.dumps({"candidates": [cand.to_dict()]}))
    args = ["--plan", str(tmp_path / "plan.json"), "--profile", str(tmp_path / "p.json"), "--cluster", cluster,
            "--format", "megatron", "--closest"]
    r = run(app, *args)
    assert r.exit_code == 0, r.output
    back = megatron.parse(r.stdout)
    assert back.config.schedule == "1f1b" and (back.config.tensor, back.config.pipeline) == (8, 16)
    fast = predict(prof, cl, req, back.config)
    assert fast.fits and f"predicted {fast.iteration_time:.4g} s per iteration" in r.stdout.splitlines()[1]
    assert "does not fit" not in r.stdout
    # none fits (micro-batches of 4 sequences): the most alike, and the header says it does not fit
    big = predict(prof, cl, req, cfg.model_copy(update={"micro_batch": 4}))
    (tmp_path / "plan.json").write_text(json.dumps({"candidates": [big.to_dict()]}))
    r = run(app, *args)
    assert r.exit_code == 0, r.output
    assert megatron.parse(r.stdout).config.schedule == "interleaved"
    assert "# WARNING: the planner predicts this configuration does not fit in memory: out of memory" in r.stdout


def test_out_in_a_missing_folder_is_refused(app, tmp_path):
    """`export --out /nonexistent/dir/x.json` made the missing folders (a mistyped path written somewhere new);
    run, profile and profile-analytic refuse it (planner.outpath): export now does too, with exit 2. The --out
    folder itself (a multi-file export, or OUT ending in /) is still made when the folder it is in exists."""
    args = ["--schedule", "gpipe", "-D", "4", "-N", "8"]
    for out, missing in ((tmp_path / "no" / "dir" / "x.json", tmp_path / "no" / "dir"),
                         (str(tmp_path / "no" / "dir") + "/", tmp_path / "no")):
        r = run(app, *args, "--out", str(out))
        assert r.exit_code == 2, r.output
        assert r.stderr.strip() == f"error: --out {str(out).rstrip('/')}: the folder {missing} does not exist"
        assert not (tmp_path / "no").exists()
    r = run(app, *args, "--out", str(tmp_path / "made") + "/")
    assert r.exit_code == 0 and (tmp_path / "made" / "schedule.json").is_file(), r.output


def test_schedule_formats_into_one_folder_keep_their_own_files(app, tmp_path):
    """`--out adir/` wrote every schedule format to adir/schedule (no extension): a json then a torch-csv export
    to the same folder overwrote each other silently. Each is now schedule.<its extension>."""
    args = ["--schedule", "1f1b", "-D", "2", "-N", "4", "--out", str(tmp_path / "adir") + "/"]
    for fmt in ("json", "torch-csv", "text"):
        r = run(app, *args, "--format", fmt)
        assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "adir").iterdir()) == ["schedule.csv", "schedule.json", "schedule.txt"]
    sched = build("1f1b", 2, 4)
    assert Schedule.from_json((tmp_path / "adir" / "schedule.json").read_text()).actions == sched.actions
    assert (tmp_path / "adir" / "schedule.csv").read_text() == export_torch_csv(sched)
    _, plan = _plan_file(tmp_path, ["1f1b"])  # a --plan candidate's schedule too
    r = run(app, *plan[:2], "--format", "torch-csv", "--out", str(tmp_path / "bdir") + "/")
    assert r.exit_code == 0 and (tmp_path / "bdir" / "schedule.csv").is_file(), r.output
