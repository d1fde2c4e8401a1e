"""A provider's signed heartbeat taken with its nonce and role check in one
group-committed transaction (db/beats.py), and the refusal of a role a call does
not allow: the store side of the API's signed calls, so the HTTP edge never
reaches the store itself."""

from __future__ import annotations

import asyncio

from shoal.client.identity import Signer, Unauthenticated
from shoal.coordinator.db import beats
from shoal.coordinator.errors import Forbidden
from shoal.coordinator.services.coordinator import Coordinator
from shoal.spec.coordinator import Heartbeat, Role

REPLAYED = "this nonce was already used: a replayed request is refused; sign the request again"


def refuse_role(address: str, role: Role | None, roles: tuple[Role, ...]) -> None:
    """`Forbidden` unless `role`, the one `address` holds, is one of `roles`."""
    if role not in roles:
        held = f"a {role.value}" if role else "not registered"
        wanted = " or ".join(r.value for r in roles)
        raise Forbidden(f"{address} is {held}; this call needs the {wanted} role")


async def take_signed_beat(coordinator: Coordinator, signer: Signer, agent_id: str,
                           beat: Heartbeat, now: float) -> beats.BeatTaken:
    """The beat of `signer`, whose signature is already checked, taken at `now`.

    The store work waits on the group commit without holding the event loop,
    and this returns only after the transaction holding the nonce has committed.
    """
    operator = signer.address in coordinator.settings.operators
    note = beats.BeatNote(signer.address, agent_id, sorted(set(beat.running)), now,
                          nonce=signer.nonce, role_needed=Role.provider.value,
                          known_role=Role.operator.value if operator else None)
    taken = await asyncio.wrap_future(beats.beat_committer(coordinator.engine).submit(note))
    if taken.outcome is beats.BeatOutcome.replayed:
        raise Unauthenticated(REPLAYED)
    if taken.outcome is beats.BeatOutcome.wrong_role:
        refuse_role(signer.address, Role(taken.role) if taken.role else None, (Role.provider,))
    return taken
