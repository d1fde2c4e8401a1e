"""The coordinator is composed, not inherited (STYLE.md 14): each of its services takes
what it uses in its constructor, none is mixed into the coordinator, and none holds
the coordinator itself, so what a service depends on is visible in one place."""

from __future__ import annotations

from shoal.coordinator import Coordinator
from tests.coordinator.conftest import make_settings

SERVICES = ("shoal.coordinator.services.", "shoal.coordinator.proofs.")


def test_nothing_is_mixed_into_the_coordinator():
    assert Coordinator.__bases__ == (object,)


def test_no_service_holds_the_coordinator(tmp_path):
    co = Coordinator(make_settings(f"sqlite:///{tmp_path}/store.db"))
    try:
        services = {name: held for name, held in vars(co).items()
                    if type(held).__module__.startswith(SERVICES)}
        assert {"offers", "agents", "jobs", "supervision", "chain", "carry", "specs", "records",
                "plants", "challenges", "verdicts", "referee", "penalties", "disputes",
                "unfiled"} <= set(services)
        for name, service in services.items():
            back = [field for field, value in vars(service).items() if value is co]
            assert back == [], f"co.{name} holds the coordinator as {back}"
    finally:
        co.hosts.stop_all()
        co.engine.dispose()
