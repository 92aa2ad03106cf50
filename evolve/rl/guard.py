"""The guard of the RL hook: a new policy version serves only if it is not worse than the one
it would replace.

One training step measured on this CPU made the mutator worse (answers that applied fell from
19.5 % to 4 %, copies of the prompt's worked example rose from 3 to 19 of 40) and was served
anyway. So after each step, before the new adapter serves the search, both versions answer the
same held-out parents (archive elites that no training call used as its parent, never the seed)
with the same request seeds, every answer is applied and scored in the sandbox, and the new
version is refused when its valid-answer rate, its improving rate (children that beat their
parent) or the reward its algorithm optimises falls below its predecessor's by more than
`train.guard.margin`: GRPO's mean scalar reward per answer, VPO's mean set reward over whole
completions (the max over a completion's m answers, under fixed Dirichlet weightings). A VPO
step that trades a few valid answers for better sets is VPO doing its job; a drop of the set
reward is not. A predecessor is
measured once, before the step, while the server still serves it; its rates are kept for the
next check, and in the step's record with the parents' ids, so a resumed run measures only its
next version too (a measure is 32 answers: 4-10 min on this CPU). Each version is measured as
the run serves it (merged into the weights on a CPU, where a LoRA halves generation), so the
guard costs half what LoRAs on the base weights did and needs no restart of its own.

The answers the guard asks for are not part of the run: they are not stored, trained on or
counted in the budget, so they give a training arm no candidate a frozen arm lacks; they cost it
time (answers and seconds, recorded with the training step) and, by refusing a version, decide
which policy writes its next answers.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

from evolve.config import Guard as GuardSettings
from evolve.config import Policy, Problem
from evolve.judge.evaluator import Evaluator
from evolve.mutation.prompt import answer_format
from evolve.rl import advantages
from evolve.rl.heldout import new_valid, sample_answers, score_answers
from evolve.rl.rollouts import fitness_vector, gain
from evolve.serving.client import Sampler
from evolve.store.database import ProgramDatabase

SALT = 0x6A4D  # the guard's parents and request seeds: apart from the run's and compare's


@dataclass
class Rates:
    version: int
    answers: int
    valid: float  # share of answers whose child scored with outputs of its own (heldout.new_valid)
    improving: float  # share of answers whose child beat its parent
    seconds: float
    reward: float | None = None  # the algorithm's own: GRPO's per answer, VPO's set reward per completion


@dataclass
class Verdict:
    """The guard's word on a new version, stored with its training step (`record`)."""
    ok: bool
    why: str
    margin: float
    parent_ids: list[int]
    before: Rates
    after: Rates

    def record(self) -> dict:
        return {**asdict(self), "parents": len(self.parent_ids)}


class Guard:
    def __init__(self, settings: GuardSettings, problem: Problem, policy: Policy, db: ProgramDatabase):
        self.settings, self.problem, self.policy, self.db = settings, problem, policy, db
        self.parents: list[dict] | None = None  # chosen at the first check, then fixed
        self.measured: dict[int, Rates] = {}  # version -> its rates on those parents
        weights = problem.weight_vector()
        self.weights = np.array([weights[c.name] for c in problem.components])
        # VPO's set reward under weightings fixed for the run: every version is measured alike
        self.set_weights = np.random.default_rng(SALT).dirichlet(np.ones(len(problem.components)), size=1000)

    def choose_parents(self) -> list[dict]:
        """Elites of the archive that no training call had as its parent; never the seed."""
        pool = self.db.unasked_elites()
        rng = np.random.default_rng([self.db.run_seed(), SALT])
        picked = sorted(rng.choice(len(pool), size=min(self.settings.parents, len(pool)), replace=False))
        return [_parent(pool[i]) for i in picked]

    def restore(self, record: dict | None) -> None:
        """After a resume: the parents and the serving version's rates of the last check (a
        record written before parent ids were kept restores nothing: both are chosen and measured
        again)."""
        if not record:
            return
        programs = [self.db.get(pid) for pid in record.get("parent_ids", [])]
        if not programs or None in programs:
            return
        self.parents = [_parent(p) for p in programs]
        serving = record["after"] if record["ok"] else record["before"]
        self.measured = {serving["version"]: Rates(**serving)}

    async def measure(self, client: Sampler, model: str, version: int, evaluator: Evaluator) -> Rates:
        """The version's answers for every guard parent, applied and scored (same seeds for all)."""
        started, records, rewards = time.time(), [], []
        for i, parent in enumerate(self.parents or []):
            answers, _ = await sample_answers(client, self.problem, self.policy, parent, SALT + i,
                                              self.settings.answers, model=model)
            scored = await score_answers(evaluator, self.problem, parent, answers,
                                         self.problem.budget.eval_concurrency,
                                         answer_format(self.policy, SALT + i), self.policy.literal_digits)
            records += scored
            rewards += [self.reward(scored, parent)] * len(scored)
        n = max(len(records), 1)
        return Rates(version, len(records), sum(new_valid(r) for r in records) / n,
                     sum(r["beats_parent"] for r in records) / n, time.time() - started,
                     float(np.mean(rewards)) if rewards else 0.0)

    def reward(self, records: list, parent: dict | None = None) -> float:
        """The mean of what the policy's algorithm rewards over one parent's answers: GRPO (m = 1)
        an answer's weighted components, VPO a whole completion's set reward. An answer that
        failed or changed nothing (its parent's outputs) is the zero vector, as in training; with
        `train.reward: improvement`, an answer's vector is its gain over the parent, clipped at 0."""
        vectors = np.array([r["vector"] if new_valid(r) else [0.0] * len(r["vector"]) for r in records])
        if not len(vectors):
            return 0.0
        if parent is not None and self.policy.train is not None and self.policy.train.reward == "improvement":
            vectors = gain(vectors, fitness_vector(parent.get("fitness"), [c.name for c in self.problem.components]))
        train = self.policy.train
        if train is None or train.algorithm == "grpo":
            return float(np.mean(vectors @ self.weights))
        m = self.policy.answers  # sample_answers gives whole completions: the sets are every m in a row
        return float(np.mean([advantages.set_reward(vectors[i:i + m], self.set_weights)
                              for i in range(0, len(vectors), m)]))

    async def prepare(self, client: Sampler, old: tuple[int, str], evaluator: Evaluator) -> bool:
        """Before a step: choose the held-out parents (again while the archive is young) and
        measure `old` (version, served name) on them unless it was measured already, while the
        server still serves it as the run does. False when the archive has no held-out parent
        yet: a new version could not be measured, so it is not worth training."""
        if self.parents is None or len(self.parents) < self.settings.parents:
            chosen = self.choose_parents()
            if [p["id"] for p in chosen] != [p["id"] for p in self.parents or []]:
                self.parents, self.measured = chosen, {}  # rates on other parents do not compare
        if not self.parents:
            return False
        if old[0] not in self.measured:
            self.measured[old[0]] = await self.measure(client, old[1], old[0], evaluator)
        return True

    async def check(self, client: Sampler, old: int, new: tuple[int, str], evaluator: Evaluator) -> Verdict:
        """The verdict on `new` (version, served name) against version `old`, measured by `prepare`."""
        before = self.measured[old]
        after = await self.measure(client, new[1], new[0], evaluator)
        margin = self.settings.margin
        fmt = lambda name, x: f"{x:.3f}" if name == "reward" else f"{x:.1%}"  # noqa: E731
        worse = [f"{name} {fmt(name, getattr(before, name))} -> {fmt(name, getattr(after, name))}"
                 for name in ("valid", "improving", "reward")  # (a record of before the reward: none)
                 if None not in (getattr(after, name), getattr(before, name))
                 and getattr(after, name) < getattr(before, name) - margin]
        if not worse:
            self.measured[new[0]] = after
        why = (f"worse than v{old} by more than {margin:.2f}: {'; '.join(worse)}" if worse
               else f"not worse than v{old} (margin {margin:.2f})")
        return Verdict(not worse, why, margin, [p["id"] for p in self.parents or []], before, after)


def _parent(program) -> dict:
    """A held-out parent as the prompt and the scorer take it (no inspirations: same for all)."""
    return {"id": program.id, "code": program.code, "status": "ok", "objective": program.objective,
            "headline": program.headline, "fitness": program.fitness, "error": program.error,
            "inspirations": []}
