"""clusters.calibration_jobs: the jobs a version's calibration was fitted to, beside its body

List answers label each cluster version ("v2, calibrated from 3 jobs", api/cluster_versions.py) from this
column instead of loading every body. Existing rows are filled from their bodies.

Revision ID: 0005_cluster_calibration_jobs
Revises: 0004_gang_agents
Create Date: 2026-11-23 05:40:00
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = '0005_cluster_calibration_jobs'
down_revision = '0004_gang_agents'
branch_labels = None
depends_on = None


def _jobs(body: object) -> int | None:
    """What :func:`api.cluster_versions.calibration_jobs_of` gives for a stored body (JSON text)."""
    data = json.loads(body) if isinstance(body, str) else body
    cal = data.get("calibration") if isinstance(data, dict) else None
    if not isinstance(cal, dict):
        return None
    jobs = cal.get("jobs", 0)
    return int(jobs) if isinstance(jobs, int) else 0


def upgrade() -> None:
    with op.batch_alter_table('clusters', schema=None) as batch_op:
        batch_op.add_column(sa.Column('calibration_jobs', sa.Integer(), nullable=True))
    conn = op.get_bind()
    clusters = sa.table('clusters', sa.column('id', sa.Integer), sa.column('body', sa.Text),
                        sa.column('calibration_jobs', sa.Integer))
    for cid, body in conn.execute(sa.select(clusters.c.id, clusters.c.body)).all():
        jobs = _jobs(body)
        if jobs is not None:
            conn.execute(clusters.update().where(clusters.c.id == cid).values(calibration_jobs=jobs))


def downgrade() -> None:
    with op.batch_alter_table('clusters', schema=None) as batch_op:
        batch_op.drop_column('calibration_jobs')
