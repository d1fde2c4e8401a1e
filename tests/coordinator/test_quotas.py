"""Attacks on the coordinator's capacity (issue 40, point 10): one key, or one client
address, flooding it with requests, and listings asked to return everything. Each
is bounded: the flood is refused with 429 and `Retry-After` once past its quota,
with nothing done, while honest keys and addresses are served as before; an honest
client rides through a refusal by waiting as told. The quotas' windows run on a
clock the test moves (the limiter's own, patched), never on the wall clock."""

from __future__ import annotations

import types

import httpx
import limits.storage.memory
import limits.strategies
import pytest
from eth_account import Account

from shoal.client import http as client_http
from shoal.client.http import CoordinatorClient, CoordinatorRefused
from shoal.coordinator import Coordinator
from shoal.coordinator.services import quotas as quotas_module
from shoal.spec.coordinator import DEFAULT_PAGE, MAX_PAGE, Registration
from tests.coordinator.conftest import Served, make_settings


class QuotaClock:
    """The limiter's clock, moved by the test: its windows slide only when told."""

    def __init__(self) -> None:
        self.now_s = 1_000_000.0

    def time(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


@pytest.fixture
def quota_clock(monkeypatch) -> QuotaClock:
    clock = QuotaClock()
    fake = types.SimpleNamespace(time=clock.time)
    for module in (limits.storage.memory, limits.strategies, quotas_module):
        monkeypatch.setattr(module, "time", fake)
    return clock


@pytest.fixture
def serving(tmp_path, operator, request, quota_clock):
    overrides = {"key_quota": "", "address_quota": "", **getattr(request, "param", {})}
    coordinator = Coordinator(make_settings(f"sqlite:///{tmp_path}/store.db", operator,
                                            **overrides))
    served = Served(coordinator)
    yield served
    served.stop()
    coordinator.engine.dispose()


def from_address(served: Served, host: str, account=None, **kw) -> CoordinatorClient:
    """A client whose requests come from loopback address `host` (127.0.0.0/8)."""
    return CoordinatorClient(served.url, account,
                             transport=httpx.HTTPTransport(local_address=host), **kw)


def registrations(served: Served) -> int:
    return sum(e.kind == "registered" for e in served.client().events(limit=1000))


@pytest.mark.parametrize("serving", [{"key_quota": "5/hour"}], indirect=True)
def test_a_key_flooding_signed_requests_is_refused_past_its_quota(serving, quota_clock):
    mallory = serving.client(Account.create())
    mallory.rate_limit_wait_s = 0  # the attacker does not wait: every refusal comes back
    for _ in range(5):
        mallory.register(Registration(role="submitter", name="mallory"))
    done = registrations(serving)

    with pytest.raises(CoordinatorRefused) as refused:
        mallory.register(Registration(role="submitter", name="mallory"))
    assert refused.value.status == 429
    assert "quota of 5 per 1 hour" in refused.value.detail \
        and "SHOAL_COORDINATOR_KEY_QUOTA" in refused.value.detail
    assert registrations(serving) == done  # refused: nothing was done
    raw = httpx.get(f"{serving.url}/v1/info")  # unsigned reads are not the key's to spend
    assert raw.status_code == 200

    # An honest key beside it is served; nobody can spend its quota by naming it
    # in requests it did not sign (a forged signature is refused before the charge).
    alice = serving.client(Account.create())
    forged = {"x-shoal-address": alice.account.address, "x-shoal-signature": "0x" + "00" * 65}
    for _ in range(10):
        assert httpx.post(f"{serving.url}/v1/participants", json={"role": "submitter",
                          "name": "x"}, headers=forged).status_code == 401
    for _ in range(5):
        alice.register(Registration(role="submitter", name="alice"))

    # The window passes: the attacker is served at its quota again, no more.
    quota_clock.advance(3600)
    mallory.register(Registration(role="submitter", name="mallory"))


@pytest.mark.parametrize("serving", [{"key_quota": "4/minute"}], indirect=True)
def test_the_429_says_when_and_an_honest_client_waits_that_long(serving, quota_clock):
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # the honest client's wait, on the quota's clock
        slept.append(seconds)
        quota_clock.advance(seconds)

    alice = serving.client(Account.create())
    alice.register(Registration(role="submitter", name="alice"))
    patient = CoordinatorClient(serving.url, alice.account, sleep=sleep)
    for _ in range(3):
        patient.register(Registration(role="submitter", name="alice"))
    raw = patient._send("POST", "/v1/participants", b'{"role":"submitter","name":"alice"}',
                        "application/json", None, sign=True)
    assert raw.status_code == 429 and 1 <= int(raw.headers["retry-after"]) <= 60
    # The same call through the client: refused once, waited out, then served.
    assert patient.register(Registration(role="submitter", name="alice")).name == "alice"
    assert slept and all(1 <= s <= 60 for s in slept) and sum(slept) <= 30


@pytest.mark.parametrize("serving", [{"key_quota": "1/hour"}], indirect=True)
def test_a_client_waits_a_bounded_time_then_reports_the_refusal(serving, quota_clock):
    slept: list[float] = []
    alice = CoordinatorClient(serving.url, Account.create(), sleep=slept.append)
    alice.register(Registration(role="submitter", name="alice"))
    with pytest.raises(CoordinatorRefused) as refused:  # an hour's wait is past 30 s: no wait
        alice.register(Registration(role="submitter", name="alice"))
    assert refused.value.status == 429 and slept == []


@pytest.mark.parametrize("serving", [{"address_quota": "20/hour"}], indirect=True)
def test_an_address_flooding_the_coordinator_is_refused_and_others_are_served(serving,
                                                                              quota_clock):
    flood = from_address(serving, "127.0.0.2")
    flood.rate_limit_wait_s = 0
    answers = [flood.request("GET", "/healthz", sign=False) for _ in range(20)]
    assert len(answers) == 20
    for path in ("/healthz", "/v1/participants"):  # any read
        with pytest.raises(CoordinatorRefused) as refused:
            flood.request("GET", path, sign=False)
        assert refused.value.status == 429 and "client address 127.0.0.2" in refused.value.detail
    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2")) as raw:
        unsigned = raw.post(f"{serving.url}/v1/participants", json={})
    assert unsigned.status_code == 429 and int(unsigned.headers["retry-after"]) >= 1

    honest = from_address(serving, "127.0.0.3", Account.create())
    assert honest.register(Registration(role="provider", name="bob")).name == "bob"
    coordinator = serving.app.state.coordinator
    assert coordinator.participants.role_of(honest.account.address) is not None


def test_the_default_quotas_let_an_honest_fleet_beat_every_half_second(tmp_path, operator):
    """Twenty agents under one provider key, each beating twice a second (as the e2e
    stack's do): under the default key quota, with room for their records and progress."""
    settings = make_settings(f"sqlite:///{tmp_path}/store.db", operator)
    limits_per_key = limits.parse_many(settings.key_quota)
    per_second = min(i.amount / i.get_expiry() for i in limits_per_key)
    assert per_second >= 20 * 2 * 1.25
    per_address = min(i.amount / i.get_expiry() for i in limits.parse_many(settings.address_quota))
    assert per_address >= 3 * per_second  # a few honest keys behind one address


# ------------------------------------------------------------ listings


def test_listings_come_a_page_at_a_time_and_the_client_reads_them_all(serving, monkeypatch):
    """The attack: register many providers (each with an agent) and ask for the list: a
    page is bounded, whatever the market's size; the client follows pages."""
    coordinator = serving.app.state.coordinator
    count = DEFAULT_PAGE + 30
    addresses = [Account.create().address for _ in range(count)]
    for i, address in enumerate(addresses):
        coordinator.participants.register(address, Registration(role="provider", name=f"p{i}"))

    first = httpx.get(f"{serving.url}/v1/providers").json()
    assert len(first) == DEFAULT_PAGE
    for path in ("/v1/providers", "/v1/participants", "/v1/jobs", "/v1/agents", "/v1/offers"):
        too_many = httpx.get(f"{serving.url}{path}", params={"limit": MAX_PAGE + 1})
        assert too_many.status_code == 422, path
    rest = httpx.get(f"{serving.url}/v1/providers",
                     params={"after": first[-1]["address"], "limit": MAX_PAGE}).json()
    assert [p["address"] for p in first + rest] == sorted(addresses)

    monkeypatch.setattr(client_http, "MAX_PAGE", 7)  # pages of 7: the client reads 19 of them
    client = serving.client()
    assert sorted(p.address for p in client.providers()) == sorted(addresses)
    assert len(client.participants()) == count


def test_each_provider_is_listed_with_its_own_agents_and_offers(serving):
    from tests.coordinator.conftest import provider_with_agent
    from shoal.spec.coordinator import OfferTerms

    owners = {}
    for name in ("a", "b", "c"):
        client = serving.client(Account.create())
        provider_with_agent(client, agent_id=f"agent-{name}")
        client.post_offer(OfferTerms(offer_id=f"offer-{name}", agent_id=f"agent-{name}",
                                     device=0, price_wei_per_s=10))
        owners[client.account.address] = name
    listed = serving.client().providers()
    assert {p.address: ([a.agent_id for a in p.agents], [o.offer_id for o in p.offers])
            for p in listed} == {a: ([f"agent-{n}"], [f"offer-{n}"]) for a, n in owners.items()}


def test_jobs_page_in_submission_order(serving, operator):
    from shoal.spec.coordinator import JobSubmission
    from tests.coordinator.conftest import TINY_JOB

    alice = serving.client(Account.create())
    alice.register(Registration(role="submitter", name="alice"))
    submitted = [alice.submit(JobSubmission(name=f"j{i}", job_file=TINY_JOB, workers=1,
                                            max_price_wei_per_s=10**6, budget_wei=10**12)).job_id
                 for i in range(5)]
    page = httpx.get(f"{serving.url}/v1/jobs", params={"limit": 2}).json()
    after = httpx.get(f"{serving.url}/v1/jobs",
                      params={"limit": 10, "after": page[-1]["job_id"]}).json()
    assert [j["job_id"] for j in page + after] == submitted
    missing = httpx.get(f"{serving.url}/v1/jobs", params={"after": "no-such-job"})
    assert missing.status_code == 404 and "after" in missing.json()["detail"]
