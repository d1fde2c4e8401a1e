"""Participants of a coordinator and their roles, a service of its own: nonces
that count once, self-registration as a submitter or provider, roles an operator
grants, and the signed heartbeats taken with their nonce and role check."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future
from contextlib import AbstractContextManager

from eth_utils import to_checksum_address
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from shoal.coordinator.errors import Conflict, Forbidden
from shoal.coordinator.services.views import participant_view
from shoal.client.identity import Signer, Unauthenticated
from shoal.coordinator.db import beats
from shoal.coordinator.db.database import write_transaction
from shoal.coordinator.db.schema import ParticipantRow
from shoal.coordinator.db.store import Store, record_event
from shoal.coordinator.settings import CoordinatorSettings
from shoal.spec.coordinator import SELF_SERVICE_ROLES, Grant, Participant, Registration, Role
from shoal.spec.events import Granted, Registered

REPLAYED = "this nonce was already used: a replayed request is refused; sign the request again"


def refuse_role(address: str, role: Role | None, roles: tuple[Role, ...]) -> None:
    """`Forbidden`, naming the role held and the one needed, unless `role` is in `roles`."""
    if role not in roles:
        held = f"a {role.value}" if role else "not registered"
        wanted = " or ".join(r.value for r in roles)
        raise Forbidden(f"{address} is {held}; this call needs the {wanted} role")


class Participants:
    """Who may sign what: each address's role, and the nonces already used."""

    def __init__(self, store: Store, settings: CoordinatorSettings, now_s: Callable[[], float],
                 change: Callable[[], AbstractContextManager[Session]]) -> None:
        """`now_s`: the coordinator's clock; `change`: its one writer (the lock and one
        transaction), which registrations and grants go through like every change."""
        self.store, self.settings, self.now_s, self._change = store, settings, now_s, change

    def consume_nonce(self, signer: Signer) -> None:
        """A nonce counts once: a replayed request is refused before it is looked at."""
        now = self.now_s()
        try:
            with write_transaction(self.store.engine) as connection:
                beats.record_nonce(connection, signer.address, signer.nonce, now)
        except IntegrityError:
            raise Unauthenticated(REPLAYED) from None

    def take_signed_beat(self, signer: Signer, agent_id: str, running: Iterable[int],
                         now_s: float) -> Future[beats.BeatTaken]:
        """A provider's signed heartbeat, taken with its nonce and role check in one
        group-committed transaction; the future resolves once that has committed."""
        operator = signer.address in self.settings.operators
        note = beats.BeatNote(signer.address, agent_id, sorted(set(running)), now_s,
                              nonce=signer.nonce, role_needed=Role.provider.value,
                              known_role=Role.operator.value if operator else None)
        return beats.beat_committer(self.store.engine).submit(note)

    @staticmethod
    def refuse_signed_beat(address: str, taken: beats.BeatTaken) -> None:
        """`Unauthenticated` for a replayed beat, `Forbidden` for one not of a provider."""
        if taken.outcome is beats.BeatOutcome.replayed:
            raise Unauthenticated(REPLAYED)
        if taken.outcome is beats.BeatOutcome.wrong_role:
            refuse_role(address, Role(taken.role) if taken.role else None, (Role.provider,))

    def role_of(self, address: str) -> Role | None:
        if address in self.settings.operators:
            return Role.operator
        with self.store.engine.connect() as connection:
            role = beats.role_of(connection, address)
        return Role(role) if role else None

    def registered(self, after: str | None = None, limit: int | None = None) -> list[Participant]:
        """Everyone registered or granted a role, by address: those after `after`, `limit`
        at most."""
        query = select(ParticipantRow).order_by(ParticipantRow.address).limit(limit)
        if after is not None:
            query = query.where(ParticipantRow.address > after)
        with self.store.read() as session:
            return [participant_view(row) for row in session.scalars(query)]

    def register(self, signer: str, registration: Registration) -> Participant:
        if registration.role not in SELF_SERVICE_ROLES:
            raise Forbidden(f"the {registration.role.value} role is granted by an operator; "
                            "register as a submitter or a provider")
        with self._change() as session:
            row = session.get(ParticipantRow, signer)
            if row is not None and row.role != registration.role.value:
                raise Conflict(f"{signer} is registered as a {row.role}; use another key "
                               f"for the {registration.role.value} role")
            now = self.now_s()
            if row is None:
                row = ParticipantRow(address=signer, role=registration.role.value,
                                     name=registration.name, registered_at_s=now)
                session.add(row)
            row.name = registration.name
            record_event(session, now, signer, Registered(role=row.role, name=row.name))
            return participant_view(row)

    def grant(self, operator: str, grant: Grant) -> Participant:
        address = to_checksum_address(grant.address)
        with self._change() as session:
            now = self.now_s()
            row = session.get(ParticipantRow, address)
            if row is None:
                row = ParticipantRow(address=address, role=grant.role.value, name=grant.name,
                                     registered_at_s=now)
                session.add(row)
            row.role, row.name = grant.role.value, grant.name
            if grant.max_priority is not None:
                row.max_priority = grant.max_priority
            record_event(session, now, operator, Granted(address=address, role=row.role,
                                                         max_priority=row.max_priority or 0))
            return participant_view(row)

    def check_priority(self, submitter: str, priority: int) -> None:
        """A job above priority 0 may take spot devices from others' jobs (with notice):
        that is an operator's grant, or anyone could preempt everyone with a job of no
        budget, again and again. Up to the submitter's ceiling (0 unless granted)."""
        if priority <= 0:
            return
        with self.store.engine.connect() as connection:
            row = connection.execute(select(ParticipantRow.max_priority).where(
                ParticipantRow.address == submitter)).first()
        ceiling = row[0] if row is not None else 0
        if priority > ceiling:
            raise Forbidden(f"priority {priority} is above your ceiling of {ceiling}: a job "
                            "above 0 takes spot devices from others' jobs, so an operator "
                            "grants it (shoal grant ADDRESS submitter --max-priority N); "
                            "submit at priority 0 or ask one")
