"""Alembic environment for the program database.

The engine calls `evolve.store.database.migrate(url)`, which hands its connection in through
`config.attributes["connection"]`; the `alembic` CLI (db/alembic.ini) works too.
"""
from alembic import context
from sqlalchemy import engine_from_config, pool

from evolve.store.schema import Base

config = context.config
target_metadata = Base.metadata


def run_with(connection) -> None:
    # render_as_batch: SQLite cannot ALTER most things; batch mode rebuilds the table.
    context.configure(connection=connection, target_metadata=target_metadata,
                      render_as_batch=connection.dialect.name == "sqlite")
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    run_with(connection)
else:
    engine = engine_from_config(config.get_section(config.config_ini_section, {}),
                                prefix="sqlalchemy.", poolclass=pool.NullPool)
    with engine.connect() as conn:
        run_with(conn)
