"""pipeplan profile --tensor: each layer's tensor-parallel shard timed on one device into tensor_times."""

from __future__ import annotations

import pytest

import executor.tensor_parallel as tp
from executor.models import get_config
from profiler.run import profile_model


def test_profile_with_tensor_times() -> None:
    cfg = get_config("gpt-tiny").with_(seq=8)
    real_dist = tp.dist
    prof = profile_model(cfg, micro_batches=[1, 2], tensor=[1, 2, 4], repeats=1, warmup=0, threads=1)
    assert tp.dist is real_dist  # the collectives are back after profiling
    assert prof.tensor_sizes == [1, 2, 4]
    assert prof.environment["tensor"] == "1,2,4" and "tensor_times" in prof.notes
    for layer in prof.layers:
        assert layer.tensor_times is not None and set(layer.tensor_times) == {1, 2, 4}
        for st in layer.tensor_times.values():
            assert st.source == "measured" and set(st.fwd_time) == {1, 2}
            assert all(v > 0 for v in st.fwd_time.values()) and all(v > 0 for v in st.bwd_time.values())
        if layer.kind == "transformer":
            full = layer.tensor_times[1]
            assert full.fwd_time == layer.fwd_time  # t = 1 is the layer itself
            # the shard stashes less: its attention and MLP activations are split t ways
            s1, s2, s4 = (layer.tensor_times[t].stashed_bytes_per_sample for t in (1, 2, 4))
            assert s1 is not None and s2 is not None and s4 is not None and s1 > s2 > s4
        else:  # replicated by the executor: the same at every t
            assert layer.tensor_times[4].fwd_time == layer.fwd_time
    assert prof.layers[0].shard_time("fwd", 1, 2) == prof.layers[0].time("fwd", 1)

    # the planner uses the measured shard times at t = 2 and says so
    from planner.cluster import Cluster, Link
    from planner.request import Config, TrainingRequest
    from planner.search import predict

    link = Link(alpha=5e-5, beta=5e-10)
    cl = Cluster(name="local", nodes=1, gpus_per_node=4, device="cpu", memory_bytes=2**34, peak_flops=1e11,
                 intra=link, inter=link)
    cand = predict(prof, cl, TrainingRequest(global_batch=2), Config(tensor=2, pipeline=1, data=1, micro_batch=2,
                                                                       schedule="1f1b"))
    assert cand.to_dict()["compute"] == "per-t measured"


def test_tensor_sizes_must_split_the_heads() -> None:
    with pytest.raises(ValueError, match="--tensor: t=3"):
        profile_model("gpt-tiny", micro_batches=[1], tensor=[1, 3], repeats=1, warmup=0)


def test_cli_profile_tensor_bad_value(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from typer.testing import CliRunner

    from pipeplan.cli import app

    r = CliRunner().invoke(app, ["profile", "--model", "gpt-tiny", "--micro-batches", "1", "--tensor", "0",
                                 "--out", str(tmp_path / "p.json")])
    assert r.exit_code == 2 and "--tensor" in r.output
