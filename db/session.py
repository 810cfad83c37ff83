"""Engine and sessions. SQLite by default (``$PIPEPLAN_DATA_DIR/pipeplan.db``, WAL mode, busy timeout);
PostgreSQL when ``DATABASE_URL`` says so (``postgresql://`` is taken as psycopg 3)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker


def default_url() -> str:
    data = Path(os.environ.get("PIPEPLAN_DATA_DIR", "data"))
    return f"sqlite:///{data / 'pipeplan.db'}"


def database_url(url: str | None = None) -> str:
    """The URL in use: ``url``, else ``$DATABASE_URL``, else SQLite under the data directory. A bare
    ``postgresql://`` or ``postgres://`` URL is given the psycopg 3 driver."""
    url = url or os.environ.get("DATABASE_URL") or default_url()
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def make_engine(url: str | None = None, **kw: Any) -> Engine:
    url = database_url(url)
    if is_sqlite(url):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False}, **kw)

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        return engine
    kw.setdefault("pool_size", 10)
    kw.setdefault("max_overflow", 20)
    kw.setdefault("pool_pre_ping", True)
    return create_engine(url, **kw)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)
