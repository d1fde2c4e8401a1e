"""Issue 40, point 9, the agent's side: lease terms reach an agent in its coordinator's
heartbeat replies, and whoever rewrites them (a coordinator gone bad, anyone on the path
of plain HTTP) could have the agent sign a lease on a contract of their choosing,
locking its provider's free stake there. The agent signs only terms naming the chain and
contract its own configuration pins, at its lease's own price."""

from __future__ import annotations

import pytest
from eth_account import Account

from shoal.agent import Agent, AgentConfig, ChainPin
from shoal.client.http import CoordinatorClient
from shoal.spec.coordinator import AcceptanceTerms, Assignment
from shoal.spec.market import DeviceLease

CONTRACT = "0x" + "c" * 40
PIN = ChainPin(chain_id=1337, contract=CONTRACT)


def assignment(number: int, **changes: object) -> Assignment:
    terms = {"chain_id": 1337, "contract": CONTRACT, "chain_job": 4, "price_wei_per_s": 10,
             "term_s": 600, "deadline": 10**9, **changes}
    lease = DeviceLease(lease=number, job="j", offer_id="o", provider="0x" + "1" * 40,
                        device_kind="cpu", region="eu", speed_samples_per_s=1.0, memory_gb=1.0,
                        tenancy="spot", priority=0, price_wei_per_s=10, start_s=0.0)
    return Assignment(lease=lease, job_file="", rendezvous="127.0.0.1:1", ends_at_s=None,
                      acceptance=AcceptanceTerms(**terms))


@pytest.fixture
def signed(tmp_path, monkeypatch):
    """An agent whose acceptances are caught where they would be sent."""
    sent: list[int] = []
    client = CoordinatorClient("http://127.0.0.1:9", Account.create())
    monkeypatch.setattr(client, "accept_lease", lambda number, signed: sent.append(number))

    def agent(pin: ChainPin | None) -> Agent:
        return Agent(client, AgentConfig(agent_id="a", work_dir=tmp_path / "a", chain=pin))

    return agent, sent


@pytest.mark.parametrize("rewritten", [{"contract": "0x" + "e" * 40}, {"chain_id": 1},
                                       {"price_wei_per_s": 11}])
def test_terms_rewritten_on_the_way_are_not_signed(signed, rewritten):
    agent, sent = signed
    pinned = agent(PIN)
    pinned._accept((assignment(7, **rewritten),))
    pinned._accept((assignment(7, **rewritten),))  # offered again at the next beat
    assert sent == [] and pinned.unsigned == {7}
    pinned._accept((assignment(8),))  # the terms it was pinned to: signed
    assert sent == [8]


def test_an_agent_with_no_pin_signs_no_chain_lease(signed):
    agent, sent = signed
    agent(None)._accept((assignment(7),))
    assert sent == []
    # The contract address is compared as an address, not as a string's case.
    agent(ChainPin(1337, CONTRACT.upper().replace("0X", "0x")))._accept((assignment(9),))
    assert sent == [9]
