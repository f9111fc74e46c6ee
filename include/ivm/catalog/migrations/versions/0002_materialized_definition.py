"""the definition a view's stored state was computed from

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-26

`ivm apply` keeps, when it changes a materialized view's definition, the definition the stored state
was computed from, so the next refresh can maintain a recursive view across added or removed rules
(DRed, 000 §7) instead of recomputing it.
"""

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('ivm_views', schema=None) as batch_op:
        batch_op.add_column(sa.Column('materialized', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('ivm_views', schema=None) as batch_op:
        batch_op.drop_column('materialized')
