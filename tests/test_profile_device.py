"""pipeplan profile-device: a device description measured with torch on this machine (quick mode, CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from planner.device import DeviceSpec, find_device, load_device
from planner.model import PRESETS
from profiler.device import efficiency_curve, model_shapes


def test_model_shapes_follow_megatron_split() -> None:
    spec = PRESETS["gpt2-medium"]  # h 1024, a 16, s 1024, f 4096
    shapes = model_shapes(spec, [2], [1, 4])
    tokens = 2 * 1024
    assert (tokens, 3 * 1024, 1024, 1) in shapes and (tokens, 3 * 1024 // 4, 1024, 1) in shapes  # QKV columns
    assert (tokens, 1024, 4096 // 4, 1) in shapes  # MLP down: rows split, k / t
    assert (1024, 1024, 64, 2 * 16 // 4) in shapes  # scores per local head
    assert all(m > 0 and n > 0 and k > 0 and b > 0 for m, n, k, b in shapes)
    # t that does not divide the heads is skipped
    assert model_shapes(spec, [1], [3]) == []


def test_efficiency_curve_bins_and_clamps() -> None:
    curve = efficiency_curve([(0.001, 0.1), (0.0012, 0.2), (1.0, 0.9), (1.1, 1.3), (100.0, 0.95)])
    sizes = [p[0] for p in curve.points]
    assert sizes == sorted(sizes) and len(sizes) == 3
    assert all(0 < e <= 1 for _, e in curve.points)


def test_profile_device_quick_cpu(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from pipeplan.cli import app

    out = tmp_path / "dev.json"
    r = CliRunner().invoke(app, ["profile-device", "--quick", "--device", "cpu", "--model", "gpt-tiny",
                                 "--threads", "1", "--name", "test-cpu", "--out", str(out)])
    assert r.exit_code == 0, r.output
    dev = load_device(out)
    assert isinstance(dev, DeviceSpec) and dev.kind == "cpu" and dev.name == "test-cpu"
    assert set(dev.peak_flops) == {"fp32"} and dev.memory_bandwidth > 0 and dev.kernel_overhead_s > 0
    tiny = PRESETS["gpt-tiny"]
    want = model_shapes(tiny.with_(seq=min(tiny.seq, 64)), [1], [1, 2, 4, 8])
    got = {(p.m, p.n, p.k, p.batch) for p in dev.gemm_points}
    assert set(want) <= got
    # a measured shape's efficiency comes from its own point, and none exceeds the peak
    p = max(dev.gemm_points, key=lambda p: p.flops)
    assert dev.gemm_eff(p.m, p.n, p.k, p.batch, "fp32") == pytest.approx(p.flops / (p.seconds * dev.peak("fp32")))
    assert all(dev.gemm_eff(q.m, q.n, q.k, q.batch, "fp32") <= 1.0 for q in dev.gemm_points)
    assert "profile-device" in dev.sources["gemm_efficiency"]
    assert find_device(str(out)) is not None  # a cluster's device may name the file
    bad = CliRunner().invoke(app, ["profile-device", "--quick", "--device", "cpu", "--model", "no-such",
                                   "--out", str(tmp_path / "x.json")])
    assert bad.exit_code == 2 and "no-such" in bad.output


def test_time_queued_on_the_cpu_is_the_wall_time_per_call():
    """:func:`profiler.timing.time_queued` (CUDA: the kernels alone, queued behind a sleep kernel) on the CPU:
    the op runs where it is issued, so both figures are the wall time per call; bad counts are refused."""
    import time

    import pytest
    import torch

    from profiler.timing import time_queued

    q = time_queued(lambda: time.sleep(0.002), torch.device("cpu"), calls=3, tries=2)
    assert q.valid and q.gpu_s == q.host_s
    assert 0.002 <= q.gpu_s < 0.05
    with pytest.raises(ValueError, match="calls and tries"):
        time_queued(lambda: None, torch.device("cpu"), calls=0)


def test_what_the_sweep_does_not_measure_comes_from_the_shipped_description():
    """A measured H100 keeps the shipped H100's power-limited rate and power figures, attention figures,
    collectives and SM count (without wave quantisation on its measured whole-kernel curve), each source
    naming where it came from; the CPU's description carries nothing (it sets none of them)."""
    from profiler.device import CARRIED, unmeasured

    h100 = find_device("H100-SXM5-80GB")
    fields, sources = unmeasured(h100)
    assert set(fields) == {*CARRIED, "wave_quantisation"} and fields["wave_quantisation"] is False
    assert fields["sustained_rate"] == 0.86 and fields["power"] == h100.power and fields["sm_count"] == 132
    assert all("not measured by profile-device" in sources[k] for k in fields)
    spec = DeviceSpec(**{**h100.model_dump(exclude=set(fields)), **fields})
    assert spec.power == h100.power
    a100_fields, _ = unmeasured(find_device("A100-SXM4-80GB"))
    assert "sustained_rate" not in a100_fields and "power" not in a100_fields and a100_fields["sm_count"] == 108
    assert unmeasured(find_device("cpu")) == ({}, {})


def test_an_analytical_profile_on_an_unknown_device_says_whose_curves_it_used() -> None:
    """A profile made for a cluster of device 'TPU-v9' (no shipped description) said 'GEMM and memory efficiency
    from the device description', though the description was a generic one with the A100's curves."""
    from planner.analytic import analytic_profile
    from planner.device import generic_device, get_device

    notes = analytic_profile(PRESETS["gpt-tiny"], generic_device("TPU-v9", 1e15, 2e12, 80 * 2**30)).notes
    assert "generic description of 'TPU-v9'" in notes and "curves are the A100's" in notes
    assert "generic" not in analytic_profile(PRESETS["gpt-tiny"], get_device("A100-SXM4-80GB")).notes


def test_the_cpu_is_named_as_clusters_name_it(tmp_path: Path) -> None:
    """profile-device named this CPU platform.processor()'s 'x86_64' where `pipeplan profile` and the clusters say
    'cpu': an analytical profile on its description planned on examples/clusters/local-cpu-4.json warned "timed on
    'x86_64' but cluster 'local-cpu-4' has 'cpu' devices". Its peak stays the one measured here (the shipped
    cpu.json is one VM's, not found by the generic name)."""
    from typer.testing import CliRunner

    from pipeplan.cli import app

    runner, dev_json, prof = CliRunner(), tmp_path / "dev.json", tmp_path / "a.json"
    r = runner.invoke(app, ["profile-device", "--quick", "--device", "cpu", "--threads", "1", "--repeats", "1",
                            "--out", str(dev_json)])
    assert r.exit_code == 0, r.output
    dev = load_device(dev_json)
    assert dev.name == "cpu" and dev.aliases == [] and "measured here" in dev.sources["peak_flops"]
    r = runner.invoke(app, ["profile-analytic", "--preset", "gpt-tiny", "--device", str(dev_json), "--dtype", "fp32",
                            "--out", str(prof)])
    assert r.exit_code == 0, r.output
    cluster = Path(__file__).resolve().parent.parent / "examples" / "clusters" / "local-cpu-4.json"
    r = runner.invoke(app, ["plan", "--profile", str(prof), "--cluster", str(cluster), "--global-batch", "8"])
    assert r.exit_code == 0, r.output
    assert "timed on" not in r.stderr, r.stderr
