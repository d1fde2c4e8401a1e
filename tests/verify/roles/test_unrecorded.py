"""A worker that poisons its part of a step and files no record of it: its peers'
records still say what it declared, and a replay of its share from the step's
agreed parameters gives it away. A worker whose records were lost with its
machine is judged valid. Real jobs, real stores."""

from __future__ import annotations

import subprocess

import pytest
import torch

from shoal.verify.roles.verifier import Verifier
from shoal.proof.verdicts import guilty_workers
from shoal.spec.proof import VerdictKind
from shoal.verify.audit.unrecorded import UNRECORDED
from shoal.train.step_log import read_step_logs
from tests.conftest import shoal_command
from tests.verify.roles.conftest import run_proven_job, run_members

POISON = "unrecorded"
LOST = "tests.verify.roles.cheats:LostRecords"


@pytest.mark.slow
def test_a_share_without_a_record_is_replayed_and_its_poisoner_named(tmp_path):
    proven = run_proven_job(tmp_path, workers=3, steps=6, epoch_steps=3,
                            adversaries={1: POISON, 2: LOST})
    applied = [r.applied for r in read_step_logs(tmp_path / "run") if r.worker == "w0"]
    assert applied == [True] * 6  # the declarations add up: every poisoned step went in
    records = proven.store.records()
    assert {r.worker for r in records} == {"w0"}

    verifier = Verifier(proven.auditor(), proven.job.proof, salt=b"u" * 16,
                        total_steps=proven.job.steps, members=run_members(tmp_path / "run"))
    verdicts = []
    for epoch in verifier.complete_epochs(records):
        audit = verifier.audit_epoch(epoch, [r for r in records if r.step // 3 == epoch],
                                     every=True)
        assert not audit.unnamed
        verdicts += audit.verdicts
    assert guilty_workers(verdicts) == {"w1"}
    poisoner = sorted((v.step, v.kind) for v in verdicts if v.worker == "w1")
    assert poisoner == [(step, VerdictKind.wrong_contribution) for step in range(6)]
    lost = [v for v in verdicts if v.worker == "w2"]
    assert len(lost) == 6 and all(v.kind is VerdictKind.valid and v.detail.startswith(UNRECORDED)
                                  for v in lost)
    assert all(v.kind is VerdictKind.valid for v in verdicts if v.worker == "w0")

    # Without the membership the shares cannot be named: none is judged, and the CLI
    # says so; with the run's directory, `shoal verify` blames the poisoner (exit 1).
    blind = Verifier(proven.auditor(), proven.job.proof, salt=b"u" * 16,
                     total_steps=proven.job.steps)
    assert len(blind.audit_epoch(0, [r for r in records if r.step < 3], every=True).unnamed) == 6
    job = str(tmp_path / "job.toml")
    done = subprocess.run(shoal_command("verify", job, "--all"), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and "--run-dir" in done.stderr
    done = subprocess.run(shoal_command("verify", job, "--all", "--run-dir",
                                        str(tmp_path / "run"), "--json"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    assert '"guilty": {"w1": "wrong_contribution"}' in done.stdout


DILOCO = 'mode = "diloco"\ninner_steps = 4'


def judge_rounds(proven, tmp_path, epoch_steps: int, threads: int = 1):
    """Every verdict on the job, audited on `threads` (the workers ran on one)."""
    verifier = Verifier(proven.auditor(), proven.job.proof, salt=b"r" * 16,
                        total_steps=proven.job.steps, members=run_members(tmp_path / "run"))
    records = proven.store.records()
    verdicts = []
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for epoch in verifier.complete_epochs(records):
            audit = verifier.audit_epoch(
                epoch, [r for r in records if r.step // epoch_steps == epoch], every=True)
            assert not audit.unnamed
            verdicts += audit.verdicts
    finally:
        torch.set_num_threads(before)
    return verdicts


@pytest.mark.slow
def test_a_diloco_round_without_records_is_replayed_from_its_kept_states(tmp_path):
    """Under DiLoCo the poisoner sends its pseudo-gradients ×10 and files no record of
    any step; each round is replayed from the states it kept and its declarations do
    not match. An honest worker whose records were all lost replays to what it
    declared, its later rounds from where its earlier ones ended."""
    proven = run_proven_job(tmp_path, workers=3, steps=12, epoch_steps=4, sync=DILOCO,
                            adversaries={1: POISON, 2: LOST})
    records = proven.store.records()
    assert {r.worker for r in records} == {"w0"}
    verdicts = judge_rounds(proven, tmp_path, 4, threads=2)
    ends = [3, 7, 11]
    poisoner = sorted((v.step, v.kind) for v in verdicts if v.worker == "w1")
    assert poisoner == [(step, VerdictKind.wrong_contribution) for step in ends], poisoner
    lost = sorted((v.step, v.kind, v.detail) for v in verdicts if v.worker == "w2")
    assert [(s, k) for s, k, _ in lost] == [(step, VerdictKind.valid) for step in ends], lost
    assert all(detail.startswith(UNRECORDED) for _, _, detail in lost)
    assert all(v.kind is VerdictKind.valid for v in verdicts if v.worker == "w0")


@pytest.mark.slow
def test_a_diloco_round_whose_kept_states_are_gone_is_withheld(tmp_path):
    proven = run_proven_job(tmp_path, workers=3, steps=8, epoch_steps=4, sync=DILOCO,
                            adversaries={1: POISON})
    proven.store.layout.local("w1", 5).unlink()  # the second round's second step
    verdicts = {(v.worker, v.step): v.kind for v in judge_rounds(proven, tmp_path, 4)}
    assert verdicts[("w1", 3)] is VerdictKind.wrong_contribution
    assert verdicts[("w1", 7)] is VerdictKind.withheld


@pytest.mark.slow
def test_a_record_less_round_passes_through_a_skipped_round_end(tmp_path):
    """w1's NaN at step 7 makes every member skip that round's end, and the round goes
    on from where its last step started: w2, whose records are all lost, kept the same
    state again there, which its replay takes as the skip it is (its samples of step 7
    not counted). Only w1's NaN is blamed."""
    proven = run_proven_job(tmp_path, workers=3, steps=16, epoch_steps=8, sync=DILOCO,
                            adversaries={2: LOST}, env={"SHOAL_INJECT": "nan-loss@w1:step7"})
    verdicts = judge_rounds(proven, tmp_path, 8, threads=2)
    assert [(v.worker, v.step) for v in verdicts if v.guilty] == [("w1", 7)]
    lost = sorted((v.step, v.kind) for v in verdicts if v.worker == "w2")
    assert lost == [(step, VerdictKind.valid) for step in (3, 7, 11, 15)], lost


@pytest.mark.slow
def test_a_record_less_round_must_start_from_theta_outer_with_a_state_of_the_model(tmp_path):
    """The kept states are the worker's own word: a round whose first state is not the
    round's agreed parameters is `wrong_params` (else a worker could start its round
    where it liked and replay to any pseudo-gradient), and so is a kept state shaped for
    another model (no honest worker writes one), not a crash of the verifier."""
    proven = run_proven_job(tmp_path, workers=3, steps=8, epoch_steps=4, sync=DILOCO,
                            adversaries={2: LOST})
    store = proven.store
    honest = {step: store.layout.local("w2", step).read_bytes() for step in (4, 5)}
    params, state = store.load_local("w2", 4)
    store.save_local("w2", 4, {k: v + 1e-2 if v.is_floating_point() else v
                               for k, v in params.items()}, state)
    verdicts = {(v.worker, v.step): v for v in judge_rounds(proven, tmp_path, 4)}
    assert verdicts[("w2", 3)].kind is VerdictKind.valid
    assert verdicts[("w2", 7)].kind is VerdictKind.wrong_params
    assert "agreed parameters" in verdicts[("w2", 7)].detail

    store.layout.local("w2", 4).write_bytes(honest[4])
    params, state = store.load_local("w2", 5)
    store.save_local("w2", 5, {k: v[:1] for k, v in params.items()}, state)
    verdicts = {(v.worker, v.step): v for v in judge_rounds(proven, tmp_path, 4)}
    assert verdicts[("w2", 7)].kind is VerdictKind.wrong_params
    assert "not one of the job's model" in verdicts[("w2", 7)].detail

    store.layout.local("w2", 5).write_bytes(honest[5])
    assert all(v.kind is VerdictKind.valid for v in judge_rounds(proven, tmp_path, 4))
