"""Evaluations, the budget's unit, counted one way wherever a run's figures are shown: the
engine's budget, the dashboard and `status`, the exported plots, and the comparison.

An evaluated candidate is one that ran in the sandbox: an LLM child counts one (a failed
mutation never runs, a duplicate copies a stored result and has no evaluation of its own), a
tuning counts every trial it scored, on its own row (a tuning that beat nothing stores no child,
and its trials were spent all the same), the seed and migrants count none (the seed is the run's
start, a migrant a copy).
"""
from __future__ import annotations

from sqlalchemy import func, select

from evolve.store.schema import Evaluation, Program, Tuning

LLM_ORIGINS = ("mutation", "repair")  # an LLM answer, first asked or re-asked


def evaluation_units(origin: str, trials: int | None = None) -> int:
    """What one evaluation row of a program of this origin stands for: a tuned child's, its
    tuning's `trials` (the views count a tuning at its child; a tuning without one on its own row)."""
    if origin in LLM_ORIGINS:
        return 1
    return (trials or 1) if origin == "tuned" else 0


def evaluations_done(conn, run_id: int) -> int:
    """The run's evaluations so far (`conn`: a Session or a Connection), by evaluation_units
    and the tunings' trials."""
    children = (select(func.count()).select_from(Evaluation)
                .join(Program, Program.id == Evaluation.program_id)
                .where(Program.run_id == run_id, Program.origin.in_(LLM_ORIGINS)))
    trials = select(func.coalesce(func.sum(Tuning.trials), 0)).where(Tuning.run_id == run_id)
    return (conn.execute(children).scalar() or 0) + (conn.execute(trials).scalar() or 0)
