"""`evolve check PROBLEM.yaml`: run the seed program through the real sandbox and scorer.

The first thing to do with a new or edited problem: it validates the YAML (and template),
evaluates the seed exactly as a run would (sandbox backend, limits, trusted scorer) and
prints its vector, its descriptors and where it lands in the MAP-Elites grid.
"""
from __future__ import annotations

import asyncio

from rich.console import Console
from rich.table import Table

from evolve.archive import cell_of
from evolve.config import ConfigError, Problem
from evolve.judge.evaluator import Evaluator, Judgement

MAX_ROWS = 40  # a code problem can have dozens of test cases; the rest are summarised


class SeedError(ConfigError):
    """The problem's own seed program fails its scorer: no run can start from it."""


def seed_failure(problem: Problem, result: Judgement) -> str:
    reason = (result.error or "").strip().splitlines()[:1] or ["no reason given"]
    return (f"{problem.source_path}: field 'program': the seed program is not valid ({result.status}): "
            f"{reason[0]}; see `evolve check {problem.source_path}`")


def evaluate_seed(problem: Problem, backend: str | None = None) -> tuple[Judgement, str]:
    """The seed's evaluation, exactly as a run makes it, and the sandbox backend used."""
    if backend:
        problem = problem.model_copy(update={"sandbox": problem.sandbox.model_copy(update={"backend": backend})})
    evaluator = Evaluator(problem)
    try:
        return asyncio.run(evaluator.evaluate(problem.seed_code())), evaluator.sandbox.backend
    finally:
        evaluator.sandbox.close()


def check(problem: Problem, backend: str | None = None) -> int:
    """Exit status 0 when the seed evaluates to status ok, 1 otherwise."""
    result, used = evaluate_seed(problem, backend)
    console = Console()
    console.print(f"[bold]{problem.name}[/]: seed program through the {used} "
                  f"sandbox and the trusted scorer in {result.elapsed_s:.2f} s")
    console.print(_vector_table(problem, result))
    console.print(_summary(problem, result))
    if result.error:
        console.print(result.error, style="dim", markup=False, highlight=False)
    return 0 if result.status == "ok" else 1


def _vector_table(problem: Problem, result: Judgement) -> Table:
    t = Table(title="vector fitness (1.0 = the reference)", title_justify="left")
    for col in ("component", "raw", "normalised", "reference", "goal"):
        t.add_column(col, justify="left" if col in ("component", "goal") else "right")
    for c in problem.components[:MAX_ROWS]:
        raw = result.raw.get(c.name)
        t.add_row(c.name, "-" if raw is None else f"{raw:.6g}", f"{result.components[c.name]:.4f}",
                  f"{c.reference:.10g}", c.goal)
    if len(problem.components) > MAX_ROWS:
        t.add_row(f"... {len(problem.components) - MAX_ROWS} more", "", "", "", "")
    return t


def _summary(problem: Problem, result: Judgement) -> str:
    headline = "-" if result.headline is None else f"{result.headline:.6g}"
    lines = [f"status {result.status} | objective {result.objective:.4f} | "
             f"headline {problem.headline} = {headline}"]
    for axis in problem.descriptors:
        value = result.descriptors.get(axis.name)
        lines.append(f"descriptor {axis.name}: not computed" if value is None else
                     f"descriptor {axis.name} = {value:.4g} in [{axis.low:g}, {axis.high:g}]")
    cell = cell_of(result.descriptors, problem.descriptors)
    lines.append(f"MAP-Elites cell {cell}" if cell else "no MAP-Elites cell (descriptors missing)")
    return "\n".join(lines)
