"""A worker that commits its honest work and puts something else in the
all-reduce (which shows nobody its part): its peers refuse the step, or the
sketch it declared gives it away to an audit. Real jobs, real stores."""

from __future__ import annotations

import os
import subprocess

import pytest

from shoal.proof.verdicts import guilty_workers
from shoal.spec.proof import VerdictKind
from shoal.train.step_log import read_step_logs
from tests.conftest import shoal_command
from tests.verify.roles.conftest import run_proven_job, write_proven_job
from tests.verify.roles.test_diloco_proof import DILOCO, audit_all

QUIET = "tests.verify.roles.cheats:QuietScale"
SENT_OTHER = "what it declared it put in the exchange is not what it committed"


def _applied(tmp_path, worker: str = "w0") -> list[bool]:
    return [r.applied for r in sorted(read_step_logs(tmp_path / "run"), key=lambda r: r.step)
            if r.worker == worker]


@pytest.mark.slow
def test_a_worker_sending_other_than_it_declares_has_every_step_refused(tmp_path):
    """The quiet cheat's declarations are honest, so no audit can blame it; what stops it
    is that its peers refuse every step it sends ×10 in."""
    proven = run_proven_job(tmp_path, workers=3, steps=6, epoch_steps=3, adversaries={1: QUIET})
    assert _applied(tmp_path) == [False] * 6
    log = (tmp_path / "run" / "w0.log").read_text()
    assert log.count("the declared sketches do not add up to the exchanged sum (skip)") >= 6
    verdicts = [v for audit in audit_all(proven, 3).values() for v in audit.verdicts]
    assert len(verdicts) == 18 and not guilty_workers(verdicts)


@pytest.mark.slow
def test_a_worker_that_declares_what_it_really_sent_is_caught_on_every_record(tmp_path):
    proven = run_proven_job(tmp_path, workers=3, steps=6, epoch_steps=3,
                            adversaries={2: "hidden_scale"})
    assert _applied(tmp_path) == [True] * 6  # the sums add up: the step goes through
    verdicts = [v for audit in audit_all(proven, 3).values() for v in audit.verdicts]
    cheat = [v for v in verdicts if v.worker == "w2"]
    assert len(cheat) == 6 and all(v.kind is VerdictKind.wrong_contribution
                                   and v.detail == SENT_OTHER for v in cheat)
    assert all(v.kind is VerdictKind.valid for v in verdicts if v.worker != "w2")


@pytest.mark.slow
def test_under_diloco_a_samples_count_sent_is_bound_to_the_record(tmp_path):
    """The outer average is normalised by the counts sent: one sample fewer goes through
    and is caught at every audited round end; a negative count is refused outright (and
    caught too)."""
    proven = run_proven_job(tmp_path, workers=3, steps=8, epoch_steps=4, sync=DILOCO,
                            adversaries={1: "tests.verify.roles.cheats:CountLie",
                                         2: "tests.verify.roles.cheats:NegativeCount"})
    log = (tmp_path / "run" / "w0.log").read_text()
    assert "a declared samples count is outside the round" in log
    assert not any(_applied(tmp_path)[3::4])  # no round's end was taken
    for audit in audit_all(proven, 4).values():
        assert guilty_workers(audit.verdicts) == {"w1", "w2"}
        blamed = [v for v in audit.verdicts if v.guilty]
        assert all(v.kind is VerdictKind.wrong_samples and "samples count" in v.detail
                   for v in blamed)
        assert all(v.kind is VerdictKind.valid for v in audit.verdicts if v.worker == "w0")


@pytest.mark.slow
def test_under_diloco_a_pseudo_gradient_sent_other_than_declared_is_refused(tmp_path):
    run_proven_job(tmp_path, workers=3, steps=8, epoch_steps=4, sync=DILOCO,
                   adversaries={1: QUIET})
    applied = _applied(tmp_path)
    assert applied[3] is False and applied[7] is False  # both round ends refused
    assert "the declared sketches do not add up" in (tmp_path / "run" / "w0.log").read_text()


@pytest.mark.slow
def test_under_a_robust_rule_what_was_gathered_is_checked_too(tmp_path):
    """A robust rule all-gathers the contributions; the check sums what was gathered (the
    rule's output is not a sum), so a worker that sent other than it committed is
    caught the same way."""
    proven = run_proven_job(tmp_path, workers=4, steps=4, epoch_steps=2,
                            adversaries={3: "hidden_scale"}, top='aggregation = "median"\n')
    assert _applied(tmp_path) == [True] * 4
    verdicts = [v for audit in audit_all(proven, 2).values() for v in audit.verdicts]
    assert {v.worker for v in verdicts if v.guilty} == {"w3"}
    assert all(v.detail == SENT_OTHER for v in verdicts if v.guilty)


@pytest.mark.slow
def test_a_run_whose_steps_keep_being_refused_is_given_up_with_the_reason(tmp_path):
    """Refused steps still commit (skipped, with records that are paid for): a cheat that
    keeps sending other than it declares would hold the job at no progress. After ten
    refusals in a row the run stops, and says why and what to do."""
    path = write_proven_job(tmp_path, steps=40, epoch_steps=10)
    done = subprocess.run(shoal_command("train", str(path), "--workers", "3", "--run-dir",
                                        str(tmp_path / "run"), f"--adversary=1={QUIET}"),
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode != 0
    assert "10 steps in a row were refused" in done.stderr
    assert "sends other than it declares" in done.stderr and "resume" in done.stderr
    assert len(_applied(tmp_path)) < 40  # it stopped, it did not skip to the end


@pytest.mark.slow
@pytest.mark.parametrize("sync", ["every-step", "diloco"])
def test_a_loss_reported_other_than_computed_is_caught_at_every_voted_step(tmp_path, sync):
    """The loss a worker reports for the guard is summed like any step scalar, so it adds
    up whatever it is; the step's records carry it, and a replay of the worker's samples
    finds it (under DiLoCo at the round's end, where the loss is exchanged)."""
    diloco = sync == "diloco"
    proven = run_proven_job(tmp_path, workers=3, steps=8, epoch_steps=4,
                            sync=DILOCO if diloco else "",
                            adversaries={1: "tests.verify.roles.cheats:LossLie"})
    assert all(_applied(tmp_path))  # nothing refused: it is only found by a replay
    verdicts = [v for audit in audit_all(proven, 4).values() for v in audit.verdicts]
    voted = {3, 7} if diloco else set(range(8))
    cheat = {v.step: v for v in verdicts if v.worker == "w1"}
    assert {s for s, v in cheat.items() if v.guilty} == voted
    assert all(cheat[s].kind is VerdictKind.wrong_loss
               and "a replay of its samples gives" in cheat[s].detail for s in voted)
    assert all(v.kind is VerdictKind.valid for v in verdicts if v.worker != "w1")


@pytest.mark.slow
def test_under_diloco_a_rounds_end_published_as_an_inner_step_is_caught(tmp_path):
    """The cheat sends its pseudo-gradient ×10 and declares it (the sums add up), then
    calls its round's end an inner step: no pseudo-gradient committed, a gradient that
    replays exactly. Its peers' records show the round ended there."""
    proven = run_proven_job(tmp_path, workers=3, steps=8, epoch_steps=4, sync=DILOCO,
                            adversaries={1: "tests.verify.roles.cheats:HiddenRoundEnd"})
    records = proven.store.records()
    assert not any(r.local.outer for r in records if r.worker == "w1")  # what it claims
    verdicts = [v for audit in audit_all(proven, 4).values() for v in audit.verdicts]
    cheat = {v.step: v for v in verdicts if v.worker == "w1" and v.guilty}
    assert set(cheat) == {3, 7}
    assert all(v.kind is VerdictKind.wrong_params and "claims no round ended" in v.detail
               for v in cheat.values())
    assert all(v.kind is VerdictKind.valid for v in verdicts if v.worker != "w1")
