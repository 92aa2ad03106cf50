"""The LLM mutation operator: one call samples a group of answers for one parent.

A step asks the archive for a parent and inspirations, samples the policy's group (n answers,
m per completion), and stores every answer as a child at once, in the same transaction as the
call: pending, or a failed mutation. Their evaluation runs beside the next call. Between calls a
learning mutator (the RL hook) may train: generation pauses, since the two cores cannot serve and
train at once.
"""
from __future__ import annotations

import asyncio
import time
from typing import cast

from evolve.config import Policy
from evolve.faults import Fault
from evolve.mutation import pipeline
from evolve.mutation.prompt import KNOB, Shown, dump_messages
from evolve.search.operator import Engine, Learner, Step
from evolve.serving.client import Sample, Sampler
from evolve.store.schema import Completion, LLMCall, Program


class LLMMutation:
    name = "llm"
    origin = "mutation"

    def __init__(self, engine: Engine, policy: Policy, client: Sampler, hook: Learner | None = None):
        self.engine, self.policy, self.client = engine, policy, client
        self.hook = hook  # the RL hook (evolve/rl/hook.py), or None for a frozen mutator
        self.train_lock = asyncio.Lock()
        self.calls_in_flight = 0
        self.answers_running = 0  # asked of the server and not yet answered (scheduler: llm_batch)

    async def start(self) -> None:
        if self.hook is not None:
            await self.hook.resume(self.client)

    def offer(self, child: Program, island_best: bool) -> None:
        pass  # the LLM takes its parents from the archive

    def stop(self) -> None:
        if self.hook is not None:  # a training step in its thread stops at its next check
            self.hook.stop.set()

    def training(self) -> bool:
        return self.hook is not None and self.train_lock.locked()

    def served(self) -> str | None:
        """The name the run's current policy version is served under, which every call names;
        None: the client's own model (a frozen mutator, an ensemble)."""
        return self.hook.served if self.hook is not None else None

    async def step(self) -> Step:
        """One call (or, when the hook is due, one training step instead). Once the calls in
        flight make a step's worth, no new call starts: every step trains on the same number of
        answers (`train_every_answers`)."""
        if self.hook is not None and (self.hook.due() or self.hook.full(self.calls_in_flight)):
            await self._train(self.hook)
            return Step(0)
        self.calls_in_flight += 1
        try:
            return await self._call()
        finally:
            self.calls_in_flight -= 1

    async def _train(self, hook: Learner) -> None:
        """Pause generation and train.

        Calls already in flight come from the current version and complete the step's worth, so
        they finish and are scored first; the other generation loop waits on the lock. A call in
        flight that failed leaves the step short: no step yet, and the loop asks a new call.
        """
        engine = self.engine
        async with self.train_lock:
            while self.calls_in_flight:
                await asyncio.sleep(0.1)
            await engine.tasks.drain()
            if engine.tasks.failure is not None:  # the other loop's step failed: stop with it, not train again
                raise engine.tasks.failure
            # Not already done by the other loop, and some budget left to use the new policy on.
            if hook.due() and engine.ledger.left() is None:
                try:
                    await hook.step(self.client, engine.evaluator)
                except Exception as exc:
                    engine.tasks.failure = exc
                    raise

    async def _call(self) -> Step:
        engine = self.engine
        call_index = engine.ledger.calls
        engine.ledger.stats.calls += 1
        island = call_index % len(engine.db.archive.islands)
        ask = engine.db.ask(island, engine.rng)
        knob = pipeline.asks_knob(engine.problem, engine.seed, call_index)
        # (cast: the archive hands out evaluated programs only, whose code is set)
        messages, fmt = pipeline.prompt(engine.problem, self.policy, cast(Shown, ask.parent), ask.inspirations,
                                        call_index, KNOB if knob else None)
        call = LLMCall(island=island, parent_id=ask.parent.id, policy_version=engine.db.policy_version().version,
                       model=self.served() or self.client.model, prompt=dump_messages(messages),
                       n=self.policy.sampling.group_size, started_at=time.time())
        sample = await self.sample(call, messages, call_index)
        if sample is None:
            return Step(0)
        children = self.record(call, sample, ask.parent, fmt, self.origin)
        engine.tasks.spawn(self._finish(island, children))
        return Step(sum(child.status == "pending" for child in children))

    def record(self, call: LLMCall, sample: Sample, parent: Program, fmt: str, origin: str) -> list[Program]:
        """Store the call, its completions and every answer as a child of `parent`, all or nothing."""
        engine = self.engine
        call.model = sample.model or call.model  # an ensemble's member that answered
        call.prompt_tokens, call.completion_tokens = sample.prompt_tokens, sample.completion_tokens
        call.latency_s, call.prompt_token_ids = sample.latency_s, sample.prompt_token_ids
        with engine.db.batch():
            engine.db.add_call(call)
            children = self._children(parent, call, sample, fmt, origin)
        engine.ledger.stats.tokens += sample.completion_tokens or 0
        engine.ledger.stats.llm_s += sample.latency_s
        return children

    async def sample(self, call: LLMCall, messages: list[dict], call_index: int) -> Sample | None:
        """The group, or None where the call failed (recorded) or the wall time cut it."""
        engine = self.engine
        # Cut at the wall time: a call of 8 answers takes minutes on two CPU cores, and a run
        # asked for 10 minutes must not run 15.
        deadline = asyncio.timeout(engine.ledger.wall_left())
        left = call.n  # this call's answers still running: a retried call may report one twice

        def answered() -> None:
            nonlocal left
            if left:
                left -= 1
                self.answers_running -= 1

        self.answers_running += left
        try:
            async with deadline:
                return await self.client.sample(messages, call.n, model=self.served(), on_answer=answered,
                                                seed=pipeline.request_seed(engine.seed, call_index))
        except asyncio.CancelledError:  # interrupted: keep the call's time in the accounts
            self._cut(call)
            raise
        except Fault:  # the policy server cannot be brought back: the run stops
            raise
        except Exception as exc:
            if deadline.expired():  # the wall time: the loop stops on it
                self._cut(call)
                return None
            # the server answered badly: record it, the search goes on
            call.error = f"{type(exc).__name__}: {exc}"[:2000]
            engine.db.add_call(call)
            engine.emit("llm_error", f"llm call failed: {call.error[:200]}", call=call.id)
            await asyncio.sleep(1.0)
            return None
        finally:
            self.answers_running -= left
            left = 0

    def _cut(self, call: LLMCall) -> None:
        """Record a call cut short: its time counts, the call does not (resume asks again)."""
        call.error, call.latency_s = "cancelled", time.time() - call.started_at
        self.engine.db.add_call(call)

    def _children(self, parent: Program, call: LLMCall, sample: Sample, fmt: str, origin: str) -> list[Program]:
        """Store every answer as a child right away: pending, or a failed mutation."""
        engine, children = self.engine, []
        for i, text in enumerate(sample.texts):
            ids = sample.token_ids[i] if sample.token_ids else None
            completion = Completion(call_id=call.id, index=i, text=text, token_ids=ids,
                                    logprobs=sample.logprobs[i] if sample.logprobs else None,
                                    tokens=len(ids) if ids is not None else None,
                                    finish_reason=sample.finish_reasons[i])
            engine.db.add(completion)
            for j, text_j in enumerate(pipeline.answers(text, self.policy.answers)):
                child = Program(island=call.island, parent_id=parent.id, origin=origin,
                                generation=parent.generation + 1, completion_id=completion.id,
                                answer_index=j, status="pending")
                engine.ledger.stats.answers += 1
                answer = pipeline.apply(cast(Shown, parent).code, text_j, fmt, engine.problem.entry_point,
                                        self.policy.literal_digits)
                if answer.child is not None:
                    child.code = answer.child
                    engine.ledger.stats.applied += 1
                else:
                    child.status, child.error = "mutation_failed", answer.error
                engine.db.tell(child)
                children.append(child)
        return children

    async def _finish(self, island: int, children: list[Program]) -> None:
        engine = self.engine
        await engine.evaluate_group(children)
        migrant = engine.db.advance(island)
        if migrant is not None:
            engine.emit("migration", f"migration: island {island} -> {migrant.island}, "
                        f"objective {migrant.objective:.4f}", source=island, target=migrant.island,
                        program=migrant.id, objective=migrant.objective)
        engine.progress()
