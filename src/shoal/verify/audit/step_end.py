"""Where a DiLoCo step ended (check 4 of `shoal.verify.audit.local`): the job's
optimizer, from the kept start on the committed gradient, ends where the record
says, bit for bit or, where another CPU rounds differently, within the tolerance
of the state a later step kept there."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from shoal.spec.proof import VerdictKind, WorkRecord
from shoal.train.hashing import optimizer_state_sha256
from shoal.verify.audit.walk import Finding
from shoal.verify.known_records import KnownRecords
from shoal.verify.proof_store import ProofStore, UnreadableFile
from shoal.verify.replay import Replayer, relative_distance


class StepEnds:
    def __init__(self, store: ProofStore, replayer: Replayer, tolerance: float) -> None:
        self.store, self.replayer, self.tolerance = store, replayer, tolerance

    def problem(self, record: WorkRecord, everyone: KnownRecords, start: dict,
                new_state: dict) -> Finding | None:
        """Does the optimizer step (from parameters `start`; the replayer's model holds
        where it ended, `new_state` its optimizer state) end where the record claims?
        Bit for bit, or within the tolerance of the claimed end as kept for a later step:
        the worker's own next one, or else a peer's that started from the claimed
        optimizer state.

        Peers count: a worker that claims an end it never reached and goes on from its
        true state, while a colluding peer starts from the claim (its next round, or a
        restart at theta_outer), would otherwise leave nothing to measure against
        (`unavailable`, no verdict). Each kept file must be the state its record claims:
        a peer's that is not cannot speak for or against this worker (one keeping the
        true end under the forged claim's name would clear it), and the worker's own that
        is not is its own broken commitment."""
        claim = record.local
        for later in next_kept_starts(record, everyone):
            try:
                kept = self.store.load_local(later.worker, later.step)
            except UnreadableFile:
                if later.worker == record.worker:
                    return (VerdictKind.bad_commitment, f"the state its step {later.step} "
                            "started from is not a state", None)
                continue  # a peer's broken file speaks for nobody
            if kept is None:
                continue
            next_params, next_state = kept
            if optimizer_state_sha256(next_state) != claim.end_state_sha256:
                if later.worker == record.worker:
                    return (VerdictKind.bad_commitment, f"the state its step {later.step} "
                            "started from is not the one its records claim", None)
                continue
            distance = relative_distance(state_tensors(new_state), state_tensors(next_state))
            if not claim.outer and later.worker == record.worker:  # the parameters go on too
                distance = max(distance, self._moved_distance(start, next_params))
            if distance <= self.tolerance:
                return None
            return (VerdictKind.wrong_contribution,
                    "the optimizer step does not end where the record says", distance)
        return (VerdictKind.unavailable,
                "the step's end differs in its last bits and no later step's state that "
                "starts there is kept to measure by how much", None)

    def _moved_distance(self, start: dict, next_params: dict) -> float:
        """How far the re-taken move of the parameters from `start` is from the move to
        the worker's next kept start."""
        moved = self.replayer.flat_params()
        names = _trainable(self.replayer.model)
        base = torch.cat([start[k].reshape(-1) for k in names])
        there = torch.cat([next_params[k].reshape(-1) for k in names])
        return relative_distance([moved - base], [there - base])


def next_kept_starts(record: WorkRecord, everyone: Iterable[WorkRecord]) -> list[WorkRecord]:
    """The later records that start where `record` claims its step ended, in the order
    an audit measures against them: the worker's own next (at the claimed parameters and
    optimizer state; after a round's end, the state alone, the parameters going to the
    outer step), then peers' that started from the claimed optimizer state (a joiner's,
    or a restart at theta_outer), in step order."""
    claim = record.local
    own = [r for r in everyone if r.worker == record.worker and r.step > record.step
           and r.local is not None and r.local.state_sha256 == claim.end_state_sha256
           and (claim.outer or r.params_sha256 == claim.end_params_sha256)]
    peers = [r for r in everyone if r.worker != record.worker and r.step > record.step
             and r.local is not None and r.local.state_sha256 == claim.end_state_sha256]
    return sorted(own, key=lambda r: r.step) + sorted(peers, key=lambda r: (r.step, r.worker))


def state_tensors(state: dict) -> list[torch.Tensor]:
    """An optimizer state's tensors in a fixed order (parameter, then name)."""
    return [state[i][name].detach().reshape(-1).double() for i in sorted(state)
            for name in sorted(state[i]) if isinstance(state[i][name], torch.Tensor)]


def _trainable(model: torch.nn.Module) -> list[str]:
    return [name for name, p in model.named_parameters() if p.requires_grad]
