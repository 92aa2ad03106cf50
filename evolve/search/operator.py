"""What an operator is, and what the engine lends it.

An operator makes children (pyribs' emitters, ask/tell): in one `step` it asks the archive for
a parent, spends evaluations through the engine and tells the engine what to store; it says what
the step spent. The scheduler (scheduler.py) decides when each operator steps; the controller
(controller.py) keeps the loop, the budget and storage. A new operator is one file that
implements `Operator`, and a line in `scheduler.operators`.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from evolve.config import Problem
from evolve.judge.evaluator import Evaluator, Judgement
from evolve.serving.client import Sampler
from evolve.store.database import ProgramDatabase
from evolve.store.schema import Program

if TYPE_CHECKING:  # the controller's parts, which import this module's records
    from evolve.search.budget import Ledger
    from evolve.search.tasks import Tasks


@dataclass(frozen=True)
class Step:
    """What one step spent."""
    trials: int  # candidates it sent to the evaluators (0: it had nothing to do)
    objective: float | None = None  # its stored child's objective, where the step waited for it


class Engine(Protocol):
    """What the controller lends its operators: the archive and its store, the budget, the
    evaluators, the tasks in flight and the run's record."""
    problem: Problem
    db: ProgramDatabase
    evaluator: Evaluator
    ledger: Ledger
    tasks: Tasks
    seed: int
    rng: np.random.Generator

    async def claimed_run(self, code: str) -> tuple[Judgement, float] | None:
        """One evaluation that claims a unit of the budget: (result, start time), or None when
        the budget is spent."""

    async def evaluate_group(self, children: list[Program]) -> None:
        """Evaluate stored pending children (each distinct one once) and store their results."""

    def store(self, child: Program, result: Judgement, started: float, *rows: Any) -> bool:
        """A child's result and the rows that go with it, in one commit; True: its island's new best."""

    def emit(self, kind: str, message: str, **fields: Any) -> None: ...

    def progress(self) -> None: ...


class Learner(Protocol):
    """What the LLM operator asks of a mutator that learns from the run (the RL hook,
    evolve/rl/hook.py); a frozen mutator has none."""
    stop: threading.Event  # set on interrupt: a training step in its thread stops at its next check

    @property
    def served(self) -> str:
        """The name the current policy version is served under: every call names it."""

    def due(self) -> bool:
        """A step's worth of the current version's answers is in."""

    def full(self, in_flight: int) -> bool:
        """With `in_flight` calls out, a step's worth is asked for: start no new call before the step."""

    async def resume(self, client: Sampler) -> None:
        """Serve the run's latest version again (a fresh server knows none)."""

    async def step(self, client: Sampler, evaluator: Evaluator) -> object:
        """Train on the current version's groups, measure and (maybe) publish the next."""


class Operator(Protocol):
    name: str  # in the turns, the allocation and the reports
    origin: str  # the origin of the children it stores

    async def start(self) -> None:
        """Before the first step of a session (the LLM: serve the run's latest policy version)."""

    async def step(self) -> Step:
        """One unit of work (each operator picks its island: the LLM by call, the tuner in turn)."""

    def offer(self, child: Program, island_best: bool) -> None:
        """A child another operator made was stored (the tuner takes the ones worth tuning)."""

    def stop(self) -> None:
        """The run is stopping: abandon work that runs outside the event loop."""
