"""The program database's tables (SQLAlchemy 2 ORM).

The schema itself is owned by the Alembic migrations in `db/`; these classes must
match them (tests/store/test_database.py checks that autogenerate finds no difference).
"""
from __future__ import annotations

import time
from typing import Any

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


def now() -> float:
    return time.time()


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Run(Base):
    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200))
    problem: Mapped[str] = mapped_column(String(200))
    problem_yaml: Mapped[str] = mapped_column(Text)  # snapshot: a resume uses exactly this
    policy_yaml: Mapped[str] = mapped_column(Text)
    seed: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[float] = mapped_column(Float, default=now)


class Session(Base):
    """One stretch of `evolve run`/`resume` on a run: wall-clock accounting and resume history."""
    __tablename__ = "sessions"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    started_at: Mapped[float] = mapped_column(Float, default=now)
    ended_at: Mapped[float | None] = mapped_column(Float)
    stop_reason: Mapped[str | None] = mapped_column(String(200))
    # With every commit of results: a session killed with -9 never sets ended_at, and counts
    # in the wall-time budget up to its last heartbeat. Deferred: older schemas lack it.
    heartbeat_at: Mapped[float | None] = mapped_column(Float, deferred=True)


class PolicyVersion(Base):
    """Version 0 is the base model; each trained adapter adds one."""
    __tablename__ = "policy_versions"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    version: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(300))  # the name requests are routed to
    adapter_path: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float, default=now)


class LLMCall(Base):
    """One request: a prompt built from one parent, answered by a group of `n` completions."""
    __tablename__ = "llm_calls"
    id: Mapped[int] = mapped_column(primary_key=True)  # doubles as the group id
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    island: Mapped[int] = mapped_column(Integer)
    parent_id: Mapped[int] = mapped_column(Integer)  # no FK: programs already point here (no cycle)
    policy_version: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(300))
    prompt: Mapped[str] = mapped_column(Text)
    n: Mapped[int] = mapped_column(Integer)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    started_at: Mapped[float] = mapped_column(Float)
    latency_s: Mapped[float | None] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)
    prompt_token_ids: Mapped[list[Any] | None]  # the rendered prompt as served (for training)


class Completion(Base):
    """One rollout of a group: the text of one choice."""
    __tablename__ = "completions"
    id: Mapped[int] = mapped_column(primary_key=True)
    call_id: Mapped[int] = mapped_column(ForeignKey("llm_calls.id"), index=True)
    index: Mapped[int] = mapped_column(Integer)
    text: Mapped[str] = mapped_column(Text)
    tokens: Mapped[int | None] = mapped_column(Integer)
    finish_reason: Mapped[str | None] = mapped_column(String(40))
    token_ids: Mapped[list[Any] | None]  # the sampled tokens exactly as served (for training)
    # Their log-probs under the distribution vLLM sampled from (temperature and top_p applied):
    # the trainer's importance weights and sampler-to-trainer KL. Deferred: older schemas lack it.
    logprobs: Mapped[list[Any] | None] = mapped_column(JSON, deferred=True)


class Program(Base):
    """Every candidate ever made, failures included.

    status: ok | invalid | error | timeout (evaluated), mutation_failed (the answer could
    not be applied: no code to run), pending (made, not yet evaluated).
    origin: seed | mutation (an LLM answer) | tuned (the best trial of a tuning) | migration.
    outcome, for an evaluated child: better (a higher objective than its parent), same (the
    very outputs of its parent: no progress, whatever its code) or worse.
    """
    __tablename__ = "programs"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    island: Mapped[int] = mapped_column(Integer)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("programs.id"))
    generation: Mapped[int] = mapped_column(Integer, default=0)
    origin: Mapped[str] = mapped_column(String(20))  # seed | mutation | tuned | migration
    completion_id: Mapped[int | None] = mapped_column(ForeignKey("completions.id"), index=True)
    answer_index: Mapped[int | None] = mapped_column(Integer)
    code: Mapped[str | None] = mapped_column(Text)
    code_hash: Mapped[str | None] = mapped_column(String(64), index=True)
    duplicate_of: Mapped[int | None] = mapped_column(ForeignKey("programs.id"))
    status: Mapped[str] = mapped_column(String(20))
    error: Mapped[str | None] = mapped_column(Text)
    fitness: Mapped[dict[str, Any] | None]  # normalised vector, component name -> value
    raw: Mapped[dict[str, Any] | None]
    objective: Mapped[float | None] = mapped_column(Float)
    headline: Mapped[float | None] = mapped_column(Float)
    descriptors: Mapped[dict[str, Any] | None]
    cell: Mapped[str | None] = mapped_column(String(100))
    # deferred: read only where used, so the read-only views still open a run of schema 0002
    outcome: Mapped[str | None] = mapped_column(String(10), deferred=True)
    created_at: Mapped[float] = mapped_column(Float, default=now)

    __table_args__ = (Index("ix_programs_run_island", "run_id", "island"),)

    def copy_result(self, original: "Program") -> None:
        """A duplicate's judgement is its original's (it is never evaluated twice)."""
        for name in ("status", "error", "fitness", "raw", "objective", "headline", "descriptors"):
            setattr(self, name, getattr(original, name))


class Evaluation(Base):
    """One sandbox run of a program (timing and sandbox detail for audit and benchmarks)."""
    __tablename__ = "evaluations"
    id: Mapped[int] = mapped_column(primary_key=True)
    program_id: Mapped[int] = mapped_column(ForeignKey("programs.id"), index=True)
    backend: Mapped[str] = mapped_column(String(20))
    status: Mapped[str] = mapped_column(String(20))
    started_at: Mapped[float] = mapped_column(Float)
    elapsed_s: Mapped[float] = mapped_column(Float)
    error: Mapped[str | None] = mapped_column(Text)


class TrainingStep(Base):
    """One step of the RL hook (or `evolve train`): it produced policy version `version`."""
    __tablename__ = "training_steps"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    version: Mapped[int] = mapped_column(Integer)
    algorithm: Mapped[str] = mapped_column(String(20))  # grpo | vpo
    groups: Mapped[int] = mapped_column(Integer)  # LLM calls (groups) trained on
    rollouts: Mapped[int] = mapped_column(Integer)
    loss: Mapped[float] = mapped_column(Float)
    kl: Mapped[float] = mapped_column(Float)  # mean per-token KL to the base model
    clip_fraction: Mapped[float] = mapped_column(Float)
    mean_abs_advantage: Mapped[float] = mapped_column(Float)
    reward_mean: Mapped[float] = mapped_column(Float)  # the algorithm's scalar/set reward
    train_s: Mapped[float] = mapped_column(Float)  # forward/backward/optimizer time
    load_s: Mapped[float | None] = mapped_column(Float)  # hot-loading into the server
    peak_rss_mb: Mapped[float | None] = mapped_column(Float)
    started_at: Mapped[float] = mapped_column(Float, default=now)
    # The guard's verdict: False when the version was measured worse than its predecessor on
    # held-out parents and never served. guard: the measured rates of both, and the cost.
    # Deferred: older schemas lack them.
    published: Mapped[bool | None] = mapped_column(Boolean, deferred=True)
    guard: Mapped[dict | None] = mapped_column(JSON, deferred=True)
    # Mean per-token KL(sampler || trainer) over the step's tokens: how far the served
    # distribution is from the one the trainer computes ratios against. Null: not served.
    sampler_kl: Mapped[float | None] = mapped_column(Float, deferred=True)
    # The first call to the newly served version against the trainer's log-probs of the same
    # tokens: {mean, max, tokens, ok, seconds} in nats. Null: not checked (older schemas, refused).
    served_check: Mapped[dict | None] = mapped_column(JSON, deferred=True)


class Tuning(Base):
    """One in-the-loop tuning of a program: `trials` scored variants, the best stored as `child`.

    Every trial counts in the evaluation budget; only the best becomes a program.
    """
    __tablename__ = "tunings"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    parent_id: Mapped[int] = mapped_column(ForeignKey("programs.id"))
    child_id: Mapped[int | None] = mapped_column(ForeignKey("programs.id"), index=True)
    trials: Mapped[int] = mapped_column(Integer)
    parameters: Mapped[int] = mapped_column(Integer)  # float literals tuned
    start_objective: Mapped[float] = mapped_column(Float)
    best_objective: Mapped[float | None] = mapped_column(Float)
    started_at: Mapped[float] = mapped_column(Float)
    elapsed_s: Mapped[float] = mapped_column(Float)


class Turn(Base):
    """One cycle of the turns between the LLM and tuning (search.tuning.background): what each
    raised the best objective by in its turn and the seconds it had. A resume replays them, so
    the shares go on from the run's record instead of from `background` again."""
    __tablename__ = "turns"
    id: Mapped[int] = mapped_column(primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    llm_gain: Mapped[float] = mapped_column(Float)
    llm_s: Mapped[float] = mapped_column(Float)
    tuning_gain: Mapped[float] = mapped_column(Float)
    tuning_s: Mapped[float] = mapped_column(Float)
    share: Mapped[float] = mapped_column(Float)  # tuning's share of the next cycle
    at: Mapped[float] = mapped_column(Float, default=now)


class Cell(Base):
    """The MAP-Elites grids: one elite per (island, cell)."""
    __tablename__ = "cells"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    island: Mapped[int] = mapped_column(Integer, primary_key=True)
    cell: Mapped[str] = mapped_column(String(100), primary_key=True)
    program_id: Mapped[int] = mapped_column(ForeignKey("programs.id"))
    objective: Mapped[float] = mapped_column(Float)


class Island(Base):
    __tablename__ = "islands"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), primary_key=True)
    island: Mapped[int] = mapped_column(Integer, primary_key=True)
    generation: Mapped[int] = mapped_column(Integer, default=0)
    last_migration: Mapped[int] = mapped_column(Integer, default=0)
