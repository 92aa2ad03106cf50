"""the run-time served-equals-trained check of each published policy version

Revision ID: 0007
Revises: 0006
"""
import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('training_steps', schema=None) as batch_op:
        batch_op.add_column(sa.Column('served_check', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('training_steps', schema=None) as batch_op:
        batch_op.drop_column('served_check')
