"""The base of every spec value."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Frozen(BaseModel):
    """Base of every spec value: immutable, and unknown keys are an error."""

    model_config = ConfigDict(frozen=True, extra="forbid")
