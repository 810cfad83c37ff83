"""What an overlapped collective takes from the compute beside it (:mod:`planner.contention`): NCCL's channels hold
SMs while a collective runs, so FSDP's prefetched gathers and scatters, PyTorch DDP's bucketed all-reduce and
Megatron-Core's overlapped reduce-scatter / all-gather slow the compute they hide under; a device without a
channel count (CPUs, V100/P100) is charged nothing, and runs that overlap nothing do not change."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from search_support import config_costs

from planner import fsdp
from planner.analytic import analytic_profile
from planner.cluster import load_cluster
from planner.contention import collective_share, overlapped
from planner.cost import DDP_BUCKET_BYTES, allreduce_time
from planner.device import DeviceSpec, get_device
from planner.model import PRESETS
from planner.request import Config, TrainingRequest
from planner.search import predict

ROOT = Path(__file__).resolve().parent.parent
A100 = ROOT / "examples" / "clusters" / "dgx-a100-80gb.json"


def test_the_rule():
    """``max(comm, compute + share comm)``: the ideal overlap at share 0; compute-bound, the compute is
    stretched by share x comm; link-bound (the collective outlasts even the slowed compute), the collective."""
    assert overlapped(10.0, 4.0, 0.0) == 10.0 and overlapped(3.0, 4.0, 0.0) == 4.0
    assert overlapped(10.0, 4.0, 0.25) == pytest.approx(11.0)
    assert overlapped(3.0, 8.0, 0.25) == 8.0  # 3 s of compute at 0.75 ends at 4 s, before the collective
    assert overlapped(3.0, 3.5, 0.25) == pytest.approx(3.875)  # the compute outlasts it, slowed for 3.5 s
    assert overlapped(5.0, 0.0, 0.5) == 5.0
    shares = [overlapped(6.0, 5.0, s) for s in (0.0, 0.1, 0.2, 0.4)]
    assert shares == sorted(shares) and shares[0] < shares[-1]


def test_the_share_is_the_collectives_channels_over_the_sms():
    """24 NCCL channels (the device files' source) on 108 A100 SMs and 132 H100 SMs; none where the file gives
    no channel count or no SM count."""
    assert collective_share(get_device("A100-SXM4-80GB")) == pytest.approx(24 / 108)
    assert collective_share(get_device("A100-SXM4-40GB")) == pytest.approx(24 / 108)
    assert collective_share(get_device("H100-SXM5-80GB")) == pytest.approx(24 / 132)
    assert collective_share(get_device("V100-SXM2-32GB")) == 0.0
    assert collective_share(get_device("cpu")) == 0.0
    assert collective_share(None) == 0.0
    dev = get_device("A100-SXM4-80GB")
    assert "collective_efficiency.channels" in dev.sources
    doc = json.loads(dev.model_dump_json())
    doc["collective_efficiency"]["channels"] = 0
    with pytest.raises(ValidationError, match="channels"):
        DeviceSpec.model_validate(doc)


def _without_channels(tmp_path: Path, device: str = "A100-SXM4-80GB") -> Path:
    """The shipped device description with no channel count (no contention charged), as a file a cluster's
    ``device`` can name."""
    doc = json.loads(get_device(device).model_dump_json())
    doc["collective_efficiency"]["channels"] = None
    doc["name"], doc["aliases"] = device + "-nochannels", []
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(doc))
    return path


@pytest.fixture(scope="module")
def gpt2():
    return analytic_profile(PRESETS["gpt2-1.3b"], "A100-SXM4-80GB", micro_batches=(1, 4), tensor_sizes=(1,),
                            dp_allreduce="overlapped")


def test_fsdp_compute_pays_for_the_gathers_it_hides(gpt2, tmp_path):
    """Without a pipeline each F hides all gathers but the first: compute-bound, it is stretched by exactly
    share x those gathers (and the B by share x its gathers and scatters); the same cluster whose device has no
    channel count predicts the ideal overlap, so the iteration is faster there."""
    cl = load_cluster(A100)
    bare = cl.model_copy(update={"device": str(_without_channels(tmp_path))})
    cfg = Config(tensor=1, pipeline=1, data=8, micro_batch=4, schedule="1f1b")
    req = TrainingRequest(global_batch=64, shard_parameters=True)
    with_share, ideal = config_costs(gpt2, cl, cfg, req), config_costs(gpt2, bare, cfg, req)
    assert with_share.comm_share == pytest.approx(24 / 108) and ideal.comm_share == 0.0
    gathers, scatters = with_share.fsdp_layers(0)
    assert ideal.fsdp_layers(0) == (gathers, scatters)  # the collectives themselves do not change
    hidden_f = sum(gathers[1:])
    hidden_b = sum(gathers[:-1]) + sum(scatters[1:])
    assert ideal.fwd(0) > hidden_f and ideal.bwd(0) > hidden_b  # compute-bound at this size
    assert with_share.fwd(0) - ideal.fwd(0) == pytest.approx(24 / 108 * hidden_f)
    assert with_share.bwd(0) - ideal.bwd(0) == pytest.approx(24 / 108 * hidden_b)
    assert with_share.fwd(0) == pytest.approx(
        fsdp.forward_time(config_costs(gpt2, cl, cfg, TrainingRequest(global_batch=64)).fwd(0), gathers,
                          copies=with_share.fsdp_copies(0), share=24 / 108))
    slow, fast = predict(gpt2, cl, req, cfg), predict(gpt2, bare, req, cfg)
    assert slow.iteration_time > fast.iteration_time
    assert slow.breakdown["fsdp_in_compute"] > fast.breakdown["fsdp_in_compute"]


def test_ddps_overlapped_all_reduce_slows_the_backward_it_hides_under(gpt2, tmp_path):
    """PyTorch DDP on a one-stage pipeline: of the all-reduce, the buckets before the last one run beside the
    backward and stretch it by share x their time; the last bucket is left after it, as before."""
    cl = load_cluster(A100)
    bare = cl.model_copy(update={"device": str(_without_channels(tmp_path))})
    cfg = Config(tensor=1, pipeline=1, data=16, micro_batch=4, schedule="1f1b")
    req = TrainingRequest(global_batch=64)
    with_share, ideal = config_costs(gpt2, cl, cfg, req), config_costs(gpt2, bare, cfg, req)
    ranks = [with_share.rank(0, w) for w in range(16)]
    nbytes = with_share.stages[0].param_bytes
    whole = allreduce_time(cl, ranks, nbytes)
    bucket = allreduce_time(cl, ranks, min(nbytes, DDP_BUCKET_BYTES))
    assert whole - bucket < with_share.bwd(0)  # hidden under the backward
    assert ideal.allreduce(0, 0, 0) == pytest.approx(bucket)
    assert with_share.allreduce(0, 0, 0) == pytest.approx(bucket + 24 / 108 * (whole - bucket))


def test_nothing_overlapped_nothing_changes(tmp_path):
    """Megatron's all-reduce after the backward and a plan without data parallelism overlap no collective with
    compute: the same prediction with and without the channel count."""
    cl = load_cluster(A100)
    bare = cl.model_copy(update={"device": str(_without_channels(tmp_path))})
    prof = analytic_profile(PRESETS["gpt2-1.3b"], "A100-SXM4-80GB", micro_batches=(4,), tensor_sizes=(1, 2))
    for cfg in (Config(tensor=1, pipeline=1, data=16, micro_batch=4, schedule="1f1b"),
                Config(tensor=2, pipeline=4, data=1, micro_batch=4, schedule="1f1b")):
        req = TrainingRequest(global_batch=64)
        assert predict(prof, cl, req, cfg).iteration_time == pytest.approx(
            predict(prof, bare, req, cfg).iteration_time, rel=1e-12)


def test_the_simulator_charges_eager_all_reduces_what_they_take_from_the_compute_after_them():
    """Chimera's eager all-reduces (section 3.2) run on the collective stream while the device computes its
    other stage: both replays delay the device's compute after the post by share x the all-reduce (or the
    compute left, if shorter), the same figures from the compute-only and the lowered lists; all-reduces at
    the end overlap no compute, so a 1F1B schedule does not change."""
    from planner.schedules import build, lower
    from planner.schedules.ir import builder_eager
    from planner.schedules.replay import replay_lowered
    from planner.schedules.timing import UnitCosts, contention_debt
    from planner.simulate import simulate

    assert contention_debt(0.25, 3.0, 10.0) == 0.75 and contention_debt(0.25, 3.0, 2.0) == 0.5
    assert contention_debt(0.0, 3.0, 10.0) == 0.0 and contention_debt(0.25, 3.0, 0.0) == 0.0
    sched = build("chimera", 4, 8)
    eager = builder_eager(sched)
    assert eager not in ("none", [])  # it does post some all-reduces early
    ideal = UnitCosts(1, 2, allreduce_time=3, step_time=0.5)
    shared = UnitCosts(1, 2, allreduce_time=3, step_time=0.5)
    shared.comm_share = 0.25
    a, b = simulate(sched, ideal), simulate(sched, shared)
    assert b == replay_lowered(lower(sched, eager=eager), shared)
    early = max(sum(1 for act, _, _ in row if act.kind == "ALLREDUCE") - 1 for row in b.timeline)
    assert a.makespan < b.makespan <= a.makespan + early * 0.25 * 3 + 1e-9
    assert any(bd.compute_end > ad.compute_end for ad, bd in zip(a.devices, b.devices, strict=True))
    one = build("1f1b", 4, 8)
    plain = UnitCosts(1, 2, allreduce_time=3)
    busy = UnitCosts(1, 2, allreduce_time=3)
    busy.comm_share = 0.25
    assert simulate(one, busy) == simulate(one, plain)
