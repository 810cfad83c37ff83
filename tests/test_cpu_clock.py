"""CPU profiles and the shared-host model count the machine's load once (issue 11): profiles are core time
(:mod:`profiler.timing`), the host's slowdown is wall per CPU second (:mod:`profiler.local_cluster`), and
the executor records each action kind's CPU time beside its wall time (:mod:`executor.trace`)."""

from __future__ import annotations

import time

import pytest
import torch

from executor.trace import summarize
from profiler.local_cluster import round_slowdowns
from profiler.timing import cpu_clock, time_op


def test_one_thread_profiles_core_time_not_waiting() -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert cpu_clock()[0] == "thread CPU time"
        # a wait uses no core: its core time is (nearly) nothing, whatever the wall clock says
        t = time_op(lambda: None, lambda _s: time.sleep(0.05), torch.device("cpu"), warmup=0, repeats=3)
        assert t.median < 0.025
        torch.set_num_threads(2)
        assert cpu_clock()[0] == "wall"  # other threads' work is not in the caller's CPU time
    finally:
        torch.set_num_threads(before)


def test_profile_says_its_clock() -> None:
    from executor.models import get_config
    from profiler.run import profile_model

    cfg = get_config("gpt-tiny").with_(hidden=8, heads=1, seq=2, vocab=8, layers=1)
    prof = profile_model(cfg, micro_batches=[1], threads=1, repeats=1, warmup=0)
    assert prof.environment["clock"] == "thread CPU time"


def test_host_slowdown_is_wall_per_cpu_second() -> None:
    # two processes, two rounds: (alone wall, together wall, together CPU) per repetition
    got = {0: [(1.0, 4.0, 1.0), (1.0, 3.0, 1.0)], 1: [(0.0, 2.0, 1.0), (0.0, 3.0, 1.5)]}
    assert round_slowdowns(got, 2, 2) == [pytest.approx(3.0), pytest.approx(2.5)]


def test_cpu_by_kind_per_rank_and_iteration() -> None:
    def payload(rank: int, f_cpu: float) -> dict:  # type: ignore[type-arg]
        rec = [("0F0", "F", 0.0, 1.0), ("1RECV_B0", "RECV_B", 1.0, 1.5), ("STEP", "STEP", 1.5, 2.0)]
        return {"rank": rank, "device": rank, "data": 0, "tensor": 0, "records": [rec, rec], "peak_alive": 1,
                "cpu_by_kind": [{"F": 9.0, "RECV_B": 9.0}, {"F": f_cpu, "RECV_B": 0.1, "STEP": 0.2}]}

    m = summarize([payload(0, 0.4), payload(1, 0.6)], warmup=1, emulated=False)
    assert m["cpu_by_kind"] == {"F": pytest.approx(0.5), "RECV": pytest.approx(0.1), "STEP": pytest.approx(0.2)}
    old = payload(0, 0.4)
    del old["cpu_by_kind"]
    assert summarize([old], warmup=1, emulated=False)["cpu_by_kind"] is None
