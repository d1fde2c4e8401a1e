"""Forced errors served through the coordinator: each job's committed plan, its
planted records, and its proof epochs as verifiers are served them.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "forced_plans",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("secret", sa.String(length=64), nullable=False),
        sa.Column("commitment", sa.String(length=64), nullable=False),
        sa.Column("rate", sa.Float(), nullable=False),
        sa.Column("committed_at_s", sa.Float(), nullable=False),
        sa.Column("revealed_at_s", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"]),
        sa.PrimaryKeyConstraint("job_id"),
    )
    op.create_table(
        "plants",
        sa.Column("plant", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("epoch", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=128), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("requested_at_s", sa.Float(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("body", sa.JSON(), nullable=True),
        sa.Column("sha256", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"]),
        sa.PrimaryKeyConstraint("plant"),
    )
    op.create_index(op.f("ix_plants_job_id"), "plants", ["job_id"], unique=False)
    op.create_index("ix_plants_target", "plants", ["job_id", "worker", "step"], unique=True)
    op.create_table(
        "served_epochs",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("epoch", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("scheduled_at_s", sa.Float(), nullable=False),
        sa.Column("published_at_s", sa.Float(), nullable=True),
        sa.Column("root", sa.String(length=66), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"]),
        sa.PrimaryKeyConstraint("job_id", "epoch"),
    )


def downgrade() -> None:
    op.drop_table("served_epochs")
    op.drop_index("ix_plants_target", table_name="plants")
    op.drop_index(op.f("ix_plants_job_id"), table_name="plants")
    op.drop_table("plants")
    op.drop_table("forced_plans")
