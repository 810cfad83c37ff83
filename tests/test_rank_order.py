"""The rank order (planner.placement): the two orders' ranks, where they differ, the enumeration, the costs that
follow the order (pipeline links, gradient reduction, expert all-to-alls) and the search's bounds across orders and
expert-parallel sizes."""

from __future__ import annotations

from collections import Counter

import pytest
from moe_support import FLASH, H100, MIXTRAL, h100_cluster
from pydantic import ValidationError

from planner.analytic import analytic_profile
from planner.cost import allreduce_time, alltoall_time
from planner.enumeration import enumerate_configs
from planner.model import PRESETS
from planner.placement import ORDERS, coords, global_rank, orders_differ
from planner.request import Config, TrainingRequest
from planner.search import Planner, predict


@pytest.fixture(scope="module")
def h100():
    return h100_cluster()


@pytest.fixture(scope="module")
def mixtral():
    return analytic_profile(MIXTRAL, H100, micro_batches=(1, 2), tensor_sizes=(1, 2), options=FLASH)


@pytest.fixture(scope="module")
def gpt2(h100):
    return analytic_profile(PRESETS["gpt2-medium"], H100, micro_batches=(1, 2, 4), tensor_sizes=(1, 2))


def test_megatron_default_order_is_its_docstring_example():
    """Megatron-LM's initialize_model_parallel, 16 GPUs, t = 2, D = 4: data-parallel groups [g0, g2], [g1, g3], ...,
    pipeline groups [g0, g4, g8, g12], ...; the other order keeps a pipeline contiguous."""
    D, W, t = 4, 2, 2
    dp = sorted(sorted(global_rank("tp-dp-pp", d, w, k, D, W, t) for w in range(W)) for d in range(D) for k in range(t))
    assert dp == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
    assert [global_rank("tp-dp-pp", d, 0, 0, D, W, t) for d in range(D)] == [0, 4, 8, 12]
    assert [global_rank("tp-pp-dp", d, 0, 0, D, W, t) for d in range(D)] == [0, 2, 4, 6]
    assert [global_rank("tp-pp-dp", 0, w, 0, D, W, t) for w in range(W)] == [0, 8]
    for order in ORDERS:
        seen = {global_rank(order, d, w, k, D, W, t): (d, w, k) for d in range(D) for w in range(W) for k in range(t)}
        assert sorted(seen) == list(range(16))
        assert all(coords(order, r, D, W, t) == dwk for r, dwk in seen.items())


def test_where_the_orders_differ():
    assert not orders_differ(1, 1, 64, 8) and not orders_differ(1, 64, 1, 8)  # the same ranks
    assert not orders_differ(8, 4, 4, 8) and not orders_differ(16, 2, 2, 8)  # whole nodes per (device, replica)
    assert not orders_differ(1, 2, 4, 8)  # one node
    assert orders_differ(1, 4, 4, 8) and orders_differ(4, 2, 2, 8)


def test_enumeration_tries_both_orders_where_they_differ(h100):
    req = TrainingRequest(global_batch=64, gpus=32)
    configs = enumerate_configs(24, h100, req, Counter(), heads=16)
    orders: dict[tuple[int, int, int], set[str]] = {}
    for c in configs:
        orders.setdefault((c.tensor, c.pipeline, c.data), set()).add(c.order)
    for (t, D, W), got in orders.items():
        assert got == (set(ORDERS) if orders_differ(t, D, W, 8) else {"tp-pp-dp"}), (t, D, W)
    assert orders[(1, 4, 8)] == set(ORDERS)
    only = enumerate_configs(24, h100, req.model_copy(update={"rank_order": "tp-dp-pp"}), Counter(), heads=16)
    assert {c.order for c in only} == {"tp-dp-pp"}
    assert len(only) == len({c for c in configs if c.order == "tp-pp-dp"})


def test_the_order_is_in_the_label_and_record_only_where_not_the_default():
    c = Config(tensor=1, pipeline=2, data=4, micro_batch=1, schedule="1f1b")
    assert "order" not in c.model_dump() and "ranks=" not in c.label()
    o = c.model_copy(update={"order": "tp-dp-pp"})
    assert o.model_dump()["order"] == "tp-dp-pp" and o.label().endswith("ranks=tp-dp-pp")
    with pytest.raises(ValidationError, match="order"):
        Config(tensor=1, pipeline=2, data=4, micro_batch=1, schedule="1f1b", order="dp-pp-tp")
    with pytest.raises(ValidationError, match="rank_order"):
        TrainingRequest(global_batch=8, rank_order="pp")


def test_links_and_reduction_follow_the_order(h100, gpt2):
    """t = 1, D = 4, W = 8 on 8-GPU nodes: with the pipeline inside data parallelism a replica's pipeline is in one
    node and a stage's 8 copies on 8 nodes; with the pipeline outermost the other way round."""
    req = TrainingRequest(global_batch=64, gpus=32)
    base = dict(tensor=1, pipeline=4, data=8, micro_batch=1, schedule="1f1b")
    inner = predict(gpt2, h100, req, Config(**base))
    outer = predict(gpt2, h100, req, Config(**base, order="tp-dp-pp"))
    a, b = inner.costs, outer.costs
    assert a is not None and b is not None
    assert [a.link_class(0, d) for d in range(1, 4)] == ["intra"] * 3
    assert [b.link_class(0, d) for d in range(1, 4)] == ["inter"] * 3
    assert a.p2p("SEND_F", 0, 1, 0, 1) < b.p2p("SEND_F", 0, 1, 0, 1)
    nbytes = a.stages[1].param_bytes
    assert a.allreduce(1, 0, 1) == pytest.approx(allreduce_time(h100, [1 + 4 * w for w in range(8)], nbytes))
    assert b.allreduce(1, 0, 1) == pytest.approx(allreduce_time(h100, [8 + w for w in range(8)], nbytes))
    assert b.allreduce(1, 0, 1) < a.allreduce(1, 0, 1) / 3
    assert inner.iteration_time != outer.iteration_time
    assert "data parallel, then pipeline" in outer.to_dict()["placement"] and outer.to_dict()["order"] == "tp-dp-pp"


def test_expert_groups_stay_in_a_node_with_the_pipeline_outermost(h100, mixtral):
    req = TrainingRequest(global_batch=64, gpus=32)
    base = dict(tensor=1, pipeline=4, data=8, expert=8, micro_batch=1, schedule="1f1b")
    a = predict(mixtral, h100, req, Config(**base)).costs
    b = predict(mixtral, h100, req, Config(**base, order="tp-dp-pp")).costs
    assert a is not None and b is not None
    nbytes = 1 * 4096 * 2 * 4096 * 2  # T k h el
    layers = a.stages[0].moe_layers
    assert b.ep_comm(0, 1) == pytest.approx(2 * layers * alltoall_time(h100, list(range(8)), nbytes))
    assert a.ep_comm(0, 1) == pytest.approx(2 * layers * alltoall_time(h100, [4 * w for w in range(8)], nbytes))
    assert b.ep_comm(0, 1) < a.ep_comm(0, 1) / 3


def test_bounds_hold_for_every_order_and_expert_size(h100, mixtral):
    """Every configuration evaluated in the search's order, with the caches one search shares: its lower bound is at
    most its time. (The bounds' per-stage work was once cached without e: the first e's all-to-alls bounded the
    others, and the pruned search lost rows.)"""
    req = TrainingRequest(global_batch=64, gpus=32, schedules=["1f1b", "zb-h1", "interleaved"])
    p = Planner(mixtral, h100, req)
    seen = Counter()
    for cfg in p.configs(Counter()):
        cand, costs = p.prepare(cfg)
        if costs is None:
            continue
        p.refine(cand, costs)
        p.evaluate(cand, costs)
        if cand.iteration_time:
            seen[(cfg.expert, cfg.order)] += 1
            assert cand.lower_bound <= cand.iteration_time * (1 + 1e-9), cfg.label()
    assert {e for e, _ in seen} == {1, 2, 4, 8} and {o for _, o in seen} == set(ORDERS)


def test_pruned_search_across_orders_is_exact(h100, mixtral):
    req = TrainingRequest(global_batch=64, gpus=32, top=8, schedules=["1f1b", "zb-h1", "interleaved"])
    pruned = Planner(mixtral, h100, req).search()
    full = Planner(mixtral, h100, req).search(prune=False)
    assert [(c.config, c.iteration_time) for c in pruned.candidates] == \
        [(c.config, c.iteration_time) for c in full.candidates]
    assert "tp-dp-pp" in {c.config.order for c in full.candidates}
