"""where a log segment's keys fall

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-28

The skipping filter's ranges of a segment's keys (ivm.zset.KeyBounds), found when it is appended, so a
refresh's trim merges its segments' ranges instead of querying its changes for them. NULL: not known
(every segment appended before this revision); the trim then queries, as before.
"""

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('ivm_log_segments', schema=None) as batch_op:
        batch_op.add_column(sa.Column('key_bounds', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('ivm_log_segments', schema=None) as batch_op:
        batch_op.drop_column('key_bounds')
