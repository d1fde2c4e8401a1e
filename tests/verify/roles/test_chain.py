"""The chain from one step to the next, on real jobs: a resync's state source (the
authority picks the most common state; a member can no longer name itself) that sends
moved parameters leaves records that all agree and all replay, and only the chain shows
the injection, at the exact step, blamed on it. An honest resync and an honest rollback
to the kept snapshot break nothing."""

from __future__ import annotations

import json
import subprocess

import pytest

from shoal.proof.chain import chain_breaks
from shoal.proof.epochs import final_lineage
from shoal.proof.verdicts import guilty_workers
from shoal.spec.proof import VerdictKind
from shoal.verify.roles.verifier import Verifier
from tests.conftest import shoal_command
from tests.verify.roles.conftest import run_members, run_proven_job

FORGER = "tests.verify.roles.cheats:ForgedStateSource"


def published(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "epochs.jsonl").read_text().splitlines()]


def audit_all(verifier: Verifier, records, epoch_steps: int):
    verdicts, breaks = [], []
    for epoch in verifier.complete_epochs(records):
        audit = verifier.audit_epoch(epoch, [r for r in records if r.step // epoch_steps == epoch],
                                     every=True)
        verdicts += audit.verdicts
        breaks += audit.breaks
    return verdicts, breaks


@pytest.mark.slow
def test_a_state_injected_by_a_resync_breaks_the_chain_at_its_step_and_names_its_source(tmp_path):
    """w1's replica diverges before step 3; of w0 and w2 (alike), the authority picks the
    lower rank's state. Both would move the state they send: whichever is picked does."""
    proven = run_proven_job(tmp_path, workers=3, steps=8, epoch_steps=4,
                            adversaries={0: FORGER, 2: FORGER},
                            env={"SHOAL_INJECT": "diverge@w1:step3"})
    run = tmp_path / "run"
    [resync] = [e for e in published(run) if e.get("state_source")]
    source = resync["state_source"]
    assert source in ("w0", "w2")
    records = proven.store.records()
    lineage = final_lineage(records)
    injected = min(r.step for r in lineage if r.membership_epoch == resync["epoch"])
    before = {r.end_sha256 for r in lineage if r.step == injected - 1}
    after = {r.params_sha256 for r in lineage if r.step == injected}
    assert len(before) == len(after) == 1 and before != after  # every member moved, alike

    # The attack as audits saw it before the chain: every record of every step passes.
    blind = Verifier(proven.auditor(), proven.job.proof, salt=b"c" * 16,
                     total_steps=proven.job.steps, members=run_members(run))
    verdicts, breaks = audit_all(blind, records, 4)
    assert {v.kind for v in verdicts} == {VerdictKind.valid}
    # The chain sees it even so, and with no state source to blame, blames nobody.
    assert [(b.step, b.source) for b in breaks] == [(injected, None)]

    sources = dict.fromkeys(range(100))
    sources.update({resync["epoch"]: source})
    verifier = Verifier(proven.auditor(), proven.job.proof, salt=b"c" * 16,
                        total_steps=proven.job.steps, members=run_members(run),
                        sources=sources.get)
    verdicts, breaks = audit_all(verifier, records, 4)
    assert [(b.step, b.source) for b in breaks] == [(injected, source)]
    assert guilty_workers(verdicts) == {source}
    [blamed] = [v for v in verdicts if v.guilty]
    assert (blamed.step, blamed.kind) == (injected, VerdictKind.wrong_params)
    assert "chain" in blamed.detail and source in blamed.detail
    # The referee's one re-execution of the source's record there reaches the same verdict.
    [record] = [r for r in lineage if (r.worker, r.step) == (source, injected)]
    epoch_records = [r for r in records if r.step // 4 == injected // 4]
    assert verifier.audit_one(record, epoch_records).kind is VerdictKind.wrong_params

    # `shoal verify` with the run's directory reads the state source the host published.
    done = subprocess.run(shoal_command("verify", str(tmp_path / "job.toml"), "--all",
                                        "--run-dir", str(run), "--json"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr[-2000:]
    assert source in done.stdout and "chain" in done.stdout


@pytest.mark.slow
def test_an_honest_resync_and_rollback_break_no_chain(tmp_path):
    """w1's replica diverges before step 3 (every member adopts the most common state),
    and three NaN steps from w0 at 52-54 roll every member back to the snapshot kept at
    step 50: each step still starts where the one before ended, as applied."""
    proven = run_proven_job(tmp_path, workers=3, steps=58, epoch_steps=10,
                            env={"SHOAL_INJECT": "diverge@w1:step3,nan-loss@w0:step52-54"})
    run = tmp_path / "run"
    resyncs = [e for e in published(run) if e.get("state_source")]
    assert resyncs and all(e["state_source"] != "w1" for e in resyncs)
    records = proven.store.records()
    assert {r.rolled_back_to for r in records if r.step == 54} == {50}
    sources = {e["epoch"]: e.get("state_source") for e in published(run)}
    verifier = Verifier(proven.auditor(), proven.job.proof, salt=b"h" * 16,
                        total_steps=proven.job.steps, members=run_members(run),
                        sources=sources.get)
    verdicts, breaks = audit_all(verifier, records, 10)
    assert breaks == []
    # Only the injected NaNs replay as other than sent.
    assert {(v.worker, v.step) for v in verdicts if v.guilty} <= {("w0", s) for s in (52, 53, 54)}


@pytest.mark.slow
def test_under_diloco_each_round_starts_where_the_last_ended_and_the_chain_checks_it(tmp_path):
    """Inside a round each replica steps alone; a round's first step starts at the outer
    step's result, which every member's record of the last round's end committed. An
    honest run breaks nothing; a round start moved under every record is a break."""
    proven = run_proven_job(tmp_path, workers=3, steps=12, epoch_steps=4,
                            sync='mode = "diloco"\ninner_steps = 4')
    lineage = final_lineage(proven.store.records())
    ends = {r.end_sha256 for r in lineage if r.step == 3}
    assert len(ends) == 1 and ends == {r.params_sha256 for r in lineage if r.step == 4}
    assert chain_breaks(lineage, lambda epoch: None) == []
    moved = [r.model_copy(update={"params_sha256": "0" * 64}) if r.step == 8 else r
             for r in lineage]
    assert [b.step for b in chain_breaks(moved, lambda epoch: None)] == [8]
