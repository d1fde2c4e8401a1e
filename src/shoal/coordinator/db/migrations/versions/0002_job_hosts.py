"""Jobs remember the job host serving their rendezvous.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("rendezvous", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("host_pid", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("host_pid")
        batch_op.drop_column("rendezvous")
