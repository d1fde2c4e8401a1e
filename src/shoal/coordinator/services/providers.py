"""Providers as the market meets them, two services the coordinator holds: their
offers (posted at a device's measured speed, withdrawn, or barred from a job) and
their agents (registered with the link our probe measured, and heard at each
heartbeat, answered with the workers to run and the challenges to answer)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.coordinator.db import beats
from shoal.coordinator.db.schema import AgentRow, LeaseRow, OfferRow
from shoal.coordinator.db.store import Store, record_event
from shoal.coordinator.errors import Conflict, Forbidden, NotFound
from shoal.coordinator.services import journal
from shoal.coordinator.services.job_hosts import JobHosts
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.services.probe import NetworkProbing
from shoal.coordinator.services.views import agent_view, offer_view
from shoal.coordinator.settings import CoordinatorSettings
from shoal.spec.audit import ChallengeView
from shoal.spec.coordinator import (
    COORDINATOR, AgentRegistration, AgentView, Assignment, Heartbeat, HeartbeatReply,
    OfferTerms, OfferView,
)
from shoal.spec.events import AgentRegistered, OfferPosted, OfferWithdrawn, ProviderBarred
from shoal.spec.market import DeviceLease, Offer

# What an agent's heartbeat answers with besides its workers, from the services that own
# it: the challenges it must answer (agent -> challenges), and the chain-lease terms its
# provider must still sign (provider, its leases -> lease number -> terms).
PendingChallenges = Callable[[str], tuple[ChallengeView, ...]]
AcceptanceTerms = Callable[[str, list[DeviceLease]], dict[int, Any]]


class ProviderOffers:
    """Providers' offers on the market, each change journaled with its rows and event."""

    def __init__(self, desk: MarketDesk) -> None:
        self.desk = desk

    def post(self, provider: str, terms: OfferTerms) -> OfferView:
        """Offer one of an agent's measured devices at the provider's price (a marked-down
        speed stays marked down)."""
        with self.desk.change() as session:
            now = self.desk.now_s()
            agent = own_agent(session, provider, terms.agent_id)
            if terms.device >= len(agent.devices):
                raise NotFound(f"agent '{agent.agent_id}' measured {len(agent.devices)} "
                               f"device(s); there is no device {terms.device}")
            measured = agent.devices[terms.device]
            row = session.get(OfferRow, terms.offer_id)
            if row is not None and row.provider != provider:
                raise Forbidden(f"offer '{terms.offer_id}' belongs to another provider")
            speed = measured["speed_samples_per_s"]
            if row is not None and row.marked_down:
                speed = min(speed, row.speed_samples_per_s)  # a re-post does not undo a mark-down
            offer = Offer(offer_id=terms.offer_id, provider=provider,
                          device_kind=measured["device_kind"], speed_samples_per_s=speed,
                          memory_gb=measured["memory_gb"], region=agent.region,
                          price_wei_per_s=terms.price_wei_per_s, tenancy=terms.tenancy,
                          torch=measured.get("torch"))
            reference = self.desk.command(session, journal.PostOffer(offer=offer), now)
            if row is None:
                row = OfferRow(offer_id=offer.offer_id, provider=provider, marked_down=False)
                session.add(row)
            row.agent_id, row.device, row.device_kind = agent.agent_id, terms.device, offer.device_kind
            row.region, row.speed_samples_per_s, row.memory_gb = offer.region, speed, offer.memory_gb
            row.price_wei_per_s, row.tenancy = offer.price_wei_per_s, offer.tenancy.value
            row.reference_wei_per_s, row.withdrawn = reference, False
            record_event(session, now, provider, OfferPosted(
                offer_id=offer.offer_id, price_wei_per_s=offer.price_wei_per_s,
                tenancy=offer.tenancy.value))
            return offer_view(row)

    def bar_provider(self, job_id: str, provider: str, reason: str) -> None:
        """Lease none of `provider`'s devices to `job_id` again (removed from it: its worker
        stayed out, or it was slashed); a re-posted offer would otherwise win it back."""
        with self.desk.change() as session:
            now = self.desk.now_s()
            self.desk.command(session, journal.BarProvider(job=job_id, provider=provider), now)
            record_event(session, now, COORDINATOR,
                         ProviderBarred(provider=provider, reason=reason), job_id)

    def drop_provider(self, job_id: str, provider: str, reason: str) -> None:
        """A provider caught cheating: its offers that hold this job's leases are withdrawn,
        so its workers stop and the next round leases replacements."""
        with self.desk.store.read() as session:
            offers = set(session.scalars(select(LeaseRow.offer_id).where(
                LeaseRow.job_id == job_id, LeaseRow.provider == provider)))
        for offer_id in sorted(offers):
            self.withdraw(COORDINATOR, offer_id, reason=reason)

    def withdraw(self, actor: str, offer_id: str, reason: str = "withdrawn") -> OfferView:
        """Take an offer off the market (its provider, or the coordinator): its leases end."""
        with self.desk.change() as session:
            now = self.desk.now_s()
            row = session.get(OfferRow, offer_id)
            if row is None:
                raise NotFound(f"no offer '{offer_id}'")
            if actor not in (row.provider, COORDINATOR):
                raise Forbidden(f"offer '{offer_id}' belongs to another provider")
            if not row.withdrawn:
                ended = self.desk.command(
                    session, journal.WithdrawOffer(offer_id=offer_id, provider=row.provider), now)
                self.desk.store_leases(session, ended)
                row.withdrawn = True
                record_event(session, now, actor, OfferWithdrawn(
                    offer_id=offer_id, reason=reason,
                    ended_leases=[lease.lease for lease in ended]))
            return offer_view(row)


class ProviderAgents:
    """Providers' agents: registered with the devices our probe measured, and heard."""

    def __init__(self, store: Store, desk: MarketDesk, settings: CoordinatorSettings,
                 probing: NetworkProbing, hosts: JobHosts,
                 pending_challenges: PendingChallenges,
                 acceptance_terms: AcceptanceTerms,
                 secrets_of: Callable[[str], dict[str, str]] = lambda job: {}) -> None:
        """`pending_challenges` (the audit service's), `acceptance_terms` (the chain
        settlement's) and `secrets_of` (a bundled job's secret variables) fill in each
        heartbeat's reply."""
        self.store, self.desk, self.settings = store, desk, settings
        self.probing, self.hosts = probing, hosts
        self.pending_challenges, self.acceptance_terms = pending_challenges, acceptance_terms
        self.secrets_of = secrets_of

    def register(self, provider: str, registration: AgentRegistration) -> AgentView:
        """Register (or update) a provider's agent with its devices as our probe measured
        their link; refused where the pre-flight collective failed."""
        bad = [d.device_kind for d in registration.devices if not d.collective_ok]
        if bad:
            raise Conflict(f"agent '{registration.agent_id}': the pre-flight collective failed "
                           f"on {bad}; fix the backend before offering these devices")
        # The link as our probe saw it, not as the agent states it.
        measured = self.probing.probed_devices(provider, registration)
        with self.desk.change() as session:
            now = self.desk.now_s()
            row = session.get(AgentRow, registration.agent_id)
            if row is not None and row.provider != provider:
                raise Forbidden(f"agent '{registration.agent_id}' belongs to another provider")
            devices = [d.model_dump(mode="json") for d in measured]
            if row is None:
                row = AgentRow(agent_id=registration.agent_id, provider=provider,
                               registered_at_s=now, running=[], region=registration.region,
                               devices=devices, last_seen_s=now)
                session.add(row)
            row.region, row.devices, row.last_seen_s = registration.region, devices, now
            record_event(session, now, provider, AgentRegistered(
                agent_id=row.agent_id, region=row.region, devices=devices))
            return agent_view(row, now, self.settings.agent_timeout_s)

    def heartbeat(self, provider: str, agent_id: str, beat: Heartbeat,
                  taken: beats.BeatTaken | None = None) -> HeartbeatReply:
        """Note the agent alive; answer with the workers it must run and those to stop.

        No market call and no lock: a beat touches one agent's row, so a
        thousand agents beating cannot queue behind a clearing round. Beats
        are group-committed (`store.beats`): this returns once the beat's
        transaction has committed. The API's signed beats come `taken`
        already, in one transaction with their nonce and role check.
        """
        if taken is None:
            taken = beats.beat_committer(self.store.engine).submit(beats.BeatNote(
                provider, agent_id, sorted(set(beat.running)), self.desk.now_s())).result()
        if taken.outcome is beats.BeatOutcome.no_agent:
            raise NotFound(f"no agent '{agent_id}': register it (POST /v1/agents) first")
        if taken.outcome is beats.BeatOutcome.not_owner:
            raise Forbidden(f"agent '{agent_id}' belongs to another provider")
        now = taken.at_s
        current = [(DeviceLease.model_validate(value), job_file, rendezvous)
                   for value, job_file, rendezvous in taken.leases]
        open_numbers = {lease.lease for lease, _, _ in current if lease.start_s <= now}
        terms = self.acceptance_terms(provider, [lease for lease, _, _ in current])
        return HeartbeatReply(
            at_s=now,
            # A worker is assigned once its job's host serves: it has a rendezvous to join.
            assignments=tuple(Assignment(lease=lease, job_file=job_file, rendezvous=rendezvous,
                                         rendezvous_pass=self.hosts.gate_pass(lease.job,
                                                                              lease.lease),
                                         ends_at_s=lease.ends_at_s,
                                         acceptance=terms.get(lease.lease),
                                         secret_env=self.secrets_of(lease.job))
                              for lease, job_file, rendezvous in current
                              if lease.lease in open_numbers and rendezvous),
            stop=tuple(n for n in beat.running if n not in open_numbers),
            challenges=self.pending_challenges(agent_id))


def own_agent(session: Session, provider: str, agent_id: str) -> AgentRow:
    """The agent, if it is `provider`'s; else `NotFound` or `Forbidden`."""
    agent = session.get(AgentRow, agent_id)
    if agent is None:
        raise NotFound(f"no agent '{agent_id}': register it (POST /v1/agents) first")
    if agent.provider != provider:
        raise Forbidden(f"agent '{agent_id}' belongs to another provider")
    return agent


def own_lease(session: Session, provider: str, job_id: str, lease: int) -> tuple[LeaseRow, str]:
    """The caller's lease of `job_id` and the agent it runs on: a provider speaks only for
    its own leases' workers (NotFound for no such lease of the job, Forbidden for
    another provider's)."""
    row = session.get(LeaseRow, lease)
    if row is None or row.job_id != job_id:
        raise NotFound(f"job '{job_id}' has no lease {lease}")
    if row.provider != provider:
        raise Forbidden(f"lease {lease} is not yours")
    return row, session.get(OfferRow, row.offer_id).agent_id
