"""Bad input on the command line, as a new user types it (issue 13, QA on a fresh clone): one ``error:`` line
naming the option or field and the rule, exit code 2, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeplan.cli import app
from planner.limits import MAX_GLOBAL_BATCH

runner = CliRunner()
EX = Path(__file__).resolve().parent.parent / "examples" / "clusters"
CPU4 = str(EX / "local-cpu-4.json")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    prof = tmp_path_factory.mktemp("cli-bad") / "tiny.json"
    r = runner.invoke(app, ["profile-analytic", "--preset", "gpt-tiny", "--out", str(prof)])
    assert r.exit_code == 0, r.output
    return prof


def _refused(args: list[str]) -> str:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output and not isinstance(r.exception, (ValueError, OverflowError, MemoryError))
    return r.output


def test_gems_on_an_odd_pipeline_is_not_a_candidate(tiny: Path) -> None:
    """A budget of 3 processes made every plan fail ('gems: devices hold different numbers of stages'): GEMS on
    D=3 puts both replicas' middle stage on one device. The search skips it as not valid for that D."""
    r = runner.invoke(app, ["plan", "--profile", str(tiny), "--cluster", CPU4, "--global-batch", "6", "--gpus", "3",
                            "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["candidates"], data["rejected"]
    assert all(not (c["schedule"] == "gems" and c["pipeline"] % 2) for c in data["candidates"])
    assert data["rejected"].get("gems: not valid for this D and N", 0) > 0


def test_predict_gems_on_an_odd_pipeline_says_why(tiny: Path) -> None:
    out = _refused(["predict", "--profile", str(tiny), "--cluster", CPU4, "--global-batch", "8", "--tensor", "1",
                    "--pipeline", "3", "--data", "1", "--micro-batch", "1", "--schedule", "gems"])
    assert "gems on D=3" in out and "an even D" in out


def test_huge_global_batch_is_refused_before_the_search(tiny: Path) -> None:
    """99999999999999999999 was an OverflowError traceback, 10**12 a MemoryError, 2**20 a search running for
    over ten minutes; the API holds requests to MAX_GLOBAL_BATCH, so does the command line."""
    for big in (str(MAX_GLOBAL_BATCH + 1), "99999999999999999999"):
        out = _refused(["plan", "--profile", str(tiny), "--cluster", CPU4, "--global-batch", big])
        assert "--global-batch" in out and str(MAX_GLOBAL_BATCH) in out
    out = _refused(["predict", "--profile", str(tiny), "--cluster", CPU4, "--global-batch", "1048576", "--tensor",
                    "1", "--pipeline", "2", "--data", "1", "--micro-batch", "1", "--schedule", "1f1b"])
    assert "--global-batch" in out


@pytest.mark.parametrize(("text", "words"), [
    ('{"layers": [', ": Invalid JSON: EOF"),
    ("[1, 2]", ": Input should be an object"),
    ('{"name": "x", "layers": []}', "device: Field required"),
    # a Hugging Face config.json where the profile goes: said to be one, with how to make a profile of it
    ('{"model_type": "qwen3", "hidden_size": 64}', "this is a Hugging Face config.json, not a model profile: "
                                                   "make a profile of it with `pipeplan profile-analytic --hf-config"),
])
def test_malformed_profile_file_is_one_line_naming_the_field(tiny: Path, tmp_path: Path, text: str,
                                                             words: str) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(text)
    out = _refused(["plan", "--profile", str(bad), "--cluster", CPU4, "--global-batch", "8"])
    assert out.startswith(f"error: invalid profile {bad}: ") and words in out
    assert "errors.pydantic.dev" not in out and len(out.strip().splitlines()) == 1


def test_malformed_cluster_file_names_the_file_and_fields(tiny: Path, tmp_path: Path) -> None:
    bad = tmp_path / "cluster.json"
    bad.write_text(json.dumps({"name": "c", "device": "A100-SXM4-80GB", "nodes": -1, "gpus_per_node": 8}))
    out = _refused(["plan", "--profile", str(tiny), "--cluster", str(bad), "--global-batch", "8"])
    assert out.startswith(f"error: invalid cluster {bad}: nodes: Input should be greater than 0")
    assert "errors.pydantic.dev" not in out and len(out.strip().splitlines()) == 1


def test_budget_over_a_cpu_cluster_says_cpu_processes(tiny: Path) -> None:
    out = _refused(["plan", "--profile", str(tiny), "--cluster", CPU4, "--global-batch", "8", "--gpus", "100"])
    assert out.startswith("error: --gpus: budget 100 exceeds the cluster's 4 CPU processes") and "GPUs" not in out


GPT2M = "examples/profiles/gpt2-medium-a100-80gb-analytic.json"
A100 = "examples/clusters/dgx-a100-80gb.json"


@pytest.mark.parametrize(("args", "words"), [
    (["plan", "--memory-reserve", "80"], "error: --memory-reserve: the reserve of 80 GiB per device leaves nothing"),
    (["predict", "--schedule", "1f1b", "--tensor", "3", "--pipeline", "2", "--data", "1", "--micro-batch", "1"],
     "error: --tensor: t = 3 does not divide the model's 16 attention heads"),
    (["predict", "--schedule", "1f1b", "--tensor", "1", "--pipeline", "2", "--data", "1", "--micro-batch", "1",
      "--memory-reserve", "80"], "error: t=1 D=2 W=1 b=1 1f1b: --memory-reserve: the reserve of 80 GiB"),
])
def test_the_planners_field_names_are_written_as_the_options(args: list[str], words: str) -> None:
    """The planner's messages name a request's fields (``memory_reserve_bytes: ...``, ``tensor: ...``, as the
    API's 422s do); on the command line they are the options that set them."""
    out = _refused([*args, "--profile", GPT2M, "--cluster", A100, "--global-batch", "8"])
    assert out.startswith(words), out


def test_run_refuses_more_processes_than_the_host_memory_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """An emulated GPT-3 candidate (1024 processes) dispatched to the local CPU agent started 1024 gloo processes
    on one 24 GiB machine: ``pipeplan run`` now refuses before launching any, saying why."""
    import executor.cli
    import executor.launch

    def launched(*_a: object, **_k: object) -> None:
        raise AssertionError("no process may start")

    real = executor.cli.host_memory_available()  # /proc/meminfo's MemAvailable
    assert real is None or real > 0
    monkeypatch.setattr(executor.cli, "host_memory_available", lambda: 1 << 30)  # 1 GiB free
    monkeypatch.setattr(executor.launch, "launch", launched)
    out = _refused(["run", "--schedule", "1f1b", "-D", "4", "-N", "4", "--data-parallel", "4", "--model",
                    "gpt-tiny"])
    assert "needs 16 processes on this machine, about 5.0 GiB at 320 MiB each" in out
    assert "1.0 GiB is available" in out


@pytest.mark.parametrize(("args", "words"), [
    # --seq 0 was taken as no --seq (the config's own 1024): a silently changed input
    (["--hf-config", "examples/models/gpt2/config.json", "--seq", "0"], "--seq must be a positive integer, got 0"),
    (["--layers", "-4", "--hidden", "128", "--heads", "4", "--seq", "16", "--vocab", "100"],
     "--layers must be a positive integer, got -4"),
    # options a preset or a config overrides were silently ignored
    (["--preset", "gpt-tiny", "--seq", "64"], "--seq: not with --preset"),
    # GPT-2's learned positions end at 1024: the table grew to 4096 rows, silently
    (["--hf-config", "examples/models/gpt2", "--seq", "4096"],
     "error: --seq: 4096 is beyond the model's learned positions: its n_positions is 1024"),
    (["--hf-config", "examples/models/gpt2/config.json", "--layers", "3"], "--layers: not with --hf-config"),
    # a pydantic error of several lines with its documentation link
    (["--layers", "4", "--hidden", "100", "--heads", "3", "--seq", "16", "--vocab", "100"],
     "error: hidden (100) must be divisible by heads (3)"),
])
def test_profile_analytic_refuses_what_it_would_ignore_or_misread(args: list[str], words: str,
                                                                   tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    args = [str(root / a) if a.startswith("examples/") else a for a in args]
    out = _refused(["profile-analytic", *args, "--out", str(tmp_path / "p.json")])
    assert words in out and "errors.pydantic.dev" not in out
    assert not (tmp_path / "p.json").exists()


def test_profile_analytic_to_a_missing_directory_is_one_line(tmp_path: Path) -> None:
    """It was a FileNotFoundError traceback."""
    out = _refused(["profile-analytic", "--preset", "gpt-tiny", "--out", str(tmp_path / "no" / "p.json")])
    assert "cannot write it: No such file or directory" in out


@pytest.mark.parametrize("args", [
    ["profile", "--model", "gpt-tiny", "--micro-batches", "1"],
    ["profile-device", "--quick"],
    ["profile-links", "--local-procs", "2"],
    ["run", "--schedule", "1f1b", "-D", "2", "-N", "2", "--model", "gpt-tiny"],
])
def test_out_in_a_missing_folder_is_refused_before_the_work(args: list[str], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``--out`` in a folder that does not exist ended a profile (seconds to minutes) or a run in a
    FileNotFoundError traceback after the work; now it is refused first, naming the folder."""
    import executor.launch

    def launched(*_a: object, **_k: object) -> None:
        raise AssertionError("no run may start")

    monkeypatch.setattr(executor.launch, "launch", launched)
    missing = tmp_path / "no-such-folder"
    r = runner.invoke(app, [*args, "--out", str(missing / "out.json")])
    assert r.exit_code == 2, r.output
    assert f"the folder {missing} does not exist" in r.output
    assert not missing.exists()


@pytest.mark.parametrize(("runs", "words"), [
    ("[1, 2]", "runs[0]: expected an object"),  # was "TypeError: argument of type 'int' is not iterable"
    ('[{"profile": "p.json", "candidate": 3, "measured": 1}]', "runs[0]: expected an object"),
    ("[{", "not JSON"),  # was "JSONDecodeError: Expecting ...", naming no file
])
def test_calibrate_runs_file_errors_name_the_entry(tmp_path: Path, runs: str, words: str) -> None:
    path = tmp_path / "runs.json"
    path.write_text(runs)
    out = _refused(["calibrate", "--cluster", CPU4, "--runs", str(path)])
    assert words in out and "TypeError" not in out


def test_agent_with_an_unreachable_api_fails_to_register_saying_so(tmp_path: Path) -> None:
    """It was a RuntimeError traceback from the retry loop."""
    from executor.agent import Agent, RegistrationFailed

    agent = Agent("http://127.0.0.1:1", "token", name="a", workdir=tmp_path, retry_for=0.2)
    with pytest.raises(RegistrationFailed, match=r"cannot register with the API at http://127.0.0.1:1: .*ConnectError"):
        agent.register()


@pytest.mark.slow
def test_agent_with_a_wrong_token_says_so_in_one_line(live_server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """``pipeplan agent`` with a token the API refuses ended in an httpx.HTTPStatusError traceback."""
    r = runner.invoke(app, ["agent", "--api", live_server.url, "--token", "wrong", "--name", "a", "--workdir",
                            str(tmp_path), "--once"])
    assert r.exit_code == 2, r.output
    assert "refused the registration token (HTTP 401" in r.output and "PIPEPLAN_WORKER_TOKEN" in r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


@pytest.mark.parametrize("fmt", ["megatron", "deepspeed", "torchtitan"])
def test_export_with_another_profile_than_the_plans_is_refused(tiny: Path, tmp_path: Path, fmt: str) -> None:
    """The stage boundaries index the planning profile's layers: Megatron's export of a GPT-3 plan with gpt-tiny's
    profile was an IndexError traceback, DeepSpeed's wrote GPT-3's boundaries (0..98) for a 6-layer model."""
    plan = tmp_path / "plan.json"
    r = runner.invoke(app, ["plan", "--profile", str(tiny), "--cluster", str(EX / "dgx-a100-80gb.json"),
                            "--global-batch", "16", "--gpus", "8", "--schedules", "1f1b", "--json"])
    assert r.exit_code == 0, r.output
    plan.write_text(r.output)
    other = tmp_path / "gpt2-medium.json"
    assert runner.invoke(app, ["profile-analytic", "--preset", "gpt2-medium", "--out", str(other)]).exit_code == 0
    out = _refused(["export", "--plan", str(plan), "--candidate", "0", "--format", fmt, "--profile", str(other),
                    "--out", str(tmp_path / "out")])
    assert "gpt2-medium has 26 layers, but candidate 0" in out and "partitions 6" in out
    r = runner.invoke(app, ["export", "--plan", str(plan), "--candidate", "0", "--format", fmt, "--profile",
                            str(tiny), "--out", str(tmp_path / "out")])
    assert r.exit_code == 0, r.output  # the plan's own profile exports


@pytest.mark.parametrize(("names", "words"), [
    ("", "--schedules: an empty name in ''"),  # was: every schedule, silently
    ("1f1b,", "--schedules: an empty name in '1f1b,'"),
    ("pipedream", "only asynchronous ones are named (pipedream); set allow_async"),  # was: an empty table
    ("bogus", "error: --schedules: unknown schedule 'bogus'"),  # was ": Value error, schedules: ..."
])
def test_plan_schedules_option_refuses_what_would_plan_all_or_nothing(tiny: Path, names: str, words: str) -> None:
    out = _refused(["plan", "--profile", str(tiny), "--cluster", CPU4, "--global-batch", "8", "--schedules", names])
    assert words in out and "Value error" not in out


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="a machine with CUDA runs nccl")
def test_nccl_without_cuda_is_one_line() -> None:
    """`run --backend nccl` here died in every rank's torch.cuda.set_device: 114 lines of tracebacks, exit 1."""
    out = _refused(["run", "--schedule", "1f1b", "--devices", "2", "--microbatches", "2", "--backend", "nccl"])
    assert out.startswith("error: --backend nccl needs CUDA GPUs") and len(out.strip().splitlines()) == 1, out


@pytest.mark.parametrize(("args", "words"), [
    # the command's own options, as typed (were "invalid request: global_batch: ..." and "('micro_batch',): ...")
    (["--global-batch", "0"], "error: --global-batch: Input should be greater than 0"),
    (["--global-batch", "8", "--micro-batch", "0"], "error: --micro-batch: Input should be greater than 0"),
])
def test_predict_errors_name_the_option(tiny: Path, args: list[str], words: str) -> None:
    base = ["predict", "--profile", str(tiny), "--cluster", CPU4, "--tensor", "1", "--pipeline", "2", "--data", "1",
            "--schedule", "1f1b"]
    out = _refused(base + (args if "--micro-batch" in args else [*args, "--micro-batch", "1"]))
    assert out.startswith(words) and len(out.strip().splitlines()) == 1, out


def test_a_missing_input_file_names_its_option(tiny: Path) -> None:
    out = _refused(["plan", "--profile", "nope.json", "--cluster", CPU4, "--global-batch", "8"])
    assert out.strip() == "error: --profile nope.json: no such file", out


@pytest.mark.parametrize(("args", "words"), [
    (["--model", "nope"], "error: unknown model 'nope'; presets: "),
    (["--model", "gpt-tiny", "--micro-batches", "1,x"], "error: --micro-batches must be comma-separated integers"),
])
def test_profile_refusals_are_one_line(tmp_path: Path, args: list[str], words: str) -> None:
    """`profile` refused with typer's three-line usage box; the other commands give one line."""
    out = _refused(["profile", *args, "--out", str(tmp_path / "p.json")])
    assert out.startswith(words) and len(out.strip().splitlines()) == 1, out


@pytest.mark.parametrize("command", [["profile", "--model", "gpt-tiny", "--micro-batches", "1"],
                                     ["profile", "--hf-config", "examples/models/gpt2", "--seq", "8"],
                                     ["profile-device", "--quick"]])
@pytest.mark.parametrize(("device", "gpus", "words"), [
    # torch's AssertionError 'Torch not compiled with CUDA enabled' (a traceback) on a CPU-only torch
    ("cuda", 0, "error: --device: cuda is not available here"),
    # torch's RuntimeError listing twenty device types
    ("tpu", 0, "error: --device: 'tpu' is not one of cpu, cuda or cuda:N"),
    ("mps", 0, "error: --device: 'mps' is not one of cpu, cuda or cuda:N"),
    ("cuda:3", 2, "error: --device: 'cuda:3' is not on this machine (2 CUDA devices: cuda:0..cuda:1)"),
])
def test_profile_device_option_is_checked_first(command: list[str], device: str, gpus: int, words: str,
                                                tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpus > 0)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    root = Path(__file__).resolve().parent.parent
    args = [str(root / a) if a.startswith("examples/") else a for a in command]
    out = _refused([*args, "--device", device, "--out", str(tmp_path / "p.json")])
    assert out.startswith(words) and len(out.strip().splitlines()) == 1, out
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize(("args", "words"), [
    # a pydantic ValidationError traceback for ModelConfig (seq > 0)
    (["--model", "gpt-tiny", "--seq", "0"], "error: --seq must be a positive integer, got 0"),
    (["--model", "gpt-tiny", "--seq", "-3"], "error: --seq must be a positive integer, got -3"),
    (["--model", "gpt-tiny", "--seq", "99999999"], "error: --seq: Input should be less than or equal to 16777216"),
    # taken as no --seq: the config's own 1024, silently
    (["--hf-config", "examples/models/gpt2", "--seq", "0"], "error: --seq must be a positive integer, got 0"),
    (["--hf-config", "examples/models/gpt2", "--seq", "1025"],
     "error: --seq: 1025 is beyond the model's learned positions: its n_positions is 1024"),
    # silently ignored: the factory's sample makes the sequence
    (["--module", "examples/custom_model.py:build", "--seq", "8"], "error: --seq: not with --module"),
    # ignored: a profile without tensor_times, or of the layers it measures anyway
    (["--module", "examples/custom_model.py:build", "--tensor", "2"], "error: --tensor: only with --model"),
    (["--hf-config", "examples/models/gpt2", "--seq", "8", "--all-layers"], "error: --all-layers: only with --model"),
])
def test_profile_refuses_bad_or_ignored_options_first(args: list[str], words: str, tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    args = [str(root / a) if a.startswith("examples/") else a for a in args]
    out = _refused(["profile", *args, "--micro-batches", "1", "--out", str(tmp_path / "p.json")])
    assert out.startswith(words) and len(out.strip().splitlines()) == 1, out


def test_profile_out_of_memory_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gpt-tiny at --seq 100000 asked the CPU allocator for 160 GB for the attention scores: a RuntimeError
    traceback with torch's C++ frames; now one line naming the sizes. Other RuntimeErrors stay what they are."""
    import profiler.run

    def alloc(*_a: object, **_k: object) -> None:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
                           "memory: you tried to allocate 160000000000 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(profiler.run, "profile_model", alloc)
    out = _refused(["profile", "--model", "gpt-tiny", "--seq", "100000", "--micro-batches", "1,2",
                    "--out", str(tmp_path / "p.json")])
    assert out.startswith("error: out of memory timing a layer at --seq 100000, --micro-batches up to 2 (you tried "
                          "to allocate 160000000000 bytes): give a smaller --seq"), out
    assert len(out.strip().splitlines()) == 1

    def other(*_a: object, **_k: object) -> None:
        raise RuntimeError("something else")

    monkeypatch.setattr(profiler.run, "profile_model", other)
    r = runner.invoke(app, ["profile", "--model", "gpt-tiny", "--micro-batches", "1",
                            "--out", str(tmp_path / "q.json")])
    assert isinstance(r.exception, RuntimeError) and str(r.exception) == "something else"


@pytest.mark.parametrize(("args", "cuda", "words"), [
    # the ranks' init_process_group with a timeout of 0: RuntimeError _links_worker ... with C++ frames
    (["--local-procs", "2", "--timeout", "0"], False, "error: --timeout must be a number of seconds above 0"),
    (["--local-procs", "2", "--timeout", "-5"], False, "error: --timeout must be a number of seconds above 0"),
    (["--local-procs", "2", "--timeout", "inf"], False, "error: --timeout must be a number of seconds above 0"),
    (["--local-procs", "2", "--timeout", "1e15"], False,
     "error: --timeout must be a number of seconds above 0 and at most 86400 (a day), got 1e+15"),
    (["--local-procs", "1"], False, "error: --local-procs needs at least 2 processes, got 1"),
    (["--local-procs", "-3"], False, "error: --local-procs needs at least 2 processes, got -3"),
    # the local processes ran gloo and wrote "backend": "gloo"
    (["--local-procs", "2", "--backend", "nccl"], True, "error: --backend nccl: not with --local-procs"),
    (["--backend", "nccl"], False, "error: --backend nccl needs CUDA GPUs"),
    (["--local-procs", "2", "--backend", "mpi"], False, "error: --backend must be gloo or nccl, got 'mpi'"),
])
def test_profile_links_refuses_bad_options_before_any_process(args: list[str], cuda: bool, words: str,
                                                              tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    import profiler.local_cluster

    def started(*_a: object, **_k: object) -> None:
        raise AssertionError("no process may start")

    monkeypatch.setattr(profiler.local_cluster, "measure_links", started)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setenv("RANK", "0")  # under torchrun: the nccl check comes before init_process_group
    monkeypatch.setenv("WORLD_SIZE", "1")
    out = _refused(["profile-links", *args, "--out", str(tmp_path / "l.json")])
    assert out.startswith(words) and len(out.strip().splitlines()) == 1, out
    assert not (tmp_path / "l.json").exists()


FACTORIES = '''
import torch
from torch import nn

def sample(b):
    return torch.randn(b, 8), torch.randint(0, 4, (b,))

def loss(out, targets):
    return nn.functional.cross_entropy(out, targets)

def not_layers():
    return 5, sample, loss

def not_modules():
    return [1, 2], sample, loss

def mismatched():
    return [nn.Linear(8, 8), nn.Linear(16, 4)], sample, loss

def bad_sample():
    return [nn.Linear(8, 4)], lambda b: torch.randn(b, 8), loss

def sample_raises():
    return [nn.Linear(8, 4)], lambda b: 1 / 0, loss

def two_outputs():
    class Two(nn.Module):
        def forward(self, x):
            return x, x
    return [Two(), nn.Linear(8, 4)], sample, loss

def vector_loss():
    return [nn.Linear(8, 4)], sample, lambda out, t: out.sum(1)
'''


@pytest.mark.parametrize(("target", "words"), [
    # a factory with another signature: TypeError traceback
    ("json:loads", "error: --module: the factory json:loads raised TypeError: loads() missing 1 required "
                   "positional argument: 's'"),
    ("os:getcwd", "error: --module: the factory os:getcwd returned a str; it must return (layers, sample, loss)"),
    ("F:not_layers", "returned layers that are an int; give a non-empty list of torch.nn.Module"),
    ("F:not_modules", "error: --module: the factory F:not_modules returned layers: give a non-empty list"),
    # two layers that do not chain: torch's RuntimeError from inside the timing loop
    ("F:mismatched", "error: --module F:mismatched: layer.1 (Linear) failed on layer.0's output of shape (2, 8): "
                     "RuntimeError: mat1 and mat2 shapes cannot be multiplied"),
    ("F:bad_sample", "error: --module F:bad_sample: sample(2) returned a Tensor; it must return (inputs, targets)"),
    ("F:sample_raises", "error: --module F:sample_raises: sample(2) raised ZeroDivisionError: division by zero"),
    ("F:two_outputs", "layer.0 (Two) returned a tuple of 2; a layer returns one tensor"),
    ("F:vector_loss", "loss returned a tensor of shape (2,) for a micro-batch of 2; it must return a scalar"),
    ("B:build", "error: --module: loading B raised ZeroDivisionError: division by zero"),
])
def test_profile_module_factory_errors_are_one_line(target: str, words: str, tmp_path: Path) -> None:
    factories, broken = tmp_path / "factories.py", tmp_path / "broken.py"
    factories.write_text(FACTORIES)
    broken.write_text("x = 1 / 0\n")
    target = target.replace("F:", f"{factories}:").replace("B:", f"{broken}:")
    out = _refused(["profile", "--module", target, "--micro-batches", "1", "--out", str(tmp_path / "p.json")])
    words = words.replace("F:", f"{factories}:").replace("loading B", f"loading {broken}")
    assert out.strip().startswith(words) or (not words.startswith("error:") and words in out), out
    assert len(out.strip().splitlines()) == 1, out
    assert not (tmp_path / "p.json").exists()


def test_a_seq_beyond_rotary_positions_warns_and_proceeds(tmp_path: Path) -> None:
    """Llama 3.1 at --seq 1000000 (its max_position_embeddings 131072) was taken without a word: now one warning
    line, and the profile as asked (rotary positions reach that far, untrained)."""
    root = Path(__file__).resolve().parent.parent
    r = runner.invoke(app, ["profile-analytic", "--hf-config", str(root / "examples/models/llama-3.1-8b"), "--seq",
                            "1000000", "--out", str(tmp_path / "a.json")])
    assert r.exit_code == 0, r.output
    assert r.stderr.strip() == ("warning: --seq 1000000 is beyond max_position_embeddings (131072): the model was "
                                "not trained for so long a sequence (its rotary positions extrapolate); taken as "
                                "given"), r.stderr
    assert "sequence 1000000" in r.stdout
    r = runner.invoke(app, ["profile", "--hf-config", str(root / "tests/fixtures/tiny-llama"), "--seq", "32",
                            "--micro-batches", "1", "--repeats", "1", "--warmup", "0",
                            "--out", str(tmp_path / "m.json")])
    assert r.exit_code == 0, r.output
    assert "warning: --seq 32 is beyond max_position_embeddings (16)" in r.stderr.splitlines()[0], r.stderr


@pytest.mark.parametrize("command", ["profile-links", "plan", "predict", "export", "calibrate", "profile-analytic"])
def test_help_at_80_columns_cuts_no_option_name(command: str) -> None:
    """A default-off flag rendered as ``--executor-overhead / --no-executor-overhead`` widened the option column so
    far that at 80 columns the names and help words were cut (``--executor-overh…``, ``init_process_gro…``); so
    did profile-analytic's ``--encoder/--no-encoder`` (``--recompute-granulari…``)."""
    r = runner.invoke(app, [command, "--help"], env={"COLUMNS": "80", "TERM": "dumb"})
    assert r.exit_code == 0 and "Usage" in r.output
    assert "…" not in r.output, [ln for ln in r.output.splitlines() if "…" in ln]


@pytest.mark.parametrize("times", [["--fwd", "0", "--bwd", "0"], ["--fwd", "0"], ["--bwd", "0"]])
def test_show_refuses_actions_of_no_time(times: list[str]) -> None:
    """``show --fwd 0 --bwd 0`` drew 'B3' alone on each row with makespan 0."""
    out = _refused(["show", "-s", "gpipe", "-D", "4", "-N", "4", *times])
    assert out.startswith(f"error: {times[0]}: a timeline draws each action in cells of its time"), out


def test_profile_analytic_no_encoder_is_the_decoder(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``--encoder`` is a flag alone (help at 80 columns); ``--no-encoder``, hidden, still gives the decoder it gave,
    and the two together are refused."""
    import json

    shape = ["--layers", "2", "--hidden", "64", "--heads", "2", "--seq", "32", "--vocab", "128",
             "--device", "a100-80gb"]
    got = {}
    for flags in ([], ["--no-encoder"], ["--encoder"]):
        out = tmp_path / f"p{len(got)}.json"
        r = runner.invoke(app, ["profile-analytic", *shape, *flags, "--out", str(out)])
        assert r.exit_code == 0, r.output
        spec = json.loads(json.loads(out.read_text())["environment"]["model_spec"])
        got[" ".join(flags)] = spec["architecture"]
    assert got == {"": "decoder", "--no-encoder": "decoder", "--encoder": "encoder"}, got
    r = runner.invoke(app, ["profile-analytic", *shape, "--encoder", "--no-encoder", "--out", str(tmp_path / "x.json")])
    assert r.exit_code == 2 and "--encoder and --no-encoder: give one" in r.output, r.output
