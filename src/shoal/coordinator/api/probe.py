"""The API's route to the network probe: a registered provider asks for one
for its agent, and is answered where and how to join it (probe.py)."""

from __future__ import annotations

from fastapi import APIRouter, Request

from shoal.coordinator.api.deps import Co, LabelPath, ProviderSigner
from shoal.coordinator.api.errors import PROBLEMS
from shoal.spec.coordinator import ProbeRendezvous

router = APIRouter(tags=["providers"], responses=PROBLEMS)


@router.post("/v1/agents/{agent_id}/probe", status_code=201)
def open_probe(agent_id: LabelPath, co: Co, signer: ProviderSigner,
               request: Request) -> ProbeRendezvous:
    """Open a network probe for this agent: join it (a two-rank gloo group) on the
    coordinator's host at the port named, then register the agent."""
    client = request.client.host if request.client else None
    return co.probing.open_probe(signer.address, agent_id, client)
