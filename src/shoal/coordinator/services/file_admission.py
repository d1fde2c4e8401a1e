"""Who may send a file before it is read, a service the coordinator holds.

A challenge's answer and a carried checkpoint are files of up to
`max_file_bytes` (256 MiB by default), where every other body is at most
`max_body_bytes`. Their signature covers the body's hash, so checking it
needs the body; read first, a stranger could make the coordinator buffer a
quarter of a gigabyte per request before being told no. So a body over the
small limit to those paths is admitted unread only when its signed headers
(the body's hash announced beside them, `identity.BODY_SHA256`) verify, the
nonce is fresh, and the signer is the one party that may send that file: the
provider answerable for the challenge, or one holding a lease of the job the
checkpoint is for, or a submitter for a job bundle. The body, once read, is
checked against the announced hash by the usual signature check, and the call
itself checks the rest again (nothing here changes the store).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from urllib.parse import parse_qs

from sqlalchemy.orm import Session

from shoal.coordinator.services.checkpoints import UPLOAD_GRACE_S
from shoal.coordinator.errors import Forbidden, NotFound
from shoal.coordinator.services.numbering import FETCH_BASE
from shoal.client.identity import Signer, Unauthenticated, verify_signed_headers
from shoal.coordinator.db import beats
from shoal.coordinator.db.store import Store
from shoal.coordinator.services.market_desk import MarketDesk
from shoal.coordinator.services.participants import REPLAYED, Participants
from shoal.coordinator.settings import CoordinatorSettings
from shoal.spec.coordinator import Role

_ANSWER = re.compile(r"/v1/challenges/([0-9]{1,20})/answer")
_CHECKPOINT = re.compile(r"/v1/jobs/([^/]+)/checkpoints/[0-9]+")
_BUNDLE = re.compile(r"/v1/bundles/[0-9a-f]{64}")
# The paths whose bodies are files, not JSON: the body limit lets these through up to
# max_file_bytes, past max_body_bytes only once `admit_file` has said who may send them.
FILE_UPLOADS = re.compile(f"{_ANSWER.pattern}|{_CHECKPOINT.pattern}|{_BUNDLE.pattern}")


# Each checks, in the caller's session, that `provider` may send the file; raises if not.
ChallengeCheck = Callable[[Session, str, int], object]  # (session, provider, challenge)


class FileAdmission:
    """Who may send a file before its body is read: the signed headers, the nonce, the
    role, then the one party answerable for the challenge or holding the job's lease."""

    def __init__(self, store: Store, desk: MarketDesk, settings: CoordinatorSettings,
                 participants: Participants, active_lease: Callable[..., object],
                 answerable: ChallengeCheck, plant_fetch: ChallengeCheck) -> None:
        """`active_lease(session, provider, job, number, grace_s)` (the checkpoint carry's),
        `answerable` and `plant_fetch` (the proof services'): each raises when `provider`
        may not send that file."""
        self.store, self.desk, self.settings, self.participants = store, desk, settings, \
            participants
        self.active_lease, self.answerable, self.plant_fetch = active_lease, answerable, \
            plant_fetch

    def admit_file(self, headers: dict[str, str], method: str, path: str, target: str,
                   query: str) -> Signer:
        """The signer of a file upload to `path` not read yet, if it may send it; else
        `Unauthenticated`, `Forbidden` or `NotFound` saying why (nothing is changed)."""
        settings = self.settings
        signer = verify_signed_headers(headers, settings.audience, method, target,
                                       self.desk.now_s(), settings.max_skew_s)
        with self.store.engine.connect() as connection:
            if beats.nonce_seen(connection, signer.address, signer.nonce):
                raise Unauthenticated(REPLAYED)
        role = self.participants.role_of(signer.address)
        if _BUNDLE.fullmatch(path) is not None:
            if role is not Role.submitter:  # a bundle is a job's code: its submitter's
                raise Forbidden(f"{signer.address} is not a submitter: only submitters "
                                "send bundles")
            return signer
        if role is not Role.provider:
            raise Forbidden(f"{signer.address} is not a provider: only the provider "
                            "whose worker wrote a file may send it")
        with self.store.read() as session:
            if (answer := _ANSWER.fullmatch(path)) is not None:
                self._may_answer(session, signer.address, int(answer[1]))
            elif (checkpoint := _CHECKPOINT.fullmatch(path)) is not None:
                leases = parse_qs(query).get("lease", [])
                number = int(leases[0]) if len(leases) == 1 and leases[0].isdigit() else None
                if number is None:
                    raise Forbidden("a checkpoint is sent with its lease (?lease=N)")
                self.active_lease(session, signer.address, checkpoint[1], number,
                                   UPLOAD_GRACE_S)
            else:
                raise NotFound(f"{path} takes no file")
        return signer

    def _may_answer(self, session: Session, provider: str, challenge: int) -> None:
        if not 1 <= challenge <= 2**62:  # the route's own bounds
            raise NotFound(f"no challenge {challenge}")
        if challenge >= FETCH_BASE:  # a forced error's fetch: the agent it was asked of
            self.plant_fetch(session, provider, challenge)
        else:
            self.answerable(session, provider, challenge)
