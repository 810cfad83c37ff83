"""cluster versions: a calibrated cluster is a new version of its base

Revision ID: 0002_fidmeasure_cluster_versions
Revises: 0001
Create Date: 2026-11-22 18:35:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002_fidmeasure_cluster_versions'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('clusters', schema=None) as batch_op:
        batch_op.add_column(sa.Column('base_id', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('version', sa.Integer(), nullable=False, server_default='1'))
        batch_op.create_index(batch_op.f('ix_clusters_base_id'), ['base_id'], unique=False)
        batch_op.create_foreign_key('fk_clusters_base_id', 'clusters', ['base_id'], ['id'], ondelete='SET NULL')


def downgrade() -> None:
    with op.batch_alter_table('clusters', schema=None) as batch_op:
        batch_op.drop_constraint('fk_clusters_base_id', type_='foreignkey')
        batch_op.drop_index(batch_op.f('ix_clusters_base_id'))
        batch_op.drop_column('version')
        batch_op.drop_column('base_id')
