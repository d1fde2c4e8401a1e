"""The heartbeat's lean path: a thousand agents beat every second, so a well-formed
beat skips FastAPI's per-request machinery, through the same checks and the same
`Coordinator.heartbeat`; anything else goes to the declared route (agents.py)."""

from __future__ import annotations

import asyncio
import re

from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.routing import Match, Route
from starlette.types import Message, Receive, Scope, Send

from shoal.coordinator.api.auth import beat_signer
from shoal.coordinator.api.metrics import CoordinatorMetrics
from shoal.coordinator.service import Coordinator
from shoal.spec.coordinator import Heartbeat

LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # deps.LabelPath, matched whole


class FastHeartbeat(Route):
    """POST /v1/agents/{agent_id}/heartbeat without FastAPI's per-request machinery.

    A thousand agents beat every second, and FastAPI's dependency solving and
    its validation of the reply cost several times the beat itself. Matched
    before the declared route, this takes a well-formed beat (a JSON
    `Heartbeat` for a valid agent label) straight through the same checks
    (signature, nonce, provider role: `beat_signer`, `take_signed_beat`) and
    `Coordinator.heartbeat`.
    Anything else is handed to the declared route, which documents the call
    in /openapi.json and answers it exactly as before.
    """

    def __init__(self, declared: APIRoute, coordinator: Coordinator,
                 metrics: CoordinatorMetrics) -> None:
        super().__init__(declared.path, declared.endpoint, methods=["POST"],
                         include_in_schema=False)
        self.declared, self.coordinator, self.metrics = declared, coordinator, metrics

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match is not Match.NONE:
            child_scope["route"] = self.declared  # timed under the declared route's template
        return match, child_scope

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # nobody is left to answer
            body, more = body + message.get("body", b""), message.get("more_body", False)
        agent_id = scope["path_params"]["agent_id"]
        beat = _well_formed(scope, agent_id, body)
        if beat is None:
            await self.declared.handle(scope, _replayed(body), send)
            return
        now = self.coordinator.desk.now_s()
        signer = beat_signer(self.coordinator, scope, body, now)
        participants = self.coordinator.participants
        # The store work waits on the group commit without holding the event loop, and
        # the beat is answered only once the transaction holding its nonce has committed.
        taken = await asyncio.wrap_future(
            participants.take_signed_beat(signer, agent_id, beat.running, now))
        participants.refuse_signed_beat(signer.address, taken)
        reply = self.coordinator.agents.heartbeat(signer.address, agent_id, beat, taken)
        self.metrics.heartbeats.inc()
        payload = reply.model_dump_json().encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})


def _well_formed(scope: Scope, agent_id: str, body: bytes) -> Heartbeat | None:
    """The beat, when FastAPI would take this request's path and body as they are."""
    content_types = [value for name, value in scope["headers"] if name.lower() == b"content-type"]
    if content_types != [b"application/json"] or not LABEL.fullmatch(agent_id):
        return None
    try:
        return Heartbeat.model_validate_json(body)
    except ValidationError:
        return None


def _replayed(body: bytes) -> Receive:
    """A receive that hands the already-read `body` over again."""
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def serve_heartbeats_fast(app: FastAPI, declared: APIRoute, coordinator: Coordinator,
                          metrics: CoordinatorMetrics) -> None:
    """Put the lean path in front of every other route of `app`."""
    app.router.routes.insert(0, FastHeartbeat(declared, coordinator, metrics))
