"""In-the-loop tuning: the float literals of a program's EVOLVE-BLOCK, improved by CMA-ES.

The small LLMs this engine runs on a CPU write structure acceptably and numbers badly: their
valid edits are mostly constant tweaks, each one a single random sample. A numeric optimiser
does that job far better (measured: CMA-ES took a ring construction from 1.838 to 1.996 in 100
scored trials, where the 1.5B model's best of 64 answers was 1.878). So the LLM proposes code
and this operator moves its numbers: every float literal of the block becomes one coordinate
of a vector, and each trial is an ordinary candidate scored through the same sandbox and judge.

A tuning never returns below its start: the start is its first incumbent (a tuning returns
nothing rather than a child below its parent). The first descent is plain CMA-ES (`cma`'s
defaults: small steps, refused trials ranked last), and restarts then alternate large steps with
a growing population and small ones (BIPOP), where one draw of a large step used to wreck a seed
it did not suit. Against plain CMA-ES at equal trials it is level or ahead on most programs and
behind on one (a lattice on the edge of validity, docs/benchmarks/generalization.md).

CMA-ES (the `cma` package) rather than TPE or SMAC: the literals are continuous and few (a
handful to a dozen), the trials of one population can run in parallel, and it needs no model
of its own to fit between trials.
"""
from __future__ import annotations

import asyncio
import math
import warnings
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

import numpy as np

from evolve.judge.evaluator import Judgement
from evolve.mutation.literals import float_literals, substitute


@dataclass
class Trial:
    code: str
    objective: float  # the judge's objective; a failed candidate scores what the judge gave it
    result: Judgement | None  # the evaluator's, kept so the best trial needs no second run
    ok: bool = True  # the judge accepted it


@dataclass
class Tuned:
    best: Trial | None  # the best trial above the start; None: nothing beat it, nothing to tune
    trials: int
    parameters: int
    start_objective: float
    descents: int = 0  # CMA-ES runs: the first and its restarts


Evaluate = Callable[[str], Awaitable[Trial | None]]  # None: the budget is spent, stop

# The stall rule of the tuner before `tuning.resume` (now `tuning.stall_trials`, off by default):
# a descent that has not raised its own best in this many trials (and three generations) restarts
# from the best point.
STALL_TRIALS = 100
# Fewer than this share of a restart's first generation accepted by the judge: its steps are
# too large for this program (a radius scaled up overlaps), so that regime's step is quartered.
MIN_ACCEPTED = 0.25
# A descent whose every trial the judge refused learned nothing: cma stops it at once (all
# fitness values equal), which is no sign of convergence. It is drawn again with another seed
# at the same step, this many times in a row at most, before the restarts' schedule moves on.
# On the hexagonal lattice (every circle at half the spacing: most steps overlap) 29 of 30
# first-generation trials at 5 % steps were refused; where the first descent ended so, the
# schedule's next steps were large (refused) and then small, and the tuner never left the
# start, where plain CMA-ES, restarting at its first step, reached 0.88.
REDRAWS = 8


@dataclass
class Restarts:
    """BIPOP's schedule, in the small: the first descent refines near the start with a small step;
    the restarts then alternate a large step with a population that doubles each time (IPOP:
    the global view) and a small step drawn below the first (the local view). Every restart
    begins at the best point so far (Hansen 2009, "Benchmarking a BI-population CMA-ES")."""
    small: float
    large: float
    popsize: int
    rng: np.random.Generator
    count: int = 0
    large_runs: int = 0

    def next(self) -> tuple[float, int]:
        """The (first step, population) of the next descent."""
        self.count += 1
        if self.count == 1:
            return self.small, self.popsize
        if self.count % 2 == 0:
            self.large_runs += 1
            return self.large, self.popsize * 2 ** self.large_runs
        return self.small * 10 ** -self.rng.uniform(0, 1), self.popsize

    def refused(self, sigma: float) -> None:
        """The judge refused most of a descent's first generation at this step: smaller steps."""
        if sigma >= self.large:
            self.large = max(self.small, self.large / 4)
        else:
            self.small /= 4


async def tune(program: str, objective: float, evaluate: Evaluate, trials: int,
               sigma: float | tuple[float, float], seed: int, max_parameters: int,
               rng: np.random.Generator, stall: int | None = None) -> Tuned:
    """One tuning of `trials` scored candidates at most from a fresh state (Tuning)."""
    tuning = TuningState(program, objective, sigma, seed, max_parameters, rng, stall)
    return await tuning.run(evaluate, trials)


class TuningState:
    """CMA-ES with restarts over one program's float literals, resumable.

    The start is the first incumbent (its objective is known), so a tuning never returns below
    the program it tuned. A literal is start + scale * z (scales: the literals' median size), so
    `sigma`, the (small, large) pair of first steps of the restarts (Restarts), or one step for
    all, is relative to the literals' typical size. With more literals than `max_parameters`, a
    random subset is tuned and the rest kept (CMA-ES needs far more trials than a tuning may
    spend once it has dozens of coordinates).

    Its state (the descent in progress, its step and covariance, the restarts' schedule) lives
    between `run`s, so the search's next tuning of the best it found goes on where this one
    stopped instead of starting CMA-ES afresh: plain CMA-ES's one long descent beat chained
    fresh 300-trial tunings on the foreign seeds (docs/benchmarks/generalization.md).
    `stall`: trials without a gain after which a descent restarts (None: only when cma stops).
    """

    def __init__(self, program: str, objective: float, sigma: float | tuple[float, float], seed: int,
                 max_parameters: int, rng: np.random.Generator, stall: int | None = None):
        literals = float_literals(program)
        if len(literals) > max_parameters:
            keep = np.sort(rng.choice(len(literals), size=max_parameters, replace=False))
            literals = [literals[i] for i in keep]
        self.program, self.literals, self.seed, self.stall = program, literals, seed, stall
        self.start = np.array([lit.value for lit in literals])
        self.scale = scales(self.start) if literals else self.start
        small, large = (sigma, sigma) if isinstance(sigma, (int, float)) else sigma
        self.restarts = Restarts(small, large, _popsize(max(1, len(literals))), rng)
        self.incumbent = Incumbent(np.zeros(len(literals)), objective)
        self.descent: Descent | None = None
        self.descents = 0  # started: restarts and redraws; each its own seed
        self.redraws = 0  # in a row (REDRAWS)
        self.exhausted = not literals  # nothing to tune, or cma stops before a first generation

    @property
    def objective(self) -> float:
        """The best objective so far: the program a later `run` goes on from."""
        return self.incumbent.objective

    async def run(self, evaluate: Evaluate, trials: int) -> Tuned:
        """Up to `trials` more scored candidates; the best is returned only if it beats where this
        run began."""
        before, spent = self.incumbent.objective, 0

        async def candidate(z: np.ndarray) -> Trial | None:
            return await evaluate(substitute(self.program, self.literals, self.start + self.scale * z))

        while spent < trials and not self.exhausted:
            descent = self._descent()
            ran, cut = await descent.generation(candidate, self.incumbent, trials - spent, self.stall)
            spent += ran
            if cut:
                break
            if not ran and descent.generations == 0:
                self.exhausted = True  # cma stopped before its first generation: nothing more to learn
        best = self.incumbent.trial if self.incumbent.objective > before else None
        return Tuned(best, spent, len(self.literals), before, self.descents)

    def _descent(self) -> "Descent":
        """The descent in progress, or the next one from the best point once it has ended: the
        same again where it learned nothing (every trial refused), else the next restart."""
        last = self.descent
        if last is not None and not last.ended:
            return last
        if last is not None and last.refused:
            self.restarts.refused(last.sigma)
        if last is not None and not last.refused and not last.accepted and self.redraws < REDRAWS:
            self.redraws += 1
            step, popsize, may_refuse = last.sigma, last.es.popsize, last.may_refuse
        else:
            self.redraws = 0
            step, popsize = self.restarts.next()
            may_refuse = self.restarts.count > 1
        self.descents += 1
        self.descent = Descent.start(self.incumbent.z, step, popsize, self.seed + self.descents, may_refuse)
        return self.descent


@dataclass
class Incumbent:
    """The best point so far (z, objective) and its trial; the start has no trial."""
    z: np.ndarray
    objective: float
    trial: Trial | None = None

    def offer(self, z: np.ndarray, trial: Trial) -> bool:
        if trial.objective <= self.objective:
            return False
        self.z, self.objective, self.trial = np.asarray(z, dtype=float), trial.objective, trial
        return True


@dataclass
class Descent:
    """One CMA-ES run from the incumbent, kept between tunings until it stops, stalls or is
    refused. A restart (`may_refuse`) whose first generation the judge mostly refuses ends there;
    the first descent goes on as plain CMA-ES would, ranking refused trials last and adapting
    its step."""
    es: Any
    sigma: float
    may_refuse: bool
    trials: int = 0
    accepted: int = 0  # trials the judge accepted
    generations: int = 0
    own_best: float = -math.inf
    last_gain: int = 0
    refused: bool = False
    ended: bool = False

    @classmethod
    def start(cls, z: np.ndarray, sigma: float, popsize: int, seed: int, may_refuse: bool) -> "Descent":
        import cma

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # cma warns about one-dimensional problems
            es = cma.CMAEvolutionStrategy(z, sigma, {"seed": seed, "verbose": -9, "popsize": popsize})
        return cls(es, sigma, may_refuse)

    async def generation(self, candidate: Callable[[np.ndarray], Awaitable[Trial | None]],
                         incumbent: Incumbent, left: int, stall: int | None) -> tuple[int, bool]:
        """One population scored and told: (trials spent, cut). Cut: the budget or `left` ran out
        mid-population (a partial population cannot be told; the next generation asks anew)."""
        if self.es.stop():
            self.ended = True
            return 0, False
        zs = self.es.ask()[:left]
        results = await asyncio.gather(*(candidate(z) for z in zs))
        ran = [(z, r) for z, r in zip(zs, results) if r is not None]
        self.trials += len(ran)
        self.accepted += sum(t.ok for _, t in ran)
        for z, trial in ran:
            incumbent.offer(z, trial)
            if trial.objective > self.own_best:
                self.own_best, self.last_gain = trial.objective, self.trials
        if len(ran) < self.es.popsize:
            return len(ran), True
        self.generations += 1
        if self.may_refuse and self.generations == 1 and sum(t.ok for _, t in ran) < MIN_ACCEPTED * len(ran):
            self.refused = self.ended = True
            return len(ran), False
        self.es.tell(zs, [-trial.objective for _, trial in ran])
        if stall is not None and self.generations >= 3 and self.trials - self.last_gain >= stall:
            self.ended = True
        return len(ran), False


def scales(start: np.ndarray) -> np.ndarray:
    """What a step of 1 means for each literal: the literals' median size, for all.

    Plain CMA-ES's coordinates (the literals themselves, one step for all), not each literal's
    own size: a small literal that places things on the unit square (an offset of 0.05, a first
    radius of 0.12) barely moved at 5 % of itself, and from the random-placement seed the search's
    tunings ended at n26 1.28-1.30 where plain CMA-ES reached 1.34 in as many trials
    (docs/benchmarks/generalization.md). CMA-ES adapts each coordinate's step from there."""
    return np.full(len(start), literal_size(start))


def literal_size(start: np.ndarray) -> float:
    """The median size of the literals that are not zero or a tolerance (1e-6 of the largest or
    less): zeros and guards such as 1e-9 say nothing of the scale the others work at. With them
    counted, min_max_distance's seed (1.0, 1e-9, 0.0, 1.0, 0.0) got a step of 1e-9 and its
    tunings never moved a point (docs/benchmarks/generalization.md, bar 4). 1 if none is left."""
    size = np.abs(np.asarray(start, dtype=float))
    size = size[size > 1e-6 * size.max(initial=0.0)]
    return float(np.median(size)) if size.size else 1.0


def _popsize(dims: int) -> int:
    """CMA-ES's default population (4 + 3 ln d), at least 6 so two evaluators stay busy."""
    return max(6, 4 + int(3 * math.log(dims)))
