"""docker-compose.yml and the Dockerfile are consistent (no Docker engine here: structure only)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def test_compose_services() -> None:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    svc = doc["services"]
    assert set(svc) == {"postgres", "api", "worker"}
    assert svc["postgres"]["image"].startswith("postgres:") and "healthcheck" in svc["postgres"]
    api = svc["api"]
    assert "db-upgrade" in " ".join(api["command"]) and "uvicorn api.main:app" in " ".join(api["command"])
    assert api["environment"]["DATABASE_URL"].startswith("postgresql://") and "@postgres:5432/" in \
        api["environment"]["DATABASE_URL"]
    assert api["depends_on"]["postgres"]["condition"] == "service_healthy"
    worker = svc["worker"]
    assert worker["command"][:2] == ["pipeplan", "agent"] and "http://api:8000" in worker["command"]
    assert worker["depends_on"]["api"]["condition"] == "service_healthy"
    assert "PIPEPLAN_WORKER_TOKEN" in worker["environment"]
    for s in ("api", "worker"):
        assert svc[s]["build"]["context"] == "."
    assert "driver: nvidia" in (ROOT / "docker-compose.yml").read_text()  # GPU reservation, commented in
    assert "pgdata" in doc["volumes"]


def test_dockerfile_copies_the_packages() -> None:
    text = (ROOT / "Dockerfile").read_text()
    for pkg in ("planner", "api", "db", "executor", "pipeplan", "examples"):
        assert f"COPY {pkg} {pkg}" in text, pkg
    assert "pip install -e ." in text
