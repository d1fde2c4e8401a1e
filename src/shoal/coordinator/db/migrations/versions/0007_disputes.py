"""Disputes a bonded challenger opened on the contract and brought to the
coordinator's referee: bisected to one step, then ruled by one replay.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "disputes",
        sa.Column("dispute", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("worker", sa.String(length=128), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("challenger", sa.String(length=42), nullable=False),
        sa.Column("provider", sa.String(length=42), nullable=False),
        sa.Column("filed_at_s", sa.Float(), nullable=False),
        sa.Column("trajectory", sa.JSON(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=True),
        sa.Column("rounds", sa.Integer(), nullable=True),
        sa.Column("ruling", sa.String(length=16), nullable=True),
        sa.Column("why", sa.Text(), nullable=False),
        sa.Column("tx", sa.String(length=66), nullable=True),
        sa.Column("chain_state", sa.String(length=16), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"]),
        sa.PrimaryKeyConstraint("dispute"),
    )
    op.create_index(op.f("ix_disputes_job_id"), "disputes", ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_disputes_job_id"), table_name="disputes")
    op.drop_table("disputes")
