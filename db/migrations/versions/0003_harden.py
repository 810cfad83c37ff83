"""harden: worker credentials, plan leases, candidate timelines stored apart

Revision ID: 0003_harden
Revises: 0002_fidmeasure_cluster_versions
Create Date: 2026-11-22 18:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003_harden'
down_revision = '0002_fidmeasure_cluster_versions'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.add_column(sa.Column('token_hash', sa.String(length=64), nullable=True))
        batch_op.create_unique_constraint('uq_workers_token_hash', ['token_hash'])
    with op.batch_alter_table('plan_requests', schema=None) as batch_op:
        batch_op.add_column(sa.Column('runner', sa.String(length=100), nullable=True))
        batch_op.add_column(sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True))
    op.create_table('candidate_timelines',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('plan_id', sa.Integer(), nullable=False),
    sa.Column('rank', sa.Integer(), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['plan_id'], ['plan_requests.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('plan_id', 'rank')
    )


def downgrade() -> None:
    op.drop_table('candidate_timelines')
    with op.batch_alter_table('plan_requests', schema=None) as batch_op:
        batch_op.drop_column('lease_expires_at')
        batch_op.drop_column('runner')
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.drop_constraint('uq_workers_token_hash', type_='unique')
        batch_op.drop_column('token_hash')
