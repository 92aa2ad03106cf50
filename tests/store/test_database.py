"""The program database on real SQLite files and a real PostgreSQL server: schema, MAP-Elites,
sampling, migration, resume."""
from collections import Counter

import numpy as np
import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import event, inspect

from evolve.config import Descriptor, Search
from evolve.store.database import ProgramDatabase, connect, migrate
from evolve.store.schema import Base, Cell, Evaluation, Program

AXES = [Descriptor(name="a", low=0, high=1, bins=4), Descriptor(name="b", low=0, high=1, bins=4)]


def open_db(url, islands=2, **search):
    return ProgramDatabase.open(url, "test", "p: 1", "q: 2", 0,
                                AXES, Search(islands=islands, **search), "toy")


def child(island=0, objective=1.0, a=0.1, b=0.1, status="ok", code=None, parent=None):
    return Program(island=island, origin="mutation", status=status, objective=objective, headline=objective,
                   fitness={"x": objective}, descriptors={"a": a, "b": b}, parent_id=parent,
                   code=code or f"x = {objective!r}  # {a} {b}\n")


def test_migration_creates_schema_matching_models(db_url):
    engine = connect(db_url)
    migrate(engine)
    tables = set(inspect(engine).get_table_names())
    assert {"runs", "programs", "evaluations", "llm_calls", "completions", "cells", "islands",
            "policy_versions", "sessions", "alembic_version"} <= tables
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == [], f"models and migrations disagree: {diff}"
    migrate(engine)  # idempotent


def test_a_migration_stopped_halfway_leaves_nothing_and_the_next_start_migrates(db_url):
    # A run killed while it creates its database: the next start must find it empty, not half
    # made (SQLite ran each CREATE TABLE in its own transaction: "table runs already exists").
    engine = connect(db_url)

    def die_at_the_second_revision(conn, cursor, statement, *args):
        if statement.lstrip().startswith("CREATE TABLE training_steps"):
            raise KeyboardInterrupt("killed mid-migration")

    event.listen(engine, "before_cursor_execute", die_at_the_second_revision)
    with pytest.raises(KeyboardInterrupt):
        migrate(engine)
    event.remove(engine, "before_cursor_execute", die_at_the_second_revision)
    engine.dispose()
    engine = connect(db_url)
    assert inspect(engine).get_table_names() == []
    migrate(engine)
    assert {"runs", "training_steps", "alembic_version"} <= set(inspect(engine).get_table_names())
    engine.dispose()


def test_sqlite_runs_in_wal_mode(tmp_path):
    db = open_db(f"sqlite:///{tmp_path / 'evolve.db'}")
    assert db.session.connection().exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"


def test_child_replaces_elite_only_when_strictly_better(db_url):
    db = open_db(db_url)
    first = child(objective=1.0)
    assert db.tell(first)
    assert not db.tell(child(objective=1.0, code="y = 1\n"))  # a tie keeps the incumbent
    assert not db.tell(child(objective=0.5))
    better = child(objective=1.5)
    assert db.tell(better)
    elite = db.session.get(Cell, (db.run_id, 0, "0,0"))
    assert elite.program_id == better.id and elite.objective == 1.5
    assert db.tell(child(objective=0.1, a=0.9))  # an empty cell takes anything valid


def test_failures_are_stored_but_never_elites(db_url):
    db = open_db(db_url)
    for status in ("invalid", "error", "timeout", "mutation_failed"):
        assert not db.tell(child(status=status, objective=None, code=None))
    assert db.count() == 4 and db.count("ok") == 0
    assert db.archive.islands[0].elites == {}


def test_duplicates_found_after_normalisation(db_url):
    db = open_db(db_url)
    original = child(code="x = 1\n\ny = 2\n")
    db.tell(original)
    assert db.find_duplicate("x = 1   \ny = 2\n").id == original.id
    assert db.find_duplicate("x = 2\n") is None


def test_sampling_ratios_follow_yaml_and_are_seeded(db_url):
    db = open_db(db_url, islands=2, exploit_ratio=0.5, explore_ratio=0.3, migrate_ratio=0.2)
    for i in range(6):
        db.tell(child(island=0, objective=float(i), a=i / 6, b=0.1))
        db.tell(child(island=1, objective=float(i), a=0.1, b=i / 6))
    hows = [db.ask(0, np.random.default_rng(7)).how for _ in range(1)]
    rng = np.random.default_rng(1)
    asks = [db.ask(0, rng) for _ in range(2000)]
    share = Counter(a.how for a in asks)
    assert abs(share["exploit"] / 2000 - 0.5) < 0.04
    assert abs(share["explore"] / 2000 - 0.3) < 0.04
    assert abs(share["migrate"] / 2000 - 0.2) < 0.04
    assert all(a.parent.island == 1 for a in asks if a.how == "migrate")
    assert all(a.parent.island == 0 for a in asks if a.how != "migrate")
    again = db.ask(0, np.random.default_rng(7))
    assert again.how == hows[0]  # same seed, same choice


def test_inspirations_are_top_and_diverse_without_parent(db_url):
    db = open_db(db_url, islands=1, exploit_ratio=1, explore_ratio=0, migrate_ratio=0,
                 top_inspirations=2, diverse_inspirations=1)
    for i in range(8):
        db.tell(child(objective=float(i), a=i / 8, b=i / 8))
    ask = db.ask(0, np.random.default_rng(0))
    ids = [p.id for p in ask.inspirations]
    assert ask.parent.id not in ids and len(ids) == len(set(ids)) == 3
    tops = [p.objective for p in ask.inspirations[:2]]
    assert tops == sorted(tops, reverse=True) and tops[0] >= 6


def test_ring_migration_copies_best_to_next_island(db_url):
    db = open_db(db_url, islands=3, migration_every=2)
    best = child(island=1, objective=9.0)
    db.tell(best, Evaluation(backend="test", status="ok", started_at=0.0, elapsed_s=0.1))
    assert db.advance(1) is None
    migrant = db.advance(1)
    assert migrant.island == 2 and migrant.origin == "migration" and migrant.parent_id == best.id
    assert migrant.objective == 9.0 and migrant.code == best.code
    assert db.archive.islands[2].best() == (9.0, migrant.id)
    assert db.evaluations_done() == 1  # a migrant is not an evaluation


def test_resume_rebuilds_the_same_index(db_url):
    db = open_db(db_url, islands=2)
    rng = np.random.default_rng(3)
    for i in range(40):
        db.tell(child(island=i % 2, objective=float(rng.random()), a=rng.random(), b=rng.random()))
    db.advance(0)
    before = [(isl.members, isl.elites, isl.top, isl.generation) for isl in db.archive.islands]
    db.close()
    again = open_db(db_url, islands=2)
    assert [(isl.members, isl.elites, isl.top, isl.generation) for isl in again.archive.islands] == before
    assert again.run_id == db.run_id and again.count() == 40


def test_any_sqlalchemy_url(tmp_path):
    """A URL that is not our default file layout (here: another file name) works the same."""
    db = ProgramDatabase.open(f"sqlite:///{tmp_path / 'other-name.sqlite'}", "r", "", "", 1, AXES,
                              Search(islands=1), "toy")
    db.tell(child())
    assert db.best() is not None


def test_evaluations_count_what_ran(db_url):
    """The budget's unit (evolve/store/counts.py): an LLM child that ran counts one, a tuning
    every trial, the seed, a duplicate, a failed mutation and a migrant nothing."""
    from evolve.store.schema import Tuning

    db = open_db(db_url)

    def ran(program):
        db.tell(program, Evaluation(backend="test", status=program.status, started_at=0.0, elapsed_s=0.1))
        return program

    seed = ran(Program(island=0, origin="seed", status="ok", objective=1.0, code="s = 1\n", descriptors={}))
    ran(child(objective=1.5, parent=seed.id))
    ran(child(objective=0.0, status="error", parent=seed.id, code="boom\n"))
    db.tell(child(objective=1.5, parent=seed.id, code="copy\n"))  # a duplicate: no evaluation
    db.tell(child(objective=None, status="mutation_failed", parent=seed.id, code=None))
    tuned = ran(Program(island=0, origin="tuned", status="ok", objective=1.7, code="t = 2.0\n", parent_id=seed.id,
                        descriptors={"a": 0.5, "b": 0.5}))
    db.add(Tuning(run_id=db.run_id, parent_id=seed.id, child_id=tuned.id, trials=40, parameters=1,
                  start_objective=1.0, best_objective=1.7, started_at=0.0, elapsed_s=1.0))
    db.advance(0)
    assert db.evaluations_done() == 1 + 1 + 40
