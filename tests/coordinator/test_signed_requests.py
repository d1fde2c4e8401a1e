"""Attacks on the API's door: each forged, replayed, stale, misdirected or
wrongly-roled request is refused, and the state after it is what it was."""

from __future__ import annotations

import httpx
import pytest
from eth_account import Account

from shoal.client.identity import SIGNATURE, TIMESTAMP, sign_request
from shoal.spec.coordinator import JobSubmission, Registration, TopUp
from tests.coordinator.conftest import TINY_JOB, Served, provider_with_agent


def state(served: Served) -> tuple:
    """Everything an attacker might change: jobs, participants, offers, the audit log."""
    client = served.client()
    return (client.jobs(), client.request("GET", "/v1/participants", sign=False),
            client.request("GET", "/v1/offers", sign=False), client.events(limit=1000))


@pytest.fixture
def victim_job(served: Served):
    alice = served.client(Account.create())
    alice.register(Registration(role="submitter", name="alice"))
    job = alice.submit(JobSubmission(name="tiny", job_file=TINY_JOB, workers=1,
                                     max_price_wei_per_s=10**6, budget_wei=10**12))
    return alice, job


def send(served: Served, method: str, target: str, body: bytes, headers: dict[str, str]):
    return httpx.request(method, served.url + target, content=body,
                         headers={"content-type": "application/json", **headers})


def signed(account, target: str, body: bytes, audience="shoal-test", method="POST", **kw):
    return sign_request(account, audience, method, target, body, **kw)


def top_up_body(amount: int = 5) -> bytes:
    return TopUp(amount_wei=amount).model_dump_json().encode()


def test_unsigned_request_is_refused(served, victim_job):
    _, job = victim_job
    before = state(served)
    answer = send(served, "POST", f"/v1/jobs/{job.job_id}/cancel", b"", {})
    assert answer.status_code == 401 and "unsigned" in answer.json()["detail"]
    assert state(served) == before


def test_a_signature_by_another_key_is_refused(served, victim_job):
    alice, job = victim_job
    mallory = Account.create()
    target = f"/v1/jobs/{job.job_id}/cancel"
    headers = signed(mallory, target, b"")
    headers["x-shoal-address"] = alice.account.address  # claims to be alice
    before = state(served)
    assert send(served, "POST", target, b"", headers).status_code == 401
    assert state(served) == before


def test_a_tampered_body_is_refused(served, victim_job):
    alice, job = victim_job
    target = f"/v1/jobs/{job.job_id}/top-up"
    headers = signed(alice.account, target, top_up_body(5))
    before = state(served)
    assert send(served, "POST", target, top_up_body(10**18), headers).status_code == 401
    assert send(served, "POST", f"/v1/jobs/{job.job_id}/cancel", top_up_body(5),
                headers).status_code == 401  # the same signature on another target
    assert state(served) == before


def test_a_replayed_request_counts_once(served, victim_job):
    alice, job = victim_job
    target = f"/v1/jobs/{job.job_id}/top-up"
    body = top_up_body(7)
    headers = signed(alice.account, target, body)
    assert send(served, "POST", target, body, headers).status_code == 200
    after_once = state(served)
    replay = send(served, "POST", target, body, headers)
    assert replay.status_code == 401 and "nonce" in replay.json()["detail"]
    assert state(served) == after_once
    assert served.client().job(job.job_id).budget_wei == job.budget_wei + 7


@pytest.mark.parametrize("skew_s", [-120.0, 120.0])
def test_a_stale_or_future_request_is_refused(served, victim_job, skew_s):
    import time

    alice, job = victim_job
    target = f"/v1/jobs/{job.job_id}/cancel"
    headers = signed(alice.account, target, b"", now_s=time.time() + skew_s)
    before = state(served)
    answer = send(served, "POST", target, b"", headers)
    assert answer.status_code == 401 and "clock" in answer.json()["detail"]
    assert state(served) == before


def test_a_request_signed_for_another_coordinator_is_refused(served, victim_job):
    alice, job = victim_job
    target = f"/v1/jobs/{job.job_id}/cancel"
    before = state(served)
    answer = send(served, "POST", target, b"", signed(alice.account, target, b"", audience="other"))
    assert answer.status_code == 401
    assert state(served) == before


def test_malformed_signature_headers_are_refused(served, victim_job):
    alice, job = victim_job
    target = f"/v1/jobs/{job.job_id}/cancel"
    before = state(served)
    for name, value in ((SIGNATURE, "0x" + "00" * 65), (SIGNATURE, "zz"), (TIMESTAMP, "soon")):
        headers = {**signed(alice.account, target, b""), name: value}
        assert send(served, "POST", target, b"", headers).status_code == 401
    assert state(served) == before


def test_wrong_roles_are_refused(served, victim_job):
    alice, job = victim_job
    provider = served.client(Account.create())
    provider_with_agent(provider)
    mallory = served.client(Account.create())
    mallory.register(Registration(role="submitter", name="mallory"))
    before = state(served)
    submission = JobSubmission(name="x", job_file=TINY_JOB, workers=1,
                               max_price_wei_per_s=1, budget_wei=1)
    attempts = [
        lambda: provider.submit(submission),  # a provider is not a submitter
        lambda: mallory.job_action(job.job_id, "cancel"),  # not mallory's job
        lambda: mallory.top_up(job.job_id, 1),
        lambda: alice.register_agent(provider_agent()),  # a submitter has no agents
        lambda: mallory.register(Registration(role="verifier", name="m")),  # granted, not taken
        lambda: mallory.register(Registration(role="provider", name="m")),  # one role per key
        lambda: mallory.request("POST", "/v1/grants", _grant(mallory.account.address)),
    ]
    for attempt in attempts:
        with pytest.raises(Exception) as refused:
            attempt()
        assert getattr(refused.value, "status", None) in (403, 409), refused.value
    assert state(served) == before


def test_oversized_and_invalid_bodies_are_refused_with_the_field_named(served, victim_job):
    alice, _ = victim_job
    big = b"{" + b" " * (300 * 1024) + b"}"
    target = "/v1/jobs"
    before = state(served)
    assert send(served, "POST", target, big, signed(alice.account, target, big)).status_code == 413
    body = b'{"name": "x", "job_file": "steps = 1", "workers": 0, "max_price_wei_per_s": 1, "budget_wei": 1}'
    answer = send(served, "POST", target, body, signed(alice.account, target, body))
    assert answer.status_code == 422 and "workers" in str(answer.json()["detail"])
    assert state(served) == before


def provider_agent():
    from shoal.spec.coordinator import AgentRegistration, Preflight

    return AgentRegistration(agent_id="stolen", region="eu", devices=(Preflight(
        device_kind="cpu", speed_samples_per_s=1.0, memory_gb=1.0, collective_ok=True),))


def _grant(address):
    from shoal.spec.coordinator import Grant

    return Grant(address=address, role="operator", name="me")


def test_a_priority_above_zero_is_granted_not_taken(served, operator):
    """A job above priority 0 takes spot devices from others' jobs, with notice. Taken
    at will, a job of no budget at the top priority could preempt everyone again and
    again: mallory's is refused, and the store is as it was. An operator grants her a
    ceiling; up to it she may submit, past it not."""
    mallory = served.client(Account.create())
    mallory.register(Registration(role="submitter", name="mallory"))

    def submission(priority: int) -> JobSubmission:
        return JobSubmission(name="urgent", job_file=TINY_JOB, workers=1,
                             max_price_wei_per_s=10**6, budget_wei=1, priority=priority)

    before = state(served)
    with pytest.raises(Exception) as refused:
        mallory.submit(submission(1_000_000))
    assert refused.value.status == 403 and "ceiling of 0" in str(refused.value)
    assert state(served) == before
    assert mallory.submit(submission(0)) and mallory.submit(submission(-5))
    from shoal.spec.coordinator import Grant, Participant

    boss = served.client(operator)
    granted = boss.request("POST", "/v1/grants", Grant(
        address=mallory.account.address, role="submitter", name="mallory", max_priority=5))
    assert Participant.model_validate(granted).max_priority == 5
    assert mallory.submit(submission(5)).priority == 5
    with pytest.raises(Exception) as refused:
        mallory.submit(submission(6))
    assert refused.value.status == 403 and "ceiling of 5" in str(refused.value)
