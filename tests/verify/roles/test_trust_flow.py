"""The trust game's verifying side, on the contract: a worker cheats, an honest
verifier catches it, a lazy verifier signs `valid` everywhere and a malicious
one accuses an honest worker. Sealed anchors hide the plants, forced errors
expose the lazy one, and the whistleblower's re-check exposes both liars.

What the referee then does runs through the coordinator's real referee, and is
tested there: a cheat disputed is slashed at its step with one replay
(tests/coordinator/test_disputes.py::test_a_cheat_disputed_is_slashed_at_the_step_it_cheated),
a false accuser loses its bond (::test_a_false_accuser_loses_its_bond_wherever_it_points),
a lazy verifier is slashed at the reveal (tests/coordinator/test_forced_errors.py::
test_a_lazy_verifier_is_caught_on_a_plant_and_the_honest_and_the_provider_are_not),
and a cheat is unpaid while the honest are paid (tests/coordinator/test_verified_work.py)."""

from __future__ import annotations

import pytest

from shoal.verify.roles.served import ServedStore
from shoal.verify.roles.verdicts import sign_verdict
from shoal.verify.roles.verifier import Verifier, false_accusations, lazy_verdicts
from shoal.verify.roles.whistleblower import recheck
from shoal.proof.forced import (
    ForcedErrors, score_verifiers, sealed_root, verify_reveal, without_plants,
)
from shoal.proof.merkle import epoch_tree
from shoal.proof.verdicts import guilty_workers
from tests.verify.roles.conftest import run_proven_job
from tests.ledger.conftest import Actors, deploy
from tests.ledger.stage import CONFIG, GWEI, STAKE

EPOCH_STEPS = 4


@pytest.fixture
def chain(embedded_chain):
    snapshot = embedded_chain.snapshot()
    yield embedded_chain
    embedded_chain.revert(snapshot)


@pytest.mark.slow
def test_plants_and_the_whistleblowers_recheck_expose_the_cheat_and_both_liars(tmp_path, chain):
    proven = run_proven_job(tmp_path, workers=3, steps=8, epoch_steps=EPOCH_STEPS,
                            adversaries={1: "sign_flip"})
    spec = proven.job.proof
    a = Actors.of(chain)
    ledger = deploy(chain, a, **CONFIG)
    lazy, malicious, whistleblower = a.submitters[1], a.stranger, a.whistleblower
    for account in (*a.providers, lazy, malicious):
        ledger.stake(account, STAKE)
    job = ledger.create_job(a.submitters[0], GWEI, 10**16).returned
    ledger.open_leases(a.operator, job, {p.address: (GWEI, 1000) for p in a.providers})
    for p in a.providers:
        ledger.accept(p, job)
    chain.advance_time(300)
    providers = {f"w{i}": p.address for i, p in enumerate(a.providers)}

    # The operator commits to its plants' secret, serves records with plants in, and
    # anchors each epoch: the workers' root, sealed so that the chain does not tell which
    # epochs' served roots differ from it.
    forced = ForcedErrors(b"the operator's secret, 32 bytes.", rate=0.3)
    commitment = forced.commitment()
    served = ServedStore(proven.store, forced, EPOCH_STEPS)
    real = _by_epoch(proven.store.records())
    shown = _by_epoch(served.records())
    served_roots = {}
    for epoch in (0, 1):
        served_roots[epoch] = epoch_tree(shown[epoch])[0].root
        ledger.anchor(a.operator, job, epoch, sealed_root(epoch_tree(real[epoch])[0].root,
                                                          forced.anchor_salt("job", epoch)))
    ledger.book(a.operator, job, 1, dict.fromkeys(providers.values(), 300))
    for epoch, anchor in enumerate(ledger.anchors(job)):
        assert bytes.fromhex(anchor.root[2:]) not in (served_roots[epoch],
                                                      epoch_tree(real[epoch])[0].root)

    def verifier(account, source):
        return Verifier(proven.auditor(source, verifier=account.address), spec,
                        salt=account.address.encode(), roots=served_roots.get)

    # An honest verifier audits what it is served: it catches the cheat and the plants.
    honest = verifier(whistleblower, served)
    audits = [v for e in (0, 1) for v in honest.audit_epoch(e, shown[e], every=True).verdicts]
    assert any(forced.planted(v) for v in audits), "the test needs at least one plant audited"
    assert guilty_workers(without_plants(forced, audits)) == {"w1"}
    # A lazy verifier signs `valid` on everything; a malicious one accuses honest w0.
    lazy_signed = [sign_verdict(v, lazy) for e in (0, 1)
                   for v in lazy_verdicts(verifier(lazy, served), e, shown[e], every=True)]
    malicious_signed = [sign_verdict(v, malicious) for v in false_accusations(
        [v for e in (0, 1) for v in verifier(malicious, served).audit_epoch(e, shown[e], every=True).verdicts],
        victim="w0")]

    # The operator reveals its secret; anyone checks it against the commitment, and the
    # plants show who signed `valid` on a wrong record.
    assert verify_reveal(commitment, forced.reveal())
    opened = ForcedErrors(forced.reveal(), rate=0.3)  # anyone, from the revealed secret
    for epoch, anchor in enumerate(ledger.anchors(job)):
        assert bytes.fromhex(anchor.root[2:]) == sealed_root(
            epoch_tree(real[epoch])[0].root, opened.anchor_salt("job", epoch))
    score = score_verifiers(forced, [s.verdict for s in lazy_signed + malicious_signed]
                            + without_plants(forced, audits) + [v for v in audits if forced.planted(v)])
    assert lazy.address in score.missed and whistleblower.address not in score.missed

    # The whistleblower re-checks both verifiers' signed verdicts.
    wrong_valid = [d for d in recheck(lazy_signed, honest, served.records())
                   if not forced.planted(d.verdict)]
    false_guilty = [d for d in recheck(malicious_signed, honest, served.records())
                    if not forced.planted(d.verdict)]
    assert {d.verdict.worker for d in wrong_valid} == {"w1"}
    assert {d.verdict.worker for d in false_guilty} == {"w0"}


def _by_epoch(records):
    out = {}
    for record in records:
        out.setdefault(record.step // EPOCH_STEPS, []).append(record)
    return out
