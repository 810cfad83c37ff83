"""How much does Megatron-LM 2021's paired blocking p2p (a rendezvous) cost? A one-off check for issue 11.

Run: ``python benchmarks/rendezvous_check.py``.

Megatron-LM 2021 (``megatron/p2p_communication.py``, ``_communicate``) posts a step's sends and receives
together with ``torch.distributed.batch_isend_irecv``, waits for all of them and synchronizes the device; a
send completes only once its peer has posted the matching receive. ``megatron/schedules.py`` groups them
so: without interleaving, ``recv_forward``; F; ``send_forward`` (warm-up), then F; ``send_forward_recv_
backward``; B; ``send_backward_recv_forward`` (steady), then ``recv_backward``; B; ``send_backward``
(cool-down); with interleaving, F; ``send_forward_recv_forward`` in the warm-up (the last one also
receives the first gradient), F; B; one ``send_forward_backward_recv_forward_backward`` per steady step,
B; ``send_backward_recv_backward`` in the cool-down, the last device sending on to the first (chunk c+1).

This script replays exactly those call sequences, once with every call a rendezvous (a call ends when
each of its messages has been posted by both ends, plus the transfer, plus the all-gather of a received
scatter/gather chunk) and once with sends that leave when posted, using the durations of the planner's
own cost model (:class:`planner.cost.ConfigCosts`, without the blocking send it adds) for Table 2's
175B and 530B rows and figure 13's (t, p) = (4, 16) and (8, 8) at B = 128. The difference is the
rendezvous' cost. It is a transcription of Megatron's call order for this check only: the planner's
schedules and replay (``planner/schedules``) stay the one description the simulator and executor share.

Measured (simulated seconds, deterministic): 175B d=4 +0.12, d=16 +0.03; 530B d=2 +0.50, d=8 +0.13;
figure 13 t4p16 +0.05, t8p8 +0.05 -- 0.15-0.3% of the iteration, not the 1.3-2.9 s per
iteration that Table 2's fit T(d) = A/d + C leaves unexplained, and the same for both sides of figure 13.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from planner.cluster import load_cluster  # noqa: E402
from planner.cost import ConfigCosts, ring_allgather  # noqa: E402
from planner.device import get_device  # noqa: E402
from planner.fidelity import (  # noqa: E402
    PublishedRun,
    _MegatronSplit,
    load_tables,
    run_cluster,
    run_profile,
    table_runs,
)
from planner.request import Config, TrainingRequest  # noqa: E402
from planner.search import Candidate  # noqa: E402

Call = tuple[float, frozenset[str]]  # compute before the call, and its ops: sn/sp send next/prev, rp/rn receive
PEER = {"sn": (1, "rp"), "rp": (-1, "sn"), "sp": (-1, "rn"), "rn": (1, "sp")}


def interleaved_calls(p: int, v: int, m: int, fwd: list[list[float]], bwd: list[list[float]]) -> list[list[Call]]:
    """Megatron 2021 ``forward_backward_pipelining_with_interleaving``: per device, (compute, ops) calls."""
    total = m * v

    def chunk(k: int, forward: bool) -> int:
        c = (k % (p * v)) // p
        return c if forward else v - 1 - c

    out = []
    for r in range(p):
        first, last = r == 0, r == p - 1
        warm = total if m == p else min((p - r - 1) * 2 + (v - 1) * p, total)
        rem = total - warm
        calls: list[Call] = [(0.0, frozenset() if first else frozenset({"rp"}))]
        for k in range(warm):
            c = chunk(k, True)
            ops = set() if (last and c == v - 1) else {"sn"}
            if not ((first and chunk(k + 1, True) == 0) or k == total - 1):
                ops.add("rp")
            if k == warm - 1 and rem > 0 and not last:
                ops.add("rn")
            calls.append((fwd[r][c], frozenset(ops)))
        for k in range(rem):
            cf, cb = chunk(warm + k, True), chunk(k, False)
            ops = set()
            if not (last and cf == v - 1):
                ops.add("sn")
            if not (first and cb == 0):
                ops.add("sp")
            recv_prev = not (first and chunk(warm + k - (p - 1), True) == v - 1) and k != rem - 1
            recv_next = not (last and chunk(k - (p - 1), False) == 0)
            ops |= {"rp"} if recv_prev else set()
            ops |= {"rn"} if recv_next else set()
            calls.append((fwd[r][cf] + bwd[r][cb], frozenset(ops)))
        for k in range(rem, total):
            cb = chunk(k, False)
            ops = set() if (first and cb == 0) else {"sp"}
            if not ((last and chunk(k + 1, False) == v - 1) or k == total - 1):
                ops.add("rn")
            calls.append((bwd[r][cb], frozenset(ops)))
        out.append(calls)
    return out


def one_f_one_b_calls(p: int, m: int, fwd: list[float], bwd: list[float]) -> list[list[Call]]:
    """Megatron 2021 ``forward_backward_pipelining_without_interleaving``: per device, (compute, ops) calls."""
    out = []
    for r in range(p):
        first, last = r == 0, r == p - 1
        recv_f = frozenset() if first else frozenset({"rp"})
        warm = min(p - r - 1, m)
        rem = m - warm
        calls: list[Call] = []
        for _ in range(warm):
            calls += [(0.0, recv_f), (fwd[r], frozenset() if last else frozenset({"sn"}))]
        if rem > 0:
            calls.append((0.0, recv_f))
        for i in range(rem):
            calls.append((fwd[r], frozenset() if last else frozenset({"sn", "rn"})))
            ops = set() if first else {"sp"}
            if i != rem - 1 and not first:
                ops.add("rp")
            calls.append((bwd[r], frozenset(ops)))
        for _ in range(warm):
            calls += [(0.0, frozenset() if last else frozenset({"rn"})),
                      (bwd[r], frozenset() if first else frozenset({"sp"}))]
        out.append(calls)
    return out


def replay(calls: list[list[Call]], transfer: float, gather: float, rendezvous: bool) -> float:
    """End of the last call of any device. The n-th ``sn`` of device r meets the n-th ``rp`` of device
    r+1 (mod p: the interleaved schedule's last device sends on to the first), likewise ``sp``/``rn``."""
    p = len(calls)
    nth: dict[tuple[int, str], list[int]] = {}
    rank: dict[tuple[int, str, int], int] = {}
    for r, row in enumerate(calls):
        for kind in PEER:
            nth[(r, kind)] = [i for i, (_, ops) in enumerate(row) if kind in ops]
            for n, i in enumerate(nth[(r, kind)]):
                rank[(r, kind, i)] = n
    posted: list[list[float | None]] = [[None] * len(row) for row in calls]
    ptr, clock = [0] * p, [0.0] * p
    moved = True
    while moved:
        moved = False
        for r in range(p):
            while ptr[r] < len(calls[r]):
                i = ptr[r]
                work, ops = calls[r][i]
                mine = posted[r][i]
                if mine is None:
                    mine = posted[r][i] = clock[r] + work
                end, ready = mine, True
                for kind in ops:
                    step, other = PEER[kind]
                    q = (r + step) % p
                    theirs = posted[q][nth[(q, other)][rank[(r, kind, i)]]]
                    receive = kind in ("rp", "rn")
                    if theirs is None and (receive or rendezvous):
                        ready = False
                        break
                    start = max(mine, theirs) if rendezvous else (theirs if receive else mine)
                    end = max(end, start + transfer + (gather if receive else 0.0))
                if not ready:
                    break
                clock[r] = end
                ptr[r] += 1
                moved = True
    if ptr != [len(row) for row in calls]:
        raise RuntimeError("the call sequences deadlock")
    return max(clock)


def costs_of(run: PublishedRun, chunks: int, base, dev) -> tuple[Candidate, ConfigCosts]:
    prof = run_profile(run, dev, (1,))
    req = TrainingRequest(global_batch=run.batch, gpus=run.gpus, max_tensor=run.t)
    cfg = Config(tensor=run.t, pipeline=run.p, data=run.d, micro_batch=1, recompute=True,
                 schedule="interleaved" if chunks > 1 else "1f1b", chunks=chunks if chunks > 1 else None)
    planner = _MegatronSplit(prof, run_cluster(base, run.gpus), req)
    cand, costs = planner.prepare(cfg)
    if costs is None:
        raise ValueError(f"{run.label}: {cand.reason}")
    return planner.explain(planner.evaluate(cand, costs)), costs


def main() -> None:
    data = load_tables(ROOT / "tests" / "data" / "megatron_tables.json")
    base = load_cluster(ROOT / "examples" / "clusters" / f"{data['cluster']}.json")
    dev = get_device(data["device"])
    cases: list[tuple[PublishedRun, int]] = [(table_runs(data, "table2")[i], 0) for i in (0, 2, 3, 5)]
    fig = data["rankings"][0]["model"]
    for t, p in ((4, 16), (8, 8)):
        cases.append((PublishedRun(label=f"fig13 t={t} p={p} B=128", layers=fig["layers"], hidden=fig["hidden"],
                                   heads=fig["heads"], seq=data["seq"], vocab=data["vocab"], t=t, p=p, gpus=64,
                                   batch=128, tflops=0.0, micro_batch=1, chunks=1), 1))
    print(f"{'run':28s} {'ours s':>8s} {'rendezvous s':>12s} {'async s':>8s} {'cost s':>7s}")
    for run, _ in cases:
        v = run.chunks or 1
        cand, costs = costs_of(run, v, base, dev)
        p = run.p
        fwd = [[0.0] * v for _ in range(p)]
        bwd = [[0.0] * v for _ in range(p)]
        for s in range(p * v):
            fwd[s % p][s // p] = costs.fwd(s, 1) - costs._blocking_send(s, s + 1, 1)
            bwd[s % p][s // p] = costs.bwd(s) - costs._blocking_send(s, s - 1, 1)
        full = costs.stages[0].out_bytes
        transfer = max(costs.link(s, s + 1).time(full / run.t) for s in range(p - 1))
        gather = ring_allgather(run.t, full, base.intra)
        m = run.batch // run.d
        calls = (interleaved_calls(p, v, m, fwd, bwd) if v > 1
                 else one_f_one_b_calls(p, m, [f[0] for f in fwd], [b[0] for b in bwd]))
        rv, av = replay(calls, transfer, gather, True), replay(calls, transfer, gather, False)
        print(f"{run.label:28s} {cand.iteration_time:8.2f} {rv:12.2f} {av:8.2f} {rv - av:+7.3f}")
    print("(ours: the planner's prediction with the all-reduce and optimizer step; the replays: the pipeline only)")


if __name__ == "__main__":
    main()
