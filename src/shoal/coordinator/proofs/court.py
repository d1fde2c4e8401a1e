"""What the referee and its penalties use of the coordinator, as a protocol: they are
typed by it without importing the composition root (`coordinator/service.py`), which
builds them and so must not be imported back."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from shoal.coordinator.db.store import Store
from shoal.coordinator.proofs.published_epochs import PublishedEpochs
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.services.providers import ProviderOffers
from shoal.coordinator.services.settlement import Settlement
from shoal.spec.audit import ProofEpochView, VerdictView
from shoal.spec.job import JobSpec
from shoal.spec.proof import WorkRecord


class Court(Protocol):
    """The coordinator as the referee sees it: the store, the chain, the proof services."""

    store: Store
    desk: MarketDesk  # the market, the clock and the one writer
    settlement: Settlement | None  # None: escrow is the store's bookkeeping only
    _published: PublishedEpochs  # the membership epochs each job's host published
    offers: ProviderOffers  # bars a slashed provider from the job

    def job_spec(self, job_id: str, job_file: str | None = None) -> JobSpec: ...

    def work_records(self, job_id: str, epoch: int | None = None) -> list[WorkRecord]: ...

    def proof_dir(self, job_id: str) -> Path: ...

    def proof_epochs(self, job_id: str) -> list[ProofEpochView]: ...

    def verdicts(self, job_id: str) -> list[VerdictView]: ...

    def is_plant(self, job_id: str, worker: str, step: int) -> bool: ...

    def drop_provider(self, job_id: str, provider: str, reason: str) -> None: ...
