"""Re-taking a worker's chain of DiLoCo steps in one pass (`shoal.verify.audit.local`
holds the rules; this is the mechanics and what it may skip).

From the chain's first kept and checked start, the job's optimizer takes each step
on its committed gradient, keeping its state from step to step, and the last
step's gradient is judged at the state the chain reached. A step's end is hashed
only where a claim is needed: the chain's last (which pins every step before it:
the walk's state there is the committed gradients' work from a checked start,
and the worker's own is that only if it took those steps from that start), one a
later step of the chain does not start from, and one another record starts from
(a joiner, a restart: their audits trust the claim). Any other step's claimed end
is a name only the next step's claimed start repeats, and nothing reads a state
by it without re-taking the chain to it first: an audit of that next step walks
there (its gradient replayed at the walk's state, not at a kept file), and the
step-by-step fallback measures every claimed end against the re-taken one.

A walk that ends bit for bit as claimed leaves its state for a later walk of the
same chain to go on from (an inner step's audit, then its round end's): the same
bits, a cache, not a trust.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from shoal.spec.proof import VerdictKind, WorkRecord
from shoal.train.hashing import optimizer_state_sha256, param_sha256
from shoal.verify.known_records import KnownRecords
from shoal.verify.proof_store import ProofStore, UnreadableFile, contribution_sha256
from shoal.verify.replay import Replayer

# (kind, detail, distance) of a failed check, or None when the record passes.
Finding = tuple[VerdictKind, str, float | None]
# A step's kept start, checked by the audit's rules: (finding, (params, optimizer state)).
KeptStart = Callable[[WorkRecord], tuple[Finding | None, tuple[dict, dict] | None]]

# The states walks reached that a later walk may go on from, at most this many bytes.
REACHED_BYTES = 256 * 2**20


class RoundWalk:
    def __init__(self, store: ProofStore, replayer: Replayer) -> None:
        self.store, self.replayer = store, replayer
        # chain (`_chain_key`) -> (parameters, optimizer state, the records it was
        # walked over, bytes)
        self._reached: dict[tuple, tuple[dict, dict, KnownRecords, int]] = {}

    def walk(self, chain: list[WorkRecord], everyone: KnownRecords, kept_start: KeptStart,
             judge: Callable[[list[torch.Tensor]], Finding | None]) -> list[torch.Tensor] | None:
        """Re-take `chain` (a worker's steps of a round, in order, their seeds and slices
        checked); `judge` replays the last step's gradient at the state reached. The last
        step's revealed contribution when every check passed and every hash taken matched
        its claim; None when anything did not (the caller then audits step by step, which
        says what and where)."""
        revealed: list[torch.Tensor] = []
        resume = self._resume(chain, everyone)
        for i, step in enumerate(chain[resume:], start=resume):
            # From a kept start at the chain's first step and at a restart; else the
            # replayer holds where the last step (or an earlier walk) ended.
            if i == resume == 0 or i > resume and _start(step) != _end(chain[i - 1]):
                found, kept = kept_start(step)
                if found is not None:
                    return None
                try:  # the check loaded the parameters; a forged state may not fit
                    self.replayer.hold(None, kept[1])
                except (RuntimeError, KeyError, ValueError, IndexError, TypeError):
                    return None
            found, revealed = opened_reveal(self.store, step)
            if found is not None:
                return None
            gradients = revealed[:-1] if step.local.outer else revealed
            if i == len(chain) - 1 and judge(gradients) is not None:
                return None
            if step.local.applied:
                try:
                    self.replayer.local_step(step, None, None, gradients)
                except (RuntimeError, KeyError, ValueError, IndexError):
                    return None
            successor = chain[i + 1] if i + 1 < len(chain) else None
            if successor is None or _start(successor) != _end(step) or \
                    _relied_on(everyone, _end(step), successor):
                ended = (param_sha256(self.replayer.model),
                         optimizer_state_sha256(self.replayer.local_state()))
                if ended != _end(step):
                    return None
        if not chain[-1].local.outer:  # a round's end: no longer chain goes on from it
            self._remember(chain, everyone)
        return revealed

    def _resume(self, chain: list[WorkRecord], everyone: KnownRecords) -> int:
        """How many of `chain`'s steps an earlier walk took, ending bit for bit where the
        last of them claims and the next starts (the replayer then holds that state), or
        0. Only over the same records (the same index: `KnownRecords.of` keeps it while
        they are the same objects), as which claims the walk hashed depends on them: as
        many records, one filed again otherwise, could start from a claim it skipped."""
        for k in range(len(chain) - 1, 0, -1):
            reached = self._reached.get(_chain_key(chain[:k]))
            if reached is not None and reached[2] is everyone and \
                    _start(chain[k]) == _end(chain[k - 1]):
                self.replayer.hold(reached[0], _copied(reached[1]))
                return k
        return 0

    def _remember(self, chain: list[WorkRecord], everyone: KnownRecords) -> None:
        """Keep the state the walk of `chain` ended at (within `REACHED_BYTES`)."""
        params = {k: v.detach().clone() for k, v in self.replayer.model.state_dict().items()}
        state = _copied(self.replayer.local_state())
        size = _nbytes(params) + sum(_nbytes(slots) for slots in state.values())
        if size > REACHED_BYTES:
            return
        self._reached[_chain_key(chain)] = (params, state, everyone, size)
        while sum(entry[3] for entry in self._reached.values()) > REACHED_BYTES:
            del self._reached[next(iter(self._reached))]  # the oldest


def opened_reveal(store: ProofStore, record: WorkRecord
                  ) -> tuple[Finding | None, list[torch.Tensor]]:
    """The worker's revealed contribution for `record`, if it opens the commitment."""
    try:
        revealed = store.load_reveal(record.worker, record.step)
    except UnreadableFile as error:
        return (VerdictKind.bad_commitment, f"the revealed file is not a contribution: {error}",
                None), []
    if revealed is None:
        return (VerdictKind.withheld, "no contribution revealed for this step", None), []
    if contribution_sha256(record.job, record.worker, record.step, revealed) != \
            record.contribution_sha256:
        return (VerdictKind.bad_commitment, "the revealed contribution is not the committed one",
                None), revealed
    return None, revealed


def _relied_on(everyone: KnownRecords, end: tuple[str, str],
               successor: WorkRecord | None) -> bool:
    """Does a record other than `successor` start from this claimed end (its parameters
    or its optimizer state)?"""
    then = _start(successor) if successor is not None else (None, None)
    params_from, state_from = everyone.starting_from(*end)
    return params_from > (then[0] == end[0]) or state_from > (then[1] == end[1])


def _chain_key(chain: list[WorkRecord]) -> tuple:
    """What a re-taken chain was: each step's worker, step, committed gradient, start and
    end claims (a record filed again differently is another chain)."""
    return tuple((r.worker, r.step, r.contribution_sha256, r.local.applied, _start(r), _end(r))
                 for r in chain)


def _copied(state: dict) -> dict:
    """An optimizer state's copy (the optimizer steps the tensors it is given in place)."""
    return {i: {n: v.detach().clone() if isinstance(v, torch.Tensor) else v
                for n, v in slots.items()} for i, slots in state.items()}


def _nbytes(tensors: dict) -> int:
    return sum(v.numel() * v.element_size() for v in tensors.values()
               if isinstance(v, torch.Tensor))


def _start(record: WorkRecord) -> tuple[str, str]:
    """The (parameters, optimizer state) a DiLoCo step claims to start from."""
    return record.params_sha256, record.local.state_sha256


def _end(record: WorkRecord) -> tuple[str, str]:
    """The (parameters, optimizer state) a DiLoCo step claims to end at."""
    return record.local.end_params_sha256, record.local.end_state_sha256
