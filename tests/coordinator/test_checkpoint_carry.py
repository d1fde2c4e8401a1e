"""Checkpoints carried between machines through the coordinator, on both
stores: the agent of the worker that wrote one sends it, the agent of a
joining worker fetches it into its own checkpoint folder, and the worker's
own store restores it. Tried as the parties that would game it: a provider
sending a state nobody trained (parameters its step's work records
contradict), a file that is not a checkpoint or a pickle that is more than
tensors, a checkpoint of another step than it says, a provider without a
lease on the job sending or reading, an unsigned read; a member that is not the
step's checkpoint writer sending first (the first upload of a step stands); the
writer itself sending the trained parameters with a shifted data cursor or
optimizer settings the job does not have."""

from __future__ import annotations

import io
import tomllib

import pytest
import torch
from eth_account import Account

from shoal.agent.checkpoints import CheckpointRelay, checkpoint_dir
from shoal.coordinator.service import Coordinator
from shoal.models.gpt_replay import gpt_replayer
from shoal.models.optim import build_optimizer
from shoal.models.model import GPT
from shoal.spec.audit import RecordUpload
from shoal.spec.coordinator import JobSubmission, OfferTerms, Registration
from shoal.spec.jobfile import parse_job
from shoal.train.checkpoint import CheckpointStore, take_snapshot
from shoal.train.hashing import param_sha256
from tests.coordinator.conftest import (
    TINY_JOB, Served, make_settings, provider_with_agent,
)
from tests.coordinator.test_proofs import PROOF_JOB, publish, record, refused

PRICE = 1_000_000
STEP = 5


@pytest.fixture
def carry(store_url, operator, tmp_path):
    """A coordinator that can build the job's model; a job leased to agent-a and agent-b
    (rank 0 and 1 of its first epoch); provider C registered with no lease."""
    coordinator = Coordinator(make_settings(store_url, operator), replayer=gpt_replayer)
    served = Served(coordinator)
    try:
        yield _market(served, tmp_path, PROOF_JOB)
    finally:
        served.stop()
        coordinator.hosts.stop_all()
        coordinator.engine.dispose()


def _market(served: Served, tmp_path, job_file: str):
    a, b, c = (served.client(Account.create()) for _ in range(3))
    submitter = served.client(Account.create())
    for client, agent in ((a, "agent-a"), (b, "agent-b"), (c, "agent-c")):
        provider_with_agent(client, agent)
        if agent != "agent-c":
            client.post_offer(OfferTerms(offer_id=f"dev-{agent[-1]}", agent_id=agent,
                                         price_wei_per_s=PRICE))
    submitter.register(Registration(role="submitter", name="alice"))
    job = submitter.submit(JobSubmission(name="tiny", job_file=job_file, workers=2,
                                         max_price_wei_per_s=2 * PRICE, budget_wei=10**12))
    served.app.state.rounds.once()
    leases = {lease.offer_id: lease.lease for lease in submitter.job(job.job_id).leases}
    workers = [f"agent-a-l{leases['dev-a']}-a0-w0", f"agent-b-l{leases['dev-b']}-a0-w0"]
    publish(served.app.state.coordinator, job.job_id, workers, "start")
    path = tmp_path / "job.toml"
    path.write_text(job_file)
    return served, a, b, c, submitter, job.job_id, leases, workers, path


def write_checkpoint(folder, job_file, step: int = STEP, nudge: float = 0.0,
                     cursor_shift: int = 0, tamper=None) -> str:
    """A checkpoint of the job at `step` written by the workers' own store, with the
    optimizer the job builds, one update in; returns the hash of its parameters (what the
    step's work records say it started from). `nudge`, `cursor_shift` and `tamper` (of
    the optimizer) forge it."""
    spec = parse_job(tomllib.loads(job_file.read_text()), "job_file")
    torch.manual_seed(1)
    model = GPT(spec.model)
    optimizer = build_optimizer(model, spec.optimizer)
    for p in model.parameters():
        p.grad = torch.full_like(p, 1e-3)
    optimizer.step()
    digest = param_sha256(model)
    with torch.no_grad():
        next(model.parameters()).add_(nudge)  # nudge != 0: a state nobody trained
    if tamper is not None:
        tamper(optimizer)
    store = CheckpointStore(folder, spec.resume_identity(), keep=2)
    store.save_async(take_snapshot(step, step * 8 + cursor_shift, model, optimizer))
    store.close()
    return digest


def upload_records(client, job_id, lease, worker, rank, digest, step=STEP):
    rec = record(worker, step, rank=rank, shares=(4, 4)).model_copy(
        update={"params_sha256": digest})
    client.upload_records(job_id, RecordUpload(lease=lease, records=(rec,)))


def test_a_checkpoint_travels_from_the_writers_agent_to_a_joiners_and_restores(carry, tmp_path):
    served, a, b, _, submitter, job_id, leases, workers, job_file = carry
    digest = write_checkpoint(checkpoint_dir(tmp_path / "a", job_id), job_file)
    relay_a = CheckpointRelay(a, tmp_path / "a")
    relay_a.sync({leases["dev-a"]: (job_id, job_file)})
    assert a.carried_checkpoint(job_id) is None  # no record of step 5 yet to check it against

    upload_records(a, job_id, leases["dev-a"], workers[0], 0, digest)
    upload_records(b, job_id, leases["dev-b"], workers[1], 1, digest)
    relay_a.sync({leases["dev-a"]: (job_id, job_file)})
    held = a.carried_checkpoint(job_id)
    assert (held.step, held.verified, held.lease) == (STEP, True, leases["dev-a"])

    relay_b = CheckpointRelay(b, tmp_path / "b")
    # A lease that ended here fetches nothing (the coordinator would refuse it, every
    # 30 s, for as long as the agent runs).
    asked = []
    b.checkpoint_file = lambda *args: asked.append(args)  # type: ignore[method-assign]
    relay_b.sync({leases["dev-b"]: (job_id, job_file)}, live=set())
    assert asked == []
    del b.checkpoint_file
    relay_b.sync({leases["dev-b"]: (job_id, job_file)}, live={leases["dev-b"]})
    spec = parse_job(tomllib.loads(job_file.read_text()), "job_file")
    restored = CheckpointStore(checkpoint_dir(tmp_path / "b", job_id), spec.resume_identity(),
                               keep=2).load_latest()
    original = CheckpointStore(checkpoint_dir(tmp_path / "a", job_id), spec.resume_identity(),
                               keep=2).load_latest()
    assert (restored.step, restored.cursor) == (original.step, original.cursor)
    for name, tensor in original.state["model"].items():
        assert torch.equal(restored.state["model"][name], tensor), name
    # The submitter may read its job's model too, and `shoal model` writes it as a plain
    # safetensors file of the parameters, loadable with no shoal at all.
    assert submitter.checkpoint_file(job_id, STEP) == b.checkpoint_file(job_id, STEP)
    from safetensors.torch import load_file
    from typer.testing import CliRunner

    from shoal.cli.main import app

    key = tmp_path / "submitter.key"
    key.write_text("0x" + bytes(submitter.account.key).hex())
    out = tmp_path / "model.safetensors"
    said = CliRunner().invoke(app, ["model", job_id, "-o", str(out), "--coordinator",
                                    served.url, "--key", str(key)])
    assert said.exit_code == 0, said.output
    assert f"at step {STEP}" in said.output
    downloaded = load_file(str(out))
    assert downloaded.keys() == original.state["model"].keys()
    for name, tensor in original.state["model"].items():
        assert torch.equal(downloaded[name], tensor), name


def test_a_state_nobody_trained_is_never_carried(carry, tmp_path):
    served, a, b, _, _, job_id, leases, workers, job_file = carry
    honest = write_checkpoint(tmp_path / "honest", job_file)
    upload_records(a, job_id, leases["dev-a"], workers[0], 0, honest)
    upload_records(b, job_id, leases["dev-b"], workers[1], 1, honest)
    forged_dir = tmp_path / "forged"
    write_checkpoint(forged_dir, job_file, nudge=0.5)
    forged = next(forged_dir.glob("*.safetensors")).read_bytes()
    assert "not what" in refused(lambda: a.upload_checkpoint(job_id, STEP, leases["dev-a"],
                                                             forged), 409)
    # Not a checkpoint; a pickle that would run code; a step other than it says.
    refused(lambda: a.upload_checkpoint(job_id, STEP, leases["dev-a"], b"\x00" * 64), 422)

    class Payload:
        def __reduce__(self):
            return (print, ("never run",))

    evil = io.BytesIO()
    torch.save({"step": STEP, "cursor": 0, "model": {}, "x": Payload()}, evil)
    refused(lambda: a.upload_checkpoint(job_id, STEP, leases["dev-a"], evil.getvalue()), 422)
    honest_blob = next((tmp_path / "honest").glob("*.safetensors")).read_bytes()
    assert "not 6" in refused(lambda: a.upload_checkpoint(job_id, 6, leases["dev-a"],
                                                          honest_blob), 422)
    assert a.carried_checkpoint(job_id) is None  # nothing held after all of that
    assert a.upload_checkpoint(job_id, STEP, leases["dev-a"], honest_blob).verified


def test_only_the_jobs_own_providers_and_submitter_see_its_checkpoints(carry, tmp_path):
    served, a, b, c, submitter, job_id, leases, workers, job_file = carry
    digest = write_checkpoint(tmp_path / "ckpt", job_file)
    blob = next((tmp_path / "ckpt").glob("*.safetensors")).read_bytes()
    upload_records(a, job_id, leases["dev-a"], workers[0], 0, digest)
    refused(lambda: c.upload_checkpoint(job_id, STEP, leases["dev-a"], blob), 403)
    refused(lambda: b.upload_checkpoint(job_id, STEP, leases["dev-a"], blob), 403)  # A's lease
    assert a.upload_checkpoint(job_id, STEP, leases["dev-a"], blob).stored
    refused(lambda: c.checkpoint_file(job_id, STEP), 403)
    unsigned = served.client(None)
    refused(lambda: unsigned.request("GET", f"/v1/jobs/{job_id}/checkpoints/{STEP}/file",
                                     raw=True, sign=False), 401)
    refused(lambda: b.checkpoint_file(job_id, STEP - 1), 404)  # not the step carried
    # An older (or the same) step is not stored over a newer one.
    again = b.upload_checkpoint(job_id, STEP, leases["dev-b"], blob)
    assert not again.stored and again.lease == leases["dev-a"]


def test_without_work_records_a_checkpoint_is_carried_on_its_providers_word(
        store_url, operator, tmp_path):
    coordinator = Coordinator(make_settings(store_url, operator), replayer=gpt_replayer)
    served = Served(coordinator)
    try:
        _, a, _, _, _, job_id, leases, _, job_file = _market(served, tmp_path, TINY_JOB)
        write_checkpoint(checkpoint_dir(tmp_path / "a", job_id), job_file)
        CheckpointRelay(a, tmp_path / "a").sync({leases["dev-a"]: (job_id, job_file)})
        held = a.carried_checkpoint(job_id)
        assert held.step == STEP and not held.verified  # said so, not hidden
    finally:
        served.stop()
        coordinator.hosts.stop_all()
        coordinator.engine.dispose()


@pytest.mark.parametrize("job_file", [PROOF_JOB, TINY_JOB], ids=["records", "no-records"])
def test_a_member_that_is_not_the_writer_cannot_carry_the_step_first(
        store_url, operator, tmp_path, job_file):
    """b, rank 1, races the writer (rank 0, a) with the step's checkpoint: were it carried,
    a's would be refused as not newer, and every worker restored from disk would take
    whatever else b put in it. b is refused; a's is carried as if b never tried."""
    coordinator = Coordinator(make_settings(store_url, operator), replayer=gpt_replayer)
    served = Served(coordinator)
    try:
        _, a, b, _, _, job_id, leases, workers, path = _market(served, tmp_path, job_file)
        digest = write_checkpoint(tmp_path / "ckpt", path)
        blob = next((tmp_path / "ckpt").glob("*.safetensors")).read_bytes()
        if job_file == PROOF_JOB:
            upload_records(a, job_id, leases["dev-a"], workers[0], 0, digest)
            upload_records(b, job_id, leases["dev-b"], workers[1], 1, digest)

        assert "writes" in refused(lambda: b.upload_checkpoint(job_id, STEP, leases["dev-b"],
                                                               blob), 403)
        assert a.carried_checkpoint(job_id) is None  # b gained the seat of nothing
        held = a.upload_checkpoint(job_id, STEP, leases["dev-a"], blob)
        assert (held.stored, held.lease, held.verified) == (True, leases["dev-a"],
                                                            job_file == PROOF_JOB)
    finally:
        served.stop()
        coordinator.hosts.stop_all()
        coordinator.engine.dispose()


def _one_parameter_dropped(optimizer):
    dropped = optimizer.param_groups[-1]["params"].pop()
    optimizer.state.pop(dropped)


FORGERIES = {  # what the writer's checkpoint says besides the trained parameters
    "cursor ahead": dict(cursor_shift=3),
    "cursor behind": dict(cursor_shift=-8),
    "gradient ascent": dict(tamper=lambda o: [g.update(maximize=True) for g in o.param_groups]),
    "betas": dict(tamper=lambda o: [g.update(betas=(0.0, 0.0)) for g in o.param_groups]),
    "eps": dict(tamper=lambda o: [g.update(eps=1e6) for g in o.param_groups]),
    "weight decay": dict(tamper=lambda o: [g.update(weight_decay=1.0) for g in o.param_groups]),
    "a parameter left out": dict(tamper=_one_parameter_dropped),
}


@pytest.mark.parametrize("forgery", list(FORGERIES), ids=list(FORGERIES))
def test_the_writer_cannot_carry_what_the_job_and_step_contradict(carry, tmp_path, forgery):
    """a holds the writer seat and sends the step's true parameters, but with a data cursor
    or optimizer settings that are not the job's: restored, a shifted cursor makes every
    honest worker's records name the wrong samples (an audit blames them), and the
    optimizer settings steer everyone's training. Refused; the honest file is carried."""
    served, a, b, _, _, job_id, leases, workers, job_file = carry
    digest = write_checkpoint(tmp_path / "forged", job_file, **FORGERIES[forgery])
    assert digest == write_checkpoint(tmp_path / "honest", job_file)  # the same parameters
    upload_records(a, job_id, leases["dev-a"], workers[0], 0, digest)
    upload_records(b, job_id, leases["dev-b"], workers[1], 1, digest)
    forged = next((tmp_path / "forged").glob("*.safetensors")).read_bytes()

    refused(lambda: a.upload_checkpoint(job_id, STEP, leases["dev-a"], forged), 409)
    assert a.carried_checkpoint(job_id) is None
    honest = next((tmp_path / "honest").glob("*.safetensors")).read_bytes()
    assert a.upload_checkpoint(job_id, STEP, leases["dev-a"], honest).verified
