"""The command line: simulate, show, and a measured profile going through the planner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeplan.cli import app

runner = CliRunner()
EX = Path(__file__).resolve().parent.parent / "examples" / "clusters"


def test_simulate_json_keys():
    r = runner.invoke(app, ["simulate", "--schedule", "chimera", "--devices", "4", "--microbatches", "4",
                            "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["makespan"] == 16 and data["bubble_ratio"] == pytest.approx(0.25)
    assert len(data["devices"]) == 4
    for d in data["devices"]:
        assert {"busy", "idle", "peak_activations"} <= d.keys()


def test_simulate_text_and_options():
    r = runner.invoke(app, ["simulate", "-s", "hanayo", "-D", "4", "-N", "8", "--waves", "2", "--comm", "0.1"])
    assert r.exit_code == 0 and "makespan" in r.output and "bubble ratio" in r.output
    r = runner.invoke(app, ["simulate", "-s", "interleaved", "-D", "4", "-N", "6", "--chunks", "2"])
    assert r.exit_code == 2 and "multiple" in r.output


def test_show_draws_one_row_per_device():
    r = runner.invoke(app, ["show", "-s", "chimera", "-D", "4", "-N", "4", "--no-color"])
    assert r.exit_code == 0, r.output
    rows = [line for line in r.output.splitlines() if line.startswith("P")]
    assert len(rows) == 4
    assert rows[0].split()[1:3] == ["F0", "F1"]  # down pipeline: upper case
    assert "f2" in rows[3] and "b2" in rows[3]  # up pipeline: lower case
    assert "makespan 16" in r.output


def test_bad_option_for_schedule():
    r = runner.invoke(app, ["simulate", "-s", "1f1b", "-D", "4", "-N", "4", "--waves", "2"])
    assert r.exit_code == 2 and "--waves does not apply" in r.output


@pytest.mark.slow
def test_measured_tiny_profile_is_accepted_by_the_planner(tmp_path):
    """Issue 4: a tiny GPT profile from the profiler goes through `pipeplan plan` as it is."""
    prof = tmp_path / "tiny.json"
    r = runner.invoke(app, ["profile", "--model", "gpt-tiny", "--micro-batches", "1,2,4", "--repeats", "3",
                            "--warmup", "1", "--threads", "1", "--out", str(prof)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["plan", "--profile", str(prof), "--cluster", str(EX / "piz-daint-p100-16gb.json"),
                            "--global-batch", "16", "--gpus", "4", "--top", "3", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["candidates"] and data["candidates"][0]["fits"]


def test_plan_table_says_cpu_processes_on_a_cpu_cluster(tmp_path):
    """A CPU cluster's devices are processes sharing the host's cores: the table and the budget error say so;
    a GPU cluster's still say GPUs (planner.units)."""
    prof = tmp_path / "tiny.json"
    r = runner.invoke(app, ["profile-analytic", "--preset", "gpt-tiny", "--out", str(prof)])
    assert r.exit_code == 0, r.output
    cpu, gpu = str(EX / "local-cpu-4.json"), str(EX / "dgx-a100-80gb.json")
    r = runner.invoke(app, ["plan", "--profile", str(prof), "--cluster", cpu, "--global-batch", "8", "--top", "2"])
    assert r.exit_code == 0, r.output
    assert "on 4 CPU processes" in r.output and "x cpu" not in r.output and "GPU" not in r.output
    r = runner.invoke(app, ["plan", "--profile", str(prof), "--cluster", gpu, "--global-batch", "8", "--gpus", "8",
                            "--top", "2"])
    assert r.exit_code == 0 and "on 8 x A100" in r.output, r.output
    r = runner.invoke(app, ["predict", "--profile", str(prof), "--cluster", cpu, "--global-batch", "8", "--tensor",
                            "1", "--pipeline", "8", "--data", "1", "--micro-batch", "1", "--schedule", "1f1b"])
    assert r.exit_code != 0 and "exceeds the cluster's 4 CPU processes" in r.output, r.output


@pytest.mark.parametrize(("device", "n", "words"), [("cpu", 4, "4 CPU processes"), ("CPU", 1, "1 CPU process"),
                                                    ("A100-SXM4-80GB", 8, "8 GPUs"), ("h100", 1, "1 GPU")])
def test_device_words(device: str, n: int, words: str) -> None:
    from planner.units import devices

    assert devices(device, n) == words


def test_plan_on_two_processes_prints_what_one_process_prints(tmp_path, monkeypatch):
    """``pipeplan plan`` on two cores (a forked child searching half, planner.split_search) prints the table
    and the document of one process; only the counts line may differ (what each part skipped by its bound).
    ``--processes`` below 1 is refused with the option named."""
    from planner import split_search

    monkeypatch.setattr(split_search, "can_fork", lambda: True)  # (the test runner may hold other threads)
    monkeypatch.setattr(split_search, "spare_core", lambda: True)  # (whatever else the machine runs)
    received: list[object] = []
    receive = split_search._receive
    monkeypatch.setattr(split_search, "_receive", lambda fd, pid: (received.append(receive(fd, pid)), received[-1])[1])
    prof = tmp_path / "gpt2.json"
    assert runner.invoke(app, ["profile-analytic", "--preset", "gpt2-medium", "--out", str(prof)]).exit_code == 0
    args = ["plan", "--profile", str(prof), "--cluster", str(EX / "dgx-a100-80gb.json"), "--global-batch", "512",
            "--gpus", "64", "--top", "5"]
    out = {n: runner.invoke(app, [*args, "--processes", str(n)]) for n in (1, 2)}
    assert all(r.exit_code == 0 for r in out.values()), out
    assert received and received[0] is not None, "the search must have been split"

    def table(text: str) -> tuple[str, str]:  # (the table, the lines after the counts)
        return text.split("\nevaluated ")[0], text[text.index("\nmemory reserve:"):]

    assert table(out[2].output) == table(out[1].output)
    docs = {n: json.loads(runner.invoke(app, [*args, "--processes", str(n), "--json"]).output) for n in (1, 2)}
    assert docs[2]["candidates"] == docs[1]["candidates"] and docs[2]["evaluated"] == docs[1]["evaluated"]
    for bad in ("0", "3"):
        r = runner.invoke(app, [*args, "--processes", bad])
        assert r.exit_code == 2 and f"--processes: 1 or 2 (the search splits in two at most), got {bad}" in r.output


def test_profile_analytic_selective_recomputation(tmp_path):
    """--recompute-granularity selective (Megatron's name) is recorded in the profile, the plan's header says
    what the rows without rc recompute, and the candidate JSON names it; a bad value is refused by name."""
    prof = tmp_path / "sel.json"
    r = runner.invoke(app, ["profile-analytic", "--preset", "gpt2-medium", "--recompute-granularity", "selective",
                            "--out", str(prof)])
    assert r.exit_code == 0, r.output
    doc = json.loads(prof.read_text())
    assert doc["environment"]["recompute_granularity"] == "selective" and "selective recomputation" in doc["notes"]
    gpu = str(EX / "dgx-a100-80gb.json")
    r = runner.invoke(app, ["plan", "--profile", str(prof), "--cluster", gpu, "--global-batch", "64", "--gpus", "8",
                            "--top", "2"])
    assert r.exit_code == 0 and "re-run the attention core selectively" in r.output, r.output
    base = ["predict", "--profile", str(prof), "--cluster", gpu, "--global-batch", "64", "--tensor", "2",
            "--pipeline", "2", "--data", "2", "--micro-batch", "2", "--schedule", "1f1b", "--json"]
    assert json.loads(runner.invoke(app, base).output)["recompute_granularity"] == "selective"
    assert json.loads(runner.invoke(app, [*base, "--recompute"]).output)["recompute_granularity"] == "full"
    r = runner.invoke(app, ["profile-analytic", "--preset", "gpt2-medium", "--recompute-granularity", "full",
                            "--out", str(tmp_path / "x.json")])
    assert r.exit_code != 0 and "--recompute-granularity must be none, selective or op" in r.output, r.output


def test_a100_40gb_device_and_cluster(tmp_path):
    """The 40 GB A100 (the first DGX A100): the 80 GB part's compute with its own 40 GB and 1,555 GB/s. The
    same GPT-3 configuration is predicted a little slower (its memory-bound kernels) and, on its half-size
    memory, a configuration that fits 80 GB does not fit."""
    from planner.device import get_device

    small, big = get_device("NVIDIA A100-SXM4-40GB"), get_device("a100-80gb")
    assert (small.name, small.memory_bytes, small.memory_bandwidth) == ("A100-SXM4-40GB", 40 * 2**30, 1555e9)
    assert small.peak("bf16") == big.peak("bf16") and small.sm_count == big.sm_count
    out = {}
    for dev in ("a100-40gb", "a100-80gb"):
        out[dev] = tmp_path / f"{dev}.json"
        r = runner.invoke(app, ["profile-analytic", "--preset", "gpt3-175b", "--device", dev, "--out", str(out[dev])])
        assert r.exit_code == 0, r.output
    res = {}
    for dev, cluster in (("a100-40gb", "dgx-a100-40gb"), ("a100-80gb", "dgx-a100-80gb")):
        r = runner.invoke(app, ["predict", "--profile", str(out[dev]), "--cluster", str(EX / f"{cluster}.json"),
                                "--global-batch", "1536", "--tensor", "8", "--pipeline", "8", "--data", "2",
                                "--micro-batch", "1", "--schedule", "1f1b", "--recompute", "--json"])
        assert r.exit_code == 0, r.output
        res[dev] = json.loads(r.output)
    assert res["a100-80gb"]["fits"] and not res["a100-40gb"]["fits"], res
    # refused before simulating: strict JSON, the time not predicted (null, not Infinity) and the reason
    assert res["a100-40gb"]["iteration_time"] is None and res["a100-80gb"]["iteration_time"] > 0
    assert res["a100-40gb"]["reason"].startswith("weights, gradients and optimizer state do not fit")


def test_profile_analytic_runtime(tmp_path):
    """--p2p blocking / --dp-allreduce overlapped describe the runtime a plan is for (Megatron-LM's blocking
    sends, DDP's overlapped all-reduce): recorded in the profile (defaults leave it as it was), the same
    pipelined configuration predicted slower with blocking sends, the plan warned that pipeplan's executor
    runs otherwise; bad values are refused by the option's name."""
    docs = {}
    for tag, extra in (("default", []), ("megatron", ["--p2p", "blocking", "--dp-allreduce", "overlapped"])):
        out = tmp_path / f"{tag}.json"
        r = runner.invoke(app, ["profile-analytic", "--preset", "gpt2-medium", *extra, "--out", str(out)])
        assert r.exit_code == 0, r.output
        docs[tag] = out
    env = {k: json.loads(v.read_text())["environment"] for k, v in docs.items()}
    assert "p2p" not in env["default"] and "dp_allreduce" not in env["default"]
    assert (env["megatron"]["p2p"], env["megatron"]["dp_allreduce"]) == ("blocking", "overlapped")
    gpu = str(EX / "dgx-a100-80gb.json")
    times = {}
    for tag, prof in docs.items():
        r = runner.invoke(app, ["predict", "--profile", str(prof), "--cluster", gpu, "--global-batch", "64",
                                "--tensor", "1", "--pipeline", "4", "--data", "2", "--micro-batch", "2",
                                "--schedule", "1f1b", "--json"])
        assert r.exit_code == 0, r.output
        times[tag] = json.loads(r.output)["iteration_time"]
    assert times["megatron"] > times["default"], times
    r = runner.invoke(app, ["plan", "--profile", str(docs["megatron"]), "--cluster", gpu, "--global-batch", "64",
                            "--gpus", "8", "--top", "2"])
    assert r.exit_code == 0 and "blocking pipeline sends" in r.output and "pipeplan's executor" in r.output, r.output
    for opt, bad, msg in (("--p2p", "blocked", "--p2p must be one of overlapped, blocking, got 'blocked'"),
                          ("--dp-allreduce", "x_y", "--dp-allreduce must be one of after-backward, overlapped, "
                                                    "got 'x_y'")):
        r = runner.invoke(app, ["profile-analytic", "--preset", "gpt2-medium", opt, bad, "--out",
                                str(tmp_path / "x.json")])
        assert r.exit_code != 0 and msg in r.output, r.output


def test_profile_analytic_scatter_gather(tmp_path):
    """--p2p-scatter-gather: Megatron-LM's 2021-22 pipeline sends (1/t of the boundary tensor per tensor rank,
    then gathered) -- recorded in the profile, named by the plan beside the executor's difference, and a
    tensor-parallel pipeline whose sends cross nodes predicted no slower than with whole tensors (pipeplan's
    executor, the default)."""
    docs = {}
    for tag, extra in (("whole", []), ("sg", ["--p2p-scatter-gather"])):
        out = tmp_path / f"{tag}.json"
        r = runner.invoke(app, ["profile-analytic", "--preset", "gpt2-1.3b", *extra, "--out", str(out)])
        assert r.exit_code == 0, r.output
        docs[tag] = out
    env = {k: json.loads(v.read_text())["environment"] for k, v in docs.items()}
    assert "p2p_scatter_gather" not in env["whole"] and env["sg"]["p2p_scatter_gather"] == "on"
    gpu = str(EX / "dgx-a100-80gb.json")
    times = {}
    for tag, prof in docs.items():  # t = 8 D = 4: every send crosses a node
        r = runner.invoke(app, ["predict", "--profile", str(prof), "--cluster", gpu, "--global-batch", "64",
                                "--tensor", "8", "--pipeline", "4", "--data", "1", "--micro-batch", "1",
                                "--schedule", "gpipe", "--json"])
        assert r.exit_code == 0, r.output
        times[tag] = json.loads(r.output)["iteration_time"]
    assert times["sg"] < times["whole"], times
    r = runner.invoke(app, ["plan", "--profile", str(docs["sg"]), "--cluster", gpu, "--global-batch", "64",
                            "--gpus", "32", "--top", "2"])
    assert r.exit_code == 0 and "scatter/gather" in r.output and "pipeplan's executor" in r.output, r.output


def test_profile_analytic_attention_implementation(tmp_path):
    """--attention flash --attention-impl names the flash kernel's implementation (default flash2), recorded in
    the profile; on the H100 cuDNN's kernel is the faster one by its published rate; a bad name is refused."""
    docs = {}
    for impl in ("flash2", "cudnn"):
        out = tmp_path / f"{impl}.json"
        r = runner.invoke(app, ["profile-analytic", "--preset", "gpt2-medium", "--device", "h100-80gb",
                                "--attention", "flash", "--attention-impl", impl, "--out", str(out)])
        assert r.exit_code == 0, r.output
        docs[impl] = json.loads(out.read_text())
        assert docs[impl]["environment"]["attention_impl"] == impl and f"({impl})" in docs[impl]["notes"]
    fwd = {k: d["layers"][1]["fwd_time"]["1"] for k, d in docs.items()}
    assert fwd["cudnn"] < fwd["flash2"]
    r = runner.invoke(app, ["profile-analytic", "--preset", "gpt2-medium", "--attention", "flash",
                            "--attention-impl", "flash4", "--out", str(tmp_path / "x.json")])
    assert r.exit_code != 0 and "--attention-impl must be flash2, flash3 or cudnn" in r.output, r.output


def test_an_hf_profile_says_its_sequence_and_an_empty_plan_says_nothing_fits(tmp_path):
    """Without --seq a Hugging Face config is profiled at its longest sequence (Llama 3.1: 131072) and every
    configuration then ran out of memory: `plan` printed an empty table. Both now say it."""
    prof = tmp_path / "l8.json"
    r = runner.invoke(app, ["profile-analytic", "--hf-config", "examples/models/llama-3.1-8b/config.json",
                            "--device", "h100-80gb", "--out", str(prof)])
    assert r.exit_code == 0 and "sequence 131072: the config's longest, --seq to choose" in r.output, r.output
    r = runner.invoke(app, ["plan", "--profile", str(prof), "--cluster", "examples/clusters/dgx-h100-80gb.json",
                            "--global-batch", "64", "--gpus", "8", "--schedules", "1f1b"])
    assert r.exit_code == 1 and "no configuration fits: most were rejected for 'out of memory'" in r.stderr, r.output
    assert "the profile's sequence is 131072" in r.stderr


def test_plan_exits_1_when_no_configuration_fits(tmp_path):
    """GPT-3 175B on 7 A100s: nothing fits, and `plan` (and `plan --json`) exited 0, as if a plan were made. Exit
    code 1 now, the reason on stderr; --json still prints the plan (no candidates, the rejections); --help says it."""
    prof = tmp_path / "gpt3.json"
    r = runner.invoke(app, ["profile-analytic", "--preset", "gpt3-175b", "--device", "a100-80gb", "--out", str(prof)])
    assert r.exit_code == 0, r.output
    args = ["plan", "--profile", str(prof), "--cluster", "examples/clusters/dgx-a100-80gb.json", "--global-batch",
            "1536", "--gpus", "7"]
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 1, r.output
    doc = json.loads(r.stdout)
    assert doc["candidates"] == [] and doc["rejected"]
    top = doc["rejected"]["weights, gradients and optimizer state do not fit"]
    message = (f"error: no configuration fits: most were rejected for 'weights, gradients and optimizer state do not "
               f"fit' ({top}); the profile's sequence is 2048")
    assert r.stderr.strip() == message
    r = runner.invoke(app, args)
    assert r.exit_code == 1 and r.stderr.strip() == message, r.output
    assert "no configuration fits" not in r.stdout  # (the table and its lines; the reason once, on stderr)
    r = runner.invoke(app, ["plan", "--help"])
    assert "1 when no configuration fits" in " ".join(r.output.split())


def test_an_empty_plan_on_the_whole_cluster_names_gpus(tmp_path):
    """gpt-tiny on the DGX-1 V100 cluster without --gpus: every configuration uses all its GPUs, and 'no
    configuration fits: most were rejected for more pipeline stages than layers' did not say that --gpus plans on
    fewer (where 8 GPUs fit)."""
    prof = tmp_path / "g.json"
    assert runner.invoke(app, ["profile-analytic", "--preset", "gpt-tiny", "--device", "v100-32gb",
                               "--out", str(prof)]).exit_code == 0
    args = ["plan", "--profile", str(prof), "--cluster", "examples/clusters/dgx1-v100-32gb.json", "--global-batch", "8"]
    r = runner.invoke(app, args)
    gpus = json.loads(Path("examples/clusters/dgx1-v100-32gb.json").read_text())
    n = gpus["nodes"] * gpus["gpus_per_node"]
    assert r.exit_code == 1 and r.stderr.strip().endswith(
        f"; every configuration uses all {n} GPUs of the cluster (t*D*W = --gpus, by default the cluster's): give "
        "--gpus to plan on fewer"), r.stderr
    r = runner.invoke(app, [*args, "--gpus", "8"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, [*args, "--gpus", "1024"])
    assert r.exit_code != 0 and "give --gpus" not in r.stderr


def test_a_cluster_too_small_for_the_default_reserve_names_its_memory(tmp_path):
    """A cluster of ``memory_bytes: 1000`` was answered "--memory-reserve: the reserve ... give a smaller reserve",
    an option the user had not given."""
    prof, cl = tmp_path / "t.json", tmp_path / "c.json"
    assert runner.invoke(app, ["profile-analytic", "--preset", "gpt-tiny", "--device", "a100-80gb",
                               "--out", str(prof)]).exit_code == 0
    cl.write_text(json.dumps({**json.loads(Path("examples/clusters/dgx-a100-80gb.json").read_text()),
                              "memory_bytes": 1000}))
    args = ["plan", "--profile", str(prof), "--cluster", str(cl), "--global-batch", "8", "--gpus", "8"]
    r = runner.invoke(app, args)
    assert r.exit_code != 0 and "memory_bytes: the cluster's devices hold 9.313e-07 GiB, not more than the default " \
        "reserve of 2 GiB per device" in r.stderr, r.output
    r = runner.invoke(app, [*args, "--memory-reserve", "2"])  # (GiB)
    assert r.exit_code != 0 and "the reserve of 2 GiB per device leaves nothing" in r.stderr, r.output
