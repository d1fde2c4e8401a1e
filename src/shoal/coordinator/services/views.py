"""Rows of the store as the API shows them."""

from __future__ import annotations

import functools
import tomllib

from shoal.coordinator.db.schema import AgentRow, EventRow, JobRow, OfferRow, ParticipantRow
from shoal.market import JobMeter
from shoal.spec.coordinator import (
    AgentView, Event, JobStatus, JobView, OfferView, Participant, Preflight, Role,
)
from shoal.spec.market import DeviceLease, Tenancy


def participant_view(row: ParticipantRow) -> Participant:
    return Participant(address=row.address, role=Role(row.role), name=row.name,
                       registered_at_s=row.registered_at_s, max_priority=row.max_priority or 0)


def agent_view(row: AgentRow, now_s: float, timeout_s: float) -> AgentView:
    return AgentView(agent_id=row.agent_id, provider=row.provider, region=row.region,
                     devices=tuple(Preflight.model_validate(d) for d in row.devices),
                     registered_at_s=row.registered_at_s, last_seen_s=row.last_seen_s,
                     online=now_s - row.last_seen_s <= timeout_s)


def offer_view(row: OfferRow) -> OfferView:
    return OfferView(offer_id=row.offer_id, provider=row.provider, agent_id=row.agent_id,
                     device_kind=row.device_kind, region=row.region,
                     speed_samples_per_s=row.speed_samples_per_s, memory_gb=row.memory_gb,
                     price_wei_per_s=row.price_wei_per_s, tenancy=Tenancy(row.tenancy),
                     reference_wei_per_s=row.reference_wei_per_s, withdrawn=row.withdrawn,
                     marked_down=row.marked_down)


def job_view(row: JobRow, meter: JobMeter | None, now_s: float) -> JobView:
    """A job with its bill by `now_s`; `meter` is None only for a job the market never saw."""
    leases: tuple[DeviceLease, ...] = meter.leases if meter else ()
    budget = meter.budget_wei if meter else int(row.bid["budget_wei"])
    spent = meter.accrued_wei(now_s) if meter else 0
    return JobView(job_id=row.job_id, name=row.name, submitter=row.submitter,
                   status=JobStatus(row.status), workers=int(row.bid["workers"]),
                   max_price_wei_per_s=int(row.bid["max_price_wei_per_s"]),
                   budget_wei=budget, spent_wei=spent, remaining_wei=budget - spent,
                   priority=int(row.bid["priority"]), leases=leases,
                   created_at_s=row.created_at_s, rendezvous=row.rendezvous,
                   chain_job=row.chain_job, bundle_sha256=_bundle_of(row.job_file))


@functools.lru_cache(maxsize=4096)
def _bundle_of(job_file: str) -> str | None:
    """The bundle a job file names (parsed once per job file: a page of jobs is read often,
    and a job file never changes)."""
    try:
        bundle = tomllib.loads(job_file).get("bundle")
    except tomllib.TOMLDecodeError:
        return None
    sha256 = bundle.get("sha256") if isinstance(bundle, dict) else None
    return sha256 if isinstance(sha256, str) else None


def event_view(row: EventRow) -> Event:
    return Event(seq=row.seq, at_s=row.at_s, actor=row.actor, kind=row.kind,
                 job_id=row.job_id, detail=row.detail)
