"""A provider's routes: its agents register and beat, its devices are offered and
withdrawn, a lease is accepted; anyone reads agents, offers and providers. (A
well-formed beat takes the lean path in fast_heartbeat.py before this route.)"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.routing import APIRoute

from shoal.coordinator.api.deps import Co, LabelPath, NumberPath, ProviderSigner
from shoal.coordinator.api.errors import PROBLEMS
from shoal.spec.coordinator import (
    AgentRegistration, AgentView, Heartbeat, HeartbeatReply, OfferTerms, OfferView, ProviderView,
    Role,
)
from shoal.spec.ledger import LeaseAcceptance

router = APIRouter(tags=["providers"], responses=PROBLEMS)


@router.post("/v1/agents", status_code=201)
def register_agent(body: AgentRegistration, co: Co, signer: ProviderSigner) -> AgentView:
    return co.agents.register(signer.address, body)


@router.get("/v1/agents")
def agents(co: Co) -> list[AgentView]:
    return co.reads.agents()


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
def offers(co: Co) -> list[OfferView]:
    return co.reads.offers()


@router.get("/v1/providers")
def providers(co: Co) -> list[ProviderView]:
    agents, offers = co.reads.agents(), co.reads.offers()
    return [ProviderView(address=p.address, name=p.name,
                         agents=tuple(a for a in agents if a.provider == p.address),
                         offers=tuple(o for o in offers if o.provider == p.address))
            for p in co.participants.registered() if p.role is Role.provider]


# The declared beat, which the lean path hands anything it does not take as it is.
HEARTBEAT = next(route for route in router.routes
                 if isinstance(route, APIRoute) and route.endpoint is heartbeat)
