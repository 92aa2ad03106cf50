"""the sampler's token log-probs per completion and the sampler-to-trainer KL per training step

Revision ID: 0006
Revises: 0005
"""
import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('completions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('logprobs', sa.JSON(), nullable=True))
    with op.batch_alter_table('training_steps', schema=None) as batch_op:
        batch_op.add_column(sa.Column('sampler_kl', sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('training_steps', schema=None) as batch_op:
        batch_op.drop_column('sampler_kl')
    with op.batch_alter_table('completions', schema=None) as batch_op:
        batch_op.drop_column('logprobs')
