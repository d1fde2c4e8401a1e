"""Forced errors (Truebit): wrong records planted at a known rate so verifying pays.

The operator publishes sha256(secret) before the epoch is audited; which
items are planted follows from the secret by HMAC, so after the reveal
anyone can check that the plants were fixed in advance, and a verifier that
called a plant valid (it did not replay) is named and loses its bond.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable
from dataclasses import dataclass

from shoal.proof.errors import ProofError
from shoal.spec.proof import Verdict, VerdictKind

_SCALE = 2.0**64


def commitment_of(secret: bytes) -> str:
    return hashlib.sha256(secret).hexdigest()


def verify_reveal(commitment: str, secret: bytes) -> bool:
    """Whether a revealed `secret` is the one committed to (so plants were not chosen late)."""
    return hmac.compare_digest(commitment_of(secret), commitment.lower())


class ForcedErrors:
    """The operator's plan of plants: a secret and a public rate."""

    def __init__(self, secret: bytes, rate: float) -> None:
        # A short secret could be found from its commitment by brute force, and
        # with it every plant: verifiers would replay only those.
        if len(secret) < 16:
            raise ProofError("a forced-error secret needs at least 16 random bytes "
                             "(use os.urandom(32))")
        if not 0.0 <= rate <= 1.0:
            raise ProofError(f"forced-error rate {rate} is outside [0, 1]")
        self._secret = secret
        self.rate = rate

    def commitment(self) -> str:
        """What the operator publishes before audits: sha256(secret), hex."""
        return commitment_of(self._secret)

    def reveal(self) -> bytes:
        """The secret, for publication once the epoch's verdicts are in."""
        return self._secret

    def anchor_salt(self, job: str, epoch: int) -> bytes:
        """The salt that seals epoch `epoch`'s anchored root (see `sealed_root`); anyone
        derives it from the secret once it is revealed."""
        item = json.dumps(["anchor", job, epoch], separators=(",", ":")).encode()
        return hmac.new(self._secret, item, hashlib.sha256).digest()

    def is_planted(self, job: str, epoch: int, step: int, worker: str) -> bool:
        """Whether the audit item (job, epoch, step, worker) is a planted wrong record."""
        # JSON keeps the fields apart: ("a", 1, …) and ("a1", …) cannot collide.
        item = json.dumps([job, epoch, step, worker], separators=(",", ":")).encode()
        draw = hmac.new(self._secret, item, hashlib.sha256).digest()
        return int.from_bytes(draw[:8], "big") / _SCALE < self.rate

    def planted(self, verdict: Verdict) -> bool:
        return self.is_planted(verdict.job, verdict.epoch, verdict.step, verdict.worker)


@dataclass(frozen=True)
class PlantScore:
    """How verifiers did on the plants they judged."""

    missed: frozenset[str]  # called at least one plant valid: they lose their bond
    caught: frozenset[str]  # called every plant they judged guilty
    abstained: frozenset[str]  # said only `unavailable` on plants: no conclusion either way


def score_verifiers(plan: ForcedErrors, verdicts: Iterable[Verdict]) -> PlantScore:
    """Names the verifiers that missed a plant and those that caught theirs."""
    said: dict[str, set[str]] = {}
    for v in verdicts:
        if plan.planted(v):
            said.setdefault(v.verifier, set()).add(
                "missed" if v.kind is VerdictKind.valid else "caught" if v.guilty else "abstained")
    missed = {who for who, s in said.items() if "missed" in s}
    caught = {who for who, s in said.items() if "caught" in s} - missed
    return PlantScore(frozenset(missed), frozenset(caught), frozenset(said) - missed - caught)


def without_plants(plan: ForcedErrors, verdicts: Iterable[Verdict]) -> list[Verdict]:
    """The verdicts on real records: a plant is the operator's, never the worker's guilt."""
    return [v for v in verdicts if not plan.planted(v)]


def sealed_root(records_root: bytes, salt: bytes) -> bytes:
    """What the operator anchors for an epoch while it serves forced errors.

    Verifiers are served a tree with plants in it, whose root differs from the
    workers' own wherever an epoch holds a plant. Were the workers' root
    anchored as it is, a verifier would compare the two and learn which
    epochs hold plants, then replay only those: the plants would never catch
    it being lazy elsewhere. Sealed with a salt only the operator knows until
    the reveal, the anchor tells nothing of that, yet still binds the operator
    to the workers' records: after the reveal, anyone recomputes it from the
    records' root and the revealed secret (`ForcedErrors.anchor_salt`).
    """
    return hashlib.sha256(b"\x04" + records_root + salt).digest()
