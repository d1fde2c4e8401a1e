"""The audit log's typed union: every kind has its model, a kind's name is the string
the log has always stored, and wei travel as decimal text."""

from __future__ import annotations

import typing

import pytest

from shoal.spec.events import (
    AuditEvent, EventKind, JobSubmitted, VerdictUndecided, audit_event,
)


def event_models() -> list[type]:
    union = typing.get_args(AuditEvent)[0]
    return list(typing.get_args(union))


def kind_of(model: type) -> EventKind:
    (kind,) = typing.get_args(model.model_fields["kind"].annotation)
    return kind


def test_every_kind_has_one_model_and_every_model_one_kind():
    kinds = [kind_of(model) for model in event_models()]
    assert sorted(kinds) == sorted(EventKind) and len(set(kinds)) == len(kinds)
    assert all(kind == kind.name for kind in EventKind)  # the stored strings, as they were


def test_wei_are_stored_as_decimal_text_and_read_back_whole():
    wei = 2**200 + 1
    event = JobSubmitted(workers=2, budget_wei=wei, max_price_wei_per_s=3)
    assert event.detail() == {"workers": 2, "budget_wei": str(wei), "max_price_wei_per_s": "3"}
    assert audit_event("job_submitted", event.detail()) == event


def test_only_the_fields_a_writer_gave_are_stored():
    """A chain note is in the detail only when a transaction was sent, as before."""
    ruled = VerdictUndecided(verdict=1, worker="w", step=2, verifier="v", provider=None, why="")
    assert "tx" not in ruled.detail() and ruled.detail()["provider"] is None


def test_a_detail_that_is_not_its_kinds_is_refused():
    with pytest.raises(ValueError):
        audit_event("job_submitted", {"workers": 2})
    with pytest.raises(ValueError):
        audit_event("no_such_kind", {})
