"""Stake before verdicts (issue 40, point 10): a verifier with no free stake on the
market's chain files guilty verdicts that would cost it nothing when rejected, while
each one sets the referee replaying and the accused waiting on a ruling. Its
verdicts are refused, saying how much to stake; a staked verifier's are taken."""

from __future__ import annotations

import pytest
from eth_account import Account

from shoal.client.http import CoordinatorRefused
from shoal.coordinator.proofs.penalties import FALSE_ACCUSATION_PENALTY_WEI
from shoal.verify.roles.verdicts import sign_verdict
from shoal.spec.audit import SignedVerdictBody, VerdictFiling
from shoal.spec.coordinator import Grant, Role
from shoal.spec.proof import Verdict, VerdictKind
from tests.coordinator.refereed import refereed_job
from tests.coordinator.test_proofs import PROOF_JOB

# Hosts a job leased on an embedded chain (over 5 s on two cores); it times nothing.
pytestmark = [pytest.mark.slow, pytest.mark.parallel_ok]


def filing(account, job_name: str, worker: str, steps: range) -> VerdictFiling:
    bodies = []
    for step in steps:
        signed = sign_verdict(Verdict(job=job_name, epoch=0, step=step, worker=worker,
                                      kind=VerdictKind.wrong_contribution,
                                      verifier=account.address), account)
        bodies.append(SignedVerdictBody(verdict=signed.verdict, signature=signed.signature))
    return VerdictFiling(verdicts=tuple(bodies))


def test_an_unstaked_verifier_has_no_verdicts_taken_and_a_staked_one_has(tmp_path):
    with refereed_job(tmp_path, PROOF_JOB) as r:
        operator = r.served.client(r.co.settlement.operator)
        mallory = Account.create()  # a verifier the operator granted, with nothing staked
        operator.request("POST", "/v1/grants", Grant(address=mallory.address,
                                                     role=Role.verifier, name="mallory"))
        name = r.co.specs.job_spec(r.job_id).name
        worker = f"a-l{r.lease['a-d0']}-a0-w0"
        accuser = r.served.client(mallory)

        with pytest.raises(CoordinatorRefused) as refused:
            accuser.file_verdicts(r.job_id, filing(mallory, name, worker, range(3)))
        assert refused.value.status == 409
        assert "free stake of 0 wei" in refused.value.detail \
            and f"stake {3 * FALSE_ACCUSATION_PENALTY_WEI} wei more" in refused.value.detail
        assert accuser.verdicts(r.job_id) == []  # nothing taken, nothing for the referee

        vera = r.served.client(r.vera)  # staked 10^17: a hundred accusations' worth
        taken = vera.file_verdicts(r.job_id, filing(r.vera, name, worker, range(3)))
        assert len(taken) == 3
        r.co.referee.wait()  # each accusation ruled; a rejected one is paid from that stake
        rejected = sum(v.ruling == "rejected" for v in vera.verdicts(r.job_id))
        assert r.ledger.stake_of(r.vera.address).active_wei == \
            10**17 - rejected * FALSE_ACCUSATION_PENALTY_WEI
