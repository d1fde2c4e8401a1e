"""The demo's report reads every event of its job, not a first page: the settlement
and the verifiers' penalties come last, and the full demo records thousands."""

from __future__ import annotations

from shoal.coordinator.db.store import record_event
from shoal.coordinator import Coordinator
from shoal.demo.report import job_events
from shoal.spec.events import ChallengeRaised, EventKind, VerifierSlashed
from tests.coordinator.conftest import make_settings


def test_every_event_of_the_job_is_read_past_the_first_page(tmp_path):
    co = Coordinator(make_settings(f"sqlite:///{tmp_path}/store.db"))
    try:
        with co.desk.change() as session:
            for i in range(2345):
                record_event(session, float(i), "someone", ChallengeRaised(
                    challenge=i, worker="w", step=i, blob="params", agent_id="a"))
            record_event(session, 9999.0, "coordinator", VerifierSlashed(
                verifier="v", worker="w", step=1, shown_by="u"))
        events = job_events(co, None)
        assert [e.detail.get("challenge") for e in events[:-1]] == list(range(2345))
        assert events[-1].kind == EventKind.verifier_slashed  # before: beyond the 1000 read
    finally:
        co.hosts.stop_all()
        co.engine.dispose()
