"""Liveness by progress and one truth for every restore, with real workers.

Each test fails on a runtime whose liveness is a heartbeat thread, whose
rollback snapshot stays behind on the old members, or whose replicas are
compared only at the end of a run."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from shoal.train.run_config import WorkerOverrides
from tests.train.test_elastic import assert_exact, epochs, launch

pytestmark = pytest.mark.slow

SCRIPTS = Path(__file__).parent / "scripts"


def _logs(tmp_path: Path) -> str:
    return "".join(p.read_text() for p in sorted((tmp_path / "run").glob("w*.log")))


def test_a_stuck_but_alive_worker_is_fenced_and_the_others_go_on(tmp_path):
    # w1 hangs 3 s before step 40 (its process runs; no signal can show that it is stuck).
    report = launch(tmp_path, 3, "", steps=800,
                    overrides={1: WorkerOverrides(inject="hang@w1:step40:3")})
    assert_exact(report, 800)
    reasons = [e["reason"] for e in epochs(tmp_path)]
    assert "stall:w1" in reasons
    fenced_at = next(e["t"] for e in epochs(tmp_path) if e["reason"] == "stall:w1")
    # The others kept committing steps while w1 was still hung.
    during = [json.loads(line) for line in (tmp_path / "run" / "steps-w0.jsonl").read_text().splitlines()
              if fenced_at < json.loads(line)["t_commit"] < fenced_at + 1]
    assert len(during) > 5
    # When it woke up, its state was stale: it rejoined and received live state again.
    assert re.search(r"formed at step \d+ \(join\) after receiving state",
                     (tmp_path / "run" / "w1.log").read_text())


def test_a_rollback_restores_the_same_state_on_a_worker_that_joined_after_the_snapshot(tmp_path):
    # Snapshots every 50 steps; a warm spare (w2) joins soon after step 52; three NaN
    # steps in a row at 95-97 roll every member back to the step-50 snapshot, which
    # w2 must have received with the live state.
    # Steps are slowed 8x so that the spare's join (bound by wall time, not steps) lands
    # inside that window even on a loaded machine (at 4x it once landed at step 95).
    slow = WorkerOverrides(slowdown=8.0)
    report = launch(tmp_path, 2, "join@step52", steps=200, spares=1,
                    overrides={0: WorkerOverrides(slowdown=8.0, inject="nan-loss@w0:step95-97"),
                               1: slow, 2: slow})
    assert report.guard_skipped_steps == 3
    assert report.replica_mismatches == 0 and report.replica_checks >= 200
    assert report.samples_skipped == 0 and report.samples_duplicated == 0
    joiner = (tmp_path / "run" / "w2.log").read_text()
    joined_at = int(re.search(r"formed at step (\d+) \(join\)", joiner)[1])
    assert 50 < joined_at < 95, "the join must land between the snapshot and the rollback"
    assert "rolled back model and optimizer" in joiner


def test_replicas_that_drift_apart_are_caught_at_that_step_and_resynced(tmp_path):
    report = launch(tmp_path, 3, "", steps=120,
                    overrides={2: WorkerOverrides(inject="diverge@w2:step50")})
    assert_exact(report, 120)
    resyncs = [e for e in epochs(tmp_path) if e["reason"] == "resync"]
    assert len(resyncs) == 1
    assert "replicas differ at step 50" in _logs(tmp_path)


def test_a_spot_notice_takes_effect_at_the_step_boundary_with_no_failed_exchange(tmp_path):
    report = launch(tmp_path, 3, "leave:1@step60")
    assert_exact(report, 200)
    assert "exchange failed" not in _logs(tmp_path)
    records = [json.loads(line) for line in (tmp_path / "run" / "steps-w1.jsonl").read_text().splitlines()]
    assert records, "the leaving worker committed nothing"
    assert report.faults[0].steps_lost == 0


def test_a_bf16_model_with_plain_backward_trains_elastically(tmp_path):
    report = launch(tmp_path, 2, "kill:1@step30", steps=80,
                    command=[sys.executable, str(SCRIPTS / "bf16_model.py"), "80"])
    assert report.steps == 80
    assert report.samples_skipped == 0 and report.samples_duplicated == 0
    assert report.replica_mismatches == 0
