"""profiles, clusters: on SQLite an id is never handed out twice (AUTOINCREMENT)

The two tables whose rows ``DELETE /profiles/{id}`` and ``DELETE /clusters/{id}`` remove were plain rowid tables
on SQLite, which give a new row the largest id + 1: delete the newest profile (#7) and the next upload became #7
again, so a link, a script's id or a job's note that meant the deleted one silently named another. SQLite's
AUTOINCREMENT keeps the largest id ever used (``sqlite_sequence``); PostgreSQL's sequences already do (nothing
changes there).

SQLite cannot add AUTOINCREMENT to a table: each is rebuilt (Alembic's batch mode: a new table, the rows copied
with their ids, the old dropped, the new renamed; its indexes, unique and foreign keys as they were). The rebuild
drops a table that ``plan_requests`` (and the clusters' own ``base_id``) refer to, so it runs with foreign keys
off -- :func:`db.migrate.upgrade` turns them off on SQLite outside the transaction, as SQLite's documented
procedure for such changes says (https://sqlite.org/lang_altertable.html, "otherwise alter table"), and checks
``PRAGMA foreign_key_check`` before it commits. Stored data: every row, id and reference kept. Ids deleted
before this revision cannot be known and may still be reused once; none after it. Downgrade rebuilds them
without AUTOINCREMENT.

Revision ID: 0007_sqlite_ids_never_reused
Revises: 0006_plan_requests_live_unique
Create Date: 2026-12-02 02:20:00
"""

from __future__ import annotations

from alembic import op

revision = '0007_sqlite_ids_never_reused'
down_revision = '0006_plan_requests_live_unique'
branch_labels = None
depends_on = None

TABLES = ('profiles', 'clusters')


def _rebuild(autoincrement: bool) -> None:
    conn = op.get_bind()
    if conn.dialect.name != 'sqlite':
        return
    if conn.exec_driver_sql('PRAGMA foreign_keys').scalar():
        # dropping profiles with foreign keys on would refuse (plan_requests RESTRICT) or null clusters.base_id
        raise RuntimeError("migration 0007 rebuilds tables that others refer to: run it through "
                           "db.migrate.upgrade (pipeplan db-upgrade), which turns SQLite's foreign keys off for it")
    for table in TABLES:
        with op.batch_alter_table(table, recreate='always',
                                  table_kwargs={'sqlite_autoincrement': autoincrement}):
            pass


def upgrade() -> None:
    _rebuild(True)


def downgrade() -> None:
    _rebuild(False)
