"""Alembic, configured in code (no alembic.ini needed): ``upgrade``, ``current`` and ``check``.

The API refuses to start against a schema that is behind (:class:`SchemaBehind`); ``pipeplan
db-upgrade`` brings it to the head revision.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from db.session import database_url, make_engine

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
UPGRADE_HINT = "pipeplan db-upgrade"


class SchemaBehind(RuntimeError):
    pass


def alembic_config(url: str | None = None) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", database_url(url).replace("%", "%%"))
    return cfg


def head(url: str | None = None) -> str:
    heads = ScriptDirectory.from_config(alembic_config(url)).get_heads()
    assert len(heads) == 1, f"migrations have several heads: {heads}"
    return heads[0]


def current(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(url: str | None = None, revision: str = "head") -> str:
    """Upgrade the database at ``url`` (default: the configured one) to ``revision``; return it."""
    return _migrate(url, lambda cfg: command.upgrade(cfg, revision))


def downgrade(url: str | None = None, revision: str = "-1") -> str:
    """Downgrade the database at ``url`` to ``revision`` (default: one step); return where it is."""
    return _migrate(url, lambda cfg: command.downgrade(cfg, revision))


def _migrate(url: str | None, step: Callable[[Config], None]) -> str:
    """Run ``step`` in one transaction. On SQLite its foreign keys are off meanwhile (a table rebuild, migration
    0007, drops a table others refer to; the pragma is a no-op inside a transaction, so it is set before one) and
    ``PRAGMA foreign_key_check`` must find no broken reference before the commit."""
    cfg = alembic_config(url)
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            sqlite = conn.dialect.name == "sqlite"
            if sqlite:
                conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
                conn.commit()
            with conn.begin():
                cfg.attributes["connection"] = conn
                step(cfg)
                broken = conn.exec_driver_sql("PRAGMA foreign_key_check").all() if sqlite else []
                if broken:
                    raise RuntimeError(f"the migration left references to rows that do not exist (table, rowid, "
                                       f"parent, fk): {broken[:5]}; nothing was changed")
        return current(engine) or ""
    finally:
        engine.dispose()  # its connections had foreign keys off: none is reused


def check(engine: Engine) -> None:
    """Raise :class:`SchemaBehind` naming the upgrade command unless the schema is at the head."""
    have, want = current(engine), head()
    if have != want:
        where = engine.url.render_as_string(hide_password=True)
        raise SchemaBehind(
            f"database schema at {where} is at revision {have or 'none (empty database)'}, the code needs "
            f"{want}: run `{UPGRADE_HINT}` (with the same DATABASE_URL / PIPEPLAN_DATA_DIR) to upgrade it")
