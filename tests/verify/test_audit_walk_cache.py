"""A walk goes on from where an earlier walk of the same chain reached only over the very
same records: which claimed ends it hashed depends on them (one another record starts
from is hashed), so as many records, one filed again to start from a claim the earlier
walk skipped, must walk afresh."""

from __future__ import annotations

import torch

from shoal.verify.audit.walk import RoundWalk, _chain_key
from shoal.verify.known_records import KnownRecords
from tests.verify.test_known_records import RECORDS, _record


class Holder:
    def __init__(self) -> None:
        self.held = 0

    def hold(self, params, state) -> None:
        self.held += 1


def test_a_reached_state_is_gone_on_from_only_over_the_same_records():
    chain = [r for r in RECORDS if r.worker == "w0"]  # step 0 ends where step 1 starts
    known = KnownRecords(RECORDS)
    walk = RoundWalk(store=None, replayer=Holder())
    walk._reached[_chain_key(chain[:1])] = ({"w": torch.zeros(1)}, {}, known, 4)
    assert walk._resume(chain, KnownRecords.of(list(RECORDS), known)) == 1
    # As many records, one filed again: it now starts from step 0's claimed end.
    refiled = [*RECORDS[:3], _record(1, "w1", "b" * 64, "c" * 64)]
    assert walk._resume(chain, KnownRecords.of(refiled, known)) == 0
    assert walk.replayer.held == 1
