"""Every built-in adversary (and a user's own) is caught by a full audit, in
every epoch it cheats, and no honest worker beside it is accused."""

from __future__ import annotations

import pytest

from shoal.verify.roles.verifier import Verifier
from shoal.proof.verdicts import guilty_workers
from shoal.spec.proof import VerdictKind
from shoal.verify.adversary import BUILT_IN, DILOCO_ONLY
from tests.verify.roles.conftest import run_members, run_proven_job

# Every-step jobs: the cheats that cheat there (DiLoCo's are in test_diloco_proof.py).
CHEATS = sorted(n for n in BUILT_IN if n not in DILOCO_ONLY) + ["tests.verify.roles.cheats:drift"]
# Jobs of up to six workers: up to five cheats and one honest worker each (w0 stays honest).
GROUPS = [CHEATS[i : i + 5] for i in range(0, len(CHEATS), 5)]


@pytest.mark.slow
@pytest.mark.parametrize("cheats", GROUPS, ids=lambda g: "+".join(n.split(":")[-1] for n in g))
def test_each_adversary_is_caught_in_every_epoch(tmp_path, cheats):
    proven = run_proven_job(tmp_path, workers=len(cheats) + 1, steps=8, epoch_steps=4,
                            adversaries={i + 1: name for i, name in enumerate(cheats)})
    verifier = Verifier(proven.auditor(), proven.job.proof, salt=b"s" * 16,
                        total_steps=proven.job.steps, members=run_members(tmp_path / "run"))
    records = proven.store.records()
    epochs = verifier.complete_epochs(records)
    assert epochs == [0, 1]
    for epoch in epochs:
        result = verifier.audit_epoch(epoch, [r for r in records if r.step // 4 == epoch],
                                      every=True)
        caught = guilty_workers(result.verdicts)
        cheaters = {f"w{i + 1}" for i in range(len(cheats))}
        assert caught == cheaters, {v.worker: v.kind.value for v in result.verdicts}
        honest = [v for v in result.verdicts if v.worker == "w0"]
        assert honest and all(v.kind is VerdictKind.valid for v in honest)


@pytest.mark.slow
def test_a_sampled_audit_catches_a_worker_cheating_on_every_step(tmp_path):
    """The default rate with one audit per worker per epoch is enough for a steady cheat."""
    proven = run_proven_job(tmp_path, workers=3, steps=12, epoch_steps=6,
                            adversaries={2: "sign_flip"})
    verifier = Verifier(proven.auditor(), proven.job.proof, salt=b"t" * 16,
                        total_steps=proven.job.steps)
    records = proven.store.records()
    for epoch in verifier.complete_epochs(records):
        result = verifier.audit_epoch(epoch, [r for r in records if r.step // 6 == epoch])
        assert len(result.verdicts) < len([r for r in records if r.step // 6 == epoch])
        assert guilty_workers(result.verdicts) == {"w2"}
