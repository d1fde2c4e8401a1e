"""The market's command journal: every call that changed the market, in order,
as one typed union applied by one function, live and when the market is rebuilt.

The market is pure and deterministic, so replaying its commands with the
times they were made at rebuilds it exactly: that is how a coordinator that
was killed comes back with the same leases, escrows and paused jobs.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, TypeAdapter

from shoal.market import Clearing, Market
from shoal.spec.market import Bid, Offer

# Stored as a decimal string, as the journal always has: JSON numbers lose wei past 2**53.
WeiText = Annotated[int, Field(ge=0), PlainSerializer(str, return_type=str)]


class _Command(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PostOffer(_Command):
    kind: Literal["post_offer"] = "post_offer"
    offer: Offer


class WithdrawOffer(_Command):
    kind: Literal["withdraw_offer"] = "withdraw_offer"
    offer_id: str
    provider: str


class Submit(_Command):
    kind: Literal["submit"] = "submit"
    bid: Bid


class TopUp(_Command):
    kind: Literal["top_up"] = "top_up"
    job: str
    amount_wei: WeiText


class Pause(_Command):
    kind: Literal["pause"] = "pause"
    job: str


class Resume(_Command):
    kind: Literal["resume"] = "resume"
    job: str


class Finish(_Command):
    kind: Literal["finish"] = "finish"
    job: str


class BarProvider(_Command):
    """Lease none of `provider`'s devices to `job` again."""

    kind: Literal["bar_provider"] = "bar_provider"
    job: str
    provider: str


class AllowProvider(_Command):
    """What `provider`'s leases of `job` may bill in all (its chain lease's term)."""

    kind: Literal["allow_provider"] = "allow_provider"
    job: str
    provider: str
    wei: WeiText


class Clear(_Command):
    """One clearing round; journaled only when it changed something (`changed`)."""

    kind: Literal["clear"] = "clear"


MarketCommand = Annotated[
    Union[PostOffer, WithdrawOffer, Submit, TopUp, Pause, Resume, Finish, BarProvider,
          AllowProvider, Clear],
    Field(discriminator="kind"),
]
_COMMANDS: TypeAdapter[MarketCommand] = TypeAdapter(MarketCommand)


def apply(market: Market, command: MarketCommand, at_s: float) -> Any:
    """Carry out one command on `market` (live, or in a rebuild); the market's answer."""
    match command:
        case PostOffer(offer=offer):
            return market.post_offer(offer, at_s)
        case WithdrawOffer(offer_id=offer_id, provider=provider):
            return market.withdraw_offer(offer_id, provider, at_s)
        case Submit(bid=bid):
            return market.submit(bid, at_s)
        case TopUp(job=job, amount_wei=amount_wei):
            return market.top_up(job, amount_wei)
        case Pause(job=job):
            return market.pause(job, at_s)
        case Resume(job=job):
            return market.resume(job, at_s)
        case Finish(job=job):
            return market.finish(job, at_s)
        case BarProvider(job=job, provider=provider):
            return market.bar(job, provider, at_s)
        case AllowProvider(job=job, provider=provider, wei=wei):
            return market.allow(job, provider, wei, at_s)
        case Clear():
            return market.clear(at_s)
    raise TypeError(f"not a market command: {command!r}")


def stored(command: MarketCommand) -> tuple[str, dict[str, Any]]:
    """The row's `kind` and JSON `payload` for `command` (the shape stores already hold)."""
    return command.kind, command.model_dump(mode="json", exclude={"kind"})


def parsed(kind: str, payload: dict[str, Any]) -> MarketCommand:
    """The command a stored row holds; a kind this coordinator does not know is refused."""
    return _COMMANDS.validate_python({**payload, "kind": kind})


def changed(clearing: Clearing, last_status: dict[str, str]) -> bool:
    """Whether a clearing round changed anything a replay must reproduce.

    A round that leased nothing, stopped nothing and moved no job between
    full, partial, unfilled and paused leaves the market as it found it, so
    it is not journaled (rounds run every second).
    """
    if clearing.stopped or any(f.new_leases or f.notices for f in clearing.fills):
        return True
    return any(last_status.get(f.job) != f.status.value for f in clearing.fills)
