"""A market worker's identity: the agent, lease, attempt and index its name carries.

Whoever pays, slashes or judges a worker parses its name once into a `WorkerId`;
a name that does not parse is not a lease's worker (a `shoal run` worker) and earns nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from shoal.spec.errors import SpecError

# Any worker's name, a lease's or a `shoal run` worker's: one path component of letters,
# digits, '.', '_' and '-', not starting with '.' (so never '.' or '..'). Names become
# file names under a job's proof directory (proof.layout): a '/' or a '..' in one would
# write another job's files (issue 40, point 4). Held at every boundary a name crosses.
WORKER_NAME = r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$"
_WORKER_NAME = re.compile(WORKER_NAME)
WorkerName = Annotated[str, Field(min_length=1, max_length=128, pattern=WORKER_NAME)]

# Agents name a lease's node AGENT-l<lease>-a<attempt> (agent.leases); the launcher adds
# .<claim> when that node name is already in the job (elastic.launcher) and names each of
# its workers NODE-w<index> (elastic.worker_pool). AGENT is a coordinator Label. Numbers
# have no leading zeros, so two different names never parse to the same worker.
_NUMBER = r"(0|[1-9][0-9]*)"
_NAME = re.compile(rf"(?P<agent>[A-Za-z0-9][A-Za-z0-9._-]{{0,63}})-l{_NUMBER}-a{_NUMBER}"
                   rf"(?:\.{_NUMBER})?-w{_NUMBER}")


class WorkerIdError(SpecError):
    """A worker name that is not AGENT-l<lease>-a<attempt>[.<claim>]-w<index>."""


class WorkerNameError(SpecError):
    """A name that cannot be any worker's (it would not be one path component)."""


def check_worker_name(name: str) -> str:
    """`name` if it can be a worker's (WORKER_NAME), else WorkerNameError."""
    if not isinstance(name, str) or _WORKER_NAME.fullmatch(name) is None:
        raise WorkerNameError(f"worker name {name!r} is not 1 to 128 of [A-Za-z0-9._-] "
                              "starting with a letter, digit, '_' or '-'")
    return name


@dataclass(frozen=True)
class WorkerId:
    """One worker of one lease; `str()` gives back the name it was parsed from."""

    agent: str  # the provider's agent that runs the lease
    lease: int  # the coordinator's lease number: what is paid or slashed
    attempt: int  # the agent's start of the lease's worker (0, 1, ... after restarts)
    claim: int | None  # the launcher's suffix when the node name was claimed twice, else None
    index: int  # the worker's index on its node

    @classmethod
    def parse(cls, name: str) -> WorkerId:
        """The identity `name` carries. The lease is the last -l<n>-a<n>-w<n> of the whole
        name (an agent id may itself contain dashes), so no prefix can claim another lease."""
        match = _NAME.fullmatch(name)
        if match is None:
            raise WorkerIdError(f"worker name {name!r} is not AGENT-l<lease>-a<attempt>-w<index>: "
                                "it is not a market lease's worker")
        agent, lease, attempt, claim, index = match.groups()
        return cls(agent, int(lease), int(attempt), None if claim is None else int(claim),
                   int(index))

    @classmethod
    def leased(cls, name: str) -> WorkerId | None:
        """The identity of a lease's worker; None for a name no lease runs (a `shoal run`
        worker), which is paid, slashed or judged as no lease's."""
        try:
            return cls.parse(name)
        except WorkerIdError:
            return None

    def __str__(self) -> str:
        claim = "" if self.claim is None else f".{self.claim}"
        return f"{self.agent}-l{self.lease}-a{self.attempt}{claim}-w{self.index}"


def runs_on(name: str, agent: str, lease: int) -> bool:
    """Whether `name` is a worker of `lease` run by `agent`, by its parsed identity: a prefix
    of the name would let it name another lease after the prefix."""
    named = WorkerId.leased(name)
    return named is not None and (named.agent, named.lease) == (agent, lease)
