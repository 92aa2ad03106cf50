"""Read-only connections: what the views, `evolve compare` and the schema check open, never
the engine's read-write session and never a migration."""
from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import Engine, make_url

from evolve.rundir import InspectError


def readonly_engine(url: str) -> Engine:
    """An engine that cannot write: SQLite opened with mode=ro, and none of connect()'s pragmas.

    (database.connect() switches a file to WAL, which is a write; a migration would be worse.)
    PostgreSQL sessions are read-only transactions; other databases get a plain engine:
    everything here only ever SELECTs.
    """
    u = make_url(url)
    if u.get_backend_name() == "postgresql":
        return create_engine(url, execution_options={"postgresql_readonly": True}, pool_pre_ping=True)
    if u.get_backend_name() != "sqlite":
        return create_engine(url)
    if not u.database or u.database == ":memory:":
        raise InspectError(f"{url}: an in-memory database cannot be inspected")
    path = Path(u.database).resolve()
    if not path.exists():
        raise InspectError(f"{path}: no database (has the run started?)")
    return create_engine(f"sqlite:///file:{quote(str(path))}?mode=ro&uri=true")


def schema_revision(engine: Engine) -> str | None:
    """The Alembic revision a database is at, read without touching it."""
    with engine.connect() as conn:
        if "alembic_version" not in inspect(conn).get_table_names():
            return None
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
