"""how a view version is stored: derivation counts or each tuple once

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-26

Counting (000) stores each view tuple's number of derivations; key-based maintenance (003) and the
reducing algorithms (004) store each tuple once. A refresh compares the form of the view's current
version with the one its strategy needs, and recomputes the view when they differ. NULL: counts (every
version written before this revision).
"""

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('ivm_relation_versions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('form', sa.String(length=16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('ivm_relation_versions', schema=None) as batch_op:
        batch_op.drop_column('form')
