"""The state the coordinator read back from its audit log gets columns of its own: when
a job's host began serving, its latest plan, when a lease last stored work records, and
each job's settlement tries. Filled from the log, so a running store keeps its state.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

events = sa.table("events", sa.column("seq", sa.Integer), sa.column("at_s", sa.Float),
                  sa.column("kind", sa.String), sa.column("job_id", sa.String),
                  sa.column("detail", sa.JSON))
jobs = sa.table("jobs", sa.column("job_id", sa.String), sa.column("rendezvous_at_s", sa.Float),
                sa.column("plan", sa.JSON))
leases = sa.table("leases", sa.column("lease", sa.Integer),
                  sa.column("records_stored_at_s", sa.Float))
settlements = sa.table("settlements", sa.column("job_id", sa.String),
                       sa.column("failures", sa.Integer), sa.column("failed_at_s", sa.Float),
                       sa.column("settled_at_s", sa.Float))


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("rendezvous_at_s", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("plan", sa.JSON(), nullable=True))
    with op.batch_alter_table("leases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("records_stored_at_s", sa.Float(), nullable=True))
    op.create_table(
        "settlements",
        sa.Column("job_id", sa.String(length=64), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("failed_at_s", sa.Float(), nullable=True),
        sa.Column("settled_at_s", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.job_id"]),
        sa.PrimaryKeyConstraint("job_id"),
    )
    _fill_from_the_log(op.get_bind())


def _fill_from_the_log(connection: sa.Connection) -> None:
    """Replay the events that used to be read as state, oldest first: the newest wins."""
    kinds = ("job_rendezvous", "job_planned", "work_records_stored", "settlement_failed",
             "job_settled", "chain_job_closed")
    rows = connection.execute(sa.select(events.c.at_s, events.c.kind, events.c.job_id,
                                        events.c.detail)
                              .where(events.c.kind.in_(kinds)).order_by(events.c.seq))
    jobs_now: dict[str, dict] = {}
    stored_at: dict[int, float] = {}
    settling: dict[str, dict] = {}
    for at_s, kind, job_id, detail in rows:
        if kind == "job_rendezvous":
            jobs_now.setdefault(job_id, {})["rendezvous_at_s"] = at_s
        elif kind == "job_planned":
            jobs_now.setdefault(job_id, {})["plan"] = detail
        elif kind == "work_records_stored":
            stored_at[detail["lease"]] = max(at_s, stored_at.get(detail["lease"], at_s))
        elif kind == "settlement_failed":
            tries = settling.setdefault(job_id, {"failures": 0, "failed_at_s": None,
                                                 "settled_at_s": None})
            tries["failures"] += 1
            tries["failed_at_s"] = max(at_s, tries["failed_at_s"] or at_s)
        else:
            settling.setdefault(job_id, {"failures": 0, "failed_at_s": None})["settled_at_s"] = at_s
    for job_id, values in jobs_now.items():
        connection.execute(jobs.update().where(jobs.c.job_id == job_id).values(**values))
    for lease, at_s in stored_at.items():
        connection.execute(leases.update().where(leases.c.lease == lease)
                           .values(records_stored_at_s=at_s))
    for job_id, tries in settling.items():
        connection.execute(settlements.insert().values(job_id=job_id, **tries))


def downgrade() -> None:
    op.drop_table("settlements")
    with op.batch_alter_table("leases", schema=None) as batch_op:
        batch_op.drop_column("records_stored_at_s")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("plan")
        batch_op.drop_column("rendezvous_at_s")
