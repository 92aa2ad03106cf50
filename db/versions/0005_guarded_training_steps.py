"""guarded training steps: whether a step's version was published, and the guard's measurement

Revision ID: 0005
Revises: 0004
"""
import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('training_steps', schema=None) as batch_op:
        batch_op.add_column(sa.Column('published', sa.Boolean(), nullable=True))
        batch_op.add_column(sa.Column('guard', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('training_steps', schema=None) as batch_op:
        batch_op.drop_column('guard')
        batch_op.drop_column('published')
