"""tunings and child outcomes

Revision ID: 0003
Revises: 0002
"""
import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('tunings',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('parent_id', sa.Integer(), nullable=False),
    sa.Column('child_id', sa.Integer(), nullable=True),
    sa.Column('trials', sa.Integer(), nullable=False),
    sa.Column('parameters', sa.Integer(), nullable=False),
    sa.Column('start_objective', sa.Float(), nullable=False),
    sa.Column('best_objective', sa.Float(), nullable=True),
    sa.Column('started_at', sa.Float(), nullable=False),
    sa.Column('elapsed_s', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['child_id'], ['programs.id'], ),
    sa.ForeignKeyConstraint(['parent_id'], ['programs.id'], ),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('tunings', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_tunings_child_id'), ['child_id'], unique=False)
    with op.batch_alter_table('programs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('outcome', sa.String(length=10), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('programs', schema=None) as batch_op:
        batch_op.drop_column('outcome')
    with op.batch_alter_table('tunings', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_tunings_child_id'))
    op.drop_table('tunings')
