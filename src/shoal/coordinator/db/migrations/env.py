"""Alembic's entry: runs the coordinator's migrations on the connection it is handed."""

from alembic import context

from shoal.coordinator.db.schema import Base

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata,
                  render_as_batch=True)  # SQLite alters tables by copying them
with context.begin_transaction():
    context.run_migrations()
