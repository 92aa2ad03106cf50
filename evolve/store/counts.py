"""Evaluations, the budget's unit, counted one way wherever a run's figures are shown: the
engine's budget, the dashboard and `status`, the exported plots, and the comparison.

An evaluated candidate is one that ran in the sandbox: an LLM child counts one (a failed
mutation never runs, a duplicate copies a stored result and has no evaluation of its own), a
tuning counts every trial it scored (its best trial is the tuned child, whose evaluation row
stands for the tuning), the seed and migrants count none (the seed is the run's start, a migrant
a copy).
"""
from __future__ import annotations

from sqlalchemy import case, func, select

from evolve.store.schema import Evaluation, Program, Tuning


def evaluation_units(origin: str, trials: int | None) -> int:
    """What one evaluation row of a program of this origin stands for."""
    if origin == "mutation":
        return 1
    if origin == "tuned":
        return trials or 1
    return 0


def evaluations_done(conn, run_id: int) -> int:
    """The run's evaluations so far (`conn`: a Session or a Connection), by evaluation_units."""
    units = case((Program.origin == "mutation", 1),
                 (Program.origin == "tuned", func.coalesce(Tuning.trials, 1)), else_=0)
    query = (select(func.sum(units)).select_from(Evaluation)
             .join(Program, Program.id == Evaluation.program_id)
             .outerjoin(Tuning, Tuning.child_id == Program.id)
             .where(Program.run_id == run_id))
    return conn.execute(query).scalar() or 0
