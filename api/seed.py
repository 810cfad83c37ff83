"""Example data: the example clusters and analytic profiles of a few presets (idempotent: content hashes)."""

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


def seed(url: str | None = None) -> dict[str, list[tuple[str, int, bool]]]:
    """Store the example clusters and profiles; ``{"clusters": [(name, id, created)], "profiles": [...]}``."""
    settings = Settings()
    engine = make_engine(url or settings.database_url)
    out: dict[str, list[tuple[str, int, bool]]] = {"clusters": [], "profiles": []}
    try:
        with make_sessionmaker(engine).begin() as db:
            for path in sorted((EXAMPLES / "clusters").glob("*.json")):
                row, created = crud.add_cluster(db, load_cluster(path), settings.max_cluster_gpus)
                out["clusters"].append((row.name, row.id, created))
            for prof in seed_profiles():
                row, created = crud.add_profile(db, prof)
                out["profiles"].append((f"{row.name} on {row.device}", row.id, created))
    finally:
        engine.dispose()
    return out
