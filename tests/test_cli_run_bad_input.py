"""``pipeplan run``'s bad input, found by a new user's walk through the README on a fresh clone (session 33): each is
one ``error:`` line naming the option and the rule, exit code 2, before any process starts -- where it was a
traceback from every rank, a plan silently run as something else, or a refusal of the wrong model."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from executor.plan import PlanError, RunPlan, load_plan_file
from executor.supervise import describe
from pipeplan.cli import app

runner = CliRunner()
ROOT = Path(__file__).resolve().parent.parent
DGX = str(ROOT / "examples" / "clusters" / "dgx-a100-80gb.json")
CPU4 = str(ROOT / "examples" / "clusters" / "local-cpu-4.json")
DIRECT = ["run", "-s", "1f1b", "-D", "2", "-N", "4"]


def _refused(args: list[str]) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output and r.output.count("\n") == 1, r.output
    return r.output


@pytest.mark.parametrize("value", ["0", "-5"])
def test_timeout_above_zero(value: str) -> None:
    """--timeout 0 was a traceback from every rank (dist.barrier: 'Timed out waiting 0ms'), -5 one from torch."""
    assert "--timeout" in _refused([*DIRECT, "--timeout", value])


def test_seq_at_least_one() -> None:
    """--seq 0 printed pydantic's multi-line dump with its documentation address."""
    assert "--seq" in _refused([*DIRECT, "--seq", "0"])


def test_warmup_not_negative() -> None:
    """--warmup -1 ran (exit 0)."""
    assert "warmup" in _refused([*DIRECT, "--warmup", "-1"])


def _one_candidate(tmp_path: Path, tensor: int = 1) -> Path:
    prof = tmp_path / "tiny.json"
    r = runner.invoke(app, ["profile-analytic", "--preset", "gpt-tiny", "--out", str(prof)])
    assert r.exit_code == 0, r.output
    plan = tmp_path / "c.json"
    r = runner.invoke(app, ["predict", "--profile", str(prof), "--cluster", CPU4, "--global-batch", "4", "--tensor",
                            str(tensor), "--pipeline", "2", "--data", "1", "--micro-batch", "1", "--schedule", "1f1b",
                            "--json"])
    assert r.exit_code == 0, r.output
    plan.write_text(r.output)
    return plan


def test_emulation_files_are_read_before_any_rank(tmp_path: Path) -> None:
    """A missing or invalid --cluster (or --emulate) was read only after the ranks forked: a FileNotFoundError
    traceback from each, or pydantic's multi-line dump."""
    plan = _one_candidate(tmp_path)
    prof = str(tmp_path / "tiny.json")
    assert "--cluster" in _refused(["run", "--plan", str(plan), "--emulate", prof, "--cluster", str(tmp_path / "no")])
    assert "--emulate" in _refused(["run", "--plan", str(plan), "--emulate", str(tmp_path / "no.json")])
    out = _refused(["run", "--plan", str(plan), "--emulate", CPU4])  # a cluster given as the profile
    assert out.startswith("error: invalid profile") and "layers" in out
    out = _refused(["run", "--plan", str(plan), "--emulate", prof, "--cluster", prof])
    assert out.startswith("error: invalid cluster")
    assert "--emulate" in _refused([*DIRECT, "--cluster", CPU4])  # durations of an emulated run only


def test_a_key_given_twice_in_the_plan_is_refused(tmp_path: Path) -> None:
    """'"tensor": 1, "tensor": 2' ran the t = 2 run against the t = 1 prediction ('measured/predicted 3.730');
    ``pipeplan export --plan`` refused the same file."""
    plan = _one_candidate(tmp_path)
    cand = json.loads(plan.read_text())  # (predict --json: the bare candidate)
    text = json.dumps(cand)
    assert '"tensor": 1,' in text
    twice = tmp_path / "twice.json"
    twice.write_text(text.replace('"tensor": 1,', '"tensor": 1, "tensor": 2,', 1))
    out = _refused(["run", "--plan", str(twice)])
    assert "'tensor' appears twice" in out


def test_an_emulated_run_is_not_checked_against_the_default_model(tmp_path: Path) -> None:
    """Emulated compute builds no model, yet a t = 8 candidate of Llama 3.1 8B was refused with gpt-tiny's shape
    ('t=8 must divide heads (4) and the MLP width (256)'): the agent's emulated jobs without a model failed so."""
    prof = tmp_path / "l8.json"
    r = runner.invoke(app, ["profile-analytic", "--hf-config", str(ROOT / "examples" / "models" / "llama-3.1-8b"),
                            "--seq", "2048", "--device", "a100-80gb", "--out", str(prof)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["predict", "--profile", str(prof), "--cluster", DGX, "--global-batch", "8", "--tensor", "8",
                            "--pipeline", "1", "--data", "1", "--micro-batch", "1", "--schedule", "1f1b", "--json"])
    assert r.exit_code == 0, r.output
    plan = tmp_path / "c.json"
    plan.write_text(r.output)
    emulated = load_plan_file(plan, 0, emulate=str(prof), cluster=DGX)
    assert emulated.validate().devices == 1 and emulated.world_size == 8
    with pytest.raises(PlanError, match="must divide heads"):  # a real run of gpt-tiny at t = 8 is still refused
        load_plan_file(plan, 0).validate()
    with pytest.raises(PlanError, match="warmup"):
        RunPlan.direct("1f1b", 2, 4, warmup=-1).validate()


def test_a_rank_killed_by_sigkill_names_the_likely_cause() -> None:
    """'the rank's process killed by SIGKILL' with nothing more (a run at --seq 100000 on this machine): the
    kernel's out-of-memory killer sends SIGKILL, so the error says so."""
    killed = describe(signal.SIGKILL.value)  # (a wait status: the signal number in the low bits)
    assert killed.startswith("killed by SIGKILL") and "out of memory" in killed
    assert describe(signal.SIGTERM.value) == "killed by SIGTERM"
    assert describe(3 << 8) == "exited with status 3"
    assert os.waitstatus_to_exitcode(signal.SIGKILL.value) == -signal.SIGKILL.value


def test_the_plan_file_names_its_profile_and_run_says_when_it_builds_another(tmp_path: Path) -> None:
    """``plan --json`` and ``predict --json`` say which profile they were made from; ``run --plan`` building
    another model says so (a gpt-tiny plan run with --model bert-tiny read 'measured/predicted 1.309' with no
    word), and a plan of another model refused with the default model's shape says what to give instead."""
    from executor.cli import _other_model

    plan = _one_candidate(tmp_path)  # predict --json of the gpt-tiny analytic profile
    assert json.loads(plan.read_text())["profile"]["name"] == "gpt-tiny"
    assert _other_model(str(plan), 0, "gpt-tiny", None) is None
    assert _other_model(str(plan), 0, "bert-tiny", None) == "gpt-tiny"
    r = runner.invoke(app, ["plan", "--profile", str(tmp_path / "tiny.json"), "--cluster", CPU4, "--global-batch", "4",
                            "--json", "--top", "1"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["profile"] == {"name": "gpt-tiny", "source": "analytical", "device": doc["profile"]["device"],
                              "layers": 6}
    prof = tmp_path / "gpt3.json"
    r = runner.invoke(app, ["profile-analytic", "--preset", "gpt3-175b", "--device", "a100-80gb", "--out", str(prof)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["predict", "--profile", str(prof), "--cluster", DGX, "--global-batch", "16", "--tensor",
                            "8", "--pipeline", "8", "--data", "1", "--micro-batch", "1", "--schedule", "1f1b",
                            "--json"])
    assert r.exit_code == 0, r.output
    gpt3 = tmp_path / "gpt3-plan.json"
    gpt3.write_text(r.output)
    out = _refused(["run", "--plan", str(gpt3)])
    assert "must divide heads (4)" in out and "the plan was made from profile 'gpt3-175b'" in out
    assert "--emulate" in out
    out = _refused(["run", "--plan", str(gpt3), "--model", "gpt-tiny"])  # named: the refusal alone
    assert "the plan was made from" not in out


def test_a_rotary_model_past_its_trained_length_is_run_with_a_warning() -> None:
    """``profile`` and ``profile-analytic`` warn of a --seq beyond a rotary model's max_position_embeddings; ``run
    --hf-config`` took it without a word. (The bad --backend stops the run before any process starts.)"""
    r = runner.invoke(app, ["run", "-s", "1f1b", "-D", "2", "-N", "2", "--hf-config",
                            str(ROOT / "examples" / "models" / "llama-3.1-8b"), "--seq", "1000000", "--backend", "mpi"])
    assert r.exit_code == 2, r.output
    assert "warning: --seq 1000000 is beyond max_position_embeddings (131072)" in r.output
    assert "--backend must be gloo or nccl" in r.output
