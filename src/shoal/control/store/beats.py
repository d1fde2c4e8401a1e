"""The statements on every signed request's and every heartbeat's path: a
nonce remembered, a role read, an agent noted alive, its open leases read.

Plain SQL through SQLAlchemy Core, not the ORM: a thousand agents beat every
second, and the ORM's unit of work costs several times the statement it runs.
"""

from __future__ import annotations

from sqlalchemy import Connection, bindparam, insert, or_, select, update

from shoal.control.store.schema import AgentRow, JobRow, LeaseRow, NonceRow, OfferRow, ParticipantRow


# Built once: composing a statement costs more than SQLite takes to run it.
_RECORD_NONCE = insert(NonceRow).values(address=bindparam("address"), nonce=bindparam("nonce"),
                                        seen_at_s=bindparam("seen_at_s"))
_ROLE = select(ParticipantRow.role).where(ParticipantRow.address == bindparam("address"))
_NOTE_BEAT = (update(AgentRow)
              .where(AgentRow.agent_id == bindparam("agent"), AgentRow.provider == bindparam("owner"))
              .values(last_seen_s=bindparam("seen_at_s"), running=bindparam("leases_running")))
_OWNER = select(AgentRow.provider).where(AgentRow.agent_id == bindparam("agent"))
_CURRENT_LEASES = (
    select(LeaseRow.value, JobRow.job_file, JobRow.rendezvous)
    .join(OfferRow, LeaseRow.offer_id == OfferRow.offer_id)
    .join(JobRow, LeaseRow.job_id == JobRow.job_id)
    .where(OfferRow.agent_id == bindparam("agent"),
           or_(LeaseRow.ends_at_s.is_(None), LeaseRow.ends_at_s > bindparam("now_s")))
    .order_by(LeaseRow.lease))


def record_nonce(connection: Connection, address: str, nonce: str, seen_at_s: float) -> None:
    """Remember a nonce; `IntegrityError` when this address has used it before."""
    connection.execute(_RECORD_NONCE, {"address": address, "nonce": nonce, "seen_at_s": seen_at_s})


def role_of(connection: Connection, address: str) -> str | None:
    return connection.scalar(_ROLE, {"address": address})


def note_beat(connection: Connection, provider: str, agent_id: str, running: list[int],
              seen_at_s: float) -> bool:
    """Note `provider`'s agent alive and running `running`; False if it has no such agent."""
    result = connection.execute(_NOTE_BEAT, {"agent": agent_id, "owner": provider,
                                             "seen_at_s": seen_at_s, "leases_running": running})
    return result.rowcount == 1


def agent_owner(connection: Connection, agent_id: str) -> str | None:
    return connection.scalar(_OWNER, {"agent": agent_id})


def current_leases(connection: Connection, agent_id: str,
                   now_s: float) -> list[tuple[dict, str, str | None]]:
    """The agent's leases not ended at `now_s`, by number: (lease value, job file, rendezvous).

    Ended leases are left in the store: filtering them here keeps a beat's
    cost from growing with the agent's history.
    """
    rows = connection.execute(_CURRENT_LEASES, {"agent": agent_id, "now_s": now_s})
    return [(row.value, row.job_file, row.rendezvous) for row in rows]
