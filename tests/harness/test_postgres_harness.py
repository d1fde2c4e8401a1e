"""The PostgreSQL harness gives the store tests a real server: SQLAlchemy can
write and read through it, and each test's database starts empty and apart
from every other. If the server cannot start these fail; they never skip."""

from __future__ import annotations

from sqlalchemy import create_engine, inspect, text

from tests.harness.postgres import postgres_server, postgres_url  # noqa: F401


def test_real_postgres_round_trip(postgres_url: str) -> None:  # noqa: F811
    engine = create_engine(postgres_url)
    try:
        with engine.begin() as conn:
            assert conn.execute(text("select version()")).scalar_one().startswith("PostgreSQL ")
            conn.execute(text("create table t (id serial primary key, name text not null)"))
            conn.execute(text("insert into t (name) values ('a'), ('b')"))
        with engine.connect() as conn:
            names = conn.execute(text("select name from t order by id")).scalars().all()
        assert names == ["a", "b"]
    finally:
        engine.dispose()


def test_each_database_is_fresh_and_isolated(postgres_server,  # noqa: F811
                                             postgres_url: str) -> None:  # noqa: F811
    other = postgres_server.fresh_database("isolation_other")
    assert other != postgres_url
    first, second = create_engine(postgres_url), create_engine(other)
    try:
        assert inspect(first).get_table_names() == []
        with first.begin() as conn:
            conn.execute(text("create table only_here (x int)"))
        assert inspect(first).get_table_names() == ["only_here"]
        assert inspect(second).get_table_names() == []
    finally:
        first.dispose()
        second.dispose()
