"""The H200: the H100's die with another memory, a description ``like`` the H100's
(planner/devices/h200-sxm-141gb.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.analytic import analytic_profile
from planner.cluster import load_cluster
from planner.device import device_for_cluster, find_device, get_device, load_device
from planner.model import PRESETS
from planner.request import Config, TrainingRequest
from planner.search import predict

ROOT = Path(__file__).resolve().parent.parent
CLUSTERS = ROOT / "examples" / "clusters"
OWN = {"name", "aliases", "memory_bytes", "memory_bandwidth", "sources", "notes"}


def test_the_h200_is_found_by_the_names_torch_and_nvidia_smi_give():
    """torch.cuda.get_device_name and nvidia-smi say "NVIDIA H200": profile-device then carries the shipped
    description's power, attention and NCCL figures, and a cluster file names it."""
    h200 = find_device("NVIDIA H200")
    assert h200 is not None and h200.name == "H200-SXM-141GB"
    assert find_device("h200") == h200 == get_device("h200-141gb")
    assert h200.memory_bytes == 143771 * 2**20 and h200.memory_bandwidth == 4.8e12
    assert device_for_cluster(load_cluster(CLUSTERS / "dgx-h200-141gb.json")) == h200
    assert find_device("h100").name == "H100-SXM5-80GB"  # the H100's aliases stay the H100's


def test_the_h200_is_the_h100_die_with_another_memory():
    """Every figure but the memory's is the H100's measured one, its source saying so; the memory's are the
    H200's own."""
    h100, h200 = get_device("H100-SXM5-80GB"), get_device("H200-SXM-141GB")
    for field in type(h200).model_fields:
        if field not in OWN:
            assert getattr(h200, field) == getattr(h100, field), field
    assert h200.sources["gemm_efficiency"] == f'as the H100-SXM5-80GB ("like"): {h100.sources["gemm_efficiency"]}'
    assert "HBM3e" in h200.sources["memory"] and "4.8 TB/s" in h200.sources["memory"]
    assert "700 W" in h200.sources["power"]


def test_like_takes_a_shipped_description_and_names_an_unknown_one(tmp_path):
    own = {"name": "A100-test", "like": "A100-SXM4-80GB", "memory_bytes": 2**30, "sources": {"memory": "a test"}}
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(own))
    dev, a100 = load_device(path), get_device("A100-SXM4-80GB")
    assert dev.memory_bytes == 2**30 and dev.aliases == [] and dev.peak_flops == a100.peak_flops
    assert dev.sources["memory"] == "a test"
    path.write_text(json.dumps({**own, "like": "no-such-gpu"}))
    with pytest.raises(ValueError, match="like: 'no-such-gpu' is not a shipped device"):
        load_device(path)


def test_the_h200_runs_gemms_as_the_h100_and_memory_bound_kernels_faster():
    h100, h200 = get_device("H100-SXM5-80GB"), get_device("H200-SXM-141GB")
    m = n = k = 8192
    gemm = (2.0 * m * n * k, 2.0 * (m * k + k * n + m * n))
    assert h200.kernel_time(*gemm, gemm=(m, n, k, 1), dtype="bf16") == h100.kernel_time(*gemm, gemm=(m, n, k, 1),
                                                                                             dtype="bf16")
    copy = (0.0, 2.0 * 2**30)  # a memory-bound kernel moving 2 GiB, its launch apart
    launch = h100.kernel_overhead_s
    assert h200.kernel_overhead_s == launch
    assert h200.kernel_time(*copy) - launch == pytest.approx((h100.kernel_time(*copy) - launch) * 3.35 / 4.8, rel=1e-9)


def test_the_h200s_memory_holds_what_the_h100s_cannot():
    """GPT-2 1.3B data parallel on 8 GPUs, micro-batch 32 without recomputation: out of memory on 80 GiB, it fits
    in 140 and runs no slower than a smaller micro-batch does on the H100."""
    config = Config(tensor=1, pipeline=1, data=8, micro_batch=32, schedule="1f1b", recompute=False)
    got = {}
    for name in ("dgx-h100-80gb", "dgx-h200-141gb"):
        cluster = load_cluster(CLUSTERS / f"{name}.json")
        profile = analytic_profile(PRESETS["gpt2-1.3b"], device_for_cluster(cluster))
        got[name] = predict(profile, cluster, TrainingRequest(global_batch=256, gpus=8), config)
    h100, h200 = got["dgx-h100-80gb"], got["dgx-h200-141gb"]
    assert "out of memory" in h100.reason or "do not fit" in h100.reason
    assert h200.reason == "" and 80 * 2**30 < max(h200.memory) < 143771 * 2**20
    assert h200.iteration_time > 0


def test_shipped_devices_read_as_each_file_alone_and_like_looks_up_the_bases_given(tmp_path):
    """``shipped_devices`` reads each file once and resolves ``like`` against the stand-alone descriptions it
    has read: the same descriptions as loading each file by itself. ``load_device(..., bases)`` takes the base
    from ``bases`` (a changed H100 there is what a ``like`` file inherits)."""
    from planner.device import DEVICES_DIR, shipped_devices

    paths = sorted(DEVICES_DIR.glob("*.json"))
    assert list(shipped_devices()) == [load_device(p) for p in paths]
    h100 = get_device("H100-SXM5-80GB")
    changed = h100.model_copy(update={"kernel_overhead_s": 7e-6})
    path = tmp_path / "like.json"
    path.write_text(json.dumps({"like": "h100", "name": "Like-H100"}))
    assert load_device(path, (changed,)).kernel_overhead_s == 7e-6
    assert load_device(path).kernel_overhead_s == h100.kernel_overhead_s
    path.write_text(json.dumps({"like": "v100", "name": "x"}))
    with pytest.raises(ValueError, match="like: 'v100' is not a shipped device"):
        load_device(path, (changed,))  # only the bases given are looked in
