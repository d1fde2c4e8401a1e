"""A worker that files no record of a step it poisoned, through the coordinator:
a verifier's remote audit replays its share and names it, the referee's replay
upholds the verdict and slashes its provider on chain, and a verifier that
accuses the same worker of a share it did not poison loses stake. A decoy
record, filed under a membership epoch the step's final lineage does not
take, shields nothing."""

from __future__ import annotations

import threading
import time
import tomllib

import pytest

from shoal.spec.audit import BlobKind, RecordUpload
from shoal.spec.coordinator import Heartbeat
from shoal.spec.jobfile import parse_job
from shoal.spec.proof import Verdict, VerdictKind, WorkRecord
from shoal.verify.audit.unrecorded import UNRECORDED
from shoal.verify.work_records import step_rng_seed
from tests.coordinator.conftest import ruled_on
from tests.coordinator.refereed import refereed_job, remote_verifier
from tests.coordinator.replayable import replayable_pair
from tests.coordinator.test_proofs import PROOF_JOB, host_reached, publish

# Each test here trains or hosts a job and runs a chain and a coordinator (over 5 s on
# two cores): out of `make check`'s loop, in `make test`'s first part (it times nothing).
pytestmark = [pytest.mark.slow, pytest.mark.parallel_ok]

POISONED = 3


@pytest.fixture
def job(tmp_path, request):
    decoy = getattr(request, "param", False)  # the poisoner files a decoy record of the step
    with refereed_job(tmp_path, PROOF_JOB) as r:
        co, lease = r.co, r.lease
        workers = (f"a-l{lease['a-d0']}-a0-w0", f"b-l{lease['b-d0']}-a0-w0")
        publish(co, r.job_id, list(workers), "start")
        if decoy:
            publish(co, r.job_id, list(workers), "decoy")  # epoch 1, the same members
        spec = parse_job(tomllib.loads(PROOF_JOB), source="test")
        # Epoch 0 lacks b's records; it is rooted once the job's records are two epochs on.
        work = replayable_pair(spec, workers, range(11), poisoned={POISONED})
        if decoy:  # filed, and then b stores nothing more: it does not hold the job back
            r.providers["b"].upload_records(r.job_id, RecordUpload(
                lease=lease["b-d0"], records=(_decoy(spec, work, workers[1]),)))
            time.sleep(2 * co.settings.agent_timeout_s + 0.1)
        a = r.providers["a"]
        a.upload_records(r.job_id, RecordUpload(lease=lease["a-d0"], records=tuple(work.records)))
        host_reached(co, r.job_id, 10)  # the host saw both members commit every step
        r.served.app.state.rounds.once()
        assert [e.epoch for e in a.proof_epochs(r.job_id)] == [0]
        yield dict(co=co, served=r.served, ledger=r.ledger, chain_job=r.chain_job, a=a,
                   spec=spec, job_id=r.job_id, workers=workers, work=work, vera=r.vera,
                   p2=r.p2, tmp=tmp_path)


def _decoy(spec, work, poisoner: str) -> WorkRecord:
    """The poisoner's record of the poisoned step, as if honest, claiming membership
    epoch 1: a lineage only it filed, which the step's final lineage (epoch 0, the
    older of two lineages of one record each) does not take."""
    (honest,) = [r for r in work.records if r.step == POISONED]
    half = spec.global_batch // 2
    start = honest.positions_start + half
    return honest.model_copy(update={
        "worker": poisoner, "rank": 1, "positions_start": start, "positions_end": start + half,
        "rng_seed": step_rng_seed(spec.seed, POISONED, start), "membership_epoch": 1})


def _answering(s, running: threading.Thread) -> None:
    """Agent a answers what it is asked (the step's parameters it keeps) while `running`."""
    while running.is_alive():
        for asked in s["a"].heartbeat("a", Heartbeat()).challenges:
            data = s["work"].params if asked.kind is BlobKind.params \
                else s["work"].reveals[asked.step]
            s["a"].answer_challenge(asked.challenge, data)
            s["a"].heartbeat("a", Heartbeat())  # answers may outlast the 1 s agent timeout
        running.join(0.2)


def test_a_poisoned_share_without_a_record_is_found_named_upheld_and_slashed(job):
    s = job
    poisoner = s["workers"][1]
    _found_upheld_and_slashed(s, poisoner)

    # A false accusation of the same worker, at a step its share was honest: the
    # referee's replay matches what it declared, so the accuser loses stake.
    client = s["served"].client(s["vera"])
    stake = s["ledger"].stake_of(s["vera"].address).active_wei
    assert _accuse(s, client, poisoner, 1) == "rejected"
    assert s["ledger"].stake_of(s["vera"].address).active_wei < stake
    # Nor can a verifier name someone who held no seat of the step.
    assert _accuse(s, client, "a-l99-a0-w0", 2) == "rejected"


@pytest.mark.parametrize("job", [True], indirect=True)
def test_a_decoy_record_under_another_epoch_does_not_shield_the_share(job):
    """Before, the referee replayed the decoy, found it of an abandoned lineage and
    rejected the verifier's true verdict: the verifier lost stake, the cheat nothing."""
    s = job
    poisoner = s["workers"][1]
    stored = s["co"].records.work_records(s["job_id"], 0)
    assert any(r.worker == poisoner and r.step == POISONED for r in stored)
    _found_upheld_and_slashed(s, poisoner)


def _found_upheld_and_slashed(s, poisoner: str) -> None:
    client = s["served"].client(s["vera"])
    audits = remote_verifier(s["served"], s["job_id"], s["spec"], s["vera"], s["tmp"] / "vera",
                             answer_wait_s=30.0)
    assert audits.pending_epochs() == [0]
    found = []
    s["a"].heartbeat("a", Heartbeat())  # back before it is asked: else its challenges drop
    running = threading.Thread(target=lambda: found.append(audits.audit(0)))
    running.start()
    _answering(s, running)
    (audit,) = found
    assert not audit.unnamed
    theirs = sorted((v.step, v.kind) for v in audit.verdicts if v.worker == poisoner)
    assert theirs == [(step, VerdictKind.wrong_contribution if step == POISONED
                       else VerdictKind.valid) for step in range(5)]
    assert all(v.detail.startswith(UNRECORDED) for v in audit.verdicts if v.worker == poisoner)
    assert all(v.kind is VerdictKind.valid for v in audit.verdicts if v.worker != poisoner)

    s["co"].referee.wait()
    (ruled,) = [v for v in client.verdicts(s["job_id"]) if v.verdict.guilty]
    assert (ruled.verdict.worker, ruled.verdict.step, ruled.ruling) == \
        (poisoner, POISONED, "upheld")
    assert s["ledger"].lease(s["chain_job"], s["p2"].address).slashed
    # The slashed provider is barred from the job: a re-posted offer must not win it back.
    barred = [e for e in client.every_event(job=s["job_id"])
              if e.kind == "provider_barred"]
    assert [e.detail["provider"].lower() for e in barred] == [s["p2"].address.lower()]
    assert barred[0].detail["reason"].startswith("slashed: ")


def _accuse(s, client, worker: str, step: int) -> str:
    """Vera files `wrong_contribution` on `worker`'s step; the referee's ruling."""
    return ruled_on(s["co"], client, s["job_id"], Verdict(
        job="tiny", epoch=0, step=step, worker=worker, kind=VerdictKind.wrong_contribution),
        s["vera"])
