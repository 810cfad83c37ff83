"""Example data: the example clusters, analytic profiles of a few presets (idempotent: content hashes), and a
profile of gpt-tiny measured on this machine's CPU for the local CPU cluster (``examples/clusters/
local-cpu-4.json``, the cluster of ``make serve``'s agent), so that the first plan on the local cluster
predicts this CPU's times (issue 13). It is measured as the executor runs (``executor/worker.py``: one torch
thread per process, float32, as many processes at once as the cluster has devices), and only when no
measured gpt-tiny CPU profile is stored yet: timings differ from run to run, so a second one would be a new
profile each time."""

from __future__ import annotations

from pathlib import Path

from api import crud
from api.settings import Settings
from db.session import make_engine, make_sessionmaker
from planner.analytic import analytic_profile
from planner.cluster import load_cluster
from planner.device import device_for_cluster
from planner.model import PRESETS, ModelSpec
from planner.profile import ModelProfile

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

#: (profile name, preset or explicit shape (layers, hidden, heads, seq, vocab, encoder), example cluster)
SEEDS: list[tuple[str, str | tuple[int, int, int, int, int, bool], str]] = [
    ("gpt2-medium", "gpt2-medium", "dgx-a100-80gb"),
    ("bert-48", "bert-48", "piz-daint-p100-16gb"),
    ("gpt2-1.3b", "gpt2-1.3b", "dgx-a100-80gb"),
    ("gpt-tiny", (4, 256, 4, 128, 1024, False), "dgx-a100-80gb"),
    ("gpt-tiny", (4, 256, 4, 128, 1024, False), "dgx1-v100-32gb"),
    ("bert-tiny", (4, 256, 4, 128, 1024, True), "dgx1-v100-32gb"),
]


#: the cluster of ``make serve``'s local agent (``examples/clusters/local-cpu-4.json``)
LOCAL_CLUSTER = "local-cpu-4"
#: the measured local profile: (zoo model, micro-batch sizes)
MEASURED = ("gpt-tiny", [1, 2, 4, 8])


def measured_cpu_profile() -> ModelProfile:
    """gpt-tiny on this CPU, as the executor runs it on the local cluster: one process per device at once
    (:mod:`profiler.concurrent`: they share the cores as the run's processes do), each with
    ``torch.set_num_threads(1)`` and float32 (the worker's defaults); a few seconds."""
    from profiler.concurrent import profile_concurrently  # torch: only when seeding measures

    model, sizes = MEASURED
    devices = load_cluster(EXAMPLES / "clusters" / f"{LOCAL_CLUSTER}.json").gpus
    return profile_concurrently(model, sizes, devices, device="cpu", dtype="fp32", threads=1, repeats=5, warmup=2)


def seed_profiles() -> list[ModelProfile]:
    out = []
    for name, shape, cluster in SEEDS:
        cl = load_cluster(EXAMPLES / "clusters" / f"{cluster}.json")
        if isinstance(shape, str):
            spec = PRESETS[shape]
        else:
            L, h, a, s, V, enc = shape
            spec = ModelSpec(name=name, layers=L, hidden=h, heads=a, seq=s, vocab=V,
                             architecture="encoder" if enc else "decoder")
        out.append(analytic_profile(spec, device_for_cluster(cl), name=name))
    return out


def seed(url: str | None = None, measure: bool = True) -> dict[str, list[tuple[str, int, bool]]]:
    """Store the example clusters and profiles (``measure``: and the measured CPU profile, unless stored);
    ``{"clusters": [(name, id, created)], "profiles": [...]}``."""
    settings = Settings()
    engine = make_engine(url or settings.database_url)
    out: dict[str, list[tuple[str, int, bool]]] = {"clusters": [], "profiles": []}
    try:
        with make_sessionmaker(engine).begin() as db:
            # the local agent's cluster and this CPU's profile first: ids 1 and 1 in a fresh database, the
            # README's curl flow and the UI's default choice
            paths = sorted((EXAMPLES / "clusters").glob("*.json"), key=lambda p: (p.stem != LOCAL_CLUSTER, p.name))
            for path in paths:
                row, created = crud.add_cluster(db, load_cluster(path), settings.max_cluster_gpus)
                out["clusters"].append((row.name, row.id, created))
            if measure:
                name = MEASURED[0]
                rows = [r for r in crud.list_profiles(db, name, "cpu", 100, 0) if r.source == "measured"]
                row, created = (rows[0], False) if rows else crud.add_profile(db, measured_cpu_profile())
                out["profiles"].append((f"{row.name} on {row.device} (measured)", row.id, created))
            for prof in seed_profiles():
                row, created = crud.add_profile(db, prof)
                out["profiles"].append((f"{row.name} on {row.device}", row.id, created))
    finally:
        engine.dispose()
    return out
