"""where a log segment's truncates are

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06

A Debezium truncate event (``op: t``) deletes every row the table holds at its position. The trim reads
the whole table when its range holds one, so the catalog records, with each segment, the positions
(commit version, row) of its truncates, found when it is appended: a refresh knows from the catalog
alone whether its range holds any. NULL: none (every segment appended before this revision: the
readers refused truncates then).
"""

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('ivm_log_segments', schema=None) as batch_op:
        batch_op.add_column(sa.Column('truncates', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('ivm_log_segments', schema=None) as batch_op:
        batch_op.drop_column('truncates')
