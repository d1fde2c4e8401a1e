"""Job bundles at the coordinator (issue 41), tried as a hostile party would: a
submitter sending an archive that is not what its hash names, one naming someone
else's bundle in a job of its own (to lease it to itself and read the code), a
provider with no lease on the job and a stranger reading the code or the job's
data credentials."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from eth_account import Account
from sqlalchemy.orm import Session

from shoal.bundle import pack_bundle
from shoal.client.http import CoordinatorRefused
from shoal.coordinator.db.schema import JobRow
from shoal.coordinator.errors import Forbidden
from shoal.coordinator.services.bundles import FETCH_GRACE_S
from shoal.spec.coordinator import Heartbeat, JobSubmission, OfferTerms, Registration
from tests.coordinator.conftest import Served, provider_with_agent

PRICE = 1_000
TORCH = "2.13.0"


def _bundle(tmp_path: Path, text: str = "import shoal\nprint('the submitter\\'s own')\n",
            torch: str = TORCH):
    script = tmp_path / "train.py"
    script.write_text(text)
    return pack_bundle(script, torch=torch)


def _job_file(sha256: str) -> str:
    return (f'name = "own"\nsteps = 20\nglobal_batch = 8\n\n[bundle]\nsha256 = "{sha256}"\n'
            'args = ["--steps", "20"]\n')


def _submission(sha256: str) -> JobSubmission:
    return JobSubmission(name="own", job_file=_job_file(sha256), workers=1,
                         max_price_wei_per_s=2 * PRICE, budget_wei=10**12)


def _submitter(served: Served, name: str):
    client = served.client(Account.create())
    client.register(Registration(role="submitter", name=name))
    return client


def _providers(served: Served, torches: tuple[str, str] = (TORCH, TORCH)):
    """Providers a (cheaper) and b, one device each, on the torch releases given."""
    a, b = served.client(Account.create()), served.client(Account.create())
    for client, agent, price, torch in ((a, "agent-a", PRICE, torches[0]),
                                        (b, "agent-b", 3 * PRICE, torches[1])):
        provider_with_agent(client, agent, torch=torch)
        client.post_offer(OfferTerms(offer_id=f"dev-{agent[-1]}", agent_id=agent,
                                     price_wei_per_s=price))
    return a, b


def _refused(call, status: int, words: str) -> None:
    with pytest.raises(CoordinatorRefused) as refused:
        call()
    assert refused.value.status == status, refused.value.detail
    assert words in refused.value.detail, refused.value.detail


def test_a_bundle_goes_to_its_submitter_and_its_jobs_providers_only(served, tmp_path):
    alice, mallory = _submitter(served, "alice"), _submitter(served, "mallory")
    a, b = _providers(served)
    bundle = _bundle(tmp_path)
    manifest = alice.upload_bundle(bundle.sha256, bundle.archive)
    assert manifest.script == "train.py"
    # Before any job names it, only its submitter reads it.
    assert alice.bundle(bundle.sha256) == bundle.archive
    _refused(lambda: a.bundle(bundle.sha256), 403, "holds no lease")
    job = alice.submit(_submission(bundle.sha256))
    assert job.bundle_sha256 == bundle.sha256  # what `shoal jobs` and the dashboard show
    served.app.state.rounds.once()
    (lease,) = alice.job(job.job_id).leases
    assert lease.provider.lower() == a.account.address.lower()
    assert a.bundle(bundle.sha256) == bundle.archive  # the lease holder's agent runs it
    # A provider of no lease on the job, another submitter, a key of nobody's.
    _refused(lambda: b.bundle(bundle.sha256), 403, "holds no lease")
    _refused(lambda: mallory.bundle(bundle.sha256), 403, "holds no lease")
    _refused(lambda: served.client(Account.create()).bundle(bundle.sha256), 403, "")
    # Naming alice's bundle in a job of its own (to lease it to a provider it controls and
    # read the code from there) is refused: a job names only its submitter's bundles.
    _refused(lambda: mallory.submit(_submission(bundle.sha256)), 403, "not sent by")
    # Once the lease has ended, its provider no longer reads the code.
    alice.job_action(job.job_id, "cancel")
    assert a.bundle(bundle.sha256) == bundle.archive  # within the grace of a beat or two
    coordinator = served.app.state.coordinator  # past it (asked of the service: a signed
    coordinator.desk._clock = lambda: time.time() + FETCH_GRACE_S + 1  # request would be stale)
    with pytest.raises(Forbidden, match="holds no lease"):
        coordinator.bundles.read(a.account.address, bundle.sha256)


def test_an_archive_that_is_not_what_its_hash_names_is_refused(served, tmp_path):
    alice = _submitter(served, "alice")
    bundle, other = _bundle(tmp_path), _bundle(tmp_path / "..", "print('another')\n")
    _refused(lambda: alice.upload_bundle(bundle.sha256, other.archive), 422, "SHA-256")
    tampered = bytearray(bundle.archive)
    tampered[-600] ^= 1
    _refused(lambda: alice.upload_bundle(bundle.sha256, bytes(tampered)), 422, "")
    # Nothing was kept: a job cannot name it.
    _refused(lambda: alice.submit(_submission(bundle.sha256)), 422, "send it first")


def test_only_submitters_send_bundles(served, tmp_path):
    provider = served.client(Account.create())
    provider_with_agent(provider, "agent-a")
    bundle = _bundle(tmp_path)
    _refused(lambda: provider.upload_bundle(bundle.sha256, bundle.archive), 403, "submitter")


def test_a_bundled_job_with_proof_is_refused_with_what_to_do(served, tmp_path):
    alice = _submitter(served, "alice")
    bundle = _bundle(tmp_path)
    alice.upload_bundle(bundle.sha256, bundle.archive)
    job_file = _job_file(bundle.sha256) + "\n[proof]\nenabled = true\n"
    _refused(lambda: alice.submit(JobSubmission(
        name="own", job_file=job_file, workers=1, max_price_wei_per_s=PRICE,
        budget_wei=10**12)), 422, "enabled = false")


def test_a_bundle_is_leased_only_to_devices_on_its_torch(served, tmp_path):
    """A script written against one torch release never lands on a device running
    another, however cheap: the offer names its release, and the auction matches it."""
    alice = _submitter(served, "alice")
    cheap, right = _providers(served, torches=("2.12.1", TORCH))
    bundle = _bundle(tmp_path)
    assert bundle.manifest.torch == TORCH
    alice.upload_bundle(bundle.sha256, bundle.archive)
    job = alice.submit(JobSubmission(name="own", job_file=_job_file(bundle.sha256), workers=2,
                                     max_price_wei_per_s=4 * PRICE, budget_wei=10**12))
    served.app.state.rounds.once()
    (lease,) = alice.job(job.job_id).leases  # two wanted; one device runs its torch
    assert lease.provider.lower() == right.account.address.lower()


def test_a_secret_goes_to_the_running_leases_provider_alone_and_is_gone_with_the_job(
        served, tmp_path):
    """The data's credentials: not in the job file (which anyone reads), not to a provider
    without a lease, and not after the job ended."""
    alice = _submitter(served, "alice")
    a, b = _providers(served)
    bundle = _bundle(tmp_path)
    alice.upload_bundle(bundle.sha256, bundle.archive)
    secret = {"AWS_SECRET_ACCESS_KEY": "s3cr3t-for-the-lease"}
    job = alice.submit(_submission(bundle.sha256).model_copy(update={"secret_env": secret}))
    served.app.state.rounds.once()
    coordinator = served.app.state.coordinator
    with Session(coordinator.engine) as session, session.begin():  # its host serves
        session.get(JobRow, job.job_id).rendezvous = "127.0.0.1:1"
    stranger = served.client(Account.create())
    assert "s3cr3t" not in stranger.job_file(job.job_id)
    (lease,) = alice.job(job.job_id).leases
    reply = coordinator.agents.heartbeat(a.account.address, "agent-a", Heartbeat())
    assert [x.secret_env for x in reply.assignments] == [secret]
    assert coordinator.agents.heartbeat(b.account.address, "agent-b",
                                        Heartbeat()).assignments == ()
    alice.job_action(job.job_id, "cancel")
    assert coordinator.secrets.of(job.job_id) == {}
    assert not list((coordinator.settings.data_dir / "secrets").glob("*"))


def test_a_secret_for_a_job_that_runs_no_script_is_refused(served):
    alice = _submitter(served, "alice")
    _refused(lambda: alice.submit(JobSubmission(
        name="gpt", job_file="steps = 10\nglobal_batch = 4\n", workers=1,
        max_price_wei_per_s=PRICE, budget_wei=10**12,
        secret_env={"AWS_SECRET_ACCESS_KEY": "x"})), 422, "bundled job")
