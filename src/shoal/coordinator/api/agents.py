"""A provider's routes: its agents register and beat, its devices are offered and
withdrawn, a lease is accepted; anyone reads agents, offers and providers (a page at a time). (A
well-formed beat takes the lean path in fast_heartbeat.py before this route.)"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute

from shoal.coordinator.api.deps import (
    AfterAddress, AfterLabel, Co, LabelPath, NumberPath, PageLimit, ProviderSigner,
)
from shoal.coordinator.api.errors import PROBLEMS
from shoal.spec.coordinator import (
    DEFAULT_PAGE, AgentRegistration, AgentView, Heartbeat, HeartbeatReply, OfferTerms, OfferView,
    ProviderView,
)
from shoal.spec.ledger import LeaseAcceptance

router = APIRouter(tags=["providers"], responses=PROBLEMS)


@router.post("/v1/agents", status_code=201)
def register_agent(body: AgentRegistration, co: Co, signer: ProviderSigner) -> AgentView:
    return co.agents.register(signer.address, body)


@router.get("/v1/agents")
def agents(co: Co, after: AfterLabel = None, limit: PageLimit = DEFAULT_PAGE) -> list[AgentView]:
    """Agents by id, a page at a time (`after`: the page before's last agent_id)."""
    return co.reads.agents(after, limit)


@router.post("/v1/agents/{agent_id}/heartbeat")
def heartbeat(agent_id: LabelPath, body: Heartbeat, co: Co, signer: ProviderSigner,
              request: Request) -> HeartbeatReply:
    reply = co.agents.heartbeat(signer.address, agent_id, body)
    request.app.state.metrics.heartbeats.inc()
    return reply


@router.post("/v1/offers", status_code=201)
def post_offer(body: OfferTerms, co: Co, signer: ProviderSigner) -> OfferView:
    return co.offers.post(signer.address, body)


@router.delete("/v1/offers/{offer_id}")
def withdraw_offer(offer_id: LabelPath, co: Co, signer: ProviderSigner) -> OfferView:
    return co.offers.withdraw(signer.address, offer_id)


@router.post("/v1/leases/{lease}/acceptance", status_code=204)
def accept_lease(lease: NumberPath, body: LeaseAcceptance, co: Co,
                 signer: ProviderSigner) -> Response:
    co.chain.accept_lease(signer.address, lease, body)
    return Response(status_code=204)


@router.get("/v1/offers")
def offers(co: Co, after: AfterLabel = None, limit: PageLimit = DEFAULT_PAGE) -> list[OfferView]:
    """Offers by id, a page at a time (`after`: the page before's last offer_id)."""
    return co.reads.offers(after, limit)


@router.get("/v1/providers")
def providers(co: Co, after: AfterAddress = None,
              limit: PageLimit = DEFAULT_PAGE) -> list[ProviderView]:
    """Providers by address with their agents and offers, a page at a time (`after`: the
    page before's last address; a page shorter than `limit` is the last)."""
    return co.reads.providers(after, limit)


# The declared beat, which the lean path hands anything it does not take as it is.
HEARTBEAT = next(route for route in router.routes
                 if isinstance(route, APIRoute) and route.endpoint is heartbeat)
