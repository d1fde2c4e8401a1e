"""The referee's log tells one line per verifier, worker, ruling and reason: a provider whose
machine died leaves dozens of challenged steps undecided, and a line each buried the
rulings that moved money (`shoal demo` printed 118 of them)."""

from __future__ import annotations

import logging

from shoal.coordinator.proofs.referee import Ruled, log_rulings
from shoal.spec.proof import Ruling

SILENT = "the agent has been silent since the challenge: not ruled a cheat"


def test_rulings_are_told_once_per_worker_ruling_and_reason(caplog):
    ruled = [Ruled(Ruling.undecided, SILENT, "spot-w0", step, "0xvera") for step in (34, 48, 50, 56, 61)]
    ruled += [Ruled(Ruling.upheld, "the referee's replay found wrong_contribution", "cheat-w0", 2, "0xvera"),
              Ruled(Ruling.undecided, SILENT, "spot-w0", 48, "0xwhistle"),  # another verifier's: its own line
              Ruled(Ruling.plant), Ruled(Ruling.undecided)]  # a plant's, and one ruled already: nothing new
    with caplog.at_level(logging.INFO, logger="shoal.coordinator.proofs.referee"):
        log_rulings("demo", ruled)
    lines = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert lines == [
        (logging.INFO, f"job demo: 5 verdicts by 0xvera on spot-w0 undecided (steps 34, 48, 50, "
                       f"… 61): {SILENT}"),
        (logging.WARNING, "job demo: a verdict by 0xvera on cheat-w0 upheld (step 2): the "
                          "referee's replay found wrong_contribution"),
        (logging.INFO, f"job demo: a verdict by 0xwhistle on spot-w0 undecided (step 48): {SILENT}"),
    ]
