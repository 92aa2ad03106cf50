"""the turns between the LLM and tuning, one row per cycle (a resume replays them)

Revision ID: 0008
Revises: 0007
"""
import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('turns',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('llm_gain', sa.Float(), nullable=False),
    sa.Column('llm_s', sa.Float(), nullable=False),
    sa.Column('tuning_gain', sa.Float(), nullable=False),
    sa.Column('tuning_s', sa.Float(), nullable=False),
    sa.Column('share', sa.Float(), nullable=False),
    sa.Column('at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('turns', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_turns_run_id'), ['run_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('turns', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_turns_run_id'))
    op.drop_table('turns')
