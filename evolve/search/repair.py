"""The repair operator: an LLM answer that ran and failed is re-asked with the judge's reason.

Small models write near-misses: a new construction that calls its helper before the value it
needs exists, an undefined name, a function that calls itself. Each is one line from working,
and a second look with the error in front of the model mends many of them (ShinkaEvolve re-asks
up to 3 times). A repair is an LLM call like any other (stored, counted, seeded by its index) in
the LLM's loops, ahead of new calls but one at a time: the broken child is its parent, so the
lineage reads parent -> broken answer -> repair, and a repair that fails again is offered back, up to
`attempts` re-asks in all. The queue is kept in memory, as the tuner's is: a resume does not
re-ask what was waiting.
"""
from __future__ import annotations

import time
from collections import Counter, deque
from typing import cast

from evolve.config import Policy
from evolve.config import Repair as RepairConfig
from evolve.mutation import pipeline
from evolve.mutation.literals import changes_structure
from evolve.mutation.prompt import Shown, dump_messages
from evolve.search.llm import LLMMutation
from evolve.search.operator import Engine, Step
from evolve.store.schema import LLMCall, Program

BROKEN = ("error", "invalid")  # it ran, and raised or was refused: the judge says why


class Repair:
    name = "repair"
    origin = "repair"

    def __init__(self, engine: Engine, llm: LLMMutation, policy: Policy, config: RepairConfig):
        self.engine, self.llm, self.policy, self.config = engine, llm, policy, config
        self.waiting: deque[Program] = deque()
        self.taken: Counter[int] = Counter()  # broken answers queued per LLM call
        self.in_flight = 0

    @property
    def ready(self) -> bool:
        """A broken answer waits and no re-ask is in flight: one at a time, so that the other
        LLM loops keep asking new calls of `n` answers. Re-asks of n = 2 on every loop took 17
        of a 30-minute run's 23 calls and two thirds of its call time, for 0 improving answers
        (held-out seed 21, docs/benchmarks/generalization.md); beside a new call the server
        batches them with its answers."""
        return bool(self.waiting) and not self.in_flight

    async def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def offer(self, child: Program, island_best: bool) -> None:
        if self._wants(child):
            self.waiting.append(child)

    def _wants(self, child: Program) -> bool:
        """A broken LLM answer with the judge's reason, not yet re-asked `attempts` times; from
        a first answer, only one that changes the structure and the first `per_call` of its call."""
        if child.status not in BROKEN or child.code is None or not child.error or child.parent_id is None:
            return False
        db = self.engine.db
        if child.origin == "repair":
            return self.attempt(child) < self.config.attempts
        if child.origin != "mutation":
            return False
        parent = db.get(child.parent_id)
        if self.config.structural_only and (parent.code is None or not changes_structure(parent.code, child.code)):
            return False
        call = db.call_of(child)
        if call is None or self.taken[call] >= self.config.per_call:
            return False
        self.taken[call] += 1
        return True

    def attempt(self, child: Program) -> int:
        """How many re-asks made this child (0: a first answer)."""
        count = 0
        while child.origin == "repair" and child.parent_id is not None:
            count += 1
            child = self.engine.db.get(child.parent_id)
        return count

    async def step(self) -> Step:
        """Re-ask the oldest broken answer; its repairs are evaluated beside the next call."""
        if not self.waiting:
            return Step(0)
        broken = self.waiting.popleft()
        engine, llm = self.engine, self.llm
        parent = engine.db.working_ancestor(broken)  # what the broken answer was meant to improve
        call_index = engine.ledger.calls
        engine.ledger.stats.calls += 1
        # (cast: both ran, so both have code; `_wants` took only such children)
        messages, fmt = pipeline.repair_prompt(engine.problem, self.policy, cast(Shown, broken), cast(Shown, parent),
                                               call_index)
        call = LLMCall(island=broken.island, parent_id=broken.id, policy_version=engine.db.policy_version().version,
                       model=llm.served() or llm.client.model, prompt=dump_messages(messages), n=self.config.n,
                       started_at=time.time())
        llm.calls_in_flight += 1  # the turns wait for it as for any call
        self.in_flight += 1
        try:
            sample = await llm.sample(call, messages, call_index)
        finally:
            llm.calls_in_flight -= 1
            self.in_flight -= 1
        if sample is None:
            return Step(0)
        children = llm.record(call, sample, broken, fmt, self.origin)
        engine.emit("repair", f"repair #{broken.id} (attempt {self.attempt(broken) + 1}): "
                    f"{sum(c.code is not None for c in children)} of {len(children)} answers apply",
                    program=broken.id, call=call.id)
        engine.tasks.spawn(engine.evaluate_group(children))
        return Step(sum(child.status == "pending" for child in children))
