"""The statements on every signed request's and every heartbeat's path: a
nonce remembered, a role read, an agent noted alive, its open leases read.

Plain SQL through SQLAlchemy Core, not the ORM: a thousand agents beat every
second, and the ORM's unit of work costs several times the statement it runs.
Beats are taken in batches (`take_beats`, run by a `GroupCommit`): a handful
of set-wise statements per batch instead of four statements and a commit per
beat.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from weakref import WeakKeyDictionary

from sqlalchemy import Connection, Engine, bindparam, insert, or_, select, update

from shoal.coordinator.db.database import GroupCommit
from shoal.coordinator.db.schema import AgentRow, JobRow, LeaseRow, NonceRow, OfferRow, ParticipantRow


# Built once: composing a statement costs more than SQLite takes to run it.
_RECORD_NONCE = insert(NonceRow).values(address=bindparam("address"), nonce=bindparam("nonce"),
                                        seen_at_s=bindparam("seen_at_s"))
_ROLE = select(ParticipantRow.role).where(ParticipantRow.address == bindparam("address"))
_SEEN_NONCES = select(NonceRow.address, NonceRow.nonce).where(
    NonceRow.address.in_(bindparam("addresses", expanding=True)),
    NonceRow.nonce.in_(bindparam("nonces", expanding=True)))
_ROLES = select(ParticipantRow.address, ParticipantRow.role).where(
    ParticipantRow.address.in_(bindparam("addresses", expanding=True)))
_OWNERS = select(AgentRow.agent_id, AgentRow.provider).where(
    AgentRow.agent_id.in_(bindparam("agents", expanding=True)))
_NOTE_BEAT = (update(AgentRow)
              .where(AgentRow.agent_id == bindparam("agent"))
              .values(last_seen_s=bindparam("seen_at_s"), running=bindparam("leases_running")))
_CURRENT_LEASES = (
    select(OfferRow.agent_id, LeaseRow.ends_at_s, LeaseRow.value, JobRow.job_file, JobRow.rendezvous)
    .join(OfferRow, LeaseRow.offer_id == OfferRow.offer_id)
    .join(JobRow, LeaseRow.job_id == JobRow.job_id)
    .where(OfferRow.agent_id.in_(bindparam("agents", expanding=True)),
           or_(LeaseRow.ends_at_s.is_(None), LeaseRow.ends_at_s > bindparam("now_s")))
    .order_by(LeaseRow.lease))


def record_nonce(connection: Connection, address: str, nonce: str, seen_at_s: float) -> None:
    """Remember a nonce; `IntegrityError` when this address has used it before."""
    connection.execute(_RECORD_NONCE, {"address": address, "nonce": nonce, "seen_at_s": seen_at_s})


def nonce_seen(connection: Connection, address: str, nonce: str) -> bool:
    """Whether this address used this nonce before (read only: `record_nonce` takes it)."""
    return connection.execute(_SEEN_NONCES, {"addresses": [address], "nonces": [nonce]}
                              ).first() is not None


def role_of(connection: Connection, address: str) -> str | None:
    return connection.scalar(_ROLE, {"address": address})


class BeatOutcome(Enum):
    noted = "noted"
    replayed = "replayed"  # the nonce was used before (or earlier in the same batch)
    wrong_role = "wrong_role"  # nonce recorded, agent not noted
    no_agent = "no_agent"
    not_owner = "not_owner"  # the agent belongs to another provider


@dataclass(frozen=True)
class BeatNote:
    """One beat to take: `provider` says `agent_id` is alive at `seen_at_s`."""

    provider: str
    agent_id: str
    running: list[int]  # lease numbers, sorted, distinct
    seen_at_s: float
    nonce: str | None = None  # the signed request's: recorded in the same transaction
    role_needed: str | None = None  # the store must give `provider` this role, or nothing is noted
    known_role: str | None = None  # a role fixed by settings (an operator): the store is not asked


@dataclass(frozen=True)
class BeatTaken:
    outcome: BeatOutcome
    at_s: float  # the note's `seen_at_s`: the time the reply speaks of
    role: str | None  # the signer's role when the beat was taken (None: not asked, or none)
    leases: list[tuple[dict, str, str | None]]  # (lease value, job file, rendezvous), not ended


def take_beats(connection: Connection, notes: Sequence[BeatNote]) -> list[BeatTaken]:
    """Take a batch of beats in the caller's transaction: nonces, roles, agents, leases."""
    outcomes, roles = _record_nonces(connection, notes), _roles(connection, notes)
    for i, note in enumerate(notes):
        if outcomes[i] is None and note.role_needed is not None \
                and (note.known_role or roles.get(note.provider)) != note.role_needed:
            outcomes[i] = BeatOutcome.wrong_role
    agents = {n.agent_id for n, o in zip(notes, outcomes) if o is None}
    owners = dict(connection.execute(_OWNERS, {"agents": list(agents)}).all()) if agents else {}
    for i, note in enumerate(notes):
        if outcomes[i] is None and owners.get(note.agent_id) != note.provider:
            outcomes[i] = BeatOutcome.no_agent if note.agent_id not in owners else BeatOutcome.not_owner
    noted = [n for n, o in zip(notes, outcomes) if o is None]
    if noted:
        connection.execute(_NOTE_BEAT, [{"agent": n.agent_id, "seen_at_s": n.seen_at_s,
                                         "leases_running": n.running} for n in noted])
    leases = _current_leases(connection, noted)
    return [BeatTaken(outcome or BeatOutcome.noted, note.seen_at_s, note.known_role or roles.get(note.provider),
                      [(value, job_file, rendezvous)
                       for ends_at_s, value, job_file, rendezvous in leases.get(note.agent_id, ())
                       if ends_at_s is None or ends_at_s > note.seen_at_s] if outcome is None else [])
            for note, outcome in zip(notes, outcomes)]


def _record_nonces(connection: Connection, notes: Sequence[BeatNote]) -> list[BeatOutcome | None]:
    """Record the batch's nonces; a nonce seen before, or twice in the batch, is a replay."""
    signed = [n for n in notes if n.nonce is not None]
    if not signed:
        return [None] * len(notes)
    seen = set(map(tuple, connection.execute(_SEEN_NONCES, {
        "addresses": list({n.provider for n in signed}),
        "nonces": list({n.nonce for n in signed})}).all()))
    outcomes: list[BeatOutcome | None] = []
    fresh = []
    for note in notes:
        key = (note.provider, note.nonce)
        if note.nonce is not None and key in seen:
            outcomes.append(BeatOutcome.replayed)
            continue
        if note.nonce is not None:
            seen.add(key)
            fresh.append({"address": note.provider, "nonce": note.nonce,
                          "seen_at_s": note.seen_at_s})
        outcomes.append(None)
    if fresh:
        connection.execute(_RECORD_NONCE, fresh)
    return outcomes


def _roles(connection: Connection, notes: Sequence[BeatNote]) -> dict[str, str]:
    asked = {n.provider for n in notes if n.role_needed is not None and n.known_role is None}
    return dict(connection.execute(_ROLES, {"addresses": list(asked)}).all()) if asked else {}


def _current_leases(connection: Connection, noted: Sequence[BeatNote]) -> dict[str, list]:
    """The noted agents' leases not ended at the batch's earliest beat, by agent, by number.

    Ended leases are left in the store: filtering them here keeps a beat's
    cost from growing with the agent's history.
    """
    if not noted:
        return {}
    rows = connection.execute(_CURRENT_LEASES, {"agents": list({n.agent_id for n in noted}),
                                                "now_s": min(n.seen_at_s for n in noted)})
    by_agent: dict[str, list] = {}
    for row in rows:
        by_agent.setdefault(row.agent_id, []).append(
            (row.ends_at_s, row.value, row.job_file, row.rendezvous))
    return by_agent


_COMMITTERS: WeakKeyDictionary[Engine, GroupCommit] = WeakKeyDictionary()
_COMMITTERS_GUARD = threading.Lock()


def beat_committer(engine: Engine) -> GroupCommit:
    """The engine's group commit of beats (one per engine, made on first use)."""
    with _COMMITTERS_GUARD:
        committer = _COMMITTERS.get(engine)
        if committer is None:
            committer = _COMMITTERS[engine] = GroupCommit(engine, take_beats)
        return committer
