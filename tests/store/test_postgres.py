"""The archive on a real PostgreSQL server (tests/postgres.py): what SQLite's single file hid.
Migrations racing on an empty database, a second writer of one run, read-only views, kill -9
and a database server restarted under a running `evolve run` (the scripted LLM of
tests/test_reliability.py, the real Docker sandbox and scorer)."""
from __future__ import annotations

import random
import subprocess
import sys
import threading
import time

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session
from test_database import AXES, child
from test_reliability import (
    archive,
    check_consistent,
    done,
    events,
    finish,
    setup_run,
    start,
    wait_for,
)

from evolve.config import Search
from evolve.events import Event
from evolve.faults import database_away, fault_of, wait_for_database
from evolve.store.connection import readonly_engine
from evolve.store.database import ProgramDatabase, RunInUse, connect, migrate
from evolve.store.schema import Base


def open_run(url: str, name: str = "run") -> ProgramDatabase:
    return ProgramDatabase.open(url, name, "p: 1", "q: 2", 0, AXES, Search(islands=2), "toy")


def test_runs_starting_at_once_on_an_empty_database_migrate_it_once(postgres):
    url = postgres.new_database()
    failures = []

    def start_one():
        try:
            migrate(connect(url))
        except Exception as exc:  # noqa: BLE001 - collected and reported below
            failures.append(exc)

    threads = [threading.Thread(target=start_one) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    with connect(url).connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []


def test_one_process_writes_a_run_and_a_second_is_refused_until_it_is_gone(postgres):
    url = postgres.new_database()
    first = open_run(url)
    with pytest.raises(RunInUse, match="being written by another process"):
        open_run(url)
    other = open_run(url, "another-run")  # other runs of the same database are not held up
    other.tell(child())
    other.close()
    first.tell(child())
    first.close()
    again = open_run(url)  # the writer is gone: the run can be resumed
    assert again.count() == 1
    again.close()


def test_the_read_only_views_cannot_write(postgres):
    url = postgres.new_database()
    open_run(url).close()
    with readonly_engine(url).connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM runs")).scalar() == 1
        with pytest.raises(DBAPIError, match="read-only transaction"):
            conn.execute(text("DELETE FROM runs"))


def test_a_database_server_that_goes_away_is_told_apart_and_waited_for(postgres):
    url = postgres.new_database()
    db = open_run(url)
    said: list[Event] = []
    postgres.stop()
    try:
        with pytest.raises(OperationalError) as lost:
            db.tell(child())
        assert database_away(lost.value) and "went away" in fault_of(lost.value)
        db.session.rollback()
        assert not wait_for_database(url, said.append, limit_s=2.0)  # down for good: give up
        assert said[0].kind == "database_down" and "database server unavailable" in said[0].message
        threading.Timer(2.0, postgres.start).start()
        assert wait_for_database(url, said.append, limit_s=60.0)
        assert said[-1].kind == "database_up"
    finally:
        if not postgres.running():
            postgres.start()
    db.close()
    locked = Session(connect(f"sqlite:///{postgres.root / 'none' / 'x.db'}"))
    with pytest.raises(OperationalError) as missing:  # SQLite's errors are not "went away"
        locked.execute(text("SELECT 1"))
    assert not database_away(missing.value)


# ---- whole runs ---------------------------------------------------------------------------------
KILLS = 6


def test_kill_9_on_postgresql_loses_nothing_and_the_run_finishes(tmp_path, postgres, docker_ready):
    budget = 60
    url = postgres.new_database()
    command, run_dir, _ = setup_run(tmp_path, budget)
    command += ["--db-url", url]
    rng = random.Random(3)
    kept: dict[int, tuple] = {}
    for _ in range(KILLS):
        proc = start(command)
        time.sleep(rng.uniform(2.0, 6.0))
        assert proc.poll() is None, f"the run finished before {KILLS} kills:\n{proc.stdout.read()}"
        proc.kill()
        proc.wait()
        check_consistent(url)
        now = archive(url)
        assert all(now.get(pid) == row for pid, row in kept.items()), "a kill lost or changed a program"
        kept = now
    final = finish(command)  # the killed writers' locks went with their connections
    assert final.returncode == 0, final.stdout + final.stderr
    check_consistent(url)
    assert all(archive(url).get(pid) == row for pid, row in kept.items())
    assert done(url) == budget
    status = subprocess.run([sys.executable, "-m", "evolve.cli", "status", str(run_dir)],
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0 and f"{budget}" in status.stdout, status.stdout + status.stderr


def test_a_database_server_restarted_mid_run_is_waited_for_and_the_run_resumes(tmp_path, postgres, docker_ready):
    budget = 40
    url = postgres.new_database()
    command, run_dir, _ = setup_run(tmp_path, budget)
    command += ["--db-url", url]
    proc = start(command, SCRIPTED_DELAY="0.2")
    wait_for(lambda: done(url) >= 5, proc, what="5 evaluations")
    kept = archive(url)
    postgres.stop()
    time.sleep(3.0)  # the run finds the server gone and waits for it
    postgres.start()
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert "stopped: budget reached" in out and "Traceback" not in out, out
    told = [e for e in events(run_dir) if e["kind"] in ("fault", "database_down", "database_up", "resume")]
    away = next(i for i, e in enumerate(told) if "database server went away" in e["message"])
    assert any(e["kind"] == "resume" for e in told[away:]), told  # resumed in the same process
    check_consistent(url)
    assert all(archive(url).get(pid) == row for pid, row in kept.items())
    assert done(url) == budget
