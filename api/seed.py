"""Example data: the example clusters (and the local one measured here, see below), analytic profiles of a
few presets (idempotent: content hashes), and a
profile of gpt-tiny measured on this machine's CPU for the local CPU cluster (``examples/clusters/
local-cpu-4.json``, the cluster of ``make serve``'s agent), so that the first plan on the local cluster
predicts this CPU's times (issue 13). It is measured as the executor runs a layer (one torch thread per
process, float32) in one process: a layer's time on a core of its own; the cluster's measured host
(:class:`planner.cluster.HostCpu`) says how the job's processes share the cores, and the cost model stretches
compute by that share (:func:`planner.cost.host_share`). It is measured only when no
measured gpt-tiny CPU profile is stored yet: timings differ from run to run, so a second one would be a new
profile each time. Likewise the local cluster itself is measured as its jobs run (links among that many
gloo processes, the executor's per-action overhead: :mod:`profiler.local_cluster`) and stored first, so
that a plan on cluster 1 costs this machine's communication and executor too."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from api import crud
from api.settings import Settings
from db.session import make_engine, make_sessionmaker
from planner.analytic import analytic_profile
from planner.cluster import Cluster, load_cluster
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
#: the measured local profile: (zoo model, micro-batch sizes); up to 64, the new-plan page's default global batch
#: (one micro-batch of it on one replica), so that the candidates of the page's first plan on the local cluster
#: are timed on measured sizes (planner.mismatch.size_warnings); 16, 32 and 64 add about a second
MEASURED = ("gpt-tiny", [1, 2, 4, 8, 16, 32, 64])


def measured_cpu_profile() -> ModelProfile:
    """gpt-tiny on this CPU as the executor runs a layer: ``torch.set_num_threads(1)`` and float32 (the
    worker's defaults), in one process (the sharing of the cores among the job's processes is the measured
    cluster's ``host``, costed by :func:`planner.cost.host_share`: measuring it here too would count it
    twice); a few seconds."""
    from profiler.run import profile_model  # torch: only when seeding measures

    model, sizes = MEASURED
    return profile_model(model, sizes, device="cpu", dtype="fp32", threads=1, repeats=5, warmup=2)


def measured_local_cluster() -> Cluster:
    """``examples/clusters/local-cpu-4.json`` with links, all-reduce and executor overhead measured on as
    many local gloo processes at once as it has devices (:mod:`profiler.local_cluster`); seconds."""
    from profiler.local_cluster import measured_cluster  # torch: only when seeding measures

    return measured_cluster(load_cluster(EXAMPLES / "clusters" / f"{LOCAL_CLUSTER}.json"))[0]


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


#: a progress line's sink (``make serve`` prints them as they come: the measuring takes tens of seconds)
Progress = Callable[[str], None]


@contextmanager
def step(progress: Progress | None, what: str) -> Iterator[None]:
    """Say ``what`` is being done before it starts and how long it took when it ends."""
    if progress is None:
        yield
        return
    progress(f"seeding: {what} ...")
    t0 = time.perf_counter()
    yield
    progress(f"seeding: {what}: done in {time.perf_counter() - t0:.1f} s")


def kept_or_measured(progress: Progress | None, stored: list[Any], name: str, measuring: str,
                     measure: Callable[[], tuple[Any, bool]]) -> tuple[Any, bool]:
    """``(row, created)``: the first stored measurement of ``name``, kept (and said so), or ``measure()``
    run as the step ``measuring``."""
    if stored:
        if progress:
            progress(f"seeding: {name}: measured before (#{stored[0].id}), kept")
        return stored[0], False
    with step(progress, measuring):
        return measure()


def seed(url: str | None = None, measure: bool = True,
         progress: Progress | None = None) -> dict[str, list[tuple[str, int, bool]]]:
    """Store the example clusters and profiles (``measure``: and the measured CPU profile, unless stored);
    ``{"clusters": [(name, id, created)], "profiles": [...]}``. ``progress`` gets a line before and after each
    step, with its time (what is measured, and when a stored measurement is kept instead)."""
    settings = Settings()
    engine = make_engine(url or settings.database_url)
    out: dict[str, list[tuple[str, int, bool]]] = {"clusters": [], "profiles": []}
    try:
        with make_sessionmaker(engine).begin() as db:
            # the local agent's cluster and this CPU's profile first: ids 1 and 1 in a fresh database, the
            # README's curl flow and the UI's default choice
            if measure:  # measured once; a stored one (it has the executor field) is kept
                stored = [r for r in crud.list_clusters(db, LOCAL_CLUSTER, None, 100, 0) if r.body.get("executor")]
                row, created = kept_or_measured(
                    progress, stored, f"cluster {LOCAL_CLUSTER}",
                    f"measuring cluster {LOCAL_CLUSTER} on this machine (links, all-reduce and executor overhead "
                    "among its gloo processes; about a minute)",
                    lambda: crud.add_cluster(db, measured_local_cluster(), settings.max_cluster_gpus))
                out["clusters"].append((f"{row.name} (measured)", row.id, created))
            paths = sorted((EXAMPLES / "clusters").glob("*.json"), key=lambda p: (p.stem != LOCAL_CLUSTER, p.name))
            with step(progress, "example clusters (examples/clusters/)"):
                for path in paths:
                    if measure and path.stem == LOCAL_CLUSTER:  # measured above: one local cluster, not two
                        continue
                    row, created = crud.add_cluster(db, load_cluster(path), settings.max_cluster_gpus)
                    out["clusters"].append((row.name, row.id, created))
            if measure:
                name = MEASURED[0]
                rows = [r for r in crud.list_profiles(db, name, "cpu", 100, 0) if r.source == "measured"]
                row, created = kept_or_measured(
                    progress, rows, f"profile {name} on cpu",
                    f"profiling {name} on this CPU (micro-batches {','.join(map(str, MEASURED[1]))}; seconds)",
                    lambda: crud.add_profile(db, measured_cpu_profile()))
                out["profiles"].append((f"{row.name} on {row.device} (measured)", row.id, created))
            with step(progress, "analytic profiles of " + ", ".join(dict.fromkeys(n for n, _s, _c in SEEDS))):
                for prof in seed_profiles():
                    row, created = crud.add_profile(db, prof)
                    out["profiles"].append((f"{row.name} on {row.device}", row.id, created))
    finally:
        engine.dispose()
    return out
