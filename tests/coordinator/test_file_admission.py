"""A large file is read only from the one party that may send it. A challenge's
answer or a carried checkpoint may be up to `max_file_bytes`; an attacker who
could make the coordinator buffer that much before the signature check says no
could exhaust its memory with a few requests. Each attempt below is driven at
the app itself, so the test sees whether a single byte of the body was read."""

from __future__ import annotations

import asyncio
import hashlib

import pytest
from eth_account import Account

from shoal.coordinator.services.numbering import FETCH_BASE
from shoal.client.identity import BODY_SHA256, Signer, sign_request
from shoal.spec.audit import ChallengeRequest
from shoal.spec.coordinator import Registration
from tests.coordinator.conftest import Served, provider_with_agent
from tests.coordinator.test_proofs import PROOF_JOB, filed_proof_job

LARGE = 1024 * 1024  # over max_body_bytes (256 KiB), under max_file_bytes


@pytest.fixture
def filed(served: Served, operator):
    """A proof job leased to agent-a's provider, whose worker filed steps 0-5, and a
    verifier. Returns (served, provider, verifier, job_id, worker, lease)."""
    a, verifier, job_id, worker, lease = filed_proof_job(served, operator, PROOF_JOB)
    return served, a, verifier, job_id, worker, lease


@pytest.fixture
def challenged(filed):
    """`filed`, with step 1 challenged. Returns (served, provider, job_id, challenge, lease)."""
    served, a, verifier, job_id, worker, lease = filed
    (challenge,) = verifier.raise_challenges(job_id, [ChallengeRequest(worker=worker, step=1)])
    return served, a, job_id, challenge.challenge, lease


def drive(served: Served, account, path: str, body: bytes, *, query: str = "",
          announce: bytes | None = None, drop_announcement: bool = False,
          headers: dict[str, str] | None = None, length: bool | int = True
          ) -> tuple[int, str, int]:
    """PUT `body` to `path` straight into the app, signed by `account` (signed for, and
    announcing, `announce` instead if given); returns (status, detail, body bytes the
    app read). `length`: the content-length stated (True: the body's, False: none)."""
    target = f"{path}?{query}" if query else path
    signed = headers or sign_request(account, "shoal-test", "PUT", target,
                                     body if announce is None else announce)
    if drop_announcement:
        signed.pop(BODY_SHA256)
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "PUT", "scheme": "http", "path": path, "raw_path": path.encode(),
             "query_string": query.encode(), "root_path": "", "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", served.port),
             "headers": [(b"content-type", b"application/octet-stream")]
             + ([(b"content-length", str(len(body) if length is True else length).encode())]
                if length is not False else [])
             + [(k.encode(), v.encode()) for k, v in signed.items()]}
    read, sent = 0, []
    chunks = [body[i:i + 65536] for i in range(0, len(body), 65536)]

    async def receive():
        nonlocal read
        if not chunks:
            return {"type": "http.disconnect"}
        chunk = chunks.pop(0)
        read += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message):
        sent.append(message)

    asyncio.run(served.app(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start")
    detail = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return status, detail.decode(), read


def unanswered(served: Served, job_id: str, challenge: int) -> bool:
    (view,) = [c for c in served.client().challenges(job_id) if c.challenge == challenge]
    return view.answered_at_s is None


def test_strangers_cannot_make_the_coordinator_read_a_large_answer(challenged):
    served, _, job_id, challenge, _ = challenged
    path = f"/v1/challenges/{challenge}/answer"
    other = served.client(Account.create())
    provider_with_agent(other, "agent-b")  # a provider, but not the challenged worker's
    submitter = Account.create()
    served.client(submitter).register(Registration(role="submitter", name="sam"))
    for account, status in ((Account.create(), 403), (other.account, 403), (submitter, 403)):
        got, detail, read = drive(served, account, path, b"x" * LARGE)
        assert (got, read) == (status, 0), detail
    assert unanswered(served, job_id, challenge)


def test_a_large_body_must_be_announced_and_be_the_one_announced(challenged):
    served, a, job_id, challenge, _ = challenged
    path = f"/v1/challenges/{challenge}/answer"
    got, detail, read = drive(served, a.account, path, b"x" * LARGE, drop_announcement=True)
    assert (got, read) == (401, 0) and BODY_SHA256 in detail
    # Announced and signed for one file, another sent: read (the sender may send a
    # file), then refused, and nothing is taken.
    got, detail, read = drive(served, a.account, path, b"y" * LARGE, announce=b"x" * LARGE)
    assert (got, read) == (401, LARGE), detail
    assert unanswered(served, job_id, challenge)
    # The challenged provider's own large answer is taken, through the client.
    view = a.answer_challenge(challenge, b"z" * LARGE)
    assert view.answered_at_s is not None and view.sha256 == hashlib.sha256(b"z" * LARGE).hexdigest()


def test_a_replayed_or_answered_large_upload_is_refused_unread(challenged):
    served, a, _, challenge, _ = challenged
    path = f"/v1/challenges/{challenge}/answer"
    headers = sign_request(a.account, "shoal-test", "PUT", path, b"x" * LARGE)
    served.app.state.coordinator.participants.consume_nonce(Signer(
        a.account.address, headers["x-shoal-nonce"], int(headers["x-shoal-timestamp"])))
    got, detail, read = drive(served, a.account, path, b"x" * LARGE, headers=headers)
    assert (got, read) == (401, 0) and "nonce" in detail
    a.answer_challenge(challenge, b"the file")
    got, detail, read = drive(served, a.account, path, b"x" * LARGE)
    assert (got, read) == (409, 0) and "answered already" in detail
    # Challenges that do not exist, a forced error's fetch (past FETCH_BASE) among them.
    for number in (999999, FETCH_BASE + 1, 2**63):
        got, _, read = drive(served, a.account, f"/v1/challenges/{number}/answer", b"x" * LARGE)
        assert (got, read) == (404, 0), number


def test_only_a_lease_of_the_job_may_send_a_large_checkpoint(challenged):
    served, a, job_id, _, lease = challenged
    path = f"/v1/jobs/{job_id}/checkpoints/5"
    other = served.client(Account.create())
    provider_with_agent(other, "agent-b")
    for account, query in ((other.account, f"lease={lease}"), (a.account, ""),
                           (a.account, f"lease={lease + 1}")):
        got, detail, read = drive(served, account, path, b"x" * LARGE, query=query)
        assert (got, read) == (403, 0), detail
    # The lease holder's body is read (what it holds is then checked as any checkpoint:
    # here it is no checkpoint at all).
    got, detail, read = drive(served, a.account, path, b"x" * LARGE, query=f"lease={lease}")
    assert read == LARGE and got == 422 and "not a checkpoint" in detail, detail


def test_a_body_of_unstated_length_is_admitted_as_a_large_one(challenged):
    served, a, job_id, challenge, _ = challenged
    path = f"/v1/challenges/{challenge}/answer"
    got, _, read = drive(served, Account.create(), path, b"x" * LARGE, length=False)
    assert (got, read) == (403, 0)  # streamed (chunked) from a stranger: refused unread
    got, _, read = drive(served, a.account, path, b"x" * LARGE, length=False)
    assert (got, read) == (200, LARGE)
    assert not unanswered(served, job_id, challenge)


def test_a_body_declared_small_is_held_to_the_small_limit(challenged):
    served, _, job_id, challenge, _ = challenged
    path = f"/v1/challenges/{challenge}/answer"
    # A length the server might not hold the client to: the body is still counted.
    got, _, read = drive(served, Account.create(), path, b"x" * LARGE, length=100)
    assert got == 413 and read <= 256 * 1024 + 65536
    assert unanswered(served, job_id, challenge)


def test_small_bodies_go_through_the_usual_checks(challenged):
    served, _, job_id, challenge, _ = challenged
    got, detail, read = drive(served, Account.create(), f"/v1/challenges/{challenge}/answer",
                              b"small", drop_announcement=True)
    assert got == 403 and read == 5, detail  # read (at most max_body_bytes), then refused
    assert unanswered(served, job_id, challenge)
