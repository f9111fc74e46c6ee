"""a Delta source's table id

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-08

A Delta source is read by its location; a table deleted there and created anew (or replaced) starts its
versions and its change data feed over, and the versions ivm holds of the old one say nothing of the
new one. The catalog records, with each table, the Delta table id (its metaData id) of the state ivm
last published of it; a refresh that finds another id at the location recomputes the views that read
it. NULL: not a Delta source, or none published since this revision (no check until its next refresh).
"""

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('ivm_tables', schema=None) as batch_op:
        batch_op.add_column(sa.Column('source_id', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('ivm_tables', schema=None) as batch_op:
        batch_op.drop_column('source_id')
