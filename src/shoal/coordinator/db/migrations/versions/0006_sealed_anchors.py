"""Proof epochs keep the value anchored on chain, which is not their root when
forced errors are served (a sealed root: see shoal.proof.forced.sealed_root).

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("proof_epochs", sa.Column("anchored_root", sa.String(length=66), nullable=True))


def downgrade() -> None:
    op.drop_column("proof_epochs", "anchored_root")
