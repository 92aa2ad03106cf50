"""The repair operator (evolve/search/repair.py) in the fast tier: a broken LLM answer is re-asked
with the judge's reason, its repairs stored as its children, up to `attempts` re-asks in all."""
from __future__ import annotations

import asyncio
import re
import time

from fakes import ScriptedSampler, diff, toy_problem, toy_run
from sqlalchemy import select

from evolve.mutation.prompt import REPAIR
from evolve.rundir import Stop
from evolve.serving.client import Sample
from evolve.store.schema import LLMCall, Program

RAISE = re.compile(r"^    raise RuntimeError\('([^']*)'\)$", re.M)


class RepairingSampler(ScriptedSampler):
    """The scripted answers; a re-ask (the REPAIR directive) is answered with `mend(line)` of the
    broken program's `raise` line."""

    def __init__(self, mend):
        super().__init__()
        self.mend = mend
        self.reasks: list[str] = []

    async def sample(self, messages, n, seed=None, max_tokens=None, model=None, on_answer=None) -> Sample:
        request = messages[-1]["content"]
        if REPAIR not in request:
            return await super().sample(messages, n, seed, max_tokens)
        self.calls += 1
        self.seeds.append(seed)
        self.reasks.append(request)
        line = RAISE.findall(request)[-1]
        text = diff(f"    raise RuntimeError('{line}')", self.mend(line))
        return Sample(texts=[text] * n, finish_reasons=["stop"] * n, prompt_tokens=100,
                      completion_tokens=20 * n, started_at=time.time(), latency_s=0.0)


def repair_run(tmp_path, mend, **repair):
    problem = toy_problem(tmp_path, repair={"attempts": 2, "per_call": 1, "n": 2, **repair},
                          budget={"max_evaluations": 60})
    sampler = RepairingSampler(mend)
    reason, db, events = toy_run(tmp_path, problem, sampler)
    rows = list(db.session.scalars(select(Program).where(Program.run_id == db.run_id).order_by(Program.id)))
    return reason, db, sampler, rows


def test_a_broken_answer_is_re_asked_with_the_judges_reason_and_its_repair_is_its_child(tmp_path):
    reason, db, sampler, rows = repair_run(tmp_path, lambda line: "    return [0.75, 0.3]")
    assert reason == Stop.BUDGET and db.evaluations_done() == 60  # repairs count like any answer
    repairs = [p for p in rows if p.origin == "repair"]
    assert repairs and sampler.reasks
    assert all("RuntimeError: raised" in request for request in sampler.reasks)  # the judge's words
    for child in repairs:
        broken = db.get(child.parent_id)
        assert broken.origin == "mutation" and broken.status == "error"
        assert child.generation == broken.generation + 1 and child.island == broken.island
        # judged against the last working program of its lineage, not the broken answer (a copy
        # of a stored program is `same`)
        assert child.duplicate_of is not None or child.outcome == ("better" if child.objective > db.get(broken.parent_id).objective else "worse")
    calls = {c.id: c for c in db.session.scalars(select(LLMCall))}
    reask_calls = [c for c in calls.values() if db.get(c.parent_id).status == "error"]
    assert len(reask_calls) == len(sampler.reasks) and all(c.n == 2 for c in reask_calls)
    per_call: dict[int, int] = {}
    for call in reask_calls:
        first = db.call_of(db.get(call.parent_id))
        per_call[first] = per_call.get(first, 0) + 1
    assert max(per_call.values()) == 1  # per_call: one broken answer of each call is re-asked


def test_a_repair_that_fails_again_is_re_asked_up_to_the_limit(tmp_path):
    reason, db, sampler, rows = repair_run(tmp_path, lambda line: f"    raise RuntimeError('{line}!')")
    depth = {}
    for p in rows:
        if p.origin == "repair":
            parent = db.get(p.parent_id)
            depth[p.id] = depth.get(parent.id, 0) + 1
    assert depth and max(depth.values()) == 2  # attempts: 2 re-asks in all, never a third
    assert any("RuntimeError: raised" in r for r in sampler.reasks)


def test_no_repair_by_default(tmp_path):
    reason, db, sampler, rows = repair_run(tmp_path, lambda line: "    return [0.75, 0.3]", attempts=0)
    assert not sampler.reasks and not any(p.origin == "repair" for p in rows)


class SlowRepairs(RepairingSampler):
    """Re-asks that take a while, counted while they are in flight."""

    def __init__(self, mend):
        super().__init__(mend)
        self.flying = self.most = self.new_beside = 0

    async def sample(self, messages, n, seed=None, max_tokens=None, model=None, on_answer=None) -> Sample:
        if REPAIR not in messages[-1]["content"]:
            self.new_beside += self.flying > 0
            return await super().sample(messages, n, seed, max_tokens)
        self.flying += 1
        self.most = max(self.most, self.flying)
        try:
            await asyncio.sleep(0.05)
            return await super().sample(messages, n, seed, max_tokens)
        finally:
            self.flying -= 1


def test_one_re_ask_at_a_time_the_other_loops_ask_new_calls(tmp_path):
    """With two LLM loops and a queue of broken answers, never two re-asks at once: new calls go on."""
    problem = toy_problem(tmp_path, repair={"attempts": 2, "per_call": 2, "n": 2},
                          budget={"max_evaluations": 60, "llm_concurrency": 2})
    sampler = SlowRepairs(lambda line: f"    raise RuntimeError('{line}!')")
    toy_run(tmp_path, problem, sampler)
    assert sampler.reasks and sampler.most == 1
    assert sampler.new_beside  # while a re-ask was out, the other loop asked a new call
