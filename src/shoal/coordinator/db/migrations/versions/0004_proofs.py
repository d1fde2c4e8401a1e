"""Proof of learning through the coordinator: work records, proof epochs,
challenges and verdicts; and each job's step progress.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "work_records",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("worker", sa.String(length=128), nullable=False),
        sa.Column("step", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("lease", sa.Integer(), nullable=False),
        sa.Column("provider", sa.String(length=42), nullable=False),
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"]),
        sa.PrimaryKeyConstraint("job_id", "worker", "step"),
    )
    op.create_index(op.f("ix_work_records_lease"), "work_records", ["lease"], unique=False)
    op.create_table(
        "proof_epochs",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("epoch", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("root", sa.String(length=66), nullable=False),
        sa.Column("records", sa.Integer(), nullable=False),
        sa.Column("complete", sa.Boolean(), nullable=False),
        sa.Column("rooted_at_s", sa.Float(), nullable=False),
        sa.Column("chain_epoch", sa.Integer(), nullable=True),
        sa.Column("anchored_at_s", sa.Float(), nullable=True),
        sa.Column("anchor_tx", sa.String(length=66), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"]),
        sa.PrimaryKeyConstraint("job_id", "epoch"),
    )
    op.create_table(
        "challenges",
        sa.Column("challenge", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("worker", sa.String(length=128), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("agent_id", sa.String(length=64), nullable=False),
        sa.Column("requested_by", sa.String(length=42), nullable=False),
        sa.Column("requested_at_s", sa.Float(), nullable=False),
        sa.Column("answered_at_s", sa.Float(), nullable=True),
        sa.Column("sha256", sa.String(length=64), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"]),
        sa.PrimaryKeyConstraint("challenge"),
    )
    op.create_index(op.f("ix_challenges_agent_id"), "challenges", ["agent_id"], unique=False)
    op.create_index(op.f("ix_challenges_job_id"), "challenges", ["job_id"], unique=False)
    op.create_index("ix_challenges_target", "challenges", ["job_id", "worker", "step", "kind"],
                    unique=True)
    op.create_table(
        "verdicts",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("at_s", sa.Float(), nullable=False),
        sa.Column("verifier", sa.String(length=42), nullable=False),
        sa.Column("worker", sa.String(length=128), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("ruling", sa.String(length=16), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"]),
        sa.PrimaryKeyConstraint("seq"),
    )
    op.create_index(op.f("ix_verdicts_job_id"), "verdicts", ["job_id"], unique=False)
    op.create_table(
        "step_progress",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("step", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("t", sa.Float(), nullable=False),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("world", sa.Integer(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=128), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"]),
        sa.PrimaryKeyConstraint("job_id", "step"),
    )


def downgrade() -> None:
    op.drop_table("step_progress")
    op.drop_index(op.f("ix_verdicts_job_id"), table_name="verdicts")
    op.drop_table("verdicts")
    op.drop_index("ix_challenges_target", table_name="challenges")
    op.drop_index(op.f("ix_challenges_job_id"), table_name="challenges")
    op.drop_index(op.f("ix_challenges_agent_id"), table_name="challenges")
    op.drop_table("challenges")
    op.drop_table("proof_epochs")
    op.drop_index(op.f("ix_work_records_lease"), table_name="work_records")
    op.drop_table("work_records")
