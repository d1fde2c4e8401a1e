"""The API's route to the network probe: a registered provider asks for one
for its agent, and is answered where and how to join it (probe.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, FastAPI, Path

from shoal.coordinator.api.auth import coordinator_of, signed
from shoal.coordinator.service import Coordinator
from shoal.client.identity import Signer
from shoal.spec.coordinator import ProbeRendezvous, Role

AgentPath = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
Co = Annotated[Coordinator, Depends(coordinator_of)]
ProviderSigner = Annotated[Signer, Depends(signed(Role.provider))]


def probe_routes(app: FastAPI) -> None:
    @app.post("/v1/agents/{agent_id}/probe", tags=["providers"], status_code=201)
    def open_probe(agent_id: AgentPath, co: Co, signer: ProviderSigner) -> ProbeRendezvous:
        """Open a network probe for this agent: join it (a two-rank gloo group) on the
        coordinator's host at the port named, then register the agent."""
        return co.probing.open_probe(signer.address, agent_id)
