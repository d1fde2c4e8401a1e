"""What the operator serves verifiers: the job's records and contributions,
with forced errors mixed in (Truebit). A planted record is a real one whose
contribution the operator replaced with a wrong one and re-committed, so it
passes every cheap check (tree, slice, parameters, commitment) and only a
replay shows it is wrong: a verifier that does not replay cannot tell.

Plants are decided by the operator's committed secret (`ForcedErrors`), so
the operator cannot choose them after seeing verdicts, and no worker is
ever blamed for one (`without_plants`).
"""

from __future__ import annotations

import torch

from shoal.proof.epochs import epoch_of
from shoal.proof.forced import ForcedErrors
from shoal.spec.proof import WorkRecord
from shoal.verify.proof_store import ProofStore, UnreadableFile, contribution_norm, contribution_sha256


class ServedStore:
    """A ProofStore as the operator serves it: plants in place of some records."""

    def __init__(self, store: ProofStore, forced: ForcedErrors | None, epoch_steps: int) -> None:
        self.store, self.forced, self.epoch_steps = store, forced, epoch_steps
        self._plants: dict[tuple[str, int], tuple[WorkRecord, list[torch.Tensor]]] = {}

    def _planted(self, record: WorkRecord) -> bool:
        # An empty contribution has no wrong version that a replay could tell apart.
        return self.forced is not None and record.contributed and record.plantable and \
            self.forced.is_planted(record.job, epoch_of(record.step, self.epoch_steps), record.step,
                                   record.worker)

    def _plant(self, record: WorkRecord) -> tuple[WorkRecord, list[torch.Tensor]] | None:
        key = (record.worker, record.step)
        if key not in self._plants:
            try:
                real = self.store.load_reveal(record.worker, record.step)
            except UnreadableFile:
                return None  # nothing sound to plant: the record stays real, its audit finds it
            if real is None:
                return None
            # The same values shifted by one place: the same norm, the wrong direction, so
            # a norm screen cannot tell, and no cheat's contribution becomes honest by it.
            wrong = [t.roll(1) for t in real]
            self._plants[key] = (record.model_copy(update={
                "contribution_sha256": contribution_sha256(record.job, record.worker, record.step, wrong),
                "contribution_norm": contribution_norm(wrong)}), wrong)
        return self._plants[key]

    def records(self, worker: str | None = None) -> list[WorkRecord]:
        out = []
        for record in self.store.records(worker):
            plant = self._plant(record) if self._planted(record) else None
            out.append(plant[0] if plant else record)
        return out

    def load_reveal(self, worker: str, step: int) -> list[torch.Tensor] | None:
        plant = self._plants.get((worker, step))
        return [t.clone() for t in plant[1]] if plant else self.store.load_reveal(worker, step)

    def limit_file_bytes(self, limit: int) -> None:
        self.store.limit_file_bytes(limit)

    def load_params(self, step: int) -> dict[str, torch.Tensor] | None:
        return self.store.load_params(step)

    def load_local(self, worker: str, step: int) -> tuple[dict, dict] | None:
        return self.store.load_local(worker, step)  # a worker's own state: never planted
