"""Jobs name their escrow on chain; providers' chain leases are remembered.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("chain_job", sa.Integer(), nullable=True))
    op.create_table(
        "chain_leases",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("provider", sa.String(length=42), nullable=False),
        sa.Column("price_wei_per_s", sa.String(length=80), nullable=False),
        sa.Column("term_s", sa.Integer(), nullable=False),
        sa.Column("accepted_at", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"]),
        sa.PrimaryKeyConstraint("job_id", "provider"),
    )


def downgrade() -> None:
    op.drop_table("chain_leases")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("chain_job")
