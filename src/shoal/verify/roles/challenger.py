"""A bonded challenger's side of a dispute through the coordinator
(`coordinator/disputes.py` is the other): replay every record of one worker
in one proof epoch; if any step does not replay as committed, open a dispute
on the contract against the worker's provider (the bond is the challenger's
standing, no role needed there) and file the trajectory of its replays.

A step it cannot replay (its files never came) counts as accepted: nobody
is accused on what could not be checked. The bond is lost if the referee's
replay of the step the bisection lands on matches the commitment.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from eth_account.signers.local import LocalAccount

from shoal.client.http import CoordinatorClient
from shoal.errors import ControlError
from shoal.verify.roles.dispute import trajectory
from shoal.verify.roles.remote import RemoteAudits
from shoal.ledger import Ledger
from shoal.proof.epochs import final_lineage
from shoal.spec.audit import DisputeFiling, DisputeView
from shoal.spec.proof import Verdict
from shoal.spec.worker import WorkerId


@dataclass(frozen=True)
class Challenge:
    """What the challenger's replays found, and the dispute it brought (None: none)."""

    verdicts: tuple[Verdict, ...]
    dispute: DisputeView | None


def challenge_worker(client: CoordinatorClient, ledger: Ledger, account: LocalAccount,
                     audits: RemoteAudits, job_id: str, worker: str, epoch: int,
                     bond_wei: int, ruling_wait_s: float = 300.0, poll_s: float = 1.0) -> Challenge:
    served = {e.epoch: e.root for e in client.proof_epochs(job_id)}
    if epoch not in served:
        raise ControlError(f"proof epoch {epoch} of job {job_id} is not served yet; wait for it "
                           "(`shoal verify --coordinator ... --follow` shows them as they come)")
    audits.roots[epoch] = root = bytes.fromhex(served[epoch][2:])
    records = client.work_records(job_id, epoch)
    mine = sorted((r for r in final_lineage(records) if r.worker == worker), key=lambda r: r.step)
    if not mine:
        raise ControlError(f"worker {worker} has no record in proof epoch {epoch} of job {job_id}")
    # Only the worker's records: a dispute bisects over them (a share it filed no record
    # for is a verifier's verdict, ruled by the referee's replay, not a bisection's).
    found = audits.replay(epoch, records, mine, unrecorded=False)
    verdicts = tuple(v for v in found.verdicts if v.worker == worker)
    rejected = {v.step for v in verdicts if v.guilty}
    if not rejected:
        return Challenge(verdicts, None)
    job = client.job(job_id)
    named = WorkerId.leased(worker)
    provider = next((held.provider for held in job.leases
                     if named is not None and held.lease == named.lease), None)
    if job.chain_job is None or provider is None:
        raise ControlError(f"job {job_id} does not settle on chain, or worker {worker} holds no "
                           "lease in it: there is no contract to dispute on")
    opened = ledger.open_dispute(account, job.chain_job, provider, bond_wei).returned
    states = tuple(trajectory(root, mine, lambda r: r.step not in rejected))
    client.file_dispute(job_id, DisputeFiling(dispute=opened, worker=worker, epoch=epoch,
                                              trajectory=states))
    deadline = time.monotonic() + ruling_wait_s
    while True:
        view = next(d for d in client.disputes(job_id) if d.dispute == opened)
        if view.ruling is not None or time.monotonic() > deadline:
            return Challenge(verdicts, view)
        time.sleep(poll_s)
