"""plan_requests: one live plan per request (a unique index on request_hash over the plans not failed)

Identical POST /plans at once each looked the request up, found none and inserted one: duplicate plans of one
request (a QA walkthrough: 4 parallel bodies gave 201 202 202 202, four plans). The index makes the later inserts
fail, and api.crud.create_plan answers them with the stored row.

Stored data: plans stored twice before the index are kept, every field as it was (jobs refer to them; GET
/plans/{id} still reads them). Of each request's plans that are not failed, the newest -- the one a repeated
identical request was answered with (create_plan took the newest) -- stays the live one; each older one gets
``duplicate_of`` = that newest id, which leaves it out of the index. Nothing is deleted or rewritten. Downgrade
drops the index and the column.

Revision ID: 0006_plan_requests_live_unique
Revises: 0005_cluster_calibration_jobs
Create Date: 2026-12-01 23:45:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006_plan_requests_live_unique'
down_revision = '0005_cluster_calibration_jobs'
branch_labels = None
depends_on = None

LIVE = "status != 'failed' AND duplicate_of IS NULL"


def upgrade() -> None:
    with op.batch_alter_table('plan_requests', schema=None) as batch_op:
        batch_op.add_column(sa.Column('duplicate_of', sa.Integer(), nullable=True))
    conn = op.get_bind()
    plans = sa.table('plan_requests', sa.column('id', sa.Integer), sa.column('request_hash', sa.String),
                     sa.column('status', sa.String), sa.column('duplicate_of', sa.Integer))
    newest: dict[str, int] = {}
    rows = conn.execute(sa.select(plans.c.id, plans.c.request_hash).where(plans.c.status != 'failed')
                        .order_by(plans.c.id.desc())).all()
    for pid, h in rows:
        if h in newest:
            conn.execute(plans.update().where(plans.c.id == pid).values(duplicate_of=newest[h]))
        else:
            newest[h] = pid
    op.create_index('uq_plan_requests_live_request', 'plan_requests', ['request_hash'], unique=True,
                    sqlite_where=sa.text(LIVE), postgresql_where=sa.text(LIVE))


def downgrade() -> None:
    op.drop_index('uq_plan_requests_live_request', table_name='plan_requests')
    with op.batch_alter_table('plan_requests', schema=None) as batch_op:
        batch_op.drop_column('duplicate_of')
