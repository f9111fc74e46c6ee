"""quarantined commits, columns added to stored tables

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02

Commits of a table's log set aside by `ivm log quarantine` or a table's ``on_bad_change: quarantine``
policy (ivm.catalog.models.QuarantinedCommit): kept in their segments, skipped by every trim. And the
columns added to a table after it held data (ivm.evolution), which change files may lack.
"""

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'ivm_quarantine',
        sa.Column('table_name', sa.String(length=200), nullable=False),
        sa.Column('commit_version', sa.BigInteger(), nullable=False),
        sa.Column('reason', sa.Text(), nullable=False),
        sa.Column('by', sa.String(length=16), nullable=False),
        sa.Column('run_id', sa.String(length=64), nullable=True),
        sa.Column('quarantined_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('restored_as', sa.BigInteger(), nullable=True),
        sa.Column('restored_at', sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint('table_name', 'commit_version'),
    )
    with op.batch_alter_table('ivm_tables', schema=None) as batch_op:
        batch_op.add_column(sa.Column('added_columns', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('ivm_tables', schema=None) as batch_op:
        batch_op.drop_column('added_columns')
    op.drop_table('ivm_quarantine')
