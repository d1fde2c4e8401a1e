"""How long the coordinator keeps the files agents sent to answer challenges: until
nothing can need them, then no longer (issue 40, point 10).

Every answer is a file of up to `max_file_bytes`, and without an end they would pile
up on the coordinator's disk for as long as it runs. A file is deleted once
(a) its proof epoch's challenge window has closed (windows.py: nobody may ask for it
any more), (b) `answer_retention_s` has passed since, for verifiers to fetch it and
file their verdicts, and (c) nothing still reads it: no guilty verdict on its job near
its step awaits the referee's ruling, and no dispute on its job near its epoch is
open. "Near" is generous (a step's audit reads the next step's parameters and, under
DiLoCo, its whole round's states): the epochs within one epoch, plus a round, of the
accused step. The row keeps when its file was pruned, so a read answers 410 Gone with
that, never "the file changed".
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from shoal.coordinator.db.schema import ChallengeRow, DisputeRow, VerdictRow
from shoal.coordinator.proofs import windows
from shoal.coordinator.services.job_specs import JobSpecs
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.proof.epochs import epoch_of, window_epoch
from shoal.spec.job import JobSpec
from shoal.spec.proof import GUILTY

log = logging.getLogger(__name__)
GUILTY_KINDS = tuple(kind.value for kind in GUILTY)


class AnswerRetention:
    """Prunes answered challenges' files whose window and retention are over."""

    def __init__(self, desk: MarketDesk, specs: JobSpecs, retention_s: float,
                 forced_errors_on: Callable[[], bool], file_of: Callable[[ChallengeRow], Path]
                 ) -> None:
        """`forced_errors_on`: whether epochs are served when published with their plants
        (windows.py); `file_of`: where a challenge's answer lies on disk."""
        self.desk, self.specs, self.retention_s = desk, specs, retention_s
        self.forced_errors_on, self.file_of = forced_errors_on, file_of

    def prune(self) -> int:
        """Delete the files nothing can need any more, and mark their challenges pruned
        in the same transaction as the checks (a verdict filed meanwhile waits for the
        store's writer, then finds them pruned). How many files were pruned."""
        with self.desk.change() as session:
            now = self.desk.now_s()
            rows = session.scalars(select(ChallengeRow).where(
                ChallengeRow.answered_at_s.is_not(None), ChallengeRow.pruned_at_s.is_(None),
                ChallengeRow.requested_at_s <= now - self.retention_s)).all()
            by_job: dict[str, list[ChallengeRow]] = defaultdict(list)
            for row in rows:
                by_job[row.job_id].append(row)
            pruned = [row for job_id, held in by_job.items()
                      for row in self._prunable(session, job_id, held, now)]
            for row in pruned:
                row.pruned_at_s = now
            paths = {self.file_of(row) for row in pruned}
        for path in paths:  # once marked: a read now answers 410, never a half-gone file
            path.unlink(missing_ok=True)
        if pruned:
            log.info("pruned %d answered challenge file(s) past their window and %.0f s "
                     "retention", len(pruned), self.retention_s)
        return len(pruned)

    def _prunable(self, session: Session, job_id: str, rows: list[ChallengeRow],
                  now: float) -> list[ChallengeRow]:
        spec = self.specs.job_spec(job_id)
        proof, reach = spec.proof, _reach(spec)
        served = windows.served_at(session, job_id, self.forced_errors_on())
        needed = _needed_epochs(session, job_id, proof.epoch_steps, reach)
        out = []
        for row in rows:
            epoch = window_epoch(row.step, proof.epoch_steps, reach, spec.steps)
            if epoch not in served or now < served[epoch] + proof.keep_s + self.retention_s:
                continue  # its window is open (not served yet), or closed too recently
            if epoch_of(row.step, proof.epoch_steps) in needed or epoch in needed:
                continue
            out.append(row)
        return out


def _reach(spec: JobSpec) -> int:
    """How many steps on a step's files are read (windows.py): a DiLoCo round's."""
    return spec.sync.inner_steps - 1


def _needed_epochs(session: Session, job_id: str, epoch_steps: int, reach: int) -> set[int]:
    """The job's epochs whose files a ruling still to come may read: those near the step
    of each guilty verdict not ruled on yet, and near the epoch of each open dispute."""
    steps = session.scalars(select(VerdictRow.step).where(
        VerdictRow.job_id == job_id, VerdictRow.ruling.is_(None),
        VerdictRow.kind.in_(GUILTY_KINDS))).all()
    epochs = {epoch_of(step, epoch_steps) for step in steps}
    epochs |= set(session.scalars(select(DisputeRow.epoch).where(
        DisputeRow.job_id == job_id, DisputeRow.ruling.is_(None))).all())
    margin = 1 + math.ceil(reach / epoch_steps)
    return {near for epoch in epochs for near in range(epoch - margin, epoch + margin + 1)}
