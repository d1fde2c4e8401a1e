"""A cap on request bodies, enforced while they stream in: a client that
sends more than `max_bytes` gets 413 before the body is held in memory. A
file path takes up to `file_bytes`, but a body over `max_bytes` there is
read only once `admit` has said who may send it (file_admission.py).

Without it anyone could make the coordinator hold any amount of memory with
one request, before a signature is even looked at."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shoal.coordinator.api.auth import target_of
from shoal.coordinator.api.errors import refusal_of
from shoal.coordinator.api.metrics import CoordinatorMetrics
from shoal.coordinator.service import Coordinator
from shoal.coordinator.services.file_admission import FILE_UPLOADS

# Checks a large file's signed headers before its body is read: returns None to admit
# it, or (status, detail) to refuse it unread.
Admit = Callable[[Scope], Awaitable[tuple[int, str] | None]]


class BodyTooLarge(Exception):
    pass


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int, file_bytes: int | None = None,
                 file_paths: re.Pattern[str] | None = None, admit: Admit | None = None) -> None:
        """Bodies to paths matching `file_paths` (files a worker wrote, such as a revealed
        gradient) may be up to `file_bytes`, once `admit` lets one over `max_bytes` in;
        every other body up to `max_bytes`."""
        self.app, self.max_bytes = app, max_bytes
        self.file_bytes, self.file_paths = file_bytes or max_bytes, file_paths
        self.admit = admit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        # Files are PUT; a GET of the same path (a bundle's) carries no body to admit.
        if self.file_paths is not None and scope["method"] == "PUT" \
                and self.file_paths.fullmatch(scope["path"]):
            limit = self.file_bytes
        declared = dict(scope.get("headers", [])).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            await self._refuse(send, limit)
            return
        if limit > self.max_bytes and self.admit is not None:
            if declared is None or int(declared) > self.max_bytes:
                refused = await self.admit(scope)  # before a byte of the body is read
                if refused is not None:
                    await self._answer(send, *refused)
                    return
            else:  # declared small: held to that, whatever the server lets through
                limit = self.max_bytes
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge
            return message

        async def watched(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted, watched)
        except BodyTooLarge:
            if not started:
                await self._refuse(send, limit)

    async def _refuse(self, send: Send, limit: int) -> None:
        await self._answer(send, 413, f"request body over {limit} bytes")

    async def _answer(self, send: Send, status: int, detail: str) -> None:
        body = json.dumps({"detail": detail}).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def limit_bodies(app: FastAPI, coordinator: Coordinator, metrics: CoordinatorMetrics) -> None:
    """Bodies held to the coordinator's settings; a large file admitted by its signed
    headers, refused as the API refuses an error."""
    app.add_middleware(BodyLimit, max_bytes=coordinator.settings.max_body_bytes,
                       file_bytes=coordinator.settings.max_file_bytes,
                       file_paths=FILE_UPLOADS, admit=_file_admission(coordinator, metrics))


def _file_admission(coordinator: Coordinator, metrics: CoordinatorMetrics) -> Admit:
    def check(scope: Scope) -> tuple[int, str] | None:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        try:
            coordinator.files.admit_file(headers, scope["method"], scope["path"], target_of(scope),
                                         scope.get("query_string", b"").decode("latin-1"))
        except Exception as error:  # noqa: BLE001 - mapped as the API's handlers map it
            refusal = refusal_of(error)
            if refusal is None:
                raise
            status, reason = refusal
            metrics.refused.labels(reason).inc()
            return status, str(error)
        return None

    async def admit(scope: Scope) -> tuple[int, str] | None:
        if coordinator.engine.dialect.name == "sqlite":  # as deps.signed does, and why
            return check(scope)
        return await run_in_threadpool(check, scope)

    return admit
