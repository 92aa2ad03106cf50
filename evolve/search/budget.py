"""What a run has spent of its budget, over all its sessions, and whether it may go on.

The budget counts evaluated candidates (docs/design.md §8), claimed before each evaluation
starts, so a run never evaluates more than it was given; children waiting for an evaluation slot
count as spent, so that no LLM call is made for a budget already taken.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from evolve.config import Budget
from evolve.rundir import Stop
from evolve.store.database import ProgramDatabase


@dataclass
class Stats:
    """Counters for the progress line (this session only)."""
    calls: int = 0
    tokens: int = 0
    llm_s: float = 0.0
    answers: int = 0
    applied: int = 0
    evaluated: int = 0
    statuses: dict[str, int] = field(default_factory=dict)


class Ledger:
    def __init__(self, budget: Budget, db: ProgramDatabase):
        self.budget, self.db = budget, db
        self.stats = Stats()  # this session's counters
        self.started = time.time()
        self.claimed = 0  # evaluations started this session
        self.queued = 0  # children waiting for an evaluation slot: budget they will claim
        self.base_evals = self.base_calls = 0  # what earlier sessions spent
        self.past_wall = 0.0

    def open(self, session_id: int) -> None:
        """Take over what the run's earlier sessions spent."""
        self.base_evals = self.db.evaluations_done()
        self.base_calls = self.db.llm_calls_done()
        self.past_wall = self.db.past_wall_time(session_id)

    @property
    def evaluations(self) -> int:
        return self.base_evals + self.claimed

    @property
    def calls(self) -> int:
        return self.base_calls + self.stats.calls

    def claim(self) -> bool:
        """One evaluation's unit of the budget; False when it is spent."""
        if self.evaluations >= self.budget.max_evaluations:
            return False
        self.claimed += 1
        return True

    def left(self) -> str | None:
        """The reason to stop asking, or None."""
        b = self.budget
        if self.evaluations + self.queued >= b.max_evaluations:
            return Stop.BUDGET
        if b.max_llm_calls is not None and self.calls >= b.max_llm_calls:
            return Stop.LLM_CALLS
        if (left := self.wall_left()) is not None and left <= 0:
            return Stop.WALL_TIME
        if b.target_objective is not None and (best := self.db.best()) is not None \
                and (best.objective or 0.0) >= b.target_objective - 1e-12:
            return Stop.TARGET
        return None

    def wall_left(self) -> float | None:
        """Seconds left of the wall-time budget (None: none set), over all sessions."""
        if self.budget.wall_time_s is None:
            return None
        return max(self.budget.wall_time_s - self.past_wall - (time.time() - self.started), 0.0)
