"""The audit log, read by anyone: every change the coordinator made, in order, for
one job or all of them (`after` pages through it)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from shoal.coordinator.api.deps import Co
from shoal.coordinator.api.errors import PROBLEMS
from shoal.spec.coordinator import Event

router = APIRouter(tags=["events"], responses=PROBLEMS)


@router.get("/v1/events")
def events(co: Co, job: Annotated[str | None, Query(max_length=64)] = None,
           after: Annotated[int, Query(ge=0, le=2**62)] = 0,
           limit: Annotated[int, Query(ge=1, le=1000)] = 200) -> list[Event]:
    return co.reads.events(job, after, limit)
