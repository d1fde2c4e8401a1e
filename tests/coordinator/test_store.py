"""The store's migrations and types on both engines: the migrated schema is
exactly the tables the code uses, and wei of any size come back whole."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import MetaData, insert
from sqlalchemy.orm import Session

from shoal.coordinator.db.database import current_revision, migrate, open_engine, open_store_engine
from shoal.coordinator.db.schema import (
    AgentRow, Base, JobRow, LeaseRow, OfferRow, ParticipantRow, SettlementRow,
)


def test_migrations_build_exactly_the_tables_in_use(empty_store_url):
    engine = open_store_engine(empty_store_url)
    with engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
    migrate(engine, "base", down=True)  # every migration also goes back down
    assert current_revision(engine) is None
    migrate(engine)
    assert current_revision(engine) is not None
    migrate(engine)  # and a current store is left as it is
    engine.dispose()


def test_wei_of_any_size_come_back_whole(store_url):
    engine = open_store_engine(store_url)
    price = 2**200 + 1  # far past 64-bit integers and float precision
    with Session(engine) as session, session.begin():
        session.add(ParticipantRow(address="0x" + "1" * 40, role="provider", name="p",
                                   registered_at_s=0.0))
        session.flush()
        session.add(AgentRow(agent_id="a", provider="0x" + "1" * 40, region="eu", devices=[],
                             registered_at_s=0.0, last_seen_s=0.0, running=[]))
        session.flush()
        session.add(OfferRow(offer_id="o", provider="0x" + "1" * 40, agent_id="a", device=0,
                             device_kind="cpu", region="eu", speed_samples_per_s=1.0,
                             memory_gb=1.0, price_wei_per_s=price, tenancy="spot",
                             reference_wei_per_s=None))
    with Session(engine) as session:
        assert session.get(OfferRow, "o").price_wei_per_s == price
    engine.dispose()


def test_a_bad_store_url_says_what_to_give():
    import pytest

    from shoal.coordinator.db.errors import StoreError

    with pytest.raises(StoreError, match="sqlite:///PATH"):
        open_engine("not a url")
    with pytest.raises(StoreError, match="cannot reach the store"):
        migrate(open_engine("postgresql+psycopg://nobody@127.0.0.1:1/none"))


def test_the_state_once_read_from_the_log_is_carried_into_its_own_columns(empty_store_url):
    """A store at 0008 kept its jobs' serving time, plans, record stores and settlement
    tries only as events: migrated, it finds them in their columns."""
    engine = open_engine(empty_store_url)
    migrate(engine, "0008")
    tables = MetaData()
    tables.reflect(engine)
    t = tables.tables
    address = "0x" + "1" * 40
    events = [(1.0, "job_rendezvous", "j", {"rendezvous": "h:1"}),
              (2.0, "job_planned", "j", {"epoch": 0}),
              (3.0, "job_rendezvous", "j", {"rendezvous": "h:2"}),
              (4.0, "job_planned", "j", {"epoch": 1}),
              (5.0, "work_records_stored", "j", {"lease": 7, "records": 2, "steps": [0, 1]}),
              (6.0, "settlement_failed", "j", {"reason": "down"}),
              (8.0, "settlement_failed", "j", {"reason": "down"}),
              (9.0, "job_settled", "j", {}),
              (9.5, "settlement_failed", "k", {"reason": "down"})]
    with engine.begin() as connection:
        connection.execute(insert(t["participants"]).values(
            address=address, role="provider", name="p", registered_at_s=0.0, max_priority=0))
        connection.execute(insert(t["agents"]).values(
            agent_id="a", provider=address, region="eu", devices=[], registered_at_s=0.0,
            last_seen_s=0.0, running=[]))
        connection.execute(insert(t["offers"]).values(
            offer_id="o", provider=address, agent_id="a", device=0, device_kind="cpu",
            region="eu", speed_samples_per_s=1.0, memory_gb=1.0, price_wei_per_s="1",
            tenancy="spot", withdrawn=False, marked_down=False))
        for job_id in ("j", "k"):
            connection.execute(insert(t["jobs"]).values(
                job_id=job_id, name=job_id, submitter=address, job_file="", bid={},
                status="running", created_at_s=0.0))
        connection.execute(insert(t["leases"]).values(
            lease=7, job_id="j", offer_id="o", provider=address, price_wei_per_s="1",
            start_s=0.0, value={}))
        connection.execute(insert(t["events"]), [
            dict(at_s=at_s, actor="c", kind=kind, job_id=job_id, detail=detail)
            for at_s, kind, job_id, detail in events])
    migrate(engine)
    with Session(engine) as session:
        job = session.get(JobRow, "j")
        assert (job.rendezvous_at_s, job.plan) == (3.0, {"epoch": 1})
        assert session.get(JobRow, "k").plan is None
        assert session.get(LeaseRow, 7).records_stored_at_s == 5.0
        settled, failing = session.get(SettlementRow, "j"), session.get(SettlementRow, "k")
        assert (settled.failures, settled.failed_at_s, settled.settled_at_s) == (2, 8.0, 9.0)
        assert (failing.failures, failing.failed_at_s, failing.settled_at_s) == (1, 9.5, None)
    engine.dispose()
