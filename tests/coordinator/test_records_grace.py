"""A proof epoch the job has left behind waits `records_grace_s` for its members'
late records before it is rooted without them. Before, it was rooted the moment the
job was two epochs on: on a loaded machine (the demo, one core busy beside it) a spot
agent's records came 30 s late and every one was refused as "already rooted", and its
provider was docked the pay for work it did. A lost worker's records never come: the
epoch is rooted once the grace has run out, and the job is not held back longer."""

from __future__ import annotations

import pytest

from shoal.coordinator import Coordinator
from shoal.spec.audit import RecordUpload
from shoal.spec.coordinator import Heartbeat
from tests.coordinator.conftest import Served, make_settings
from tests.coordinator.test_forced_errors import Clock
from tests.coordinator.test_proofs import host_reached, leased_pair, record

GRACE_S = 5.0  # the clock is moved on by less than the 30 s signed requests may be off


@pytest.fixture
def lagging(store_url, operator):
    clock = Clock()
    co = Coordinator(make_settings(store_url, operator, records_grace_s=GRACE_S), clock=clock)
    served = Served(co)
    a, b, job_id, leases = leased_pair(served)
    yield served, co, clock, a, b, job_id, leases
    served.stop()
    co.hosts.stop_all()
    co.engine.dispose()


def _file(client, job_id, lease, worker, rank, steps):
    return client.upload_records(job_id, RecordUpload(lease=lease, records=tuple(
        record(worker, s, rank=rank, shares=(4, 4)) for s in steps)))


def test_a_late_members_records_are_waited_for_then_a_lost_ones_are_not(lagging):
    served, co, clock, a, b, job_id, leases = lagging
    wa, wb = (f"agent-{n}-l{leases[n]}-a0-w0" for n in "ab")
    _file(a, job_id, leases["a"], wa, 0, range(11))
    _file(b, job_id, leases["b"], wb, 1, range(3))  # b's agent is behind
    host_reached(co, job_id, 10)

    def beat() -> None:  # both agents alive at the advanced time
        for name, client in (("agent-a", a), ("agent-b", b)):
            client.heartbeat(name, Heartbeat())

    beat()
    served.app.state.rounds.once()
    assert a.proof_epochs(job_id) == []  # left behind, but b's records are on their way
    clock.offset += GRACE_S / 2
    beat()
    served.app.state.rounds.once()
    assert a.proof_epochs(job_id) == []
    # b's records of epoch 0 arrive late: taken, and the epoch is rooted complete.
    assert _file(b, job_id, leases["b"], wb, 1, (3, 4)).stored == 2
    served.app.state.rounds.once()
    assert [(e.epoch, e.complete) for e in a.proof_epochs(job_id)] == [(0, True)]
    # b is lost before it sends epoch 1's (steps 5-9): a goes on, and once the job has
    # left epoch 1 behind and the grace has run, it is rooted without them.
    clock.offset += GRACE_S + 1  # b quiet: the job's step is a's newest alone
    beat()
    _file(a, job_id, leases["a"], wa, 0, range(11, 16))
    host_reached(co, job_id, 15)
    served.app.state.rounds.once()
    assert [e.epoch for e in a.proof_epochs(job_id)] == [0]  # left behind: the grace starts
    clock.offset += GRACE_S + 1
    beat()
    _file(a, job_id, leases["a"], wa, 0, (16,))  # a goes on
    served.app.state.rounds.once()
    assert [(e.epoch, e.complete) for e in a.proof_epochs(job_id)] == [(0, True), (1, False)]
