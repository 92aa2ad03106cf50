"""The asynchronous search loop: the operators ask and mutate, the controller evaluates and tells.

It keeps the loop, the budget (budget.py) and storage. Children are stored as `pending` the
moment their answer is parsed, in the same transaction as the LLM call that made them, so an
interrupt or a kill -9 loses no generated code and never keeps half a group: a resume evaluates
what is pending first. An evaluation is stored in one transaction with its cell, so one in
flight at a kill is redone. Parts that fail are handled by evolve.faults.
"""
from __future__ import annotations

import asyncio
import time

import numpy as np

from evolve.config import Budget, Policy, Problem
from evolve.events import Event, Sink, print_sink
from evolve.faults import Outage, fault_of
from evolve.judge.check import SeedError, seed_failure
from evolve.judge.evaluator import Evaluator, Judgement, evaluate_through_outages
from evolve.rundir import FINISHED, Stop
from evolve.search.budget import Ledger
from evolve.search.operator import Learner
from evolve.search.progress import progress_line, scores
from evolve.search.scheduler import Scheduler, operators
from evolve.search.tasks import Tasks
from evolve.serving.client import Sampler
from evolve.store.database import ProgramDatabase
from evolve.store.schema import Evaluation, Program, Session


class Controller:
    """The loop, the budget and storage; the operators (operator.py) make the children and the
    scheduler (scheduler.py) gives them the cores."""

    def __init__(self, problem: Problem, policy: Policy, db: ProgramDatabase, evaluator: Evaluator,
                 client: Sampler | None, budget: Budget, seed: int,
                 report: Sink = print_sink, hook: Learner | None = None):
        self.problem, self.db, self.evaluator = problem, db, evaluator
        self.seed, self.report = seed, report
        self.ledger = Ledger(budget, db)
        self.tasks = Tasks()
        # A Ray cluster says how many candidates its nodes take at once; one host: the budget's.
        slots = getattr(getattr(evaluator, "sandbox", None), "capacity", None)
        self.eval_slots = asyncio.Semaphore(slots or budget.eval_concurrency)
        self.sandbox_outage = Outage("sandbox", report)
        self.rng = np.random.default_rng(seed)  # reseeded by run() from how far the run got
        self.stop_reason: str | None = None
        self.operators = operators(self, policy, client, hook)
        self.scheduler = Scheduler(self, self.operators)

    # ---- top level -----------------------------------------------------------------------
    async def run(self) -> str:
        self.tasks.main = asyncio.current_task()
        session = self.session = Session(run_id=self.db.run_id)
        self.db.add(session)
        self.ledger.open(session.id)
        # Seeded from the run seed and how far the run got, so a resume is reproducible too.
        self.rng = np.random.default_rng([self.seed, self.ledger.base_calls])
        self.scheduler.replay_turns()
        loops: list[asyncio.Task] = []
        try:
            await (self._resume() if self.db.count() else self._seed())  # an archive to go on from?
            for op in self.operators:
                await op.start()
            loops = [asyncio.create_task(self._loop(coroutine)) for coroutine in self.scheduler.loops()]
            await asyncio.gather(*loops)
            await self.tasks.drain()
            self.stop_reason = self.stop_reason or Stop.BUDGET
        except (asyncio.CancelledError, Exception) as exc:
            failure = self.tasks.failure or (exc if isinstance(exc, Exception) else None)
            self.tasks.stopping = True
            self.stop_reason = Stop.INTERRUPTED if failure is None else fault_of(failure)
            for op in self.operators:
                op.stop()
            await self.tasks.cancel(*loops)
            if failure is not None and self.stop_reason is None:
                raise failure  # a bug, not a fault: the traceback is the message
        finally:
            self.db.end_session(session, self.stop_reason or "error")
        reason = self.stop_reason or Stop.INTERRUPTED
        if reason not in FINISHED:
            self.emit("fault", f"stopped: {reason}", reason=reason)
        return reason

    async def _loop(self, coroutine) -> None:
        reason = await coroutine
        self.stop_reason = self.stop_reason or reason  # the first loop to stop says why

    # ---- seed and pending ----------------------------------------------------------------
    async def _seed(self) -> None:
        code = self.problem.seed_code()
        seed = Program(code=code, island=0, origin="seed", generation=0, status="pending")
        started = time.time()
        result = await evaluate_through_outages(self.evaluator, code, self.sandbox_outage)
        if result.status != "ok":
            raise SeedError(seed_failure(self.problem, result))
        result.fill(seed)
        with self.db.batch():  # the seed's copies and its evaluation, all or nothing
            first = self.db.add_seed(seed)[0]
            self.db.add(Evaluation(program_id=first.id, backend=self.evaluator.sandbox.backend,
                                   status=result.status, started_at=started, elapsed_s=result.elapsed_s))
        self.emit("seed", f"seed: {scores(self.problem, result)}", program=first.id, headline=result.headline,
                  objective=result.objective)
        await self.scheduler.seed(first)

    async def _resume(self) -> None:
        """Say where the run goes on from (every time, not only when children wait), then
        evaluate what a stopped session left pending."""
        pending = self.db.pending()
        first = f"; evaluating {len(pending)} pending children first" if pending else ""
        done, calls = self.ledger.base_evals, self.ledger.base_calls
        self.emit("resume", f"resume: {done} evaluations and {calls} LLM calls done{first}",
                  pending=len(pending), evaluations=done, calls=calls)
        if pending:
            await self.evaluate_group(list(pending))

    # ---- evaluation and storage --------------------------------------------------------------
    async def evaluate_group(self, children: list[Program]) -> None:
        """Evaluate each distinct pending child once; duplicates copy the stored result."""
        first_of: dict[str, Program] = {}
        jobs, dups = [], []
        for child in children:
            if child.status != "pending" or child.code is None or child.code_hash is None:
                continue
            known = first_of.get(child.code_hash) or self.db.find_duplicate(child.code)
            if known is not None:
                dups.append((child, known))
            else:
                first_of[child.code_hash] = child
                jobs.append(self._evaluate(child, child.code))
        await asyncio.gather(*jobs)
        for child, original in dups:
            if original.status == "pending":  # its evaluation did not run (budget): stay pending
                continue
            child.duplicate_of = original.id
            child.copy_result(original)
            self.db.tell_result(child)

    async def claimed_run(self, code: str, queued: bool = False) -> tuple[Judgement, float] | None:
        """(result, start time) of one evaluation that claims a unit of the budget, or None
        when the budget is spent. `queued`: the caller counted itself in the ledger's queue."""
        async with self.eval_slots:
            if queued:
                self.ledger.queued -= 1
            if not self.ledger.claim():
                return None
            started = time.time()
            result = await evaluate_through_outages(self.evaluator, code, self.sandbox_outage)
        stats = self.ledger.stats
        stats.evaluated += 1
        stats.statuses[result.status] = stats.statuses.get(result.status, 0) + 1
        return result, started

    async def _evaluate(self, child: Program, code: str) -> None:
        self.ledger.queued += 1
        ran = await self.claimed_run(code, queued=True)
        if ran is None:
            return  # over budget: the child stays pending for a resume with a larger budget
        island_best = self.store(child, *ran)
        for op in self.operators:
            op.offer(child, island_best)

    def store(self, child: Program, result: Judgement, started: float, *extra) -> bool:
        """The child's result, its evaluation (and any rows that go with it) in one commit.
        True if it is the new best of its island."""
        with self.db.unflushed():  # the child must not be flushed into its own "before"
            best_before = self.db.best()
            island_best = self.db.archive.best(child.island)
        before = best_before.objective if best_before is not None else None
        result.fill(child)
        evaluation = Evaluation(backend=self.evaluator.sandbox.backend, status=result.status,
                                started_at=started, elapsed_s=result.elapsed_s, error=result.error)
        self.session.heartbeat_at = time.time()  # committed with the result
        with self.db.batch():
            if child.id is None:
                self.db.tell(child, evaluation)
            else:
                self.db.tell_result(child, evaluation)
            for row in extra:
                row.child_id = child.id
                self.db.add(row)
        if result.status == "ok" and before is not None and result.objective > before:
            delta = result.objective - before
            self.emit("best", f"new best #{child.id} ({child.origin}): {scores(self.problem, result)} "
                      f"(+{delta:.4f})", program=child.id, island=child.island, origin=child.origin,
                      headline=result.headline, objective=result.objective, delta=delta)
        return result.status == "ok" and (island_best is None or result.objective > island_best[0])

    # ---- reporting -----------------------------------------------------------------------
    def progress(self) -> None:
        ledger, best = self.ledger, self.db.best()
        if best is None:  # before the seed
            return
        done, budget = ledger.evaluations, ledger.budget.max_evaluations
        self.emit("progress", progress_line(self.problem, ledger.stats, done, budget, best,
                                            time.time() - ledger.started),
                  evaluations=done, budget=budget, best=best.id)

    def emit(self, kind: str, message: str, **fields) -> None:
        self.report(Event(kind, message, fields))
