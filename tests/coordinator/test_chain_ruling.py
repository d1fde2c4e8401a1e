"""A break in the chain of steps, through the coordinator: the job's host published
a resync epoch naming its state source, and the steps of that epoch start from
parameters the step before never ended at (the source sent a moved state). A
verifier's verdict on the source at the break is upheld by the referee and the
source's provider slashed; the published membership a remote verifier reads
names the source. Before, the referee knew no state sources: all it could do was
replay the source's record, which agrees with every other record of the moved
state (here it waited on a file instead: `undecided`); the true verdict was
never upheld, and a replay matching the record's claims rejected it."""

from __future__ import annotations

import tomllib

import pytest

from shoal.spec.audit import RecordUpload
from shoal.spec.jobfile import parse_job
from shoal.spec.proof import Verdict, VerdictKind
from tests.coordinator.conftest import ruled_on
from tests.coordinator.refereed import refereed_job, remote_verifier
from tests.coordinator.replayable import replayable
from tests.coordinator.test_proofs import PROOF_JOB, host_reached, publish

# It hosts a job and runs a chain and a coordinator (over 5 s on two cores): out of
# `make check`'s loop, in `make test`'s first part (it times nothing).
pytestmark = [pytest.mark.slow, pytest.mark.parallel_ok]

RESYNC_AT = 7  # the first step of the resync epoch (inside proof epoch 1: steps 5-9)
MOVED = "9" * 64  # the parameters the state source sent instead of the job's


def _resynced(r, resync_at: int) -> str:
    """The job's host published a resync epoch from `resync_at` on, naming lease a's
    worker its state source, and that worker's records say it sent a moved state (each
    step ends where the next starts, but at the resync); the proof epochs are rooted.
    Returns the source's name."""
    co, lease = r.co, r.lease
    source = f"a-l{lease['a-d0']}-a0-w0"
    publish(co, r.job_id, [source], "start")
    publish(co, r.job_id, [source], "resync", source=source)
    spec = parse_job(tomllib.loads(PROOF_JOB), source="test")
    work = replayable(spec, source, range(16))
    honest = work.records[0].params_sha256
    records = []
    for record in work.records:
        moved = record.step >= resync_at
        records.append(record.model_copy(update={
            "membership_epoch": int(moved),
            "params_sha256": MOVED if moved else honest,
            "end_sha256": MOVED if moved else honest}))
    a = r.providers["a"]
    a.upload_records(r.job_id, RecordUpload(lease=lease["a-d0"], records=tuple(records)))
    host_reached(co, r.job_id, 15)
    r.served.app.state.rounds.once()
    assert 1 in [e.epoch for e in a.proof_epochs(r.job_id)]
    return source


def test_a_break_in_the_chain_is_upheld_against_the_state_source_the_host_named(tmp_path):
    with refereed_job(tmp_path, PROOF_JOB) as r:
        co = r.co
        source = _resynced(r, RESYNC_AT)

        # What a remote verifier reads names the source of the resync epoch.
        changes = r.served.client(r.vera).membership(r.job_id)
        assert [(c.epoch, c.state_source) for c in changes] == [(0, None), (1, source)]

        client = r.served.client(r.vera)
        stake = r.ledger.stake_of(r.vera.address).active_wei
        ruling = ruled_on(co, client, r.job_id, Verdict(
            job="tiny", epoch=1, step=RESYNC_AT, worker=source, kind=VerdictKind.wrong_params,
            detail="the chain of steps breaks"), r.vera)
        assert ruling == "upheld"
        assert r.ledger.lease(r.chain_job, r.p1.address).slashed
        assert r.ledger.stake_of(r.vera.address).active_wei == stake  # the verifier keeps it
        # Not a step further: the break falls on the resync's first step alone.
        assert ruled_on(co, client, r.job_id, Verdict(
            job="tiny", epoch=1, step=RESYNC_AT + 1, worker=source,
            kind=VerdictKind.wrong_params), r.vera) != "upheld"


def test_a_remote_verifier_finds_a_break_at_a_proof_epochs_first_step(tmp_path):
    """The resync falls on step 5, the first of proof epoch 1: the step before it is
    epoch 0's. Before, a remote verifier held one epoch's records at a time, saw no step
    before the break, and found nothing; it now reads the epoch before's too."""
    first = 5  # proof epoch 1: steps 5-9
    with refereed_job(tmp_path, PROOF_JOB) as r:
        source = _resynced(r, first)
        spec = parse_job(tomllib.loads(PROOF_JOB), source="test")
        audits = remote_verifier(r.served, r.job_id, spec, r.vera, tmp_path / "vera",
                                 answer_wait_s=0.1)
        assert 1 in audits.pending_epochs()
        result = audits.replay(1, r.served.client(r.vera).work_records(r.job_id, 1), chosen=[])
        assert [(b.step, b.source) for b in result.breaks] == [(first, source)]
        assert [(v.step, v.worker, v.kind) for v in result.verdicts] == \
            [(first, source, VerdictKind.wrong_params)]
