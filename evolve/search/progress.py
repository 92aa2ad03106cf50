"""The lines a run prints about itself: scores and the progress line."""
from __future__ import annotations

from evolve.config import Problem
from evolve.judge.evaluator import Judgement
from evolve.search.budget import Stats
from evolve.store.schema import Program


def six(headline: float | None) -> str:
    """A headline value; None where the program is valid on other components only."""
    return "invalid" if headline is None else f"{headline:.6f}"


def scores(problem: Problem, result: Judgement) -> str:
    """'n26 = 2.166667, objective 0.8658', or just the objective when that is the headline."""
    if problem.headline == "objective":
        return f"objective {result.objective:.4f}"
    return f"{problem.headline} = {six(result.headline)}, objective {result.objective:.4f}"


def progress_line(problem: Problem, stats: Stats, done: int, budget: int, best: Program, seconds: float) -> str:
    """'[120/400 evals] best n26=2.54 (#77) | applied 30/64 | ok=90 ... | 6.1 evals/min | 40 tok/s,
    2.1 answers/min' (the LLM's figures over the whole session: what issue 60's bar counts)."""
    minutes = max(seconds, 1e-9) / 60
    valid = f"{stats.applied}/{stats.answers}" if stats.answers else "-"
    statuses = " ".join(f"{k}={v}" for k, v in sorted(stats.statuses.items()))
    return (f"[{done}/{budget} evals] best {problem.headline}={six(best.headline)} (#{best.id}) | "
            f"applied {valid} | {statuses} | {stats.evaluated / minutes:.1f} evals/min | "
            f"{stats.tokens / (minutes * 60):.0f} tok/s, {stats.answers / minutes:.1f} answers/min")
