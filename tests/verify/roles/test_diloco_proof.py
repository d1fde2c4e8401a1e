"""Proof of learning under DiLoCo: inside a round each worker steps its own
replica, so a record claims the worker's own start and end, and the round's
last step commits the pseudo-gradient. Honest workers pass on any thread
count; every built-in cheat is caught in every epoch; and the forgeries only
a DiLoCo worker can try (a made-up optimizer state, a start its steps never
reached, a pseudo-gradient weighted by samples it did not compute) fail."""

from __future__ import annotations

import copy
import re

import pytest
import torch

from shoal.verify.roles.verifier import Verifier
from shoal.proof.verdicts import guilty_workers
from shoal.spec.proof import VerdictKind
from shoal.verify.adversary import BUILT_IN, EVERY_STEP_ONLY
from shoal.train.hashing import optimizer_state_sha256, param_sha256
from shoal.verify.proof_store import contribution_norm, contribution_sha256
from shoal.verify.work_records import step_rng_seed
from tests.verify.roles.conftest import ProvenJob, rewrite_record, run_members, run_proven_job

DILOCO = 'mode = "diloco"\ninner_steps = 4'
CHEATS = sorted(set(BUILT_IN) - EVERY_STEP_ONLY) + ["tests.verify.roles.cheats:drift"]


def audit_all(proven: ProvenJob, epoch_steps: int, threads: int | None = None):
    # The run's membership names the workers of rounds filed without a record (`unrecorded`).
    verifier = Verifier(proven.auditor(), proven.job.proof, salt=b"d" * 16,
                        total_steps=proven.job.steps,
                        members=run_members(proven.store.dir.parent / "run"))
    records = proven.store.records()
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        return {epoch: verifier.audit_epoch(epoch, [r for r in records
                                                    if r.step // epoch_steps == epoch], every=True)
                for epoch in verifier.complete_epochs(records)}
    finally:
        torch.set_num_threads(before)


@pytest.mark.slow
def test_honest_diloco_workers_pass_every_audit_on_other_thread_counts(tmp_path):
    verdicts = []
    for worker_threads, verifier_threads in ((1, 2), (2, 1)):
        proven = run_proven_job(tmp_path / f"t{worker_threads}", workers=3, steps=24,
                                epoch_steps=8, threads=worker_threads, sync=DILOCO)
        records = proven.store.records()
        assert all(r.local is not None for r in records)
        # Every round's end is recorded (by whoever was a member then: on a loaded
        # machine a starved worker may be fenced and join again).
        assert {r.step for r in records if r.local.outer} == {3, 7, 11, 15, 19, 23}
        for audit in audit_all(proven, 8, verifier_threads).values():
            verdicts += audit.verdicts
    assert len(verdicts) == 2 * 3 * 24
    assert [v for v in verdicts if v.kind is not VerdictKind.valid] == []


@pytest.mark.slow
def test_a_worker_fenced_at_an_outer_step_rejoins_and_every_audit_passes(tmp_path):
    """w1 hangs before a round's last step; the others fence it and go on; it wakes,
    fails the exchange, and joins again mid-job from a peer's state (theta_outer and
    the peer's optimizer state). Its records after the join start a new chain there,
    and every audit passes: the join is a start the audit accepts, and nothing of the
    abandoned attempt rides into the next step. (Under CPU starvation a worker was once
    told it was dropped from inside the vote, skipped the undo, and its next gradient
    carried the abandoned step's: its audit caught it. `Run` now undoes the exchange
    on that path too.)"""
    # w1 hangs well past any deadline the others measure (a CI machine once ran a step in
    # 25 ms and the whole job in 7 s: a 2 s hang at step 7 then fell inside the deadline
    # of the first, slow steps). The paced exchange keeps the others training for at
    # least 50 rounds x 0.25 s, however fast the machine, so w1 wakes while they still are.
    proven = run_proven_job(tmp_path, workers=3, steps=200, epoch_steps=40, sync=DILOCO,
                            env={"SHOAL_INJECT": "hang@w1:step15:5,exchange-delay:0.25"})
    logs = (tmp_path / "run" / "w1.log").read_text()
    assert re.search(r"formed at step \d+ \(join\) after receiving state", logs)
    verdicts = [v for audit in audit_all(proven, 40).values() for v in audit.verdicts]
    assert any(v.worker == "w1" and v.step > 7 for v in verdicts)
    assert [v for v in verdicts if v.kind is not VerdictKind.valid] == []


@pytest.mark.slow
def test_a_spare_that_joins_at_a_rounds_end_is_audited_in_that_round(tmp_path):
    """w1 dies inside a round; the warm spare joins where the round's end is redone, with
    a peer's theta_outer and optimizer state, and its record of that step is the round's
    end for it: it claims the round it joined (not one starting there), counts the
    round's earlier steps as the others recorded them, and passes."""
    # Killed half way, by step (not time: a loaded machine starts workers slowly), so that
    # the spare is up and warm by then (it took 8 s in a full test run); the `join` at the
    # same step calls it in, in the one new epoch the kill makes.
    proven = run_proven_job(tmp_path, workers=3, steps=600, epoch_steps=8, sync=DILOCO,
                            flags=("--spares", "1", "--chaos", "join@step301,kill:1@step301"))
    records = proven.store.records()
    spare = min((r for r in records if r.worker == "w3"), key=lambda r: r.step)
    assert spare.step % 4 == 3 and spare.local.outer, spare  # its first step ends a round
    assert spare.local.round_start == spare.step - 3
    verifier = Verifier(proven.auditor(), proven.job.proof, salt=b"j" * 16,
                        total_steps=proven.job.steps)
    epoch = spare.step // 8
    verdicts = verifier.audit_epoch(epoch, [r for r in records if r.step // 8 == epoch],
                                    every=True).verdicts
    assert any(v.worker == "w3" and v.step == spare.step for v in verdicts)
    assert [v for v in verdicts if v.kind is not VerdictKind.valid] == []


@pytest.mark.slow
def test_a_rollback_inside_a_round_restarts_from_an_older_snapshot_and_passes(tmp_path):
    """Three NaN steps in a row roll w1 back to its last snapshot, which may be rounds
    old: back at theta_outer with that snapshot's optimizer state, a start the audit must
    take (an end-to-end run once called it forged). Only the NaN steps are blamed."""
    # The snapshot is taken at step 100 (after the round ending at 99); the NaNs end the
    # round 104-107, so the rollback goes back past the round 100-103.
    proven = run_proven_job(tmp_path, workers=3, steps=120, epoch_steps=8, sync=DILOCO,
                            env={"SHOAL_INJECT": "nan-loss@w1:step105-107"})
    assert "rolled back model and optimizer" in (tmp_path / "run" / "w1.log").read_text()
    verdicts = [v for audit in audit_all(proven, 8).values() for v in audit.verdicts]
    blamed = {(v.worker, v.step) for v in verdicts if v.kind is not VerdictKind.valid}
    assert blamed and blamed <= {("w1", 105), ("w1", 106), ("w1", 107)}, blamed


@pytest.mark.slow
def test_a_rollback_before_any_snapshot_only_skips_and_passes(tmp_path):
    """Three NaN inner steps in a row, before any snapshot was kept: the rollback can only
    skip. Before, DiLoCo still put theta_outer back beside the round's optimizer state, a
    state no replica ever had, and the audit rightly called the next step forged (a
    bench run whose cheats kept every round end refused showed it as five false
    accusations of its honest worker). Only the NaN steps are blamed."""
    proven = run_proven_job(tmp_path, workers=3, steps=12, epoch_steps=12, sync=DILOCO,
                            env={"SHOAL_INJECT": "nan-loss@w1:step1-3"})
    assert "rollback asked for before any good state was kept" in \
        (tmp_path / "run" / "w1.log").read_text()
    verdicts = [v for audit in audit_all(proven, 12).values() for v in audit.verdicts]
    blamed = {(v.worker, v.step) for v in verdicts if v.kind is not VerdictKind.valid}
    assert blamed and blamed <= {("w1", 1), ("w1", 2), ("w1", 3)}, blamed


@pytest.mark.slow
def test_a_nan_at_a_rounds_end_is_skipped_and_only_its_sender_is_blamed(tmp_path):
    """w1's loss is NaN at the round's last step: the guard skips the outer step and the
    round goes on from where that step started (before, recording the NaN crashed the
    worker). Everyone else's chain passes through the skip; w1 sent NaN where the replay
    is finite, which is all it is blamed for."""
    proven = run_proven_job(tmp_path, workers=3, steps=16, epoch_steps=8, sync=DILOCO,
                            env={"SHOAL_INJECT": "nan-loss@w1:step7"})
    assert "loss is nan (skip)" in (tmp_path / "run" / "w0.log").read_text()
    verdicts = [v for audit in audit_all(proven, 8).values() for v in audit.verdicts]
    assert len(verdicts) == 3 * 16
    assert [(v.worker, v.step) for v in verdicts if v.kind is not VerdictKind.valid] == [("w1", 7)]


@pytest.mark.slow
@pytest.mark.parametrize("cheats", [CHEATS[:6], CHEATS[6:]],
                         ids=lambda g: "+".join(n.split(":")[-1] for n in g))
def test_each_adversary_is_caught_under_diloco_in_every_epoch(tmp_path, cheats):
    proven = run_proven_job(tmp_path, workers=len(cheats) + 1, steps=8, epoch_steps=4,
                            sync=DILOCO, adversaries={i + 1: n for i, n in enumerate(cheats)})
    audits = audit_all(proven, 4)
    assert sorted(audits) == [0, 1]
    cheaters = {f"w{i + 1}" for i in range(len(cheats))}
    for audit in audits.values():
        assert guilty_workers(audit.verdicts) == cheaters, \
            {(v.worker, v.step): v.kind.value for v in audit.verdicts if v.guilty}
        honest = [v for v in audit.verdicts if v.worker == "w0"]
        assert honest and all(v.kind is VerdictKind.valid for v in honest)


@pytest.mark.slow
def test_a_sampled_audit_catches_a_poisoner_of_either_part_of_a_round_in_every_epoch(tmp_path):
    """outer_scale keeps every inner step honest, and inner_random is honest where its
    rounds end (its chain of updates and its pseudo-gradient hold, so a round end's audit
    passes): a uniform sample of 1 record in 8 per worker would miss each most epochs;
    each worker's minimum is a round's end and an inner step of it, so it never does."""
    proven = run_proven_job(tmp_path, workers=4, steps=16, epoch_steps=8, sync=DILOCO,
                            adversaries={2: "outer_scale", 3: "inner_random"})
    verifier = Verifier(proven.auditor(), proven.job.proof, salt=b"o" * 16,
                        total_steps=proven.job.steps)
    records = proven.store.records()
    for epoch in verifier.complete_epochs(records):
        mine = [r for r in records if r.step // 8 == epoch]
        result = verifier.audit_epoch(epoch, mine, rate=0.01)
        assert len(result.verdicts) == 8
        assert guilty_workers(result.verdicts) == {"w2", "w3"}
        inner = next(v for v in result.verdicts if v.worker == "w3" and v.guilty)
        assert inner.kind is VerdictKind.wrong_contribution and inner.step % 4 != 3


# -- forgeries of a worker's own chain, on an honest job's files --------------------------


@pytest.fixture(scope="module")
def honest_diloco(tmp_path_factory):
    return run_proven_job(tmp_path_factory.mktemp("honest"), workers=2, steps=12,
                          epoch_steps=12, sync=DILOCO)


@pytest.fixture
def forger(honest_diloco, tmp_path):
    """A copy of the honest job's proof files that one worker rewrites."""
    import shutil

    from shoal.verify.proof_store import ProofStore

    shutil.copytree(honest_diloco.store.dir, tmp_path / "proof")
    return ProvenJob(honest_diloco.job, ProofStore(tmp_path / "proof"))


def verdict_on(proven: ProvenJob, worker: str, step: int):
    records = proven.store.records()
    target = next(r for r in records if (r.worker, r.step) == (worker, step))
    verifier = Verifier(proven.auditor(), proven.job.proof, salt=b"f" * 16,
                        total_steps=proven.job.steps)
    return verifier.audit_epoch(0, records, chosen=[target]).verdicts[0]


def audit_in_order(proven: ProvenJob, worker: str, steps: list[int]) -> dict:
    """One auditor's verdicts on `worker`'s records of `steps`, audited in that order."""
    records = proven.store.records()
    verifier = Verifier(proven.auditor(), proven.job.proof, salt=b"f" * 16,
                        total_steps=proven.job.steps)
    return {step: verifier.audit_one(next(r for r in records if (r.worker, r.step) ==
                                          (worker, step)), records) for step in steps}


def start_round_from(forger: ProvenJob, step: int, state: dict):
    """w1 keeps and claims `state` as the optimizer state its round's step `step` started
    from; the verdict on that step."""
    params, _ = forger.store.load_local("w1", step)
    forger.store.save_local("w1", step, params, state)
    record = next(r for r in forger.store.records("w1") if r.step == step)
    rewrite_record(forger.store, record.model_copy(update={"local": record.local.model_copy(
        update={"state_sha256": optimizer_state_sha256(state)})}))
    return verdict_on(forger, "w1", step)


def test_the_honest_files_pass(honest_diloco):
    for step in (0, 3, 4, 5, 11):
        assert verdict_on(honest_diloco, "w1", step).kind is VerdictKind.valid


def test_a_made_up_optimizer_state_at_a_rounds_start_is_refused(forger):
    """Adam's moments steer every update of a round: a worker that starts a round from
    moments of its choosing could push its pseudo-gradient anywhere while each of its
    steps replays exactly. A round may start only from a state some step ended with."""
    _, state = forger.store.load_local("w1", 4)
    for slot in state.values():
        slot["exp_avg"] = slot["exp_avg"] * 50
    found = start_round_from(forger, 4, state)
    assert found.kind is VerdictKind.wrong_params
    assert "optimizer state" in found.detail


def test_a_start_its_own_steps_never_reached_is_refused(forger, honest_diloco):
    step = 6
    params, state = forger.store.load_local("w1", step)
    params = {k: v + 0.01 if v.is_floating_point() else v for k, v in params.items()}
    forger.store.save_local("w1", step, params, state)
    replayer_model = honest_diloco.auditor().replayer.model
    replayer_model.load_state_dict(params)
    record = next(r for r in forger.store.records("w1") if r.step == step)
    rewrite_record(forger.store, record.model_copy(update={"params_sha256": param_sha256(replayer_model)}))
    found = verdict_on(forger, "w1", step)
    assert found.kind is VerdictKind.wrong_params
    assert "previous step" in found.detail


def test_a_pseudo_gradient_weighted_by_samples_not_computed_is_refused(forger):
    record = next(r for r in forger.store.records("w1") if r.local.outer)
    rewrite_record(forger.store, record.model_copy(update={"local": record.local.model_copy(
        update={"round_samples": record.local.round_samples + 6})}))
    assert verdict_on(forger, "w1", record.step).kind is VerdictKind.wrong_samples


def test_a_claimed_end_the_optimizer_does_not_reach_is_refused(forger):
    """A worker that moves its replica by more than its step did (and starts its next
    step there, so the chain holds) is caught at the step it moved."""
    step = 5
    nxt = step + 1
    params, state = forger.store.load_local("w1", nxt)
    params = {k: v * 1.05 if v.is_floating_point() else v for k, v in params.items()}
    forger.store.save_local("w1", nxt, params, state)
    model = forger.auditor().replayer.model
    model.load_state_dict(params)
    moved = param_sha256(model)
    mine = {r.step: r for r in forger.store.records("w1")}
    rewrite_record(forger.store, mine[step].model_copy(update={"local": mine[step].local.model_copy(
        update={"end_params_sha256": moved})}))
    rewrite_record(forger.store, mine[nxt].model_copy(update={"params_sha256": moved}))
    found = verdict_on(forger, "w1", step)
    assert found.kind is VerdictKind.wrong_contribution
    assert "does not end where" in found.detail
    # Here only a name moved (the files beyond are the honest run's): the round's
    # committed steps from its checked start still end where its end claims, and step
    # `nxt`'s gradient is the one the chain's state gives, so both pass; each verdict
    # is its record's round's alone, whatever else was audited first.
    end = next(r.step for r in forger.store.records("w1") if r.local.outer and r.step > step)
    for order in ([step, nxt, end], [end, nxt, step]):
        verdicts = audit_in_order(forger, "w1", order)
        assert verdicts[step].kind is VerdictKind.wrong_contribution, verdicts[step]
        assert verdicts[nxt].kind is VerdictKind.valid, verdicts[nxt]
        assert verdicts[end].kind is VerdictKind.valid, verdicts[end]


def test_a_round_end_goes_on_from_where_its_inner_steps_audit_reached(honest_diloco):
    """An inner step's audit and its round end's re-take the same steps: the second goes
    on from the state the first reached (bit for bit the claimed one), reading no kept
    state again, and says what a fresh audit of it says."""
    records = honest_diloco.store.records()
    auditor = honest_diloco.auditor()
    loads = []
    load_local = auditor.store.load_local
    auditor.store.load_local = lambda worker, step: loads.append(step) or load_local(worker, step)
    verifier = Verifier(auditor, honest_diloco.job.proof, salt=b"f" * 16,
                        total_steps=honest_diloco.job.steps)
    pick = {r.step: r for r in records if r.worker == "w1"}
    assert verifier.audit_one(pick[6], records).kind is VerdictKind.valid
    assert loads == [4]  # the round's checked start; steps 4 and 5 re-taken from it
    loads.clear()
    assert verifier.audit_one(pick[7], records).kind is VerdictKind.valid
    assert loads == []
    assert verdict_on(honest_diloco, "w1", 7).kind is VerdictKind.valid


def test_a_gradient_computed_at_a_state_of_its_own_choosing_is_caught_at_its_step(forger):
    """w1 computes step 6's gradient at a state of its choosing, keeps that state as the
    step's start and names it so (its step 5 claims to end there): the kept file, the
    names and the replay from the file all agree. The step's audit re-takes the round
    from its checked start and replays there, and the step-by-step fallback finds where
    the names left the chain. (Before, a lone audit of step 6 replayed at the kept file
    and passed.)"""
    step = 6
    auditor = forger.auditor()
    replayer = auditor.replayer
    mine = {r.step: r for r in forger.store.records("w1")}
    params, state = forger.store.load_local("w1", step)
    chosen = {k: v + 0.01 if v.is_floating_point() else v for k, v in params.items()}
    replayer.load(chosen)
    chosen_sha256 = param_sha256(replayer.model)
    gradient = replayer.contribution(mine[step])
    new_state = replayer.local_step(mine[step], chosen, copy.deepcopy(state), gradient)
    end = (param_sha256(replayer.model), optimizer_state_sha256(new_state))
    forger.store.save_local("w1", step, chosen, state)
    forger.store.save_reveal("w1", step, gradient)
    rewrite_record(forger.store, mine[step - 1].model_copy(update={"local": mine[step - 1].local.model_copy(
        update={"end_params_sha256": chosen_sha256})}))
    rewrite_record(forger.store, mine[step].model_copy(update={
        "params_sha256": chosen_sha256,
        "contribution_sha256": contribution_sha256(mine[step].job, "w1", step, gradient),
        "contribution_norm": contribution_norm(gradient),
        "local": mine[step].local.model_copy(update={"end_params_sha256": end[0],
                                                     "end_state_sha256": end[1]})}))
    found = verdict_on(forger, "w1", step)
    assert found.kind is VerdictKind.wrong_contribution, found
    assert found.detail.startswith(f"step {step - 1} of its round:"), found.detail


def test_only_a_rounds_end_is_ever_planted(honest_diloco):
    """A round's end re-reads its round's earlier steps: a plant among them would fail the
    real round end, and the referee, replaying the real files, would call the verifier a
    false accuser. So forced errors stand in for round ends only, and every plant served
    is caught by its own audit."""
    from shoal.verify.roles.served import ServedStore
    from shoal.proof.forced import ForcedErrors

    served = ServedStore(honest_diloco.store, ForcedErrors(b"s" * 32, 1.0),
                         honest_diloco.job.proof.epoch_steps)
    real = {(r.worker, r.step): r for r in honest_diloco.store.records()}
    changed = [r for r in served.records() if r != real[(r.worker, r.step)]]
    assert changed and all(r.local.outer for r in changed)
    assert len(changed) == sum(r.local.outer for r in real.values())
    verifier = Verifier(honest_diloco.auditor(served), honest_diloco.job.proof, salt=b"p" * 16,
                        total_steps=honest_diloco.job.steps)
    records = served.records()
    verdicts = verifier.audit_epoch(0, records, every=True).verdicts
    assert {(v.worker, v.step) for v in verdicts if v.guilty} == {(r.worker, r.step) for r in changed}


def test_a_diloco_record_without_its_own_steps_claims_is_refused(forger):
    """Without them its audit would look for a start every replica shared, find none,
    and say `unavailable` forever: a worker could never be caught."""
    record = next(r for r in forger.store.records("w1") if r.step == 5)
    rewrite_record(forger.store, record.model_copy(update={"local": None}))
    found = verdict_on(forger, "w1", 5)
    assert found.kind is VerdictKind.wrong_params and "sync" in found.detail


@pytest.mark.parametrize("forgery", ["data_seed", "slice"])
def test_an_inner_step_stating_other_samples_fails_its_rounds_end_unsampled(forger, forgery):
    """A round's end vouches for its round: an earlier step's samples weigh its gradient
    (and the round's pseudo-gradient), so each must be the job's seed and the rank's
    slice even where that step itself is not sampled. A data order of the worker's own
    used to pass there: the re-take applies committed gradients and reads no seed."""
    end = next(r for r in forger.store.records("w1")
               if r.local.outer and r.step > r.local.round_start)
    inner = next(r for r in forger.store.records("w1") if r.step == end.step - 1)
    if forgery == "data_seed":
        seed = inner.seed + 1
        update = {"seed": seed, "rng_seed": step_rng_seed(seed, inner.step, inner.positions_start)}
    else:
        update = {"positions_end": inner.positions_end + 1}
    rewrite_record(forger.store, inner.model_copy(update=update))
    found = verdict_on(forger, "w1", end.step)
    assert found.kind is (VerdictKind.wrong_params if forgery == "data_seed"
                          else VerdictKind.wrong_samples), found
    assert found.detail.startswith(f"step {inner.step} of its round"), found.detail


def test_an_older_rounds_optimizer_state_at_a_rounds_start_is_refused(forger):
    """A real state, but an old one: Adam's moments from two rounds back would push this
    round along old gradients. A round starts from the state the round before it left."""
    _, old = forger.store.load_local("w1", 4)  # what the round ending at step 3 left
    found = start_round_from(forger, 8, old)
    assert found.kind is VerdictKind.wrong_params
    assert "previous round's end" in found.detail


@pytest.mark.parametrize("peer_step", [4, 9], ids=["next_round", "restart_later"])
def test_a_round_end_state_its_worker_never_reached_is_caught_where_a_peer_starts_from_it(
        forger, peer_step):
    """Collusion: w0 claims its round ended at Adam moments of its choosing and goes on
    from elsewhere, and w1 starts from w0's claim: its next round (a round may start from
    a peer's end, as a joiner's does), or a restart at theta_outer later (which may take
    any earlier round end's). w0's own next round does not start there, so its claim is
    measured against the state w1 kept; before, nothing was left to measure against and
    w0's audit said `unavailable`, no verdict."""
    _, state = forger.store.load_local("w1", 4)
    for slot in state.values():
        slot["exp_avg"] = slot["exp_avg"] * 50
    end = next(r for r in forger.store.records("w0") if r.step == 3)
    rewrite_record(forger.store, end.model_copy(update={"local": end.local.model_copy(
        update={"end_state_sha256": optimizer_state_sha256(state)})}))
    start_round_from(forger, peer_step, state)
    found = verdict_on(forger, "w0", 3)
    assert found.kind is VerdictKind.wrong_contribution, found
    assert "does not end where" in found.detail


def test_a_remote_audit_asks_for_the_kept_start_of_a_peer_that_began_where_a_step_ended(
        honest_diloco):
    """What the collusion test measures against must be fetched from the peer's agent:
    where the worker itself did not go on from its claimed end, the first peer that did
    (the next step's, or one restarting at theta_outer later)."""
    from shoal.verify.roles.needed import record_files

    records = honest_diloco.store.records()
    claimed = "ab" * 32
    end = next(r for r in records if (r.worker, r.step) == ("w0", 3))
    end = end.model_copy(update={"local": end.local.model_copy(
        update={"end_state_sha256": claimed})})

    def asked(peer_step: int) -> set:
        peer = next(r for r in records if (r.worker, r.step) == ("w1", peer_step))
        joined = peer.model_copy(update={"local": peer.local.model_copy(
            update={"state_sha256": claimed})})
        others = [r for r in records if (r.worker, r.step) not in {("w0", 3), ("w1", peer_step)}]
        return {(c.worker, c.step, c.kind.value)
                for c in record_files([end], others + [end, joined])[0]}

    assert ("w1", 4, "local") in asked(4)
    assert ("w1", 9, "local") in asked(9)
    assert not any(worker == "w1" for worker, _, _ in record_files([end], records)[0])


def test_a_remote_audit_of_an_inner_step_asks_for_its_round_up_to_it(honest_diloco):
    """An inner step's audit re-takes the worker's round from its start and replays the
    step there: a remote verifier must fetch those files, or it would call an honest
    worker's step `withheld`."""
    from shoal.verify.roles.needed import record_files

    records = honest_diloco.store.records()
    inner = next(r for r in records if (r.worker, r.step) == ("w1", 6))
    assert inner.local.round_start == 4 and not inner.local.outer
    asked = {(c.worker, c.step, c.kind.value) for c in record_files([inner], records)[0]}
    assert {("w1", step, kind) for step in (4, 5) for kind in ("local", "reveal")} <= asked
    assert {("w1", 6, "local"), ("w1", 6, "reveal")} <= asked


def forge_round_end_claim(forger: ProvenJob, worker: str, step: int) -> str:
    """`worker` claims its round ending at `step` left Adam moments ×50 of its true ones;
    returns the claimed state's SHA-256."""
    _, state = forger.store.load_local(worker, step + 1)
    for slot in state.values():
        slot["exp_avg"] = slot["exp_avg"] * 50
    claimed = optimizer_state_sha256(state)
    end = next(r for r in forger.store.records(worker) if r.step == step)
    rewrite_record(forger.store, end.model_copy(update={"local": end.local.model_copy(
        update={"end_state_sha256": claimed})}))
    return claimed


def claim_start(forger: ProvenJob, worker: str, step: int, state_sha256: str) -> None:
    """`worker`'s record of `step` claims to start from `state_sha256` (its kept file unchanged)."""
    record = next(r for r in forger.store.records(worker) if r.step == step)
    rewrite_record(forger.store, record.model_copy(update={"local": record.local.model_copy(
        update={"state_sha256": state_sha256})}))


def test_a_peer_keeping_the_true_end_under_a_forged_claims_name_does_not_clear_the_forger(
        forger):
    """The colluding peer's kept start is what a forged round end is measured against: a
    peer that claims the forged state but keeps the true one would make the forgery
    measure as exact. A kept file is used only if it is the state its record claims; the
    peer's own audit finds its broken commitment."""
    claimed = forge_round_end_claim(forger, "w0", 3)
    claim_start(forger, "w1", 4, claimed)
    found = verdict_on(forger, "w0", 3)
    assert found.kind is VerdictKind.unavailable, found
    assert verdict_on(forger, "w1", 4).kind is VerdictKind.bad_commitment


def test_a_worker_keeping_its_true_end_under_a_forged_claims_name_is_caught_at_that_end(
        forger):
    """Alone: the worker's next record claims the forged state it started from while its
    kept file holds the true one. Measured against that file, the forgery was exact and
    passed; now the file must be the claimed state, and it is the worker's own."""
    claimed = forge_round_end_claim(forger, "w0", 3)
    claim_start(forger, "w0", 4, claimed)
    found = verdict_on(forger, "w0", 3)
    assert found.kind is VerdictKind.bad_commitment, found
