"""/health and /metrics (always open: probes and Prometheus scrape them)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from api.deps import DB
from db.migrate import current

router = APIRouter(tags=["health"])


@router.get("/health", responses={503: {"description": "the database cannot be reached"}})
def health(db: DB, request: Request) -> dict[str, str]:
    try:
        db.execute(text("SELECT 1"))
        schema = current(request.app.state.engine) or "none"
    except SQLAlchemyError as e:
        raise HTTPException(503, f"database unavailable: {type(e).__name__}") from None
    return {"status": "ok", "database": db.get_bind().dialect.name, "schema": schema}


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.metrics.registry), media_type=CONTENT_TYPE_LATEST)
