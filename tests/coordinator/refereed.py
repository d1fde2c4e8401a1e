"""A coordinator with a referee that enforces on an embedded chain, and a job it
hosts leased to two staked providers whose agents accepted on chain: what the
tests of rulings through the coordinator start from."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from shoal.agent import Agent, AgentConfig, ChainPin
from shoal.client.http import CoordinatorClient
from shoal.coordinator import Coordinator
from shoal.elastic.job_host import write_reached
from shoal.coordinator.services.settlement import Settlement
from shoal.verify.roles.remote import RemoteAudits
from shoal.models.gpt_replay import gpt_replayer
from shoal.ledger import Chain, Ledger
from shoal.spec import hyper_digest
from shoal.spec.audit import BlobKind, RecordUpload
from shoal.spec.coordinator import Grant, Heartbeat, Role
from shoal.spec.jobfile import parse_job
from shoal.spec.ledger import LedgerConfig
from shoal.verify.audit.record import Auditor
from shoal.verify.proof_store import ProofStore
from tests.conftest import free_port, shoal_command
from tests.coordinator.conftest import Served, make_settings
from tests.coordinator.test_settlement import BUDGET, PRICE, leased_and_hosted
from tests.verify.roles.conftest import write_proven_job


@dataclass
class Refereed:
    co: Coordinator
    served: Served
    ledger: Ledger
    chain_job: int
    job_id: str
    providers: dict[str, CoordinatorClient]  # "a", "b": each one agent, one offer, leased
    lease: dict[str, int]  # offer id ("a-d0", "b-d0") -> lease
    p1: object  # the providers' accounts (a's, b's) and the verifier's, granted its role
    p2: object
    vera: object


@contextlib.contextmanager
def refereed_job(tmp_path: Path, job_file: str) -> Iterator[Refereed]:
    chain = Chain.embedded()
    owner, operator, referee, alice, _, p1, p2, vera = chain.dev_accounts()[:8]
    ledger = Ledger.deploy(chain, owner, operator.address, referee.address,
                           LedgerConfig(min_stake_wei=10**15))
    for staker in (p1, p2):
        ledger.stake(staker, 10**18)
    ledger.stake(vera, 10**17)
    co = Coordinator(make_settings(f"sqlite:///{tmp_path}/store.db", operator),
                     settlement=Settlement(ledger, operator), referee_key=referee,
                     replayer=gpt_replayer)
    served = Served(co)
    try:
        submitter = served.client(alice)
        chain_job = ledger.create_job(alice, 2 * PRICE, BUDGET).returned
        providers, hosted = leased_and_hosted(served, submitter, (p1, p2), chain_job, job_file)
        for name, client in providers.items():  # their agents accept the leases on chain
            reply = client.heartbeat(name, Heartbeat())
            Agent(client, AgentConfig(agent_id=name, work_dir=tmp_path / name,
                                      chain=ChainPin.of(ledger)))._accept(
                reply.assignments)
        lease = {held.offer_id: held.lease for held in submitter.job(hosted.job_id).leases}
        served.client(operator).request("POST", "/v1/grants", Grant(
            address=vera.address, role=Role.verifier, name="vera"))
        yield Refereed(co, served, ledger, chain_job, hosted.job_id, providers, lease,
                       p1, p2, vera)
    finally:
        served.stop()
        co.hosts.stop_all()


def remote_verifier(served: Served, job_id: str, spec, vera, folder: Path,
                    answer_wait_s: float = 30.0) -> RemoteAudits:
    """Vera, auditing every record of the job through the coordinator into `folder`."""
    auditor = Auditor(ProofStore(folder), gpt_replayer(spec),
                      hyper_sha256=hyper_digest(spec.hyperparameters()),
                      tolerance=spec.proof.tolerance, verifier=vera.address)
    return RemoteAudits(served.client(vera), job_id, spec, auditor, vera, salt=b"v",
                        every=True, answer_wait_s=answer_wait_s, poll_s=0.1)


def run_on_lease_a(r: Refereed, job_file: Path, run_dir: Path, workers: int,
                   *flags: str, forge: Callable[[ProofStore, list[str]], None] | None = None
                   ) -> tuple[list[str], ProofStore]:
    """A real `shoal train` run of the hosted job, its workers named as lease a's agent
    would name them (NODE-w<i>; a rendezvous this one host serves); the membership it
    formed published by the job's host, the records it filed uploaded under lease a and
    the epochs rooted. Returns the workers' ids and the run's proof store (where the
    test, standing in for the agent, answers challenges from). `forge`, if given, rewrites
    the run's files (its proof store, the workers' ids) before the records go up."""
    node = f"a-l{r.lease['a-d0']}-a0"
    done = subprocess.run(shoal_command(
        "train", str(job_file), "--workers", str(workers), "--node", node, "--serve",
        "--rendezvous", f"127.0.0.1:{free_port()}", "--run-dir", str(run_dir), *flags),
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    work = ProofStore(job_file.parent / "proof")
    ids = [f"{node}-w{i}" for i in range(workers)]
    if forge is not None:
        forge(work, ids)
    published = r.co.hosts.run_dir(r.job_id) / "epochs.jsonl"
    published.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(run_dir / "epochs.jsonl", published)
    # ... and how far every member got, as the host writes it (epochs root by it).
    write_reached(published.parent, max(record.step for record in work.records()))
    r.providers["a"].upload_records(r.job_id, RecordUpload(lease=r.lease["a-d0"],
                                                           records=tuple(work.records())))
    r.served.app.state.rounds.once()
    return ids, work


def answer_as_a(a: CoordinatorClient, work: ProofStore, side: Callable[[], None]) -> None:
    """Agent a beats and answers from a run's proof directory while `side` (a verifier's,
    challenger's or referee's work) runs in a thread: the parameters its workers kept,
    and each worker's own kept states and contributions (what it does not have, it
    leaves unanswered). It beats once before `side` starts: after a run long enough for
    the coordinator to have marked it lost, a challenge raised before its first beat
    would find its holder offline and be dropped at once. And it beats between answers,
    as the agent's own loop does: a dozen answers on a loaded machine outlast the tests'
    one-second agent timeout, and the challenges still open would find it offline."""
    a.heartbeat("a", Heartbeat())
    running = threading.Thread(target=side)
    running.start()
    while running.is_alive():
        for asked in a.heartbeat("a", Heartbeat()).challenges:
            path = {BlobKind.params: lambda: work.layout.params(asked.step),
                    BlobKind.local: lambda: work.layout.local(asked.worker, asked.step),
                    BlobKind.reveal: lambda: work.layout.reveal(asked.worker, asked.step)}[
                asked.kind]()
            if path.exists():
                a.answer_challenge(asked.challenge, path.read_bytes())
                a.heartbeat("a", Heartbeat())
        running.join(0.2)


@contextlib.contextmanager
def diloco_run_on_lease_a(tmp_path: Path, steps: int, epoch_steps: int, workers: int,
                          *flags: str, forge: Callable[[ProofStore, list[str]], None] | None = None
                          ) -> Iterator[dict]:
    """A DiLoCo job (rounds of 4 inner steps) hosted, leased, and run on lease a with
    `flags` (the adversaries): what a dispute over a DiLoCo round starts from. Yields
    the coordinator's pieces, the job's spec, the workers' ids and the run's proof
    store by name, as the tests' `s[...]` read them."""
    path = write_proven_job(tmp_path / "work", steps=steps, epoch_steps=epoch_steps,
                            sync='mode = "diloco"\ninner_steps = 4')
    text = path.read_text()
    with refereed_job(tmp_path, text) as r:
        ids, work = run_on_lease_a(r, path, tmp_path / "work" / "run", workers, *flags,
                                   forge=forge)
        yield dict(co=r.co, served=r.served, ledger=r.ledger, chain_job=r.chain_job,
                   a=r.providers["a"], spec=parse_job(tomllib.loads(text), source="test"),
                   job_id=r.job_id, workers=ids, work=work, vera=r.vera, p1=r.p1,
                   tmp=tmp_path)
