"""The store's migrations and types on both engines: the migrated schema is
exactly the tables the code uses, and wei of any size come back whole."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.orm import Session

from shoal.coordinator.db.database import current_revision, migrate, open_engine, open_store_engine
from shoal.coordinator.db.schema import AgentRow, Base, OfferRow, ParticipantRow


def test_migrations_build_exactly_the_tables_in_use(store_url):
    engine = open_store_engine(store_url)
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
