"""A read-only picture of a run, built from its database: what the dashboard and `status` show.

`RunReader` opens its own read-only connection (never the engine's session, never a
migration) and keeps running totals, so each refresh reads only the rows added since the
last one plus a few small tables: the cost per refresh stays flat as the archive grows.
`RunReader.snapshot()` returns a `Snapshot`, a plain immutable value that the render
functions in evolve/views/dashboard.py turn into rich renderables.
"""
from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import yaml
from pydantic import ValidationError
from sqlalchemy import case, func, inspect, select, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DatabaseError

from evolve.config import Problem
from evolve.rundir import InspectError, RunDir
from evolve.store.connection import readonly_engine
from evolve.store.counts import LLM_ORIGINS, evaluation_units
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
)
from evolve.store.schema import Session as RunSession

WINDOW_S = 300.0  # throughput is measured over the last five minutes of activity
FAILED = ("invalid", "error", "timeout")
NOT_MADE = ("seed", "migration")  # origins of programs no operator made
# How views name an operator's children (evolve/search/operator.py: an operator's `origin`);
# an origin not listed here is shown by its own name.
LABELS = {"mutation": "LLM", "repair": "LLM repair", "tuned": "tuned"}


# ---- the snapshot ------------------------------------------------------------------------------
@dataclass(frozen=True)
class IslandRow:
    island: int
    programs: int  # every program stored on the island, failures included
    ok: int
    cells: int
    best_id: int | None
    best_objective: float | None
    best_headline: float | None
    mean_objective: float | None  # over the island's valid programs
    generation: int
    last_migration: int  # the island generation of its last migration (0: none yet)
    since_improvement: int  # generations (groups) finished on the island since its best appeared


@dataclass(frozen=True)
class Best:
    id: int
    island: int
    generation: int
    headline: float | None
    objective: float
    cell: tuple | None  # its MAP-Elites cell, as bin indices
    fitness: dict  # component -> normalised value
    raw: dict  # component -> raw scorer value


@dataclass(frozen=True)
class Throughput:
    window_s: float  # the span the rates are measured over
    llm_calls_per_s: float
    tokens_per_s: float
    answers_per_s: float  # the LLM's answers (issue 60 counts them per minute)
    evals_per_s: float
    valid_diff_rate: float | None  # answers that applied as a diff, of all answers
    failure_rates: dict  # invalid/error/timeout -> share of the window's evaluations


@dataclass(frozen=True)
class OperatorRates:
    """What one operator's evaluated children did against their parents."""
    evaluated: int
    better: int  # a higher objective than the parent: the number that says a search is alive
    same: int  # the parent's very outputs, or a copy of a stored program: no progress
    trials: int  # tuning only: every scored variant (the budget it spent)

    @property
    def improving_rate(self) -> float | None:
        return self.better / self.evaluated if self.evaluated else None

    @property
    def same_rate(self) -> float | None:
        return self.same / self.evaluated if self.evaluated else None


@dataclass(frozen=True)
class RLStatus:
    trains: bool  # the policy YAML has a `train:` section
    algorithm: str | None
    steps: int
    version: int  # the newest policy version (0 = base model)
    adapter: str | None
    train_s: float  # training plus hot-loading, all steps
    last: dict | None  # the newest training step's columns
    versions: tuple = ()  # VersionRates per policy version, oldest first (runs that train)


@dataclass(frozen=True)
class Rates:
    """The mutator's quality over a set of calls: one policy version (does learning help?) or
    one model of an ensemble."""
    calls: int
    answers: int  # mutation children asked for (one per answer)
    applied: int  # the answer applied to its parent
    valid: int  # ... and its child scored (status ok)
    better: int  # ... and beat its parent (the improving-children rate)
    same: int  # its child was its parent again (the same outputs) or a stored program
    tokens: int
    llm_s: float  # summed latency of its calls

    def rate(self, count: int) -> float | None:
        return count / self.answers if self.answers else None

    @property
    def tokens_per_s(self) -> float | None:
        return self.tokens / self.llm_s if self.llm_s > 0 else None


@dataclass(frozen=True)
class VersionRates(Rates):
    version: int = 0


@dataclass(frozen=True)
class ModelRates(Rates):
    model: str = ""


@dataclass(frozen=True)
class Axis:
    name: str
    low: float
    high: float
    bins: int


@dataclass(frozen=True)
class Snapshot:
    taken_at: float
    run_dir: str
    run: str
    problem: str
    headline: str  # the headline component's name
    components: tuple[str, ...]
    reference: float | None  # the headline component's reference value, if it has one
    seed: int
    policy: str
    model: str
    state: str  # starting | running | stopped: <reason>
    elapsed_s: float
    evaluations: int  # evaluated candidates, the budget's unit
    budget: int
    llm_calls: int
    max_llm_calls: int | None
    tokens: int
    llm_s: float  # summed latency of the calls (tok/s while a call is in flight)
    sessions: int
    eta_s: float | None
    children: dict  # mutation children by status
    islands: tuple[IslandRow, ...]
    axes: tuple[Axis, ...]
    cells: dict  # island -> {(i, j, ...): objective}
    best: Best | None
    seed_headline: float | None
    # at each new best: (evaluations so far, headline, objective, program id, time it was scored)
    series: tuple[tuple[int, float | None, float, int, float], ...]
    throughput: Throughput
    rl: RLStatus
    operators: dict  # origin (mutation | tuned) -> OperatorRates
    backend: str = ""  # the sandbox of the latest evaluation (docker | process)
    models: tuple = ()  # ModelRates per model, where an ensemble's calls came from several

    @property
    def valid_diff_rate(self) -> float | None:
        answers = sum(self.children.values())
        return (answers - self.children.get("mutation_failed", 0)) / answers if answers else None


# ---- the reader --------------------------------------------------------------------------------
@dataclass
class _IslandAcc:
    programs: int = 0
    ok: int = 0
    objective_sum: float = 0.0
    best: tuple | None = None  # (objective, -id, id, headline, created_at)


class Childless(NamedTuple):
    """A tuning that stored no child, read like an evaluation row."""
    trials: int
    origin: str = "tuned"
    status: str = "none"
    backend: str = ""
    objective: float | None = None
    program: int | None = None
    headline: float | None = None


@dataclass
class _Acc:
    """Running totals over the rows read so far."""
    last_program: int = 0
    pending: set = field(default_factory=set)  # ids stored as pending: re-read until settled
    last_evaluation: int = 0
    last_tuning: int = 0
    last_call: int = 0
    islands: dict = field(default_factory=dict)
    children: dict = field(default_factory=dict)
    evaluations: int = 0
    best: tuple | None = None  # (objective, -id, id, headline)
    seed_headline: float | None = None
    series: list = field(default_factory=list)
    calls: int = 0
    tokens: int = 0
    llm_s: float = 0.0
    call_starts: dict = field(default_factory=dict)  # island -> sorted start times of answered calls
    recent_calls: deque = field(default_factory=deque)  # (end time, tokens)
    recent_evals: deque = field(default_factory=deque)  # (end time, status)
    recent_answers: deque = field(default_factory=deque)  # (created, applied?)
    recent_trials: deque = field(default_factory=deque)  # (end time, trials) of finished tunings
    outcomes: dict = field(default_factory=dict)  # (origin, outcome) -> evaluated children
    trials: int = 0
    backend: str = ""
    last_activity: float = 0.0


@dataclass(frozen=True)
class PolicyFacts:
    """The few facts of a run's policy that are shown."""
    name: str
    model: str
    algorithm: str | None  # None: a frozen policy
    ensemble: bool

    @classmethod
    def of(cls, policy: dict) -> "PolicyFacts":
        train = policy.get("train")
        return cls(str(policy.get("name", "?")), str(policy.get("model", "?")),
                   train.get("algorithm", "?") if isinstance(train, dict) else None, bool(policy.get("ensemble")))


class RunReader:
    """Reads one run's database read-only; `snapshot()` is cheap after the first call."""

    def __init__(self, run_dir: Path, spec: dict, engine: Engine | None = None):
        self.run_dir = Path(run_dir)
        self.spec = spec
        self._engine = engine
        self.run_id: int | None = None
        self.acc = _Acc()
        self._tables: set[str] = set()
        self._beats: bool | None = None  # sessions.heartbeat_at exists (revision 0004)
        self._step_columns: set[str] | None = None  # training_steps' columns (0005-0007 added some)
        self._best_detail: Best | None = None

    # -- connection ---------------------------------------------------------------------------
    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = readonly_engine(RunDir(self.run_dir).database_url(self.spec))
        return self._engine

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()

    def ready(self) -> bool:
        """True once the run's row exists (`evolve run` creates the database after the dashboard)."""
        if self.run_id is not None:
            return True
        try:
            self.engine
        except InspectError:  # no database file yet: try again next time
            return False
        try:
            self._open_run()
        except DatabaseError:  # being created right now (no tables yet, or a header half-written)
            return False
        return self.run_id is not None

    def _open_run(self) -> None:
        with self.engine.connect() as conn:
            self._tables = set(inspect(conn).get_table_names())
            if "runs" not in self._tables:
                return
            name = self.spec.get("run_name") or self.run_dir.resolve().name
            run = conn.execute(select(Run.id, Run.problem_yaml, Run.policy_yaml, Run.seed)
                               .where(Run.name == name)).first()
            run = run or conn.execute(select(Run.id, Run.problem_yaml, Run.policy_yaml, Run.seed)
                                      .order_by(Run.id).limit(1)).first()
        if run is None:
            return
        self.problem = _parse_problem(run.problem_yaml)
        # Only a few facts of the policy are shown: read leniently, so a run made with an
        # older or newer policy schema still opens.
        self.policy = PolicyFacts.of(yaml.safe_load(run.policy_yaml) or {})
        self.seed = run.seed
        self.run_name = name
        self.run_id = run.id

    # -- refresh ------------------------------------------------------------------------------
    def snapshot(self, now: float | None = None) -> Snapshot | None:
        """A fresh snapshot, or None while the run's database does not exist yet."""
        if not self.ready():
            return None
        now = time.time() if now is None else now
        with self.engine.connect() as conn:
            self._read_programs(conn)
            self._read_evaluations(conn)
            self._read_calls(conn)
            small = self._read_small_tables(conn)
        return self._build(now, **small)

    def _read_programs(self, conn) -> None:
        # Keyed on the primary key only: a run_id condition makes SQLite walk the whole
        # (run_id, island) index instead, which is what would grow with the archive.
        acc = self.acc
        cols = (Program.id, Program.run_id, Program.island, Program.origin, Program.status, Program.objective,
                Program.headline, Program.created_at,
                Program.outcome if self.has_table("tunings") else text("NULL AS outcome"))
        rows = []
        if acc.pending:  # stored pending earlier: have they been scored since?
            rows += conn.execute(select(*cols).where(Program.id.in_(sorted(acc.pending)))).all()
        rows += conn.execute(select(*cols).where(Program.id > acc.last_program).order_by(Program.id)).all()
        for row in rows:
            if row.run_id != self.run_id:  # a database shared by several runs
                acc.last_program = max(acc.last_program, row.id)
                continue
            isl = acc.islands.setdefault(row.island, _IslandAcc())
            child = row.origin == "mutation"
            if row.id > acc.last_program:  # first sight: it counts in the island's size at once
                acc.last_program = row.id
                isl.programs += 1
                if child:
                    acc.recent_answers.append((row.created_at, row.status != "mutation_failed"))
                    if row.status == "pending":
                        _bump(acc.children, "pending", 1)
            elif row.id in acc.pending and row.status != "pending" and child:
                _bump(acc.children, "pending", -1)  # settled since the last refresh
            if row.status == "pending":
                acc.pending.add(row.id)
                continue
            acc.pending.discard(row.id)
            self._count_settled(row, isl)

    def _count_settled(self, row, isl: _IslandAcc) -> None:
        """A program whose outcome is known: counted once, whether it was read pending or not."""
        acc = self.acc
        if row.origin == "mutation":
            _bump(acc.children, row.status, 1)
        if row.origin not in NOT_MADE and row.status not in ("pending", "mutation_failed"):
            _bump(acc.outcomes, (row.origin, row.outcome), 1)
        if row.status != "ok":
            return
        isl.ok += 1
        isl.objective_sum += row.objective
        key = (row.objective, -row.id, row.id, row.headline, row.created_at)
        if isl.best is None or key > isl.best:  # ties keep the older program, as the database does
            isl.best = key
        if row.origin == "seed" and acc.seed_headline is None:
            acc.seed_headline = row.headline
        self._touch(row.created_at)

    def _read_evaluations(self, conn) -> None:
        """Evaluations in the order they finished: the x axis of best-versus-evaluations. A tuned
        child's row stands for its tuning's trials; a tuning that stored no child is read from
        its own row (evolve/store/counts.py)."""
        acc = self.acc
        tunings = self.has_table("tunings")
        trials = Tuning.trials if tunings else text("NULL AS trials")
        query = (select(Evaluation.id, Evaluation.status, Evaluation.started_at, Evaluation.elapsed_s,
                        Evaluation.backend, Program.id.label("program"), Program.run_id, Program.origin, Program.objective,
                        Program.headline, trials)
                 .join(Program, Program.id == Evaluation.program_id))
        if tunings:
            query = query.outerjoin(Tuning, Tuning.child_id == Program.id)
        rows = conn.execute(  # no run_id condition here either: see _read_programs
            query.where(Evaluation.id > acc.last_evaluation).order_by(Evaluation.id)).all()
        if rows:
            acc.last_evaluation = rows[-1].id
        ran = [(row.started_at + row.elapsed_s, row) for row in rows if row.run_id == self.run_id]
        for end, row in sorted(ran + self._childless_tunings(conn), key=lambda item: item[0]):
            units = evaluation_units(row.origin, row.trials)
            acc.evaluations += units
            self._touch(end)
            if row.origin in LLM_ORIGINS:
                acc.recent_evals.append((end, row.status))
            elif row.origin == "tuned":
                acc.trials += units
                acc.recent_trials.append((end, units))
            acc.backend = row.backend or acc.backend
            if row.status == "ok" and (acc.best is None or (row.objective, -row.program) > acc.best[:2]):
                acc.best = (row.objective, -row.program, row.program, row.headline)
                acc.series.append((acc.evaluations, row.headline, row.objective, row.program, end))

    def _childless_tunings(self, conn) -> list:
        """The tunings that beat nothing since the last read, as (end, row) like an evaluation's."""
        if not self.has_table("tunings"):
            return []
        rows = conn.execute(select(Tuning.id, Tuning.trials, Tuning.started_at, Tuning.elapsed_s)
                            .where(Tuning.run_id == self.run_id, Tuning.id > self.acc.last_tuning,
                                   Tuning.child_id.is_(None)).order_by(Tuning.id)).all()
        if rows:
            self.acc.last_tuning = rows[-1].id
        return [(row.started_at + row.elapsed_s, Childless(row.trials)) for row in rows]

    def _read_calls(self, conn) -> None:
        acc = self.acc
        rows = conn.execute(
            select(LLMCall.id, LLMCall.island, LLMCall.started_at, LLMCall.latency_s,
                   LLMCall.completion_tokens, LLMCall.error)
            .where(LLMCall.run_id == self.run_id, LLMCall.id > acc.last_call).order_by(LLMCall.id))
        for row in rows:
            acc.last_call = row.id
            if row.error == "cancelled":  # redone on resume: not a call of the budget
                continue
            acc.calls += 1
            tokens = row.completion_tokens or 0
            acc.tokens += tokens
            acc.llm_s += row.latency_s or 0.0
            end = row.started_at + (row.latency_s or 0.0)
            acc.recent_calls.append((end, tokens))
            self._touch(end)
            if row.error is None:  # a failed call finishes no group: the island does not advance
                bisect.insort(acc.call_starts.setdefault(row.island, []), row.started_at)

    def _read_small_tables(self, conn) -> dict:
        """Tables that stay small however long the run: read whole on every refresh."""
        rid = self.run_id
        cells = conn.execute(select(Cell.island, Cell.cell, Cell.objective).where(Cell.run_id == rid)).all()
        islands = conn.execute(select(Island.island, Island.generation, Island.last_migration)
                               .where(Island.run_id == rid).order_by(Island.island)).all()
        beat = RunSession.heartbeat_at if self._heartbeats(conn) else text("NULL AS heartbeat_at")
        sessions = conn.execute(select(RunSession.started_at, RunSession.ended_at, RunSession.stop_reason, beat)
                                .where(RunSession.run_id == rid).order_by(RunSession.id)).all()
        version = conn.execute(select(PolicyVersion.version, PolicyVersion.adapter_path)
                               .where(PolicyVersion.run_id == rid)
                               .order_by(PolicyVersion.version.desc()).limit(1)).first()
        return {"cells": cells, "islands": islands, "sessions": sessions, "version": version,
                "training": self._read_training(conn), "versions": self._read_versions(conn),
                "models": self._read_models(conn)}

    def _heartbeats(self, conn) -> bool:
        """Whether sessions have heartbeats (revision 0004 on)."""
        if self._beats is None:
            self._beats = any(c["name"] == "heartbeat_at" for c in inspect(conn).get_columns("sessions"))
        return self._beats

    def _stored_step_columns(self, conn) -> set[str]:
        """The columns training steps have in this run's schema (an older one lacks the newer)."""
        if self._step_columns is None:
            self._step_columns = {c["name"] for c in inspect(conn).get_columns("training_steps")}
        return self._step_columns

    def has_table(self, table: str) -> bool:
        """Whether the schema has this table yet (a run from an older evolve may not)."""
        return table in self._tables

    def _read_versions(self, conn) -> tuple:
        """Per policy version: answers, applied, valid, improving, same, tokens/s (runs that train)."""
        if self.policy.algorithm is None or not self.has_table("tunings"):  # frozen, or no outcomes (< 0003)
            return ()
        return tuple(VersionRates(version=v, **r) for v, r in sorted(self._rates(conn, LLMCall.policy_version).items()))

    def _read_models(self, conn) -> tuple:
        """Per model, where an ensemble's calls came from more than one."""
        if not self.policy.ensemble or not self.has_table("tunings"):
            return ()
        rates = self._rates(conn, LLMCall.model)
        return tuple(ModelRates(model=m, **r) for m, r in sorted(rates.items())) if len(rates) > 1 else ()

    def _rates(self, conn, key) -> dict:
        """Rates fields of the run's calls grouped by `key` (an LLMCall column)."""
        rid = self.run_id
        calls = {r.key: r for r in conn.execute(
            select(key.label("key"), func.count(LLMCall.id).label("calls"),
                   func.coalesce(func.sum(LLMCall.completion_tokens), 0).label("tokens"),
                   func.coalesce(func.sum(LLMCall.latency_s), 0.0).label("llm_s"))
            .where(LLMCall.run_id == rid, LLMCall.error.is_(None)).group_by(key))}
        kids = {r.key: r for r in conn.execute(
            select(key.label("key"), func.count(Program.id).label("answers"),
                   func.sum(case((Program.status != "mutation_failed", 1), else_=0)).label("applied"),
                   func.sum(case((Program.status == "ok", 1), else_=0)).label("valid"),
                   func.sum(case((Program.outcome == "better", 1), else_=0)).label("better"),
                   func.sum(case((Program.outcome == "same", 1), else_=0)).label("same"))
            .join(Completion, Completion.id == Program.completion_id)
            .join(LLMCall, LLMCall.id == Completion.call_id)
            .where(LLMCall.run_id == rid, Program.origin == "mutation").group_by(key))}
        return {k: dict(calls=c.calls, tokens=int(c.tokens), llm_s=float(c.llm_s),
                        **{f: int(getattr(kids.get(k), f, 0) or 0) for f in ("answers", "applied", "valid", "better", "same")})
                for k, c in calls.items()}

    def _read_training(self, conn) -> tuple[int, float, dict | None]:
        if not self.has_table("training_steps"):  # an older schema (revision 0001), or not yet
            self._tables = set(inspect(conn).get_table_names())
            if not self.has_table("training_steps"):
                return 0, 0.0, None
        rid = self.run_id
        count, spent = conn.execute(
            select(func.count(TrainingStep.id),
                   func.sum(TrainingStep.train_s + func.coalesce(TrainingStep.load_s, 0.0)))
            .where(TrainingStep.run_id == rid)).one()
        columns = [c for c in TrainingStep.__table__.columns if c.name in self._stored_step_columns(conn)]
        last = conn.execute(select(*columns).where(TrainingStep.run_id == rid)
                            .order_by(TrainingStep.id.desc()).limit(1)).mappings().first()
        return count, spent or 0.0, dict(last) if last else None

    def _touch(self, t: float) -> None:
        self.acc.last_activity = max(self.acc.last_activity, t)

    # -- assembling ---------------------------------------------------------------------------
    def _build(self, now, cells, islands, sessions, version, training, versions=(), models=()) -> Snapshot:
        acc = self.acc
        state, elapsed, live = _session_state(sessions, now)
        budget = self.spec.get("budget", {})
        max_evals = budget.get("max_evaluations") or self.problem.budget.max_evaluations
        max_calls = budget.get("max_llm_calls") or self.problem.budget.max_llm_calls
        through = self._throughput(now if live else acc.last_activity,
                                   sessions[-1].started_at if sessions else None)
        left = max(max_evals - acc.evaluations, 0)
        eta = left / through.evals_per_s if (live and through.evals_per_s > 0) else None
        wall = budget.get("wall_time_s") or self.problem.budget.wall_time_s
        if live and wall is not None:  # whichever budget runs out first
            eta = min(eta if eta is not None else float("inf"), max(wall - elapsed, 0.0))
        steps, spent, last = training
        return Snapshot(
            taken_at=now, run_dir=str(self.run_dir), run=self.run_name, problem=self.problem.name,
            headline=self.problem.headline, components=tuple(c.name for c in self.problem.components),
            reference=next((c.reference for c in self.problem.components if c.name == self.problem.headline), None),
            seed=self.seed, policy=self.policy.name, model=self.policy.model, state=state,
            elapsed_s=elapsed, evaluations=acc.evaluations, budget=max_evals, llm_calls=acc.calls,
            max_llm_calls=max_calls, tokens=acc.tokens, llm_s=acc.llm_s, sessions=len(sessions), eta_s=eta, children=dict(acc.children),
            islands=self._island_rows(cells, islands), axes=self._axes(), cells=_cell_map(cells),
            best=self._best(), seed_headline=acc.seed_headline, series=tuple(acc.series),
            throughput=through,
            rl=RLStatus(trains=self.policy.algorithm is not None, algorithm=self.policy.algorithm,
                        steps=steps, version=version.version if version else 0,
                        adapter=version.adapter_path if version else None, train_s=spent, last=last,
                        versions=versions),
            operators=self._operators(), backend=acc.backend, models=models)

    def _operators(self) -> dict:
        """Rates per operator that made children in this run (or tuned, if only to beat nothing),
        the LLM's first."""
        made = {k[0] for k in self.acc.outcomes} | {"mutation"} | ({"tuned"} if self.acc.trials else set())
        origins = sorted(made, key=lambda o: (o != "mutation", o))
        out = {}
        for origin in origins:
            counts = {k[1]: v for k, v in self.acc.outcomes.items() if k[0] == origin}
            out[origin] = OperatorRates(evaluated=sum(counts.values()), better=counts.get("better", 0),
                                        same=counts.get("same", 0),
                                        trials=self.acc.trials if origin == "tuned" else 0)
        return out

    def _axes(self) -> tuple[Axis, ...]:
        return tuple(Axis(d.name, d.low, d.high, d.bins) for d in self.problem.descriptors)

    def _island_rows(self, cells, islands) -> tuple[IslandRow, ...]:
        per_island: dict[int, int] = {}
        for c in cells:
            per_island[c.island] = per_island.get(c.island, 0) + 1
        rows = []
        for isl in islands:
            acc = self.acc.islands.get(isl.island, _IslandAcc())
            best = acc.best
            starts = self.acc.call_starts.get(isl.island, [])
            since = len(starts) - bisect.bisect_right(starts, best[4]) if best else 0
            rows.append(IslandRow(
                island=isl.island, programs=acc.programs, ok=acc.ok, cells=per_island.get(isl.island, 0),
                best_id=best[2] if best else None, best_objective=best[0] if best else None,
                best_headline=best[3] if best else None,
                mean_objective=acc.objective_sum / acc.ok if acc.ok else None,
                generation=isl.generation, last_migration=isl.last_migration,
                since_improvement=min(since, isl.generation)))
        return tuple(rows)

    def _best(self) -> Best | None:
        """The best program's vector fitness: read again only when the best changes."""
        if self.acc.best is None:
            return None
        pid = self.acc.best[2]
        if self._best_detail is None or self._best_detail.id != pid:
            with self.engine.connect() as conn:
                p = conn.execute(select(Program.id, Program.island, Program.generation, Program.headline,
                                        Program.objective, Program.cell, Program.fitness, Program.raw)
                                 .where(Program.id == pid)).one()
            cell = tuple(int(i) for i in p.cell.split(",")) if p.cell else None
            self._best_detail = Best(p.id, p.island, p.generation, p.headline, p.objective, cell,
                                     p.fitness or {}, p.raw or {})
        return self._best_detail

    def _throughput(self, end: float, session_start: float | None) -> Throughput:
        acc = self.acc
        start = end - WINDOW_S
        for q in (acc.recent_calls, acc.recent_evals, acc.recent_answers, acc.recent_trials):
            while q and q[0][0] < start:  # older than the window: never needed again
                q.popleft()
        if session_start is not None:
            start = max(start, session_start)  # rates of this session, not of a pause between two
        span = max(end - start, 1.0)
        calls = [c for c in acc.recent_calls if c[0] >= start]
        evals = [e[1] for e in acc.recent_evals if e[0] >= start]
        trials = sum(t for end, t in acc.recent_trials if end >= start)
        answers = [a[1] for a in acc.recent_answers if a[0] >= start]
        return Throughput(
            window_s=span, llm_calls_per_s=len(calls) / span,
            tokens_per_s=sum(t for _, t in calls) / span, answers_per_s=len(answers) / span,
            evals_per_s=(len(evals) + trials) / span,
            valid_diff_rate=sum(answers) / len(answers) if answers else None,
            failure_rates={s: evals.count(s) / len(evals) for s in FAILED} if evals else {})


def _bump(counts: dict, key: object, by: int) -> None:
    counts[key] = counts.get(key, 0) + by
    if not counts[key]:
        del counts[key]


def _session_state(sessions, now: float) -> tuple[str, float, bool]:
    """(state, wall time summed over sessions, whether a session is open)."""
    if not sessions:
        return "starting", 0.0, True
    last = sessions[-1]
    # An earlier session that never ended was killed: it counts up to its last heartbeat.
    elapsed = sum((s.ended_at or (now if s is last else s.heartbeat_at or s.started_at)) - s.started_at
                  for s in sessions)
    if last.ended_at is None:
        return "running", elapsed, True
    return f"stopped: {last.stop_reason}", elapsed, False


def _cell_map(cells) -> dict:
    grid: dict[int, dict[tuple, float]] = {}
    for c in cells:
        grid.setdefault(c.island, {})[tuple(int(i) for i in c.cell.split(","))] = c.objective
    return grid


def _parse_problem(text_: str) -> Problem:
    """The run's own problem YAML snapshot (the files it names need not exist here)."""
    try:
        return Problem.model_validate(yaml.safe_load(text_))
    except (ValidationError, yaml.YAMLError) as exc:
        raise InspectError(f"the run's problem YAML no longer validates: {exc}".splitlines()[0]) from None
