"""Answered challenges' files are kept until nothing can need them, tried as the party
that would fill the coordinator's disk: challenges answered with large files, epoch
after epoch, which before stayed on disk as long as the coordinator ran. And as the
parties that would lose by a prune: a verifier whose guilty verdict awaits the
referee, and a challenger whose dispute is open, whose files must stay."""

from __future__ import annotations

from pathlib import Path

import pytest
from eth_account import Account

from shoal.coordinator import Coordinator
from shoal.coordinator.db.schema import DisputeRow
from shoal.spec.audit import ChallengeRequest, RecordUpload, SignedVerdictBody, VerdictFiling
from shoal.spec.proof import Verdict, VerdictKind
from shoal.verify.roles.verdicts import sign_verdict
from tests.conftest import tiny_job_toml
from tests.coordinator.conftest import Served, make_settings
from tests.coordinator.test_forced_errors import Clock
from tests.coordinator.test_proofs import filed_proof_job, record, refused

KEEP_S = 5.0  # real seconds from the epochs being served to the challenges: room for a loaded machine
RETENTION_S = 10.0  # keep_s + this + 1, moved past, stays under the 30 s signed requests may be off
EPOCH_STEPS = 5
JOB = tiny_job_toml(Path("ckpt"), steps=40) + \
    f"[proof]\nenabled = true\nepoch_steps = {EPOCH_STEPS}\nkeep_s = {KEEP_S}\n"
FILE = b"\x5a" * (64 * 1024)  # one answer; a real one is about the model's size


@pytest.fixture
def kept(store_url, operator):
    """A proof job leased to agent-a, its worker's records of steps 0-39 filed, every
    epoch rooted (served) now; the coordinator's clock is one the test moves."""
    clock = Clock()
    co = Coordinator(make_settings(store_url, operator, answer_retention_s=RETENTION_S),
                     clock=clock)
    served = Served(co)
    a, verifier, job_id, worker, lease = filed_proof_job(served, operator, JOB)
    a.upload_records(job_id, RecordUpload(lease=lease, records=tuple(
        record(worker, s) for s in range(6, 40))))
    served.app.state.rounds.once()
    assert len(verifier.proof_epochs(job_id)) == 40 // EPOCH_STEPS
    yield co, clock, a, verifier, job_id, worker
    served.stop()
    co.hosts.stop_all()
    co.engine.dispose()


def _answered(a, verifier, job_id: str, worker: str, steps) -> dict[int, int]:
    """Each step's contribution challenged and answered with FILE: step -> challenge."""
    views = verifier.raise_challenges(job_id, [ChallengeRequest(worker=worker, step=s)
                                               for s in steps])
    for view in views:
        a.answer_challenge(view.challenge, FILE)
    return {view.step: view.challenge for view in views}


def _disk_bytes(co: Coordinator, job_id: str) -> int:
    return sum(p.stat().st_size for p in co.records.proof_dir(job_id).rglob("*") if p.is_file())


def test_answers_past_their_window_and_retention_no_longer_fill_the_disk(kept):
    co, clock, a, verifier, job_id, worker = kept
    asked = _answered(a, verifier, job_id, worker, range(20))  # epochs 0-3
    assert _disk_bytes(co, job_id) == 20 * len(FILE)

    clock.offset += KEEP_S + 1  # the windows closed; verifiers still fetch and file
    assert co.retention.prune() == 0
    assert verifier.challenge_file(asked[7]) == FILE

    clock.offset += RETENTION_S  # and the retention after them has passed
    assert co.retention.prune() == 20
    assert _disk_bytes(co, job_id) == 0
    for step, challenge in asked.items():
        detail = refused(lambda c=challenge: verifier.challenge_file(c), 410)
        assert "pruned at" in detail and "answer_retention_s" in detail, detail
    # Asked again, it is the same challenge: its file is gone, not to be asked anew.
    assert "pruned at" in refused(lambda: verifier.raise_challenges(
        job_id, [ChallengeRequest(worker=worker, step=3)]), 410)
    assert co.retention.prune() == 0  # once


def test_a_file_a_pending_ruling_or_an_open_dispute_needs_is_kept_and_served(kept, monkeypatch):
    co, clock, a, verifier, job_id, worker = kept
    held: list[int] = []  # the referee's queue: the guilty verdict awaits its ruling
    monkeypatch.setattr(co.referee, "rule_later", lambda job, seqs: held.extend(seqs))
    asked = _answered(a, verifier, job_id, worker, (0, 15, 30))  # epochs 0, 3, 6
    signed = sign_verdict(Verdict(job="tiny", epoch=6, step=30, worker=worker,
                                  kind=VerdictKind.wrong_contribution), verifier.account)
    verifier.file_verdicts(job_id, VerdictFiling(verdicts=(SignedVerdictBody(
        verdict=signed.verdict, signature=signed.signature),)))
    assert held
    with co.store.change() as session:  # a dispute on epoch 0, filed, its ruling to come
        session.add(DisputeRow(dispute=1, job_id=job_id, worker=worker, epoch=0,
                               challenger=Account.create().address, provider=a.account.address,
                               filed_at_s=clock(), trajectory=[], why=""))

    clock.offset += KEEP_S + RETENTION_S + 1
    assert co.retention.prune() == 1  # epoch 3's: nothing needs it
    refused(lambda: verifier.challenge_file(asked[15]), 410)
    assert verifier.challenge_file(asked[30]) == FILE  # for the referee's ruling
    assert verifier.challenge_file(asked[0]) == FILE  # for the dispute's
    assert _disk_bytes(co, job_id) == 2 * len(FILE)

    # Once ruled, neither needs them: the next pass prunes them.
    for seq in held:
        co.referee.rule(job_id, seq)
    with co.store.change() as session:
        session.get(DisputeRow, 1).ruling = "rejected"
    assert co.retention.prune() == 2
    assert _disk_bytes(co, job_id) == 0
    refused(lambda: verifier.challenge_file(asked[0]), 410)
