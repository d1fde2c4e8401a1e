"""The state a DiLoCo round starts from (theta_outer), as an audit may trust it:
the one most of the round's first-step records claim (one writer cannot forge it),
its values from the keepers' snapshot or from a kept start checked against it."""

from __future__ import annotations

import torch

from shoal.proof.chain import majority_claim
from shoal.train.hashing import param_sha256
from shoal.verify.known_records import KnownRecords
from shoal.verify.proof_store import ProofStore
from shoal.verify.replay import Replayer


class RoundStarts:
    """theta_outer of each round, kept once found: (SHA-256, flat parameters)."""

    def __init__(self, store: ProofStore, replayer: Replayer) -> None:
        self.store, self.replayer = store, replayer
        self._found: dict[int, tuple[str, torch.Tensor]] = {}

    def params(self, round_start: int, everyone: KnownRecords) -> tuple[str, torch.Tensor] | None:
        """theta_outer of a round: the keepers' snapshot, if it is what most of the
        round's first-step records claim. A snapshot not fetched yet is looked for again
        next time. Moves the replayer's model."""
        if round_start in self._found:
            return self._found[round_start]
        sha256 = load_agreed(self.store, self.replayer, round_start,
                             [r.params_sha256 for r in everyone.of_step(round_start)])
        if sha256 is None:
            return None
        self._found[round_start] = (sha256, self.replayer.flat_params().clone())
        return self._found[round_start]

    def found(self, round_start: int) -> tuple[str, torch.Tensor] | None:
        """theta_outer of a round if it was found already (no file read)."""
        return self._found.get(round_start)

    def keep(self, round_start: int, sha256: str) -> None:
        """The replayer's model holds the round's start, checked against `sha256`: keep
        it, so the round's end need not read the keepers' snapshot."""
        if round_start not in self._found:
            self._found[round_start] = (sha256, self.replayer.flat_params().clone())


def load_agreed(store: ProofStore, replayer: Replayer, step: int,
                claims: list[str]) -> str | None:
    """Load the keepers' snapshot of `step` into the replayer if it is the state most of
    the step's records `claims` to start from (one writer cannot forge it); its SHA-256,
    or None when there is no such snapshot. As many claims for another state as for the
    snapshot's is no majority: in a step of two, a cheat's forged claim against its
    peer's cannot be told apart, and whichever record is listed first must not decide."""
    state = store.load_params(step)
    if state is None or not claims:
        return None
    try:
        replayer.load(state)
    except (RuntimeError, KeyError):
        return None
    sha256 = param_sha256(replayer.model)
    return sha256 if sha256 == majority_claim(claims) else None
