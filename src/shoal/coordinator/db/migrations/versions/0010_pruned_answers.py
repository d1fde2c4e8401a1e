"""An answered challenge's file is pruned once nothing can need it any more (its epoch's
window closed, the retention after it passed, no guilty verdict awaits a ruling and no
dispute is open on it); the row keeps when, so a read of it answers 410 Gone, not "the
file changed".

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("challenges", schema=None) as batch_op:
        batch_op.add_column(sa.Column("pruned_at_s", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("challenges", schema=None) as batch_op:
        batch_op.drop_column("pruned_at_s")
