"""A DiLoCo round's end (check 5 of `shoal.verify.audit.local`): the committed
pseudo-gradient is (theta_outer − the round's last end) × round_samples /
round_expected, within the tolerance, with the counts the worker's records of the
round show, and it is what the worker put in the outer exchange."""

from __future__ import annotations

import collections
from collections.abc import Iterable

import torch

from shoal.spec.proof import VerdictKind, WorkRecord
from shoal.verify.audit.round_start import RoundStarts
from shoal.verify.audit.sent import sent_problem
from shoal.verify.audit.walk import Finding
from shoal.verify.known_records import KnownRecords
from shoal.verify.replay import Replayer, relative_distance


class RoundEnds:
    def __init__(self, replayer: Replayer, round_starts: RoundStarts, tolerance: float) -> None:
        self.replayer, self.round_starts, self.tolerance = replayer, round_starts, tolerance

    def problem(self, record: WorkRecord, mine: list[WorkRecord], everyone: KnownRecords,
                outer_sha256: str, pseudo: torch.Tensor) -> Finding:
        """The round's end (the model holds where its last step ended): is the committed
        `pseudo`-gradient (theta_outer − that) weighted by the samples its records show?"""
        claim = record.local
        outer = self.round_starts.found(claim.round_start)
        if outer is None or outer[0] != outer_sha256:  # no kept start at it was read here
            end = {k: v.clone() for k, v in self.replayer.model.state_dict().items()}
            outer = self.round_starts.params(claim.round_start, everyone)
            self.replayer.load(end)
            if outer is None:
                return (VerdictKind.unavailable, "no agreed parameters for the round starting "
                        f"at step {claim.round_start}", None)
        outer_flat = outer[1]
        samples, expected = _round_counts(record, mine, everyone, outer_sha256)
        if (claim.round_samples, claim.round_expected) != (samples, expected):
            return (VerdictKind.wrong_samples,
                    f"claims {claim.round_samples} of {claim.round_expected} samples for its "
                    f"pseudo-gradient; its records of the round show {samples} of {expected}", None)
        honest = (outer_flat - self.replayer.flat_params()) * (samples / expected)
        distance = relative_distance([honest], [pseudo])
        if distance > self.tolerance:
            return VerdictKind.wrong_contribution, "the pseudo-gradient is not the round's", distance
        # ... and it is what the worker put in the outer exchange, with that count.
        found = sent_problem(record, everyone.of_step(record.step), [pseudo],
                             self.tolerance, count=claim.round_samples)
        return found if found is not None else (VerdictKind.valid, "", distance)


def _round_counts(record: WorkRecord, mine: list[WorkRecord], everyone: KnownRecords,
                 outer_sha256: str) -> tuple[int, int]:
    """(samples behind this worker's pseudo-gradient, samples of the round's steps) as
    `DiLoCo` counts them: a step back at theta_outer after the round's start (a
    rollback, a join) drops this worker's samples before it; an earlier end of the
    round that the guard skipped counts nowhere. A step the worker has no record of
    (it joined mid-round) is counted as most of its records say; where it has one, its
    own says (a peer's record cannot move it)."""
    claim = record.local

    def of_round(records: Iterable[WorkRecord]) -> list[WorkRecord]:
        return [r for r in records if r.local is not None and r.local.round_start ==
                claim.round_start and claim.round_start <= r.step <= record.step]

    own = {r.step: r for r in of_round(mine)}
    others: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in of_round(r for step in range(claim.round_start, record.step + 1)
                      for r in everyone.of_step(step)):
        others[r.step][(r.global_batch, r.local.outer)] += 1
    samples = expected = 0
    for step in range(claim.round_start, record.step + 1):
        r = own.get(step)
        if r is not None:
            batch, skipped = r.global_batch, r.local.outer and step != record.step
        elif others[step]:
            batch, outer = others[step].most_common(1)[0][0]
            skipped = outer
        else:
            continue  # nobody recorded it
        if skipped:
            continue
        expected += batch
        if r is not None:
            if step > claim.round_start and r.params_sha256 == outer_sha256:
                samples = 0
            samples += r.samples if r.local.applied else 0
    return samples, expected
