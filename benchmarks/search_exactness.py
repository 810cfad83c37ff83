"""The search's exactness on random requests: the pruned search (bounds, memory floors, caches) against evaluating
every configuration (``prune=False``), and with ``--split`` one process against two (:mod:`planner.split_search`).

Each request draws a model and cluster from :data:`CASES`, a GPU count, a global batch and one of the request's
options (asynchronous schedules, a sharded optimizer, a memory reserve); it is ``OK`` when the ranked rows agree in
configuration, time, memory, name and alternatives (a row lists the twins within the k-th best time,
:func:`planner.search._merge`: the pruned search simulates every one of those, and a slower twin it may skip is
listed by neither). Where they differ the rows are printed. The tests check a few fixed requests the same way
(``tests/test_search_fast_paths.py``, ``test_pruned_search_ranks_as_simulating_everything``); this draws many more
than CI could afford. Session 23 found a rounding case with it (GPipe and 1F1B twins at the k-th time, the row named
by the other twin).

``--hf`` draws instead from Hugging Face configs of ``examples/models`` (:data:`HF_MODELS`: grouped-query and
latent attention, windows, mixtures of experts with shared experts and expert parallelism), profiled with flash or
unfused attention, with or without sequence parallelism, at sequence 512-2048, on DGX A100/H100 clusters, with the
later options too (:data:`HF_OPTIONS`: sharded weights, one rank order, no expert parallelism). Session 44 found
with it that one and two processes listed different twins of a row (a mixture of experts).

Run: ``PYTHONPATH=. python benchmarks/search_exactness.py [--seed 0] [--requests 20] [--split] [--hf]`` (seconds
per request; GPT-3 requests, drawn with ``--split`` only, take a few).
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path
from typing import Any

from planner.analytic import analytic_profile
from planner.cluster import load_cluster
from planner.device import device_for_cluster
from planner.model import PRESETS
from planner.operators import OperatorOptions
from planner.request import TrainingRequest
from planner.search import Planner, plan
from profiler.hf_config import read_hf_config

CLUSTERS = Path(__file__).resolve().parent.parent / "examples" / "clusters"
#: (model preset, cluster file) pairs the requests are drawn from; GPT-3 only with --split (evaluating every
#: configuration of it takes minutes)
CASES = [("bert-48", "piz-daint-p100-16gb.json"), ("gpt2-medium", "piz-daint-p100-16gb.json"),
         ("gpt2-medium", "dgx1-v100-32gb.json"), ("gpt2-1.3b", "dgx-a100-40gb.json"),
         ("gpt2-1.3b", "dgx1-v100-32gb.json"), ("gpt2-medium", "dgx-h100-80gb.json")]
OPTIONS: list[dict[str, Any]] = [{}, {"allow_async": True}, {"shard_optimizer": True},
                                 {"memory_reserve_bytes": 4 * 2**30}]
MODELS = CLUSTERS.parent / "models"
#: --hf: configs of examples/models small enough to search exhaustively on up to 16 GPUs in seconds
HF_MODELS = ["qwen1.5-moe-a2.7b", "olmoe-1b-7b", "deepseek-v2-lite", "gpt-oss-20b", "smollm3-3b", "gemma-3-1b",
             "qwen3-8b", "llama-3.1-8b", "gemma-2-9b", "phi-3-medium-4k"]
HF_CLUSTERS = ["dgx-h100-80gb.json", "dgx-a100-80gb.json", "dgx-a100-40gb.json"]
HF_OPTIONS: list[dict[str, Any]] = OPTIONS + [{"shard_parameters": True}, {"rank_order": "tp-dp-pp"},
                                              {"rank_order": "tp-pp-dp"}, {"max_expert": 1}]


def rows(res: Any) -> list[tuple]:
    return [(c.config, c.iteration_time, c.memory, c.alternatives, c.name) for c in res.candidates]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--split", action="store_true", help="one process against two, not pruned against full")
    ap.add_argument("--hf", action="store_true", help="Hugging Face configs of examples/models (module docstring)")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    cases = CASES + ([("gpt3-175b", "dgx-a100-80gb.json")] if args.split else [])
    profiles: dict[tuple[Any, ...], Any] = {}
    bad = 0
    for i in range(args.requests):
        if args.hf:
            preset, name = rng.choice(HF_MODELS), rng.choice(HF_CLUSTERS)
            seq, attention, sp = rng.choice([512, 1024, 2048]), rng.choice(["flash", "unfused"]), rng.random() < 0.3
            gpus, batch = rng.choice([2, 4, 8, 16] + ([32] if args.split else [])), rng.choice([8, 16, 32, 64])
            options = rng.choice(HF_OPTIONS)
            key: tuple[Any, ...] = (preset, name, seq, attention, sp)
        else:
            preset, name = rng.choice(cases)
            gpus = rng.choice([128, 256] if preset == "gpt3-175b" else
                              [2, 4, 8, 16] + ([32, 64] if args.split else []))
            batch = rng.choice([16, 32, 64, 128] + ([256, 512] if args.split else []))
            options = rng.choice(OPTIONS)
            key = (preset, name)
        cluster = load_cluster(CLUSTERS / name)
        if key not in profiles:
            if args.hf:
                spec = read_hf_config(MODELS / preset, seq=seq)
                opts = OperatorOptions(attention=attention, sequence_parallel=sp)
                profiles[key] = analytic_profile(spec, device_for_cluster(cluster), options=opts)
            else:
                profiles[key] = analytic_profile(PRESETS[preset], device_for_cluster(cluster))
        prof = profiles[key]
        req = TrainingRequest(global_batch=batch, gpus=gpus, top=5, **options)
        t0 = time.perf_counter()
        if args.split:
            a, b = plan(prof, cluster, req, processes=1), plan(prof, cluster, req, processes=2)
        else:
            a, b = Planner(prof, cluster, req).search(), Planner(prof, cluster, req).search(prune=False)
        same = rows(a) == rows(b)
        bad += not same
        verdict = "MISMATCH" if not same else "OK"
        what = f"{preset} s={seq} {attention}{' sp' if sp else ''}" if args.hf else preset
        print(f"{i:3d} {what:12s} {name:26s} {gpus:4d} GPUs B={batch:<4d} {options!s:40s} "
              f"{verdict}  {time.perf_counter() - t0:.1f} s", flush=True)
        if not same:
            for x, y in zip(a.candidates, b.candidates, strict=False):
                print(f"      {x.config.label():55s} {x.iteration_time:.6f} {x.alternatives} | "
                      f"{y.config.label():55s} {y.iteration_time:.6f} {y.alternatives}")
    print(f"{args.requests - bad} of {args.requests} requests agree")


if __name__ == "__main__":
    main()
