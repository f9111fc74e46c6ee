"""initial catalog

Revision ID: 0001
Revises:
Create Date: 2026-11-25

The catalog's tables as of the foundation: definitions, relations, versions, layers, log segments,
watermarks, runs and stages, validations and leases. ivm.catalog.models mirrors this schema.
"""

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('ivm_layers',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('relation', sa.String(length=200), nullable=False),
    sa.Column('kind', sa.String(length=8), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('rows', sa.BigInteger(), nullable=True),
    sa.Column('bytes', sa.BigInteger(), nullable=True),
    sa.Column('run_id', sa.String(length=64), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('ivm_layers', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_ivm_layers_relation'), ['relation'], unique=False)

    op.create_table('ivm_leases',
    sa.Column('relation', sa.String(length=200), nullable=False),
    sa.Column('run_id', sa.String(length=64), nullable=False),
    sa.Column('acquired_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('relation')
    )
    op.create_table('ivm_log_segments',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('table_name', sa.String(length=200), nullable=False),
    sa.Column('path', sa.Text(), nullable=False),
    sa.Column('source', sa.Text(), nullable=False),
    sa.Column('source_format', sa.String(length=16), nullable=False),
    sa.Column('content_hash', sa.String(length=64), nullable=False),
    sa.Column('min_commit_version', sa.BigInteger(), nullable=False),
    sa.Column('max_commit_version', sa.BigInteger(), nullable=False),
    sa.Column('rows', sa.BigInteger(), nullable=False),
    sa.Column('appended_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('table_name', 'source', 'content_hash', name='uq_segment_content')
    )
    with op.batch_alter_table('ivm_log_segments', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_ivm_log_segments_table_name'), ['table_name'], unique=False)

    op.create_table('ivm_relations',
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('current_version_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('ivm_runs',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('mode', sa.String(length=16), nullable=True),
    sa.Column('snapshot', sa.JSON(), nullable=False),
    sa.Column('relations', sa.JSON(), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('ivm_tables',
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('columns', sa.JSON(), nullable=False),
    sa.Column('key', sa.JSON(), nullable=True),
    sa.Column('unique_keys', sa.JSON(), nullable=False),
    sa.Column('references', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('ivm_validations',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.String(length=64), nullable=False),
    sa.Column('view', sa.String(length=200), nullable=False),
    sa.Column('sample_size', sa.BigInteger(), nullable=False),
    sa.Column('mismatches', sa.BigInteger(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('report_uri', sa.Text(), nullable=True),
    sa.Column('summary', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('ivm_validations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_ivm_validations_run_id'), ['run_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_ivm_validations_view'), ['view'], unique=False)

    op.create_table('ivm_views',
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('language', sa.String(length=16), nullable=False),
    sa.Column('definition', sa.Text(), nullable=False),
    sa.Column('options', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('name')
    )
    op.create_table('ivm_watermarks',
    sa.Column('relation', sa.String(length=200), nullable=False),
    sa.Column('source_table', sa.String(length=200), nullable=False),
    sa.Column('commit_version', sa.BigInteger(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('relation', 'source_table')
    )
    op.create_table('ivm_relation_versions',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('relation', sa.String(length=200), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.String(length=64), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('superseded_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['relation'], ['ivm_relations.name'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('relation', 'version', name='uq_relation_version')
    )
    op.create_table('ivm_run_stages',
    sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
    sa.Column('run_id', sa.String(length=64), nullable=False),
    sa.Column('stage', sa.String(length=32), nullable=False),
    sa.Column('relation', sa.String(length=200), nullable=True),
    sa.Column('mode', sa.String(length=16), nullable=True),
    sa.Column('rows_in', sa.BigInteger(), nullable=True),
    sa.Column('rows_out', sa.BigInteger(), nullable=True),
    sa.Column('delta_rows', sa.BigInteger(), nullable=True),
    sa.Column('seconds', sa.Float(), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('detail', sa.JSON(), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['ivm_runs.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('ivm_run_stages', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_ivm_run_stages_run_id'), ['run_id'], unique=False)

    op.create_table('ivm_version_layers',
    sa.Column('version_id', sa.Integer(), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('layer_id', sa.String(length=64), nullable=False),
    sa.ForeignKeyConstraint(['layer_id'], ['ivm_layers.id'], ),
    sa.ForeignKeyConstraint(['version_id'], ['ivm_relation_versions.id'], ),
    sa.PrimaryKeyConstraint('version_id', 'position')
    )
    with op.batch_alter_table('ivm_version_layers', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_ivm_version_layers_layer_id'), ['layer_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('ivm_version_layers', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_ivm_version_layers_layer_id'))

    op.drop_table('ivm_version_layers')
    with op.batch_alter_table('ivm_run_stages', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_ivm_run_stages_run_id'))

    op.drop_table('ivm_run_stages')
    op.drop_table('ivm_relation_versions')
    op.drop_table('ivm_watermarks')
    op.drop_table('ivm_views')
    with op.batch_alter_table('ivm_validations', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_ivm_validations_view'))
        batch_op.drop_index(batch_op.f('ix_ivm_validations_run_id'))

    op.drop_table('ivm_validations')
    op.drop_table('ivm_tables')
    op.drop_table('ivm_runs')
    op.drop_table('ivm_relations')
    with op.batch_alter_table('ivm_log_segments', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_ivm_log_segments_table_name'))

    op.drop_table('ivm_log_segments')
    op.drop_table('ivm_leases')
    with op.batch_alter_table('ivm_layers', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_ivm_layers_relation'))

    op.drop_table('ivm_layers')
