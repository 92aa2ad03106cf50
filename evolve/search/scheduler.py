"""Which operator gets the cores, and when.

- The LLM alone, or beside tuning without turns: `llm_concurrency` loops of calls (re-asks of
  broken answers, search.repair, ahead of new ones), each starting its next call once fewer than
  `llm_batch` answers are running on the server (if set), so the batch stays full; the tuner
  tunes each child worth it in a task of its own as soon as it is stored.
- Tuning alone (`search.llm: false`): one loop of tunings keeps the evaluators busy.
- Turns (`tuning.background`): the LLM and tuning take turns with the cores, tuning's share of a
  cycle set by the allocation (allocation.py). The LLM's turn is its share of `turn_s` and ends
  once the answers in flight are in, or at once with `tuning.pause_llm`, its server paused with
  them until its next turn; tuning's turn then lasts its share of the cycle so far (its
  last tuning finishes first) and tunes the LLM children waiting for it before the archive's
  programs. The LLM is credited with what the best objective rose in a cycle beyond what tuning
  of the archive's programs raised it by (a tuned LLM child is the LLM's: its structure made it).
"""
from __future__ import annotations

import asyncio
import time
from typing import Any, Coroutine

from evolve.config import Policy
from evolve.rundir import Stop
from evolve.search.allocation import Allocation
from evolve.search.llm import LLMMutation
from evolve.search.operator import Engine, Learner, Operator
from evolve.search.repair import Repair
from evolve.search.tuner import Tuner
from evolve.serving.client import Pausable, Sampler
from evolve.store.schema import Program, Turn


def operators(engine: Engine, policy: Policy, client: Sampler | None, hook: Learner | None = None) -> list[Operator]:
    """The run's operators, from its problem's `search` section."""
    search = engine.problem.search
    ops: list[Operator] = []
    if search.llm:
        assert client is not None, "an LLM search needs a policy client"
        llm = LLMMutation(engine, policy, client, hook)
        ops.append(llm)
        if search.repair.attempts:
            ops.append(Repair(engine, llm, policy, search.repair))
    if search.tuning.enabled:
        ops.append(Tuner(engine, search.tuning, queued=search.llm and search.tuning.background > 0,
                         generations=not search.llm))
    return ops


class Scheduler:
    def __init__(self, engine: Engine, ops: list[Operator]):
        self.engine = engine
        self.llm = next((op for op in ops if isinstance(op, LLMMutation)), None)
        self.tuner = next((op for op in ops if isinstance(op, Tuner)), None)
        self.repair = next((op for op in ops if isinstance(op, Repair)), None)
        t = engine.problem.search.tuning
        self.allocation = Allocation(t.background, t.adaptive, *t.bounds, plateau_share=t.plateau_share)
        self.llm_turn = asyncio.Event()  # clear while tuning has the cores
        self.llm_turn.set()

    @property
    def turns(self) -> bool:
        return self.llm is not None and self.tuner is not None and self.tuner.queued

    async def seed(self, first: Program) -> None:
        """The seed is the first best of its island. With turns it is tuned before the first
        turn, on no operator's record: the seed's easy first climb is start-up, which the LLM had
        no turn to match (on tuning's record it held tuning at its ceiling until the LLM's first
        gain, docs/benchmarks/mutation.md)."""
        if self.tuner is None or self.llm is None:
            return
        if self.turns:
            await self.tuner.tune(first)
        else:
            self.engine.tasks.spawn(self.tuner.tune(first))

    def loops(self) -> list[Coroutine[Any, Any, str | None]]:
        """The coroutines that run the search; each returns why it stopped."""
        if self.llm is not None:
            loops = [self._llm_loop(self.llm) for _ in range(self.engine.ledger.budget.llm_concurrency)]
            return loops + ([self._take_turns()] if self.turns else [])
        assert self.tuner is not None, "config.Search refuses a search without operators"
        return [self._tune_loop(self.tuner)]

    async def _llm_loop(self, llm: LLMMutation) -> str | None:
        batch = self.engine.ledger.budget.llm_batch
        while (reason := self.engine.ledger.left()) is None:
            if not self.llm_turn.is_set():
                await self.llm_turn.wait()
                continue
            if batch is not None and llm.answers_running >= batch:
                await asyncio.sleep(0.2)  # the server's batch is full: start when an answer ends
                continue
            if self.repair is not None and self.repair.ready and not llm.training():
                await self.repair.step()  # a near-miss first: it is one fix from working
            else:
                await llm.step()
        return reason

    async def _tune_loop(self, tuner: Tuner) -> str | None:
        while (reason := self.engine.ledger.left()) is None:
            if not (await tuner.step()).trials and self.engine.ledger.left() is None:
                return Stop.NOTHING_TO_TUNE  # a program without float literals
        return reason

    async def _take_turns(self) -> None:
        assert self.llm is not None and self.tuner is not None
        t = self.engine.problem.search.tuning
        while True:
            started, best = time.time(), self._best_objective()
            if not await self._wait_while_budget(t.turn_s * (1 - self.allocation.share)):
                return
            if self.llm.training():
                continue  # training has the cores
            self.llm_turn.clear()
            paused = self._pause(self.llm)
            try:
                while paused is None and self.llm.calls_in_flight:
                    await asyncio.sleep(0.1)
                # Drained, the LLM's turn lasts at least as long as its calls in flight: size
                # tuning's turn on what it really took, so that the shares hold.
                turn, share = time.time(), self.allocation.share
                tuning_gain = await self._tuning_turn(self.tuner, turn + (turn - started) * share / (1 - share))
            finally:
                if paused is not None:
                    paused.resume()
                self.llm_turn.set()
            self._record_turns(self._best_objective() - best - tuning_gain, turn - started,
                               tuning_gain, time.time() - turn)

    def _pause(self, llm: LLMMutation) -> Pausable | None:
        """End the LLM's turn by pausing its server with the answers in flight
        (`tuning.pause_llm`), where the server is ours to pause (what was paused, to resume);
        else None: the turn drains."""
        client = llm.client
        if self.engine.problem.search.tuning.pause_llm and isinstance(client, Pausable) and client.pause():
            return client
        return None

    async def _tuning_turn(self, tuner: Tuner, end: float) -> float:
        """Tune until `end`; what tuning of the archive's programs raised the best by."""
        gain = 0.0
        while time.time() < end and self.engine.ledger.left() is None:
            if tuner.waiting:  # the LLM's children: their gain is the LLM's
                await tuner.step()
                continue
            before = self._best_objective()
            step = await tuner.step()
            if not step.trials:
                await asyncio.sleep(0.5)  # nothing to tune on this island
            gain += max(0.0, (step.objective or 0.0) - before)
        return gain

    def replay_turns(self) -> None:
        """A resume: the shares go on from the run's record of turns, not from `background`."""
        for turn in self.engine.db.turns():
            self.allocation.record({"llm": turn.llm_gain, "tuning": turn.tuning_gain},
                                   {"llm": turn.llm_s, "tuning": turn.tuning_s})

    def _record_turns(self, llm_gain: float, llm_s: float, tuning_gain: float, tuning_s: float) -> None:
        share = self.allocation.record({"llm": llm_gain, "tuning": tuning_gain},
                                       {"llm": llm_s, "tuning": tuning_s})
        self.engine.db.add(Turn(run_id=self.engine.db.run_id, llm_gain=llm_gain, llm_s=llm_s,
                                tuning_gain=tuning_gain, tuning_s=tuning_s, share=share))
        if self.allocation.adaptive:
            self.engine.emit("turns", f"turns: the best rose {llm_gain:+.4f} in {llm_s:.0f} s of LLM and "
                             f"{tuning_gain:+.4f} in {tuning_s:.0f} s of tuning; tuning's next share {share:.0%}",
                             llm_gain=llm_gain, llm_s=llm_s, tuning_gain=tuning_gain, tuning_s=tuning_s,
                             share=share)

    def _best_objective(self) -> float:
        best = self.engine.db.best()
        return (best.objective or 0.0) if best is not None else 0.0

    async def _wait_while_budget(self, seconds: float) -> bool:
        """Sleep up to `seconds`; False as soon as the budget is spent."""
        end = time.time() + seconds
        while self.engine.ledger.left() is None:
            if time.time() >= end:
                return True
            await asyncio.sleep(min(1.0, end - time.time()))
        return False
