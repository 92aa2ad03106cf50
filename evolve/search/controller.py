"""The asynchronous search loop: ask -> mutate -> evaluate -> tell.

It only orchestrates. Children are stored as `pending` the moment their answer is parsed,
in the same transaction as the LLM call that made them, so an interrupt or a kill -9 loses no
generated code and never keeps half a group: a resume evaluates what is pending first. An
evaluation is stored in one transaction with its cell, so one in flight at a kill is redone.
The budget counts evaluated candidates (docs/design.md §8), claimed before each evaluation starts, so
a run never evaluates more than it was given. Parts that fail are handled by evolve.faults.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from evolve.config import Budget, ConfigError, Policy, Problem
from evolve.events import Event, Sink, print_sink
from evolve.faults import Fault, Outage, SandboxFault, fault_of
from evolve.judge.evaluator import Evaluator
from evolve.mutation import pipeline
from evolve.mutation.literals import adds_knob, changes_structure
from evolve.mutation.prompt import KNOB, dump_messages
from evolve.rundir import FINISHED, Stop
from evolve.search.allocation import Allocation
from evolve.search.tuning import Trial, tune
from evolve.serving.client import Sampler
from evolve.store.database import ProgramDatabase
from evolve.store.schema import (
    Completion,
    Evaluation,
    LLMCall,
    Program,
    Session,
    Tuning,
    Turn,
)

SANDBOX_OUTAGE_S = 1800  # an engine that stays away longer stops the run (resumable)


class SeedError(ConfigError):
    """The problem's own seed program fails its scorer: no run can start from it."""


def seed_failure(problem: Problem, result) -> str:
    reason = (result.error or "").strip().splitlines()[:1] or ["no reason given"]
    return (f"{problem.source_path}: field 'program': the seed program is not valid ({result.status}): "
            f"{reason[0]}; see `evolve check {problem.source_path}`")


@dataclass
class Stats:
    """Counters for the progress line (this session only)."""
    started: float = field(default_factory=time.time)
    calls: int = 0
    tokens: int = 0
    llm_s: float = 0.0
    answers: int = 0
    applied: int = 0
    evaluated: int = 0
    statuses: dict[str, int] = field(default_factory=dict)


class Controller:
    def __init__(self, problem: Problem, policy: Policy, db: ProgramDatabase, evaluator: Evaluator,
                 client: Sampler | None, budget: Budget, seed: int,
                 report: Sink = print_sink, hook=None):
        self.problem, self.policy, self.db = problem, policy, db
        self.evaluator, self.client, self.budget = evaluator, client, budget
        self.seed = seed
        self.report = report
        self.stats = Stats()
        self.claimed = 0  # evaluations started this session
        self.queued = 0  # children waiting for an evaluation slot: budget they will claim
        # A Ray cluster says how many candidates its nodes take at once; one host: the budget's.
        slots = getattr(getattr(evaluator, "sandbox", None), "capacity", None)
        self.eval_slots = asyncio.Semaphore(slots or budget.eval_concurrency)
        self.in_flight: set[asyncio.Task] = set()
        self.hook = hook  # the RL hook (evolve/rl/hook.py), or None for a frozen mutator
        self.train_lock = asyncio.Lock()
        self.calls_in_flight = 0
        self.stop_reason: str | None = None
        self.failure: BaseException | None = None  # what stopped the run from inside a task
        self.stopping = False
        self.loops: list[asyncio.Task] = []
        self.sandbox_outage = Outage("sandbox", report)
        self.llm_turn = asyncio.Event()  # clear while tuning has the cores (tuning.background)
        self.llm_turn.set()
        t = problem.search.tuning
        self.allocation = Allocation(t.background, t.adaptive, *t.bounds)
        # With turns, the LLM children worth tuning wait for the next tuning turn, which takes
        # them first: a tuning (300 trials) run beside the server in the LLM's turn would take
        # the cores from it. Kept in memory: a resume tunes the archive's programs instead.
        self.turns = problem.search.llm and t.enabled and t.background > 0
        self.to_tune: deque[Program] = deque()

    # ---- top level -----------------------------------------------------------------------
    async def run(self) -> str:
        self.main = asyncio.current_task()
        session = self.session = Session(run_id=self.db.run_id)
        self.db.add(session)
        self.base_evals = self.db.evaluations_done()
        self.base_calls = self.db.llm_calls_done()
        self.past_wall = self.db.past_wall_time(self.session.id)
        # Seeded from the run seed and how far the run got, so a resume is reproducible too.
        self.rng = np.random.default_rng([self.seed, self.base_calls])
        self._replay_turns()
        try:
            if self.db.count():  # an archive to go on from
                await self._resume()
            else:
                await self._seed()
            if self.hook is not None:
                await self.hook.resume(self.client)
            search = self.problem.search
            self.loops = [asyncio.create_task(self._generate_loop())
                          for _ in range(self.budget.llm_concurrency if search.llm else 0)]
            if search.tuning.enabled and not search.llm:  # one loop keeps the evaluators busy
                self.loops.append(asyncio.create_task(self._tune_loop()))
            elif search.tuning.enabled and search.tuning.background:
                self.loops.append(asyncio.create_task(self._take_turns()))
            await asyncio.gather(*self.loops)
            await self._drain()
            self.stop_reason = self.stop_reason or Stop.BUDGET
        except (asyncio.CancelledError, Exception) as exc:
            failure = self.failure or (exc if isinstance(exc, Exception) else None)
            self.stopping = True
            self.stop_reason = Stop.INTERRUPTED if failure is None else fault_of(failure)
            if self.hook is not None:  # a training step in its thread stops at its next check
                self.hook.stop.set()
            await self._cancel_in_flight()
            if failure is not None and self.stop_reason is None:
                raise failure  # a bug, not a fault: the traceback is the message
        finally:
            self.db.end_session(session, self.stop_reason or "error")
        if self.stop_reason not in FINISHED:
            self.emit("fault", f"stopped: {self.stop_reason}", reason=self.stop_reason)
        return self.stop_reason

    def _watch(self, task: asyncio.Task) -> None:
        """An in-flight task that fails stops the run (a fault), instead of dying unseen."""
        self.in_flight.discard(task)
        if self.stopping or task.cancelled():
            return
        if task.exception() is not None and self.failure is None:
            self.failure = task.exception()
            self.main.cancel()

    def _budget_left(self) -> str | None:
        """The reason to stop asking, or None."""
        b = self.budget
        # Queued children count as spent, so no LLM call is made for a budget already taken.
        if self.base_evals + self.claimed + self.queued >= b.max_evaluations:
            return Stop.BUDGET
        if b.max_llm_calls is not None and self.base_calls + self.stats.calls >= b.max_llm_calls:
            return Stop.LLM_CALLS
        if (left := self._wall_left()) is not None and left <= 0:
            return Stop.WALL_TIME
        if b.target_objective is not None and (best := self.db.best()) is not None \
                and best.objective >= b.target_objective - 1e-12:
            return Stop.TARGET
        return None

    def _wall_left(self) -> float | None:
        """Seconds left of the wall-time budget (None: none set), over all sessions."""
        b = self.budget
        if b.wall_time_s is None:
            return None
        return max(b.wall_time_s - self.past_wall - (time.time() - self.stats.started), 0.0)

    # ---- seed and pending ----------------------------------------------------------------
    async def _seed(self) -> None:
        code = self.problem.seed_code()
        seed = Program(code=code, island=0, origin="seed", generation=0, status="pending")
        started = time.time()
        result = await self._run_evaluator(code)
        if result.status != "ok":
            raise SeedError(seed_failure(self.problem, result))
        _fill(seed, result)
        with self.db.batch():  # the seed's copies and its evaluation, all or nothing
            first = self.db.add_seed(seed)[0]
            self.db.add(Evaluation(program_id=first.id, backend=self.evaluator.sandbox.backend,
                                   status=result.status, started_at=started, elapsed_s=result.elapsed_s))
        self.emit("seed", f"seed: {self._scores(result)}", program=first.id, headline=result.headline,
                  objective=result.objective)
        if self.problem.search.tuning.enabled and self.problem.search.llm:
            if self.turns:
                # Before the first turn, and on no operator's record: the seed's easy first
                # climb is start-up, which the LLM had no turn to match. On tuning's record it
                # held tuning at its ceiling until the LLM's first gain (docs/benchmarks/mutation.md).
                await self._tune(first)
            else:
                self._spawn(self._tune(first))  # the seed is the first best of its island

    async def _resume(self) -> None:
        """Say where the run goes on from (every time, not only when children wait), then
        evaluate what a stopped session left pending."""
        pending = self.db.pending()
        first = f"; evaluating {len(pending)} pending children first" if pending else ""
        self.emit("resume", f"resume: {self.base_evals} evaluations and {self.base_calls} LLM calls "
                  f"done{first}", pending=len(pending), evaluations=self.base_evals, calls=self.base_calls)
        if pending:
            await self._evaluate_group(list(pending))

    # ---- generation ----------------------------------------------------------------------
    async def _generate_loop(self) -> None:
        while (reason := self._budget_left()) is None:
            if not self.llm_turn.is_set():
                await self.llm_turn.wait()
                continue
            if self.hook is not None and self.hook.due():
                await self._train()
                continue
            self.calls_in_flight += 1
            try:
                await self._one_group()
            finally:
                self.calls_in_flight -= 1
        self.stop_reason = self.stop_reason or reason

    async def _train(self) -> None:
        """Pause generation and train: the two cores cannot serve and train at once.

        Calls already in flight come from the current version, so they finish and are scored
        first and join the (on-policy) batch; the other generation loop waits on the lock.
        """
        async with self.train_lock:
            while self.calls_in_flight:
                await asyncio.sleep(0.1)
            await self._drain()
            if self.failure is not None:  # the other loop's step failed: stop with it, not train again
                raise self.failure
            # Not already done by the other loop, and some budget left to use the new policy on.
            if self.hook.due() and self._budget_left() is None:
                try:
                    await self.hook.step(self.client, self.evaluator)
                except Exception as exc:
                    self.failure = exc
                    raise

    async def _one_group(self) -> None:
        call_index = self.base_calls + self.stats.calls
        self.stats.calls += 1
        island = call_index % len(self.db.islands)
        ask = self.db.ask(island, self.rng)
        m = self.policy.answers
        knob = pipeline.asks_knob(self.problem, self.seed, call_index)
        messages, fmt = pipeline.prompt(self.problem, self.policy, ask.parent, ask.inspirations, call_index,
                                        KNOB if knob else None)
        version = self.db.policy_version()
        call = LLMCall(island=island, parent_id=ask.parent.id, policy_version=version.version,
                       model=self.client.model, prompt=dump_messages(messages),
                       n=self.policy.sampling.group_size, started_at=time.time())
        # Cut at the wall time: a call of 8 answers takes minutes on two CPU cores, and a run
        # asked for 10 minutes must not run 15.
        deadline = asyncio.timeout(self._wall_left())
        try:
            async with deadline:
                sample = await self.client.sample(messages, call.n, seed=pipeline.request_seed(self.seed, call_index))
        except asyncio.CancelledError:  # interrupted: keep the call's time in the accounts
            self._cut(call)
            raise
        except Fault:  # the policy server cannot be brought back: the run stops
            raise
        except Exception as exc:
            if deadline.expired():  # the wall time: the loop stops on it
                self._cut(call)
                return
            # the server answered badly: record it, the search goes on
            call.error = f"{type(exc).__name__}: {exc}"[:2000]
            self.db.add_call(call)
            self.emit("llm_error", f"llm call failed: {call.error[:200]}", call=call.id)
            await asyncio.sleep(1.0)
            return
        call.model = sample.model or call.model  # an ensemble's member that answered
        call.prompt_tokens, call.completion_tokens = sample.prompt_tokens, sample.completion_tokens
        call.latency_s, call.prompt_token_ids = sample.latency_s, sample.prompt_token_ids
        with self.db.batch():  # the call, its completions and its children: all or nothing
            self.db.add_call(call)
            children = self._children(ask, call, sample, m, fmt)
        self.stats.tokens += sample.completion_tokens or 0
        self.stats.llm_s += sample.latency_s
        self._spawn(self._finish_group(island, children))

    def _cut(self, call: LLMCall) -> None:
        """Record a call cut short: its time counts, the call does not (resume asks again)."""
        call.error, call.latency_s = "cancelled", time.time() - call.started_at
        self.db.add_call(call)

    def _children(self, ask, call: LLMCall, sample, m: int, fmt: str) -> list[Program]:
        """Store every answer as a child right away: pending, a duplicate, or a failed mutation."""
        children = []
        for i, text in enumerate(sample.texts):
            ids = sample.token_ids[i] if sample.token_ids else None
            completion = Completion(call_id=call.id, index=i, text=text, token_ids=ids,
                                    logprobs=sample.logprobs[i] if sample.logprobs else None,
                                    tokens=len(ids) if ids is not None else None,
                                    finish_reason=sample.finish_reasons[i])
            self.db.add(completion)
            for j, text_j in enumerate(pipeline.answers(text, m)):
                child = Program(island=ask.island, parent_id=ask.parent.id, origin="mutation",
                                generation=ask.parent.generation + 1, completion_id=completion.id,
                                answer_index=j, status="pending")
                self.stats.answers += 1
                answer = pipeline.apply(ask.parent.code, text_j, fmt, self.problem.entry_point,
                                        self.policy.literal_digits)
                if answer.child is not None:
                    child.code = answer.child
                    self.stats.applied += 1
                else:
                    child.status, child.error = "mutation_failed", answer.error
                self.db.tell(child)
                children.append(child)
        return children

    async def _finish_group(self, island: int, children: list[Program]) -> None:
        await self._evaluate_group(children)
        migrant = self.db.advance(island)
        if migrant is not None:
            self.emit("migration", f"migration: island {island} -> {migrant.island}, "
                      f"objective {migrant.objective:.4f}", source=island, target=migrant.island,
                      program=migrant.id, objective=migrant.objective)
        self._progress()

    # ---- evaluation ----------------------------------------------------------------------
    async def _evaluate_group(self, children: list[Program]) -> None:
        """Evaluate each distinct pending child once; duplicates copy the stored result."""
        first_of: dict[str, Program] = {}
        jobs, dups = [], []
        for child in children:
            if child.status != "pending":
                continue
            known = first_of.get(child.code_hash) or self.db.find_duplicate(child.code)
            if known is not None:
                dups.append((child, known))
            else:
                first_of[child.code_hash] = child
                jobs.append(self._evaluate(child))
        await asyncio.gather(*jobs)
        for child, original in dups:
            if original.status == "pending":  # its evaluation did not run (budget): stay pending
                continue
            child.duplicate_of = original.id
            _copy_result(child, original)
            self.db.tell_result(child)

    async def _claimed_run(self, code: str, queued: bool = False):
        """(result, start time) of one evaluation that claims a unit of the budget, or None
        when the budget is spent. `queued`: the caller counted itself in self.queued."""
        async with self.eval_slots:
            if queued:
                self.queued -= 1
            if self.base_evals + self.claimed >= self.budget.max_evaluations:
                return None
            self.claimed += 1
            started = time.time()
            result = await self._run_evaluator(code)
        self.stats.evaluated += 1
        self.stats.statuses[result.status] = self.stats.statuses.get(result.status, 0) + 1
        return result, started

    async def _evaluate(self, child: Program) -> None:
        self.queued += 1
        ran = await self._claimed_run(child.code, queued=True)
        if ran is None:
            return  # over budget: the child stays pending for a resume with a larger budget
        if self._wants_tuning(child, self._store(child, *ran)):
            if self.turns:
                self.to_tune.append(child)
            else:
                self._spawn(self._tune(child))

    def _store(self, child: Program, result, started: float, *extra) -> bool:
        """The child's result, its evaluation (and any rows that go with it) in one commit.
        True if it is the new best of its island."""
        with self.db.unflushed():  # the child must not be flushed into its own "before"
            best_before = self.db.best()
            island_best = self.db.islands[child.island].best()
        _fill(child, result)
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
        if result.status == "ok" and best_before is not None and result.objective > best_before.objective:
            delta = result.objective - best_before.objective
            self.emit("best", f"new best #{child.id} ({child.origin}): {self._scores(result)} "
                      f"(+{delta:.4f})", program=child.id, island=child.island, origin=child.origin,
                      headline=result.headline, objective=result.objective, delta=delta)
        return result.status == "ok" and (island_best is None or result.objective > island_best[0])

    # ---- in-the-loop tuning ----------------------------------------------------------------
    def _wants_tuning(self, child: Program, island_best: bool) -> bool:
        """LLM children worth tuning: each new best of its island, each that changes the code's
        shape (a new structure needs its own numbers before it pays off; with its parent's
        outputs, a knob added at its neutral value) and a share of the others (changes of
        numbers only: the tuner explores those anyway). Never a copy of a stored program."""
        t = self.problem.search.tuning
        if not t.enabled or child.status != "ok" or child.duplicate_of is not None:
            return False
        parent = self.db.get(child.parent_id).code if child.parent_id is not None else None
        if child.outcome == "same":  # the parent's outputs: worth tuning only as a new knob
            return t.structural and parent is not None and adds_knob(parent, child.code)
        return ((t.new_best and island_best) or (t.structural and parent is not None and changes_structure(
            parent, child.code)) or self.rng.random() < t.share)

    def _spawn(self, coroutine) -> None:
        task = asyncio.create_task(coroutine)
        self.in_flight.add(task)
        task.add_done_callback(self._watch)

    async def _tune(self, parent: Program) -> tuple[int, float | None]:
        """Tune one program's literals; the best trial is stored as a `tuned` child. Returns
        the number of trials spent (0: nothing to tune, or no budget) and the child's objective."""
        t = self.problem.search.tuning
        started = time.time()
        tuned = await tune(parent.code, parent.objective, self._trial, t.trials, t.draw_sigma(self.rng),
                           pipeline.request_seed(self.seed, parent.id), t.max_literals, self.rng)
        if tuned.best is None:
            return tuned.trials, None
        child = Program(island=parent.island, parent_id=parent.id, origin="tuned",
                        generation=parent.generation + 1, code=tuned.best.code, status="pending")
        row = Tuning(run_id=self.db.run_id, parent_id=parent.id, trials=tuned.trials,
                     parameters=tuned.parameters, start_objective=parent.objective,
                     best_objective=tuned.best.objective, started_at=started,
                     elapsed_s=time.time() - started)
        self._store(child, tuned.best.result, started, row)
        self.emit("tuned", f"tuned #{parent.id} -> #{child.id}: {tuned.parameters} literals, "
                  f"{tuned.trials} trials, objective {parent.objective:.4f} -> {child.objective:.4f}",
                  parent=parent.id, program=child.id, trials=tuned.trials, parameters=tuned.parameters,
                  objective=child.objective, outcome=child.outcome)
        self._progress()
        return tuned.trials, child.objective

    async def _trial(self, code: str) -> Trial | None:
        if self._budget_left() not in (None, Stop.LLM_CALLS):
            return None  # out of time, or the target is met: a tuning stops mid-way
        ran = await self._claimed_run(code)
        return None if ran is None else Trial(code, ran[0].objective, ran[0])

    async def _tune_loop(self) -> None:
        """Tuning as the only operator (`search.llm: false`), parents as the LLM would get them."""
        rounds = 0
        while (reason := self._budget_left()) is None:
            island = rounds % len(self.db.islands)
            rounds += 1
            if not (await self._tune(self.db.ask(island, self.rng).parent))[0] and self._budget_left() is None:
                reason = Stop.NOTHING_TO_TUNE  # a program without float literals
                break
            self.db.advance(island)
        self.stop_reason = self.stop_reason or reason

    async def _take_turns(self) -> None:
        """`tuning.background`: the LLM and tuning of the archive's programs take turns with the
        cores, tuning's share of a cycle set by `allocation`. The LLM's turn is its share of
        `turn_s`, and ends once the answers in flight are in; tuning's turn then lasts its share
        of the cycle so far (its last tuning finishes first) and tunes the LLM children waiting
        for it before the archive's programs. The LLM is credited with what the best objective
        rose in a cycle beyond what tuning of the archive's programs raised it by (a tuned LLM
        child is the LLM's: its structure made it)."""
        t = self.problem.search.tuning
        rounds = 0
        while True:
            started, best = time.time(), self._best_objective()
            if not await self._wait_while_budget(t.turn_s * (1 - self.allocation.share)):
                return
            if self.hook is not None and self.train_lock.locked():
                continue  # training has the cores
            self.llm_turn.clear()
            try:
                while self.calls_in_flight:
                    await asyncio.sleep(0.1)
                # The LLM's turn lasts at least as long as its calls in flight: size tuning's
                # turn on what it really took, so that the shares hold.
                turn, share = time.time(), self.allocation.share
                end = turn + (turn - started) * share / (1 - share)
                tuning_gain = 0.0
                while time.time() < end and self._budget_left() is None:
                    before = self._best_objective()
                    if self.to_tune:
                        await self._tune(self.to_tune.popleft())
                        continue
                    rounds += 1
                    trials, objective = await self._tune(self.db.ask(rounds % len(self.db.islands), self.rng).parent)
                    if not trials:
                        await asyncio.sleep(0.5)  # nothing to tune on this island
                    tuning_gain += max(0.0, (objective or 0.0) - before)
            finally:
                self.llm_turn.set()
            self._record_turns(self._best_objective() - best - tuning_gain, turn - started,
                               tuning_gain, time.time() - turn)

    def _replay_turns(self) -> None:
        """A resume: the shares go on from the run's record of turns, not from `background`."""
        for turn in self.db.turns():
            self.allocation.record({"llm": turn.llm_gain, "tuning": turn.tuning_gain},
                                   {"llm": turn.llm_s, "tuning": turn.tuning_s})

    def _record_turns(self, llm_gain: float, llm_s: float, tuning_gain: float, tuning_s: float) -> None:
        share = self.allocation.record({"llm": llm_gain, "tuning": tuning_gain},
                                       {"llm": llm_s, "tuning": tuning_s})
        self.db.add(Turn(run_id=self.db.run_id, llm_gain=llm_gain, llm_s=llm_s, tuning_gain=tuning_gain,
                         tuning_s=tuning_s, share=share))
        if self.allocation.adaptive:
            self.emit("turns", f"turns: the best rose {llm_gain:+.4f} in {llm_s:.0f} s of LLM and "
                      f"{tuning_gain:+.4f} in {tuning_s:.0f} s of tuning; tuning's next share {share:.0%}",
                      llm_gain=llm_gain, llm_s=llm_s, tuning_gain=tuning_gain, tuning_s=tuning_s, share=share)

    def _best_objective(self) -> float:
        best = self.db.best()
        return best.objective if best is not None else 0.0

    async def _wait_while_budget(self, seconds: float) -> bool:
        """Sleep up to `seconds`; False as soon as the budget is spent."""
        end = time.time() + seconds
        while self._budget_left() is None:
            if time.time() >= end:
                return True
            await asyncio.sleep(min(1.0, end - time.time()))
        return False

    async def _run_evaluator(self, code: str):
        """Evaluate, waiting out a sandbox outage: a candidate is never scored for our failure."""
        while True:
            try:
                result = await self.evaluator.evaluate(code)
            except SandboxFault as exc:
                if exc.permanent:
                    raise Fault(f"sandbox: {exc}") from None
                if self.sandbox_outage.down_s > SANDBOX_OUTAGE_S:
                    raise Fault(f"sandbox unavailable for {self.sandbox_outage.down_s:.0f} s: {exc}") from None
                await asyncio.sleep(self.sandbox_outage.failed(str(exc)))
                continue
            self.sandbox_outage.recovered()
            return result

    async def _drain(self) -> None:
        while self.in_flight:
            await asyncio.gather(*list(self.in_flight))

    async def _cancel_in_flight(self) -> None:
        """Abandon evaluations (their children stay pending) and calls (redone on resume)."""
        tasks = [*self.in_flight, *self.loops]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # ---- reporting -----------------------------------------------------------------------
    def _progress(self) -> None:
        s = self.stats
        minutes = max(time.time() - s.started, 1e-9) / 60
        best = self.db.best()
        valid = f"{s.applied}/{s.answers}" if s.answers else "-"
        statuses = " ".join(f"{k}={v}" for k, v in sorted(s.statuses.items()))
        done = self.base_evals + self.claimed
        self.emit(
            "progress",
            f"[{done}/{self.budget.max_evaluations} evals] "
            f"best {self.problem.headline}={_six(best.headline)} (#{best.id}) | applied {valid} | "
            f"{statuses} | {s.evaluated / minutes:.1f} evals/min | "
            f"{s.tokens / (minutes * 60):.0f} tok/s",
            evaluations=done, budget=self.budget.max_evaluations, best=best.id)

    def _scores(self, result) -> str:
        """'n26 = 2.166667, objective 0.8658', or just the objective when that is the headline."""
        if self.problem.headline == "objective":
            return f"objective {result.objective:.4f}"
        return f"{self.problem.headline} = {_six(result.headline)}, objective {result.objective:.4f}"

    def emit(self, kind: str, message: str, **fields) -> None:
        self.report(Event(kind, message, fields))


def _six(headline: float | None) -> str:
    """A headline value; None where the program is valid on other components only."""
    return "invalid" if headline is None else f"{headline:.6f}"


def _fill(program: Program, result) -> None:
    program.status, program.error = result.status, result.error
    program.fitness, program.raw = result.components, result.raw
    program.objective, program.headline = result.objective, result.headline
    program.descriptors = result.descriptors or None


def _copy_result(child: Program, original: Program) -> None:
    for name in ("status", "error", "fitness", "raw", "objective", "headline", "descriptors"):
        setattr(child, name, getattr(original, name))
