"""In-the-loop tuning: the float literals of a program's EVOLVE-BLOCK, improved by CMA-ES.

The small LLMs this engine runs on a CPU write structure acceptably and numbers badly: their
valid edits are mostly constant tweaks, each one a single random sample. A numeric optimiser
does that job far better (measured: CMA-ES took a ring construction from 1.838 to 1.996 in 100
scored trials, where the 1.5B model's best of 64 answers was 1.878). So the LLM proposes code
and this operator moves its numbers: every float literal of the block becomes one coordinate
of a vector, and each trial is an ordinary candidate scored through the same sandbox and judge.

CMA-ES (the `cma` package) rather than TPE or SMAC: the literals are continuous and few (a
handful to a dozen), the trials of one population can run in parallel, and it needs no model
of its own to fit between trials.
"""
from __future__ import annotations

import asyncio
import math
import warnings
from dataclasses import dataclass
from typing import Awaitable, Callable

import numpy as np

from evolve.judge.evaluator import Judgement
from evolve.mutation.literals import float_literals, substitute


@dataclass
class Trial:
    code: str
    objective: float  # the judge's objective; a failed candidate scores what the judge gave it
    result: Judgement  # the evaluator's, kept so the best trial needs no second run


@dataclass
class Tuned:
    best: Trial | None  # None: nothing to tune, or no trial ran
    trials: int
    parameters: int
    start_objective: float


Evaluate = Callable[[str], Awaitable[Trial | None]]  # None: the budget is spent, stop


async def tune(program: str, objective: float, evaluate: Evaluate, trials: int, sigma: float,
               seed: int, max_parameters: int, rng: np.random.Generator) -> Tuned:
    """CMA-ES over the block's float literals, `trials` scored candidates at most.

    Each coordinate is a relative change: value = start + scale * z with scale = |start| (1 for
    a zero), so one sigma suits literals of every magnitude. With more literals than
    `max_parameters`, a random subset is tuned and the rest kept (CMA-ES needs far more trials
    than a tuning may spend once it has dozens of coordinates).
    """
    literals = float_literals(program)
    if len(literals) > max_parameters:
        keep = np.sort(rng.choice(len(literals), size=max_parameters, replace=False))
        literals = [literals[i] for i in keep]
    if not literals:
        return Tuned(None, 0, 0, objective)
    import cma

    start = np.array([lit.value for lit in literals])
    scale = np.where(start != 0, np.abs(start), 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cma warns about one-dimensional problems
        es = cma.CMAEvolutionStrategy(np.zeros(len(literals)), sigma,
                                      {"seed": seed + 1, "verbose": -9, "popsize": _popsize(len(literals))})
    best: Trial | None = None
    spent = 0
    while spent < trials and not es.stop():
        zs = es.ask()[: trials - spent]
        results = await asyncio.gather(*(evaluate(substitute(program, literals, start + scale * z))
                                         for z in zs))
        ran = [r for r in results if r is not None]
        spent += len(ran)
        for trial in ran:
            if best is None or trial.objective > best.objective:
                best = trial
        if len(ran) < es.popsize:
            break  # the budget ran out, or the trials did: a partial population cannot be told
        es.tell(zs, [-r.objective for r in ran])
    return Tuned(best, spent, len(literals), objective)


def _popsize(dims: int) -> int:
    """CMA-ES's default population (4 + 3 ln d), at least 6 so two evaluators stay busy."""
    return max(6, 4 + int(3 * math.log(dims)))
