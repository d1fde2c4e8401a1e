"""Every audit event goes into the log through the one writer and comes back the same:
as the stored row, as the `Event` the API serves, and read back as its typed model."""

from __future__ import annotations

import enum
import types
import typing

from pydantic import BaseModel

from shoal.coordinator import Coordinator
from shoal.spec.coordinator import COORDINATOR
from shoal.spec.events import audit_event
from shoal.coordinator.db.store import record_event
from tests.coordinator.conftest import make_settings
from tests.spec.test_events import event_models


def sample(annotation: object) -> object:
    """A value of the annotated type, far enough from defaults to show it round-trips."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Annotated:
        return sample(args[0])
    if origin in (typing.Union, types.UnionType):
        return sample(next(a for a in args if a is not type(None)))
    if origin is dict:
        return {"0x" + "a" * 40: sample(args[1])}
    if origin is list:
        return [sample(args[0])]
    if origin is tuple:  # tuple[str, ...] or of fixed length
        return tuple(sample(a) for a in args if a is not Ellipsis)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return list(annotation)[-1]
    return {int: 2**70 + 3, float: 1.5, str: "a-l1-a0-w0", bool: True,
            typing.Any: "any"}[annotation]


def example(model: type[BaseModel]) -> BaseModel:
    hints = typing.get_type_hints(model, include_extras=True)
    return model(**{name: sample(hints[name]) for name in model.model_fields if name != "kind"})


def test_every_event_round_trips_through_the_log_and_the_api(tmp_path):
    co = Coordinator(make_settings(f"sqlite:///{tmp_path}/store.db"))
    try:
        written = [example(model) for model in event_models()]
        with co.desk.change() as session:
            for at_s, event in enumerate(written):
                record_event(session, float(at_s), COORDINATOR, event, job_id=None)
        served = co.reads.events(None, after=0, limit=1000)
        assert [e.kind for e in served] == [event.kind for event in written]
        for event, view in zip(written, served, strict=True):
            assert view.detail == event.detail()
            assert audit_event(view.kind, view.detail) == event
            # What a client parses from the API's JSON reads back the same.
            again = type(view).model_validate_json(view.model_dump_json())
            assert audit_event(again.kind, again.detail) == event
    finally:
        co.hosts.stop_all()
        co.engine.dispose()


def test_the_client_and_shoal_events_read_the_log_to_its_end_past_the_first_page(served):
    # A job with challenges records thousands of events; its reveal and settlement come
    # last. Before: `shoal events` and the tests' reads stopped at the first 1000.
    from typer.testing import CliRunner

    from shoal.cli.main import app
    from shoal.spec.events import ChallengeRaised, JobSettled

    co = served.app.state.coordinator
    with co.desk.change() as session:
        for i in range(2345):
            record_event(session, float(i), "someone", ChallengeRaised(
                challenge=i, worker="w", step=i, blob="params", agent_id="a"), job_id="j")
        record_event(session, 9999.0, COORDINATOR, example(JobSettled), job_id="j")
    read = list(served.client().every_event(job="j"))
    assert [e.detail.get("challenge") for e in read[:-1]] == list(range(2345))
    assert read[-1].kind == "job_settled"
    assert [e.seq for e in served.client().every_event(job="j", after=read[-2].seq)] == [
        read[-1].seq]

    printed = CliRunner().invoke(app, ["events", "j", "--json", "--coordinator", served.url])
    assert printed.exit_code == 0, printed.output
    lines = printed.output.splitlines()
    assert len(lines) == 2346 and '"job_settled"' in lines[-1]
