"""gang dispatch: agents declare their host; jobs carry their placement (device, nodes, processes per node)
and multi-node jobs their node slots

Revision ID: 0004_gang_agents
Revises: 0003_harden
Create Date: 2026-11-22 21:45:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004_gang_agents'
down_revision = '0003_harden'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.add_column(sa.Column('host', sa.String(length=200), nullable=True))
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('device_type', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('nodes', sa.Integer(), nullable=False, server_default='1'))
        batch_op.add_column(sa.Column('procs_per_node', sa.Integer(), nullable=True))
        batch_op.add_column(sa.Column('slots_version', sa.Integer(), nullable=False, server_default='0'))
    op.create_table('job_slots',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=False),
    sa.Column('node_rank', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('worker_id', sa.Integer(), nullable=True),
    sa.Column('held_since', sa.DateTime(timezone=True), nullable=True),
    sa.Column('lease_expires_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('endpoint', sa.String(length=300), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['worker_id'], ['workers.id'], ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('job_id', 'node_rank'),
    sa.UniqueConstraint('job_id', 'worker_id')
    )
    with op.batch_alter_table('job_slots', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_job_slots_job_id'), ['job_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('job_slots', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_job_slots_job_id'))
    op.drop_table('job_slots')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('slots_version')
        batch_op.drop_column('procs_per_node')
        batch_op.drop_column('nodes')
        batch_op.drop_column('device_type')
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.drop_column('host')
