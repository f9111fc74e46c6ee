"""the digest of the project file last applied

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05

`ivm apply` records the digest of the project file it applied (ivm.catalog.models.AppliedProject), so
applying the same file again answers without starting Spark (#49 item 4).
"""

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'ivm_applied',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('digest', sa.String(length=64), nullable=False),
        sa.Column('applied_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id'),
    )


def downgrade() -> None:
    op.drop_table('ivm_applied')
