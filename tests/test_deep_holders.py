""":meth:`planner.cost.ConfigCosts.holders`, read once per stage and placement: the devices holding a
stage's copies, as the all-reduce read them from the placement on every call; another schedule brought by
``use_schedule`` is read again."""

from __future__ import annotations

from planner.analytic import transformer_profile
from planner.cluster import Cluster, Link
from planner.cost import ConfigCosts
from planner.model import PRESETS
from planner.request import Config, TrainingRequest
from planner.schedules import build


def cluster() -> Cluster:
    return Cluster(name="c", nodes=4, gpus_per_node=8, device="X", memory_bytes=80 * 2**30, peak_flops=100e12,
                   intra=Link(alpha=1e-6, beta=1e-11), inter=Link(alpha=1e-5, beta=1e-10))


def test_holders_follow_the_placement() -> None:
    spec = PRESETS["gpt2-medium"]
    prof = transformer_profile("m", spec.layers, spec.hidden, spec.heads, spec.seq, spec.vocab, 100e12, "X")
    D, n = 8, len(prof.layers)
    bounds = [(k * n // D, (k + 1) * n // D) for k in range(D)]
    cfg = Config(tensor=1, pipeline=D, data=2, micro_batch=2, schedule="chimera", pipelines=2, concat="direct")
    sched = build("chimera", D, 8, pipelines=2)
    costs = ConfigCosts(prof, cluster(), TrainingRequest(global_batch=32), cfg, sched, bounds)
    for s in range(D):
        want = tuple(sorted({row[s] for row in sched.placement}))
        assert costs.holders(s) == want and len(want) == 4
        assert costs.holders(s) is costs.holders(s)  # read once
        first = costs.allreduce(s, 0, want[0])
        assert costs.allreduce(s, 0, want[0]) == first
    # another placement (a 1F1B schedule's: each stage on one device) is read again, not taken from the cache
    other = build("1f1b", D, 8)
    costs.use_schedule(other)
    assert [costs.holders(s) for s in range(D)] == [(s,) for s in range(D)]
