"""A dispute over a DiLoCo worker's epoch, through the coordinator, on the embedded
chain: the worker files a record of every step but scales its pseudo-gradients ×10.
A bonded challenger replays the worker's records from the states it kept, opens a
dispute against its provider and files its trajectory; the bisection lands on the
first round's end the worker poisoned, the referee fetches what that step's audit
reads (the worker's kept states of its round, theta_outer) and re-executes it, and
the provider is slashed on chain. A challenger that disputes the honest worker of
the same run loses its bond.

The work is a real `shoal train` run of the job the coordinator hosts, its workers
named as lease a's agent would name them; the test stands in for that agent."""

from __future__ import annotations


import pytest

from shoal.verify.roles.challenger import challenge_worker
from shoal.verify.roles.dispute import trajectory
from shoal.proof.epochs import final_lineage
from shoal.spec.audit import DisputeFiling
from shoal.spec.coordinator import Heartbeat
from shoal.spec.proof import VerdictKind
from tests.coordinator.refereed import (
    answer_as_a, diloco_run_on_lease_a, remote_verifier,
)

# Each test here trains or hosts a job and runs a chain and a coordinator (over 5 s on
# two cores): out of `make check`'s loop, in `make test`'s first part (it times nothing).
pytestmark = [pytest.mark.slow, pytest.mark.parallel_ok]

STEPS, EPOCH_STEPS = 16, 8  # rounds of 4: ends at 3, 7 (epoch 0), 11 and 15


@pytest.fixture
def job(tmp_path):
    with diloco_run_on_lease_a(tmp_path, STEPS, EPOCH_STEPS, 2, "--adversary=1=outer_scale") as s:
        assert [e.epoch for e in s["a"].proof_epochs(s["job_id"])][:1] == [0]
        s["co"].disputes.fetch_wait_s = 20.0
        yield s


def _dispute(s, worker: str) -> tuple:
    """Vera's side of a dispute over `worker`'s epoch 0, while lease a's agent answers."""
    audits = remote_verifier(s["served"], s["job_id"], s["spec"], s["vera"], s["tmp"] / "vera",
                             answer_wait_s=60.0)
    bond = s["ledger"].config().min_bond_wei
    found = []
    answer_as_a(s["a"], s["work"], lambda: found.append(challenge_worker(
        s["served"].client(s["vera"]), s["ledger"], s["vera"], audits, s["job_id"], worker, 0,
        bond, ruling_wait_s=120.0, poll_s=0.2)))
    assert found, "the challenger's side did not finish"
    return found[0], bond


def test_a_diloco_worker_that_poisons_its_round_ends_is_disputed_and_slashed(job):
    s = job
    honest, cheat = s["workers"]
    found, _ = _dispute(s, cheat)
    assert sorted(v.step for v in found.verdicts if v.guilty) == [3, 7]
    assert found.dispute is not None, "a poisoned round end must be disputed"
    view = found.dispute
    assert (view.ruling, view.step) == ("upheld", 3), view.why
    assert VerdictKind.wrong_contribution.value in view.why
    assert s["ledger"].lease(s["chain_job"], s["p1"].address).slashed


def test_disputing_an_honest_diloco_worker_costs_the_bond(job):
    """The challenger claims the honest worker's first round end wrong: the referee's
    replay of it, from the worker's kept states, matches the commitment."""
    s = job
    honest, _ = s["workers"]
    client = s["served"].client(s["vera"])
    mine = sorted((r for r in final_lineage(client.work_records(s["job_id"], 0))
                   if r.worker == honest), key=lambda r: r.step)
    (epoch,) = [e for e in client.proof_epochs(s["job_id"]) if e.epoch == 0]
    root = bytes.fromhex(epoch.root[2:])
    bond = s["ledger"].config().min_bond_wei
    s["a"].heartbeat("a", Heartbeat())
    opened = s["ledger"].open_dispute(s["vera"], s["chain_job"], s["p1"].address, bond).returned
    client.file_dispute(s["job_id"], DisputeFiling(
        dispute=opened, worker=honest, epoch=0,
        trajectory=tuple(trajectory(root, mine, lambda r: r.step != 3))))
    answer_as_a(s["a"], s["work"], s["co"].referee.wait)  # the referee fetches the round's files from lease a's agent
    (view,) = [d for d in client.disputes(s["job_id"]) if d.dispute == opened]
    assert (view.ruling, view.step) == ("rejected", 3), view.why
    assert not s["ledger"].lease(s["chain_job"], s["p1"].address).slashed
