"""The program database: every candidate, and the archive (evolve/archive.py) it persists.

Ask/tell, in the manner of pyribs: `ask(island)` resolves the archive's pick of a parent and
inspirations to programs, `tell(...)` stores a child (whatever became of it) and lets it
compete for its cell. The database rows are the truth; the archive is rebuilt from them on open.
"""
from __future__ import annotations

import hashlib
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar, cast

import numpy as np
from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import create_engine, event, func, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, undefer

from evolve.archive import Archive, cell_of
from evolve.config import Descriptor, Search
from evolve.faults import fault_of
from evolve.mutation.code import normalise
from evolve.store.counts import evaluations_done
from evolve.store.schema import (
    Cell,
    Completion,
    Evaluation,
    Island,
    LLMCall,
    PolicyVersion,
    Program,
    Run,
    TrainingStep,
    Tuning,
    Turn,
)
from evolve.store.schema import Session as RunSession

# db/ at the top of the repository, shipped as package data through this link
MIGRATIONS = Path(__file__).resolve().parent / "migrations"
EVALUATED = ("ok", "invalid", "error", "timeout")
# How long a write waits for another process's lock (a reader's checkpoint, a sqlite3 shell
# holding a transaction) before the run stops with "database is locked" (resumable).
BUSY_TIMEOUT_S = 30.0


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def connect(url: str) -> Engine:
    """An engine for any SQLAlchemy URL; SQLite gets WAL so a dashboard can read while we write.
    A server database's pooled connections are pinged before use: after a server restart a
    stale one is replaced instead of failing the run."""
    sqlite = url.startswith("sqlite")
    engine = create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_S} if sqlite else {},
                           pool_pre_ping=not sqlite)
    if engine.dialect.name == "sqlite":
        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn, _record):
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints; WAL keeps it consistent
            cur.execute("PRAGMA foreign_keys=ON")
            cur.close()
    return engine


class SchemaError(Exception):
    """The database was written by a newer evolve: upgrading it here could lose data."""


class RunInUse(Exception):
    """Another process writes this run: on a shared server database, one writer per run."""


# PostgreSQL advisory locks of evolve: (LOCKS, 0) serialises migrations, (LOCKS, run id) is
# held by the one process that writes that run. SQLite's file lock does both by itself.
LOCKS = 0x65766F  # "evo"


def migrate(engine: Engine) -> None:
    """Bring the schema to the newest Alembic revision (creating it on an empty database)."""
    cfg = _alembic_config()
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":  # two runs starting on an empty database at once
            conn.execute(text("SELECT pg_advisory_xact_lock(:k, 0)"), {"k": LOCKS})
        else:  # Python's sqlite3 opens no transaction for DDL: without this a kill -9 between
            # two CREATE TABLEs leaves a half schema that no later start can migrate
            conn.exec_driver_sql("BEGIN IMMEDIATE")
        _refuse_newer(conn, ScriptDirectory.from_config(cfg))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")


def refuse_newer_schema(url: str) -> None:
    """SchemaError for a database from a newer evolve, found without writing to it."""
    from evolve.rundir import InspectError
    from evolve.store.connection import readonly_engine

    try:
        engine = readonly_engine(url)
    except InspectError:
        return  # no database yet
    try:
        with engine.connect() as conn:
            _refuse_newer(conn, ScriptDirectory.from_config(_alembic_config()))
    finally:
        engine.dispose()


def _alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def _refuse_newer(conn, scripts: ScriptDirectory) -> None:
    current = MigrationContext.configure(conn).get_current_revision()
    if current is None:
        return
    try:
        scripts.get_revision(current)
    except CommandError:
        raise SchemaError(f"the database {conn.engine.url.render_as_string(hide_password=True)} is at "
                          f"schema revision {current}, written by a newer evolve (this one knows up to "
                          f"{scripts.get_current_head()}); upgrade evolve, the run's data is untouched") from None


def session_seconds(row) -> float:
    """A session's wall time; one killed with -9 never ended and counts up to its last heartbeat."""
    return (row.ended_at or row.heartbeat_at or row.started_at) - row.started_at


def code_hash(code: str) -> str:
    return hashlib.sha256(normalise(code).encode()).hexdigest()


@dataclass
class Ask:
    island: int
    parent: Program
    inspirations: list[Program]
    how: str  # exploit | explore | migrate


def _claim_run(engine: Engine, run_id: int, run_name: str):
    """On PostgreSQL, a connection holding the run's writer lock (None elsewhere). A second
    writer, from any host, is refused; the server drops the lock when its holder dies."""
    if engine.dialect.name != "postgresql":
        return None
    conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    if not conn.execute(text("SELECT pg_try_advisory_lock(:k, :run)"), {"k": LOCKS, "run": run_id}).scalar():
        conn.close()
        raise RunInUse(f"run {run_name!r} (id {run_id}) in {engine.url.render_as_string(hide_password=True)} "
                       "is being written by another process; one process writes a run")
    return conn


class ProgramDatabase:
    def __init__(self, engine: Engine, run_id: int, axes: list[Descriptor], search: Search):
        self.engine = engine
        self.session = Session(engine, expire_on_commit=False)
        self.run_id = run_id
        self.axes = axes
        self.search = search
        self.archive = Archive(search)
        self._batch = 0  # > 0: inside batch(), commits wait for its end
        self.writer = None  # PostgreSQL: the connection that holds the run's writer lock
        self._load()

    # ---- opening -------------------------------------------------------------------
    @classmethod
    def open(cls, url: str, run_name: str, problem_yaml: str, policy_yaml: str, seed: int,
             axes: list[Descriptor], search: Search, problem_name: str) -> "ProgramDatabase":
        """Open (migrating) the database and its run, creating the run on first use."""
        refuse_newer_schema(url)  # before connect(): switching to WAL is already a write
        engine = connect(url)
        migrate(engine)
        with Session(engine) as s:
            run = s.scalars(select(Run).where(Run.name == run_name)).first()
            if run is None:
                run = Run(name=run_name, problem=problem_name, problem_yaml=problem_yaml,
                          policy_yaml=policy_yaml, seed=seed)
                s.add(run)
                s.flush()
                s.add_all(Island(run_id=run.id, island=i, generation=0, last_migration=0)
                          for i in range(search.islands))
                s.add(PolicyVersion(run_id=run.id, version=0, model="base"))
                s.commit()
            run_id = run.id
        writer = _claim_run(engine, run_id, run_name)
        db = cls(engine, run_id, axes, search)
        db.writer = writer
        return db

    def _load(self) -> None:
        rows = self.session.execute(
            select(Program.id, Program.island, Program.objective)
            .where(Program.run_id == self.run_id, Program.status == "ok")
            .order_by(Program.id))
        islands = self.archive.islands
        for pid, island, objective in rows:
            islands[island].add(pid, objective or 0.0)  # an ok program has an objective
        for c in self.session.scalars(select(Cell).where(Cell.run_id == self.run_id)):
            islands[c.island].elites[c.cell] = (c.program_id, c.objective)
        for isl in self.session.scalars(select(Island).where(Island.run_id == self.run_id)):
            islands[isl.island].generation = isl.generation
            islands[isl.island].last_migration = isl.last_migration

    @contextmanager
    def batch(self):
        """One transaction for several stores: a kill leaves all of them or none."""
        self._batch += 1
        try:
            yield
        except BaseException:
            self._batch -= 1
            if not self._batch:
                self.session.rollback()
            raise
        self._batch -= 1
        self._commit()

    def _commit(self) -> None:
        if not self._batch:
            self.session.commit()

    def close(self) -> None:
        self.session.close()
        if self.writer is not None:  # the run's advisory lock goes with its connection
            self.writer.close()
            self.writer = None
        self.engine.dispose()

    # ---- queries -------------------------------------------------------------------
    @property
    def run(self) -> Run:
        return found(self.session.get(Run, self.run_id), f"run {self.run_id}")

    def get(self, pid: int) -> Program:
        return found(self.session.get(Program, pid), f"program #{pid}")

    def count(self, *statuses: str) -> int:
        q = select(func.count(Program.id)).where(Program.run_id == self.run_id)
        if statuses:
            q = q.where(Program.status.in_(statuses))
        return self.session.scalar(q) or 0

    def evaluations_done(self) -> int:
        """The budget's unit, counted by evolve/store/counts.py."""
        return evaluations_done(self.session, self.run_id)

    def llm_calls_done(self) -> int:
        """Calls that count: an interrupted call is redone on resume, with the same seed."""
        return self.session.scalar(select(func.count(LLMCall.id)).where(
            LLMCall.run_id == self.run_id, LLMCall.error.is_distinct_from("cancelled"))) or 0

    def best(self) -> Program | None:
        return self.session.scalars(
            select(Program).where(Program.run_id == self.run_id, Program.status == "ok")
            .order_by(Program.objective.desc(), Program.id).limit(1)).first()

    def seed(self, island: int) -> Program:
        return found(self.session.scalars(select(Program).where(
            Program.run_id == self.run_id, Program.island == island, Program.origin == "seed")).first(),
            f"the seed of island {island}")

    def find_duplicate(self, code: str) -> Program | None:
        return self.session.scalars(
            select(Program).where(Program.run_id == self.run_id, Program.code_hash == code_hash(code),
                                  Program.status.in_(EVALUATED)).order_by(Program.id).limit(1)).first()

    def run_seed(self) -> int:
        return self.run.seed

    def policy_version(self) -> PolicyVersion:
        return found(self.session.scalars(
            select(PolicyVersion).where(PolicyVersion.run_id == self.run_id)
            .order_by(PolicyVersion.version.desc()).limit(1)).first(), "a policy version")

    # ---- ask -----------------------------------------------------------------------
    def ask(self, island: int, rng: np.random.Generator) -> Ask:
        """The archive's pick of a parent and inspirations (evolve/archive.py), as programs."""
        pick = self.archive.pick(island, rng)
        parent = self.seed(island) if pick.parent is None else self.get(pick.parent)
        return Ask(island, parent, [self.get(pid) for pid in pick.inspirations], pick.how)

    # ---- tell ----------------------------------------------------------------------
    def tell(self, program: Program, evaluation: Evaluation | None = None) -> bool:
        """Store a child (any status) and let an ok one compete for its cell; True if it took it."""
        program.run_id = self.run_id
        if program.code is not None and program.code_hash is None:
            program.code_hash = code_hash(program.code)
        self.session.add(program)
        self.session.flush()  # assigns the id the cell and the evaluation point to
        return self.tell_result(program, evaluation)

    def tell_result(self, program: Program, evaluation: Evaluation | None = None) -> bool:
        """Record the evaluation of a stored (pending) child and let it compete for its cell."""
        if program.status == "ok" and program.descriptors is not None:
            program.cell = cell_of(program.descriptors, self.axes)
        if program.status in EVALUATED and program.parent_id is not None and program.origin != "migration":
            program.outcome = "same" if program.duplicate_of is not None else \
                outcome(program, self._compared_with(program))
        if evaluation is not None:
            evaluation.program_id = program.id
            self.session.add(evaluation)
        placed = self._place(program)
        self._commit()
        return placed

    def _compared_with(self, program: Program) -> Program:
        """The program a child's outcome is judged against: its parent; for a repair, the last
        working program of its lineage (the broken answers it mends are no yardstick)."""
        if program.origin == "repair":
            return self.working_ancestor(program)
        return self.get(cast(int, program.parent_id))  # (tell_result asks only for a child)

    def working_ancestor(self, program: Program) -> Program:
        """The nearest ancestor that ran and passed, past broken answers and failed repairs."""
        parent = self.get(cast(int, program.parent_id))
        while parent.status != "ok" and parent.parent_id is not None:
            parent = self.get(parent.parent_id)
        return parent

    def call_of(self, program: Program) -> int | None:
        """The LLM call whose answer made this program (None: not an LLM answer)."""
        if program.completion_id is None:
            return None
        return found(self.session.get(Completion, program.completion_id), "completion").call_id

    def _place(self, program: Program) -> bool:
        if program.status != "ok":
            return False
        if not self.archive.place(program.id, program.island, program.objective or 0.0, program.cell):
            return False
        self.session.merge(Cell(run_id=self.run_id, island=program.island, cell=program.cell,
                                program_id=program.id, objective=program.objective))
        return True

    def add_seed(self, program: Program) -> list[Program]:
        """The evaluated seed starts every island (one row per island, so lineages stay per island)."""
        copies = []
        for island in range(len(self.archive.islands)):
            copy = _clone(program, island=island, origin="seed", parent_id=None)
            self.tell(copy)
            copies.append(copy)
        return copies

    def add_call(self, call: LLMCall) -> LLMCall:
        call.run_id = self.run_id
        self.session.add(call)
        self.session.flush()  # its id, for the completions
        self._commit()
        return call

    def add(self, *rows) -> None:
        self.session.add_all(rows)
        self.session.flush()
        self._commit()

    # ---- sessions of the run ---------------------------------------------------------------
    def end_session(self, session: RunSession, reason: str) -> None:
        """Record how a session ended, if the database still takes writes (disk full: it may not)."""
        try:
            self.session.rollback()  # whatever a failure left half-done is not kept
            session.ended_at, session.stop_reason = time.time(), reason
            self.session.merge(session)
            self.session.commit()
        except Exception as exc:  # noqa: BLE001 - the run is stopping for this very reason
            if fault_of(exc) is None:
                raise
            self.session.rollback()

    def past_wall_time(self, current: int) -> float:
        """Wall time of the other sessions; one killed with -9 counts up to its last heartbeat."""
        rows = self.session.execute(select(RunSession.started_at, RunSession.ended_at, RunSession.heartbeat_at)
                                    .where(RunSession.run_id == self.run_id, RunSession.id != current))
        return sum(map(session_seconds, rows))

    def turns(self) -> list[Turn]:
        """The run's cycles of turns between the LLM and tuning, oldest first."""
        return list(self.session.scalars(select(Turn).where(Turn.run_id == self.run_id).order_by(Turn.id)))

    def tunings_of(self, parent_id: int) -> int:
        """How many times this program was tuned (each tuning draws its own optimiser seed)."""
        return self.session.execute(select(func.count()).select_from(Tuning)
                                    .where(Tuning.run_id == self.run_id, Tuning.parent_id == parent_id)).scalar() or 0

    def pending(self) -> list[Program]:
        """Children stored but not evaluated (a session stopped first), oldest first."""
        return list(self.session.scalars(select(Program).where(
            Program.run_id == self.run_id, Program.status == "pending").order_by(Program.id)))

    def unflushed(self):
        """A block in which reads do not flush pending changes (e.g. a child read before its result)."""
        return self.session.no_autoflush

    # ---- what the RL hook reads ------------------------------------------------------------
    def calls_of(self, version: int, since: float | None = None) -> int:
        """Answered LLM calls made by a policy version (after `since`, if given)."""
        query = select(func.count(LLMCall.id)).where(
            LLMCall.run_id == self.run_id, LLMCall.policy_version == version, LLMCall.error.is_(None))
        if since is not None:
            query = query.where(LLMCall.started_at > since)
        return self.session.scalar(query) or 0

    def rollout_rows(self, version: int | None = None, logprobs: bool = False) -> "RolloutRows":
        return rollout_rows(self.session, self.run_id, version, logprobs)

    def last_guard(self) -> dict | None:
        """The guard's record of the run's latest training step that has one."""
        records = self.session.scalars(select(TrainingStep.guard).where(TrainingStep.run_id == self.run_id)
                                       .order_by(TrainingStep.id.desc()))
        return next((r for r in records if r), None)

    def unasked_elites(self) -> list[Program]:
        """Elites that no LLM call had as its parent, and no copy of the seed."""
        used = select(LLMCall.parent_id).where(LLMCall.run_id == self.run_id)
        seeds = select(Program.code_hash).where(Program.run_id == self.run_id, Program.origin == "seed")
        return list(self.session.scalars(
            select(Program).join(Cell, Cell.program_id == Program.id)
            .where(Program.run_id == self.run_id, Program.origin != "seed", Program.id.not_in(used),
                   Program.code_hash.not_in(seeds)).order_by(Program.id)))

    # ---- generations and migration -------------------------------------------------------
    def advance(self, island: int) -> Program | None:
        """Count one generation on the island and store the archive's migration, if it makes one
        (a copy of the island's best on the next island: no re-evaluation). Returns the migrant."""
        migration = self.archive.advance(island)
        migrant = None
        with self.batch():  # the migrant and the island's counters together
            if migration is not None:
                migrant = _clone(self.get(migration.source), island=migration.target, origin="migration",
                                 parent_id=migration.source)
                self.tell(migrant)
            idx = self.archive.islands[island]
            row = found(self.session.get(Island, (self.run_id, island)), f"island {island}")
            row.generation, row.last_migration = idx.generation, idx.last_migration
        return migrant


T = TypeVar("T")


def found(row: T | None, what: str) -> T:
    """A row the run must have (its own run, a program an id came from): missing is a bug."""
    if row is None:
        raise LookupError(f"{what} is not in the database")
    return row


def outcome(child: Program, parent: Program) -> str:
    """better: a higher objective than the parent; same: the parent's very outputs (its raw
    scores), which is no progress whatever the code says; worse: anything else. (A duplicate
    of any stored program is `same` too: it found nothing new.)"""
    if child.status != "ok":
        return "worse"
    if parent.status == "ok" and child.raw == parent.raw and child.descriptors == parent.descriptors:
        return "same"
    if parent.status != "ok" or (child.objective or 0.0) > (parent.objective or 0.0):
        return "better"
    return "worse"


def _clone(p: Program, **changes) -> Program:
    fields = dict(code=p.code, code_hash=p.code_hash, status=p.status, error=p.error, fitness=p.fitness,
                  raw=p.raw, objective=p.objective, headline=p.headline, descriptors=p.descriptors,
                  generation=p.generation, island=p.island)
    fields.update(changes)
    return Program(**fields)


@dataclass
class RolloutRows:
    """A run's answered calls with their completions and children: what rollouts are made of."""
    calls: list[LLMCall]
    completions: dict[int, list[Completion]]  # call id -> its completions, by index
    children: dict[int, list[Program]]  # completion id -> its children, by answer index
    logprobs: bool = False  # the completions' sampler log-probs were read
    parents: dict[int, Program] = field(default_factory=dict)  # call id -> the parent it showed


def rollout_rows(session: Session, run_id: int, version: int | None = None, logprobs: bool = False) -> RolloutRows:
    """Read in three queries (any session: the engine's, or a view's read-only one); `logprobs`:
    also the sampler's token log-probs (a run of an older schema has none)."""
    query = select(LLMCall).where(LLMCall.run_id == run_id, LLMCall.error.is_(None))
    if version is not None:
        query = query.where(LLMCall.policy_version == version)
    calls = list(session.scalars(query.order_by(LLMCall.id)))
    rows = RolloutRows(calls, {}, {}, logprobs)
    if not calls:
        return rows
    completions = select(Completion).where(Completion.call_id.in_([c.id for c in calls]))
    if logprobs:
        completions = completions.options(undefer(Completion.logprobs))
    for completion in session.scalars(completions.order_by(Completion.call_id, Completion.index)):
        rows.completions.setdefault(completion.call_id, []).append(completion)
    ids = [c.id for cs in rows.completions.values() for c in cs]
    for child in session.scalars(select(Program).where(Program.completion_id.in_(ids))
                                 .order_by(Program.answer_index)):
        if child.completion_id is not None:
            rows.children.setdefault(child.completion_id, []).append(child)
    parents = {p.id: p for p in session.scalars(select(Program).where(Program.id.in_({c.parent_id for c in calls})))}
    rows.parents = {c.id: parents[c.parent_id] for c in calls if c.parent_id in parents}
    return rows
