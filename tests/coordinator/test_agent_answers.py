"""An agent answers a challenge while its relay is held up. A checkpoint carry
waits for the coordinator to verify the checkpoint, and a backlog of records
takes a while to send; answers used to wait behind both in one loop, and on a
loaded machine came after the verifier had given up on them (`withheld`)."""

from __future__ import annotations

import threading
import time

from shoal.agent.agent import Agent, AgentConfig
from shoal.agent.proofs import proof_dir
from shoal.proof.layout import ProofLayout
from shoal.spec.audit import ChallengeRequest
from tests.coordinator.test_file_admission import filed  # noqa: F401  (fixture)


def test_a_challenge_is_answered_while_the_relay_is_held_up(filed, tmp_path):  # noqa: F811
    served, a, verifier, job_id, worker, _ = filed
    agent = Agent(a, AgentConfig(agent_id="agent-a", work_dir=tmp_path / "agent-a"))
    agent.workers.follow = lambda assignments, stop: None  # no worker process: files by hand
    agent.workers.running = lambda: []
    reveal = ProofLayout(proof_dir(agent.config.work_dir, job_id)).reveal(worker, 1)
    reveal.parent.mkdir(parents=True)
    reveal.write_bytes(b"the contribution of step 1")
    held, release = threading.Event(), threading.Event()

    def carry_held_up(_jobs, live=None):  # a carry the coordinator takes its time over
        held.set()
        release.wait(60)

    agent.carry.sync = carry_held_up
    runner = threading.Thread(target=agent.run, daemon=True)
    runner.start()
    try:
        assert held.wait(30), "the relay never ran"
        (challenge,) = verifier.raise_challenges(job_id, [ChallengeRequest(worker=worker, step=1)])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            (view,) = [c for c in verifier.challenges(job_id) if c.challenge == challenge.challenge]
            if view.answered_at_s is not None:
                break
            time.sleep(0.2)
        assert view.answered_at_s is not None, "not answered while the relay was held up"
        assert verifier.challenge_file(challenge.challenge) == reveal.read_bytes()
    finally:
        release.set()
        agent.stopping.set()
        runner.join(timeout=60)
