"""The coordinator's store: SQLAlchemy tables, migrations, and data access."""
