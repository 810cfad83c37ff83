"""The reserve apart from the model's own memory (newcomer pass: every candidate on the 4 GiB local CPU cluster
read "2.00 GiB", the request's default reserve, whatever its model): the candidate document, the CLI table and
the fits rule (model + reserve <= capacity); the default by the cluster's device kind (planner.reserve: a GPU's
2 GiB is nothing a CPU process holds), an explicit value winning, and which one applied."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeplan.cli import app
from planner.analytic import transformer_profile
from planner.cluster import load_cluster
from planner.request import TrainingRequest
from planner.reserve import CPU_RESERVE_BYTES, GPU_RESERVE_BYTES, default_reserve, resolve_reserve
from planner.search import plan, predict

EX = Path(__file__).resolve().parent.parent / "examples" / "clusters"
GiB = 2**30


@pytest.fixture(scope="module")
def local():
    cl = load_cluster(EX / "local-cpu-4.json")
    return cl, transformer_profile("gpt-tiny", 4, 256, 4, 128, 1024, cl.peak_flops, cl.device)


def test_defaults_by_device_kind() -> None:
    assert CPU_RESERVE_BYTES < 1 * GiB < GPU_RESERVE_BYTES == 2 * GiB
    assert default_reserve("cpu")[0] == default_reserve("CPU-x86_64")[0] == CPU_RESERVE_BYTES
    assert default_reserve("A100-SXM4-80GB")[0] == default_reserve("H100-SXM5-80GB")[0] == GPU_RESERVE_BYTES
    assert "CPU" in default_reserve("cpu")[1] and "GPU" in default_reserve("A100-SXM4-80GB")[1]


def test_cpu_cluster_gets_the_cpu_default_and_the_model_peak_is_shown_apart(local) -> None:  # type: ignore[no-untyped-def]
    cl, prof = local
    res = plan(prof, cl, TrainingRequest(global_batch=8, top=10))
    assert res.candidates
    for c in res.candidates:
        doc = c.to_dict()
        assert doc["memory_reserve"] == CPU_RESERVE_BYTES  # not the GPU's 2 GiB
        assert doc["memory_reserve_source"].startswith("default for CPU devices")
        assert doc["model_memory"] == pytest.approx([m - CPU_RESERVE_BYTES for m in doc["memory"]])
        assert doc["model_peak_memory"] == pytest.approx(doc["peak_memory"] - CPU_RESERVE_BYTES)
        # gpt-tiny: weights, gradients, Adam state and activations are megabytes, not gigabytes
        assert 0 < doc["model_peak_memory"] < 0.1 * GiB


@pytest.mark.parametrize("reserve", [0.0, 3.9 * GiB, 4 * GiB - 30 * 2**20])
def test_fits_iff_model_plus_reserve_within_capacity(local, reserve: float) -> None:  # type: ignore[no-untyped-def]
    cl, prof = local
    res = plan(prof, cl, TrainingRequest(global_batch=8, top=50, memory_reserve_bytes=reserve))
    for c in res.candidates + res.infeasible:
        assert c.memory_reserve == reserve and c.memory_reserve_source == "the request's memory_reserve_bytes"
        if c.memory:
            assert c.fits == (max(c.model_memory) + reserve <= cl.memory_bytes), (c.config.label(), c.reason)
    if reserve > 3.95 * GiB:  # 30 MiB left: the larger micro-batches no longer fit
        assert res.infeasible and all(not c.fits for c in res.infeasible)


def test_cli_table_shows_model_plus_reserve(tmp_path: Path) -> None:
    prof = tmp_path / "tiny.json"
    runner = CliRunner()
    assert runner.invoke(app, ["profile-analytic", "--preset", "gpt-tiny", "--out", str(prof)]).exit_code == 0
    args = ["plan", "--profile", str(prof), "--cluster", str(EX / "local-cpu-4.json"), "--global-batch", "8",
            "--top", "3"]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    assert "model + reserve" in r.output and " + 0.31" in r.output and " + 2.00" not in r.output, r.output
    assert "memory reserve: 0.31 GiB per device (default for CPU devices" in r.output, r.output
    r = CliRunner().invoke(app, [*args, "--memory-reserve", "0.5"])
    assert r.exit_code == 0 and " + 0.50" in r.output and " + 0.31" not in r.output, r.output
    assert "memory reserve: 0.50 GiB per device (--memory-reserve)" in r.output, r.output
    # a reserve that is no size is named by the option the user typed, in its unit (not the request's field)
    for bad in ("-1", "nan", "inf", "1e308"):  # (1e308 GiB is no float's number of bytes)
        r = CliRunner().invoke(app, [*args, "--memory-reserve", bad])
        assert r.exit_code == 2, r.output
        assert "--memory-reserve: GiB per device, a finite number from 0 to 1073741824" in r.output, r.output
        assert "bytes" not in r.output, r.output


def test_gpu_cluster_keeps_2_gib_and_an_explicit_value_wins() -> None:
    gpu = load_cluster(EX / "dgx-a100-80gb.json")
    prof = transformer_profile("gpt-tiny", 4, 256, 4, 128, 1024, gpu.peak_flops, gpu.device)
    res = plan(prof, gpu, TrainingRequest(global_batch=8, gpus=8, top=3))
    assert res.candidates and all(c.memory_reserve == GPU_RESERVE_BYTES for c in res.candidates)
    assert all(c.memory_reserve_source.startswith("default for GPU devices") for c in res.candidates)
    res = plan(prof, gpu, TrainingRequest(global_batch=8, gpus=8, top=3, memory_reserve_bytes=GiB / 4))
    assert res.candidates and all(c.memory_reserve == GiB / 4 for c in res.candidates)
    # an explicit 0 is a value, not "unset"
    req, source = resolve_reserve(TrainingRequest(global_batch=8, memory_reserve_bytes=0.0), gpu)
    assert req.memory_reserve_bytes == 0.0 and source == "the request's memory_reserve_bytes"


def test_fits_rule_uses_the_cpu_default(local) -> None:  # type: ignore[no-untyped-def]
    """The default reserve is what the fits rule counts: a cluster with just under model + CPU default of
    memory rejects what one with just over it accepts."""
    cl, prof = local
    res = plan(prof, cl, TrainingRequest(global_batch=8, top=1))
    best = res.candidates[0]
    need = max(best.model_memory) + CPU_RESERVE_BYTES
    for capacity, fits in ((need + 2**20, True), (need - 2**20, False)):
        small = cl.model_copy(update={"memory_bytes": int(capacity)})
        cand = predict(prof, small, TrainingRequest(global_batch=8), best.config)
        assert cand.fits == fits, (capacity, cand.reason)
        assert cand.memory_reserve == CPU_RESERVE_BYTES


def test_predict_takes_plans_memory_reserve(tmp_path: Path) -> None:
    """A `plan --memory-reserve X` row could not be reproduced with `predict`, which had no such option (its
    memory and fit were the default reserve's). predict takes plan's option, with the same meaning and limits."""
    import json

    prof = tmp_path / "tiny.json"
    runner = CliRunner()
    assert runner.invoke(app, ["profile-analytic", "--preset", "gpt-tiny", "--out", str(prof)]).exit_code == 0
    common = ["--profile", str(prof), "--cluster", str(EX / "local-cpu-4.json"), "--global-batch", "8"]
    r = runner.invoke(app, ["plan", *common, "--top", "1", "--memory-reserve", "3.9", "--json"])
    assert r.exit_code == 0, r.output
    row = json.loads(r.stdout)["candidates"][0]
    one = ["predict", *common, *(x for k in ("tensor", "pipeline", "data", "micro_batch", "schedule")
                                 for x in (f"--{k.replace('_', '-')}", str(row[k])))]
    r = runner.invoke(app, [*one, "--memory-reserve", "3.9", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["memory_reserve"] == 3.9 * GiB and doc["memory"] == row["memory"] and doc["fits"]
    assert doc["iteration_time"] == row["iteration_time"]
    r = runner.invoke(app, [*one, "--memory-reserve", "3.999", "--json"])  # 1 MiB left: it cannot fit
    assert r.exit_code == 0 and not json.loads(r.stdout)["fits"], r.output
    r = runner.invoke(app, [*one, "--memory-reserve", "4"])  # the whole 4 GiB set aside: refused, naming it
    assert r.exit_code == 2 and "the reserve of 4 GiB per device leaves nothing" in r.output, r.output
    r = runner.invoke(app, [*one, "--memory-reserve", "0.5"])
    assert r.exit_code == 0 and "memory reserve: 0.50 GiB per device (--memory-reserve)" in r.output, r.output
    r = runner.invoke(app, [*one, "--memory-reserve", "-1"])
    assert r.exit_code == 2 and "--memory-reserve: GiB per device, a finite number from 0 to 1073741824" in r.output


@pytest.mark.parametrize("reserve", [4 * GiB, 64 * GiB])
def test_a_reserve_of_the_whole_device_is_refused_naming_it(local, reserve: float) -> None:  # type: ignore[no-untyped-def]
    """A reserve of all of a device's memory made every candidate read 'weights, gradients and optimizer state
    do not fit' (the plan page: 'the model's weights ... alone exceed each device's memory') for a model of
    3.5 MB; now the request is refused naming the reserve, for plan and predict alike."""
    from planner.request import Config

    cl, prof = local
    words = "memory_reserve_bytes: the reserve of .* leaves nothing of the device.s 4 GiB"
    with pytest.raises(ValueError, match=words):
        plan(prof, cl, TrainingRequest(global_batch=8, memory_reserve_bytes=reserve))
    with pytest.raises(ValueError, match="memory_reserve_bytes"):
        predict(prof, cl, TrainingRequest(global_batch=8, memory_reserve_bytes=reserve),
                Config(tensor=1, pipeline=2, data=1, micro_batch=1, schedule="1f1b"))
