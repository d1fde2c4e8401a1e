"""No honest worker is ever accused: over a thousand honest audits, with the
workers and the verifier summing on different thread counts (so replays are
close to, not equal to, what the workers sent)."""

from __future__ import annotations

import pytest
import torch

from shoal.verify.roles.verifier import Verifier
from shoal.spec.proof import VerdictKind
from shoal.train.step_log import read_step_logs
from tests.verify.roles.conftest import run_proven_job


@pytest.mark.slow
def test_a_thousand_honest_audits_accuse_nobody(tmp_path):
    verdicts, inexact = [], 0
    for worker_threads, verifier_threads in ((1, 2), (2, 1)):
        proven = run_proven_job(tmp_path / f"t{worker_threads}", workers=4, steps=130,
                                epoch_steps=10, threads=worker_threads)
        # Nor is an honest step refused: every member's declarations added up every time.
        steps = read_step_logs(tmp_path / f"t{worker_threads}" / "run")
        assert len(steps) == 4 * 130 and all(s.applied for s in steps)
        verifier = Verifier(proven.auditor(), proven.job.proof, salt=b"fp" * 8,
                            total_steps=proven.job.steps)
        records = proven.store.records()
        before = torch.get_num_threads()
        torch.set_num_threads(verifier_threads)
        try:
            for epoch in verifier.complete_epochs(records):
                mine = [r for r in records if r.step // 10 == epoch]
                verdicts += verifier.audit_epoch(epoch, mine, every=True).verdicts
        finally:
            torch.set_num_threads(before)
        inexact += sum(1 for v in verdicts if v.distance)
    assert len(verdicts) >= 1000
    assert [v for v in verdicts if v.kind is not VerdictKind.valid] == []
    # The replays really did differ in the last bits somewhere: the tolerance was tested.
    assert inexact > 0
    worst = max(v.distance for v in verdicts)
    assert worst < verdicts[0].tolerance / 1000, worst
