"""clusters.last_version: a deleted cluster version's number is never handed out again

A calibration stored its new version as one more than the newest stored, so deleting v2 and calibrating again
gave another v2: a note, a script or a reader that meant the deleted fit silently named another. The uploaded
cluster's row now keeps the largest version number its lineage has handed out (``last_version``), and the next
calibration takes the one after it (api/calibration.py). Existing rows are filled from the versions stored
(numbers deleted before this revision cannot be known).

Revision ID: 0008_cluster_last_version
Revises: 0007_sqlite_ids_never_reused
Create Date: 2026-12-07 02:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008_cluster_last_version'
down_revision = '0007_sqlite_ids_never_reused'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('clusters', schema=None) as batch_op:
        batch_op.add_column(sa.Column('last_version', sa.Integer(), server_default='1', nullable=False))
    conn = op.get_bind()
    clusters = sa.table('clusters', sa.column('id', sa.Integer), sa.column('base_id', sa.Integer),
                        sa.column('version', sa.Integer), sa.column('last_version', sa.Integer))
    newest = (sa.select(clusters.c.base_id, sa.func.max(clusters.c.version))
              .where(clusters.c.base_id.is_not(None)).group_by(clusters.c.base_id))
    for base_id, version in conn.execute(newest).all():
        conn.execute(clusters.update().where(clusters.c.id == base_id).values(last_version=version))


def downgrade() -> None:
    with op.batch_alter_table('clusters', schema=None) as batch_op:
        batch_op.drop_column('last_version')
