"""Shared by the tests that check the search's pruning against simulation (test_search.py, test_calibrate.py), and
the cost model of one configuration (:func:`config_costs`: test_shard_parameters.py, test_contention.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from planner.runspec import schedule_microbatches
from planner.schedules import inflight_exact
from planner.search import Planner


def simulated_with_bounds(planner: Planner) -> Iterator[tuple[Any, Any, Any, float | None]]:
    """Every configuration of ``planner`` that fits and simulates, as ``(config, candidate, costs,
    warmup_bound)``: the candidate evaluated (its ``lower_bound`` and ``iteration_time`` set), and for a merged
    schedule (Chimera, Hanayo) the prefix bound of its replayed warm-up, None where there is none."""
    for cfg in planner.configs(Counter()):
        cand, costs = planner.prepare(cfg)
        if costs is None:
            continue
        warmup_bound = None
        if not inflight_exact(cfg.schedule):
            n = schedule_microbatches(cfg, cand.microbatches)
            rejected, warmup = planner.memory_of(cfg).too_big_before_merge(cand, costs, n)
            if not rejected and warmup is not None:
                warmup_bound = planner.bounds.prefix_bound(costs, warmup)
        planner.evaluate(cand, costs)
        if cand.simulation is not None:
            yield cfg, cand, costs, warmup_bound


def config_costs(profile: Any, cluster: Any, config: Any, request: Any) -> Any:
    """The :class:`planner.cost.ConfigCosts` the search prices ``config`` with (it must fit)."""
    cand, costs = Planner(profile, cluster, request).prepare(config)
    assert costs is not None, cand.reason
    return costs
