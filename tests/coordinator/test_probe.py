"""The coordinator's network probe against a real agent pre-flight: the link
figures on record are the coordinator's own measurement, whatever a provider
states; the door is signed and bounded; a probe nobody joins leaves nothing
behind; and an agent takes no more from a coordinator's reply than it must."""

from __future__ import annotations

import datetime
import socket
import threading

import httpx
import pytest
from eth_account import Account

from shoal.agent.preflight import preflight, probe_link
from shoal.client.http import CoordinatorClient, CoordinatorRefused
from shoal.coordinator import Coordinator
from shoal.elastic.link_probe import AGENT_RANK, probe_group
from shoal.spec.coordinator import AgentRegistration, Preflight, ProbeRendezvous, Registration
from tests.coordinator.conftest import Served, make_settings


@pytest.fixture
def probing(tmp_path, operator, request):
    """A served coordinator (SQLite: the probe keeps nothing in the store of its
    own); `request.param` overrides its settings."""
    overrides = getattr(request, "param", {})
    coordinator = Coordinator(make_settings(f"sqlite:///{tmp_path}/store.db", operator,
                                            **overrides))
    serving = Served(coordinator)
    yield serving
    serving.stop()
    for thread in coordinator.probes.running():
        thread.join(timeout=4 * coordinator.settings.probe_deadline_s)
    coordinator.engine.dispose()


def provider(served: Served, name: str = "p", host: str | None = None) -> CoordinatorClient:
    """A registered provider; with `host`, its requests come from that loopback address."""
    client = served.client(Account.create()) if host is None else CoordinatorClient(
        served.url, Account.create(), transport=httpx.HTTPTransport(local_address=host))
    client.register(Registration(role="provider", name=name))
    return client


def port_open(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def claiming(devices: tuple[Preflight, ...], **claim) -> tuple[Preflight, ...]:
    return tuple(Preflight.model_validate({**d.model_dump(), **claim}) for d in devices)


def test_the_coordinator_records_what_its_probe_saw_not_what_the_agent_claims(probing):
    mallory = provider(probing)
    measured = preflight(mallory, "agent-m", 2, "cpu")
    assert all(d.collective_ok and d.rtt_ms > 0 and d.bandwidth_gbps > 0 for d in measured)
    seen = probing.app.state.coordinator.probes.outcome(mallory.account.address, "agent-m", 5.0)
    # The agent publishes what the coordinator's side measured, told back in the probe.
    assert (measured[0].rtt_ms, measured[0].bandwidth_gbps) == (
        seen.figures.rtt_ms, seen.figures.bandwidth_gbps)

    # The attack: a link a thousand times better than the probe saw.
    boasted = claiming(measured, rtt_ms=seen.figures.rtt_ms / 1000,
                       bandwidth_gbps=min(10_000.0, seen.figures.bandwidth_gbps * 1000))
    agent = mallory.register_agent(AgentRegistration(agent_id="agent-m", region="eu",
                                                     devices=boasted))
    on_record = {(d.rtt_ms, d.bandwidth_gbps) for d in agent.devices}
    assert on_record == {(seen.figures.rtt_ms, seen.figures.bandwidth_gbps)}
    listed = next(a for a in mallory.providers()[0].agents if a.agent_id == "agent-m")
    assert {d.bandwidth_gbps for d in listed.devices} == {seen.figures.bandwidth_gbps}
    event = next(e for e in mallory.events() if e.kind == "agent_registered")
    assert {d["rtt_ms"] for d in event.detail["devices"]} == {seen.figures.rtt_ms}


def test_figures_claimed_without_a_probe_are_not_taken(probing):
    mallory = provider(probing)
    unprobed = (Preflight(device_kind="cpu", speed_samples_per_s=10.0, memory_gb=1.0,
                          collective_ok=True, rtt_ms=0.001, bandwidth_gbps=9_999.0),)
    agent = mallory.register_agent(AgentRegistration(agent_id="agent-m", region="eu",
                                                     devices=unprobed))
    assert (agent.devices[0].rtt_ms, agent.devices[0].bandwidth_gbps) == (None, None)


@pytest.mark.parametrize("probing", [{"probe_required": True}], indirect=True)
def test_where_a_probe_is_required_an_agent_without_one_is_refused(probing):
    mallory = provider(probing)
    unprobed = (Preflight(device_kind="cpu", speed_samples_per_s=10.0, memory_gb=1.0,
                          collective_ok=True),)
    with pytest.raises(CoordinatorRefused) as refused:
        mallory.register_agent(AgentRegistration(agent_id="agent-m", region="eu", devices=unprobed))
    assert refused.value.status == 409 and "/probe" in refused.value.detail
    assert mallory.providers()[0].agents == ()
    # The honest path: the agent's own pre-flight probes, and it registers.
    measured = preflight(mallory, "agent-m", 1, "cpu")
    assert mallory.register_agent(AgentRegistration(agent_id="agent-m", region="eu",
                                                    devices=measured)).devices[0].rtt_ms > 0


def test_unsigned_and_wrong_role_probe_requests_open_nothing(probing):
    coordinator = probing.app.state.coordinator
    unsigned = httpx.post(f"{probing.url}/v1/agents/agent-a/probe")
    submitter = probing.client(Account.create())
    submitter.register(Registration(role="submitter", name="sue"))
    with pytest.raises(CoordinatorRefused) as refused:
        submitter.request("POST", "/v1/agents/agent-a/probe")
    stranger = probing.client(Account.create())  # signed, but registered as nothing
    with pytest.raises(CoordinatorRefused) as unknown:
        stranger.request("POST", "/v1/agents/agent-a/probe")
    assert (unsigned.status_code, refused.value.status, unknown.value.status) == (401, 403, 403)
    assert coordinator.probes.open_count() == 0 and coordinator.probes.running() == []
    assert not any(t.name.startswith("probe-") for t in threading.enumerate())


def test_a_provider_cannot_probe_under_another_providers_agent(probing):
    alice = provider(probing, "alice")
    alice.register_agent(AgentRegistration(agent_id="agent-a", region="eu", devices=(
        Preflight(device_kind="cpu", speed_samples_per_s=1.0, memory_gb=1.0, collective_ok=True),)))
    mallory = provider(probing, "mallory")
    with pytest.raises(CoordinatorRefused) as refused:
        mallory.request("POST", "/v1/agents/agent-a/probe")
    assert refused.value.status == 403
    assert probing.app.state.coordinator.probes.open_count() == 0


@pytest.mark.parametrize("probing", [{"probe_deadline_s": 1.0}], indirect=True)
def test_probes_are_bounded_and_one_nobody_joins_is_gone_after_its_deadline(probing):
    coordinator = probing.app.state.coordinator
    # Each from a host of its own: probes asked from one host lately share fewer slots.
    providers = [provider(probing, f"p{i}", host=f"127.0.0.{i + 2}")
                 for i in range(coordinator.probes.max_open + 1)]
    plans = [ProbeRendezvous.model_validate(p.request("POST", f"/v1/agents/a{i}/probe"))
             for i, p in enumerate(providers[:-1])]
    with pytest.raises(CoordinatorRefused) as again:  # one at a time per provider
        providers[0].request("POST", "/v1/agents/a0/probe")
    with pytest.raises(CoordinatorRefused) as full:  # a few at a time in all
        providers[-1].request("POST", "/v1/agents/late/probe")
    assert (again.value.status, full.value.status) == (409, 409)
    threads = coordinator.probes.running()
    assert len(threads) == coordinator.probes.max_open
    assert all(port_open(plan.port) for plan in plans)

    # Nobody joins: each thread ends by its deadline, its port closed, its slot free.
    for thread in threads:
        thread.join(timeout=30)
    assert not any(t.is_alive() for t in threads)
    assert not any(port_open(plan.port) for plan in plans)
    assert coordinator.probes.open_count() == 0
    outcome = coordinator.probes.outcome(providers[0].account.address, "a0")
    assert not outcome.figures.collective_ok and outcome.figures.reason
    with pytest.raises(CoordinatorRefused) as refused:  # and the agent cannot register on it
        providers[0].register_agent(AgentRegistration(agent_id="a0", region="eu", devices=(
            Preflight(device_kind="cpu", speed_samples_per_s=1.0, memory_gb=1.0,
                      collective_ok=True),)))
    assert refused.value.status == 409 and "probe" in refused.value.detail


def test_a_peer_that_does_not_send_its_share_fails_the_probe(probing):
    """The attack: join the group but contribute zeros, hoping to be timed anyway."""
    import torch
    import torch.distributed as dist

    mallory = provider(probing)
    plan = ProbeRendezvous.model_validate(mallory.request("POST", "/v1/agents/agent-m/probe"))
    store = dist.TCPStore("127.0.0.1", plan.port, is_master=False,
                          timeout=datetime.timedelta(seconds=plan.deadline_s))
    group = probe_group(dist.PrefixStore(plan.key, store), AGENT_RANK, "127.0.0.1", plan.deadline_s)
    for _ in range(1 + plan.rtt_rounds):
        group.allreduce([torch.zeros(1)]).wait()
    group.allreduce([torch.zeros(plan.payload_bytes // 4)]).wait()  # not its share of twos
    del group, store
    outcome = probing.app.state.coordinator.probes.outcome(mallory.account.address, "agent-m",
                                                           wait_s=30.0)
    assert not outcome.figures.collective_ok and "wrong sum" in outcome.figures.reason
    with pytest.raises(CoordinatorRefused) as refused:
        mallory.register_agent(AgentRegistration(agent_id="agent-m", region="eu", devices=(
            Preflight(device_kind="cpu", speed_samples_per_s=1.0, memory_gb=1.0,
                      collective_ok=True, rtt_ms=0.01, bandwidth_gbps=100.0),)))
    assert refused.value.status == 409


def _coordinator_answering(reply: dict) -> CoordinatorClient:
    """A client of a coordinator that answers every call with `reply`."""
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/info":
            return httpx.Response(200, json={"audience": "x", "version": "0", "heartbeat_s": 1.0,
                                             "max_skew_s": 30.0})
        return httpx.Response(201, json=reply)

    return CoordinatorClient("http://127.0.0.1:1", Account.create(),
                             transport=httpx.MockTransport(answer))


@pytest.mark.parametrize("forged, why", [
    ({"host": "10.9.9.9"}, "host"),  # steer the agent to another host
    ({"payload_bytes": 2**30}, "payload_bytes"),  # make it send a GiB
    ({"rtt_rounds": 10_000}, "rtt_rounds"),
])
def test_an_agent_takes_no_host_and_no_unbounded_plan_from_a_reply(forged, why):
    plan = {"port": 1, "key": "0" * 32, "deadline_s": 1.0, "rtt_rounds": 1,
            "bandwidth_rounds": 1, "payload_bytes": 4}
    link = probe_link(_coordinator_answering({**plan, **forged}), "agent-a")
    assert not link.collective_ok and why in link.reason and "opened no probe" in link.reason


def test_more_agents_than_probes_at_once_all_get_probed(probing):
    """A crowd starting together (a demo's agents, a fleet after an outage) waits its turn."""
    coordinator = probing.app.state.coordinator
    clients = [provider(probing, f"p{i}") for i in range(coordinator.probes.max_open + 2)]
    links: dict[int, object] = {}

    def probe(i: int) -> None:
        links[i] = probe_link(clients[i], f"agent-{i}")

    threads = [threading.Thread(target=probe, args=(i,)) for i in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(links) == list(range(len(clients)))
    assert all(link.collective_ok for link in links.values()), links
