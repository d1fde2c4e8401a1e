"""Whether a keeper's answer to a parameters challenge is the state its step started from.

A step's parameters are kept by two of its workers, and a verifier takes a snapshot
only if it hashes to what most of the step's records claim (`audit_local.load_agreed`).
Taken unchecked, one keeper's wrong file (or garbage) would stand as the step's answer
and leave the step unauditable for everyone, the liar's own record included; checked
here first, it is refused and the other keeper is asked (keeper_routing.py).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from shoal.coordinator.errors import Conflict
from shoal.proof.epochs import final_lineage
from shoal.spec.proof import WorkRecord
from shoal.verify.audit.round_start import majority_claim
from shoal.train.hashing import param_sha256
from shoal.verify.kept_files import UnreadableFile, params_from


class WrongParams(Conflict):
    """A keeper's answer that is not the step's parameters: refused, asked of another."""


def expected_params_sha256(records: Iterable[WorkRecord]) -> str | None:
    """What the step's final lineage claims it started from, if one claim has more records
    than any other: the tie rule of `load_agreed`, so the coordinator refuses no file a
    verifier would take. A tie (or no record) is no expectation."""
    return majority_claim([r.params_sha256 for r in final_lineage(records)])


def read_params(data: bytes, step: int) -> dict[str, torch.Tensor]:
    """The answer as a state of named tensors, read as the proof store reads it (a file
    from a stranger never runs code)."""
    try:
        return params_from(data)
    except UnreadableFile as error:
        raise WrongParams(f"the answer is not a parameters file a worker wrote ({error}); "
                          f"send the proof store's params/{step:09d}.safetensors as kept"[:400]) from None


def check_params(state: dict[str, torch.Tensor], model: torch.nn.Module, expected: str,
                 step: int) -> None:
    """`state`, loaded into the job's `model`, hashes to `expected` (the step's claim)."""
    try:
        model.load_state_dict(state)
    except (RuntimeError, KeyError, TypeError, ValueError) as error:
        raise WrongParams(f"the answer does not fit the job's model: {error}"[:300]) from None
    found = param_sha256(model)
    if found != expected:
        raise WrongParams(f"the answer's parameters (sha256 {found[:12]}…) are not what most "
                          f"of step {step}'s records claim it started from ({expected[:12]}…): "
                          "refused, the step's other keeper is asked; send the parameters "
                          "the step started from, not another state")
