"""In-memory fakes of the engine's two outside protocols, for the fast tier.

`LiteralSandbox` (a `Sandbox`) never executes a candidate: a program's output is the list of the
float literals in its EVOLVE-BLOCK, read by parsing; a block that says `raise` fails. `ScriptedSampler`
(a `Sampler`) answers each call with diffs that move one literal of the toy program. With the
toy problem's trusted scorer (closeness of the literals to a target), the controller, the
operators and the scheduler run the whole loop, database included, in well under a second.
"""
from __future__ import annotations

import asyncio
import time
from pathlib import Path

import yaml
from scripted_run import write_policy

from evolve.config import Policy, Problem, load_policy, load_problem
from evolve.judge.evaluator import Evaluator
from evolve.mutation.code import evolve_block
from evolve.mutation.literals import float_literals
from evolve.run import open_database
from evolve.sandbox.result import SandboxResult
from evolve.search.controller import Controller
from evolve.serving.client import Sample
from evolve.store.database import ProgramDatabase

SEED = '''# EVOLVE-BLOCK-START
def solve():
    return [0.5, 0.5]
# EVOLVE-BLOCK-END
'''
NO_LITERALS = '''# EVOLVE-BLOCK-START
def solve():
    return [1, 2]
# EVOLVE-BLOCK-END
'''
SCORER = '''
TARGET = [0.8, 0.3]


def score(args, output):
    if len(output) > len(TARGET):
        raise ValueError(f"{len(output)} numbers, expected at most {len(TARGET)}")
    values = list(output) + [0.0] * (len(TARGET) - len(output))  # a number not given is 0
    return 1.0 / (1.0 + sum((x - t) ** 2 for x, t in zip(values, TARGET)))


def descriptors(outputs, code=""):
    return {"x": float((outputs["fit"] or [0.0])[0])}
'''


class LiteralSandbox:
    """A `Sandbox` that reads a program's output off its literals instead of running it."""
    backend = "literal"

    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s
        self.runs = 0

    async def run(self, code: str, entry_point: str, cases: list[dict]) -> SandboxResult:
        self.runs += 1
        await asyncio.sleep(self.delay_s)
        if "raise" in evolve_block(code):
            return SandboxResult("ok", {}, {c["name"]: "RuntimeError: raised" for c in cases}, "", self.delay_s)
        values = [lit.value for lit in float_literals(code)]
        return SandboxResult("ok", {c["name"]: values for c in cases}, {}, "", self.delay_s)

    def close(self) -> None:
        pass


def diff(search: str, replace: str) -> str:
    return f"Move a number.\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE"


class ScriptedSampler:
    """A `Sampler` whose answers are diffs of the toy program's return line: some apply to any
    parent (a full rewrite of the line), some only to the seed, one breaks it."""
    model = "scripted"

    def __init__(self, delay_s: float = 0.0):
        self.delay_s = delay_s
        self.calls = 0
        self.seeds: list[int | None] = []

    async def sample(self, messages: list[dict], n: int, seed: int | None = None,
                     max_tokens: int | None = None, model: str | None = None, on_answer=None) -> Sample:
        self.calls += 1
        self.seeds.append(seed)
        await self.generate()
        parent = messages[-1]["content"]
        line = next((ln for ln in parent.splitlines() if ln.strip().startswith("return [")), "    return [0.5, 0.5]")
        k = self.calls  # new numbers every call, so that the children are new programs
        answers = [diff(line, f"    return [{k * 0.137 % 1:.4f}, {k * 0.291 % 1:.4f}]"),
                   diff(line, "    raise RuntimeError('no')"),
                   diff("    this line is not there", "    pass"),
                   diff(line, f"    return [{0.8 - 0.3 / (k + 1):.4f}, 0.3]")]
        texts = [answers[i % len(answers)] for i in range(n)]
        return Sample(texts=texts, finish_reasons=["stop"] * n, prompt_tokens=100,
                      completion_tokens=20 * n, started_at=time.time(), latency_s=self.delay_s)

    async def generate(self) -> None:
        await asyncio.sleep(self.delay_s)

    async def close(self) -> None:
        pass


class PausableSampler(ScriptedSampler):
    """A ScriptedSampler whose server can be paused (`Pausable`): a call's `delay_s` runs only
    while it is not, as a frozen engine's batch waits; `spanned` counts the calls that were in
    flight across a pause."""

    def __init__(self, delay_s: float):
        super().__init__(delay_s)
        self.paused, self.pauses, self.spanned = False, 0, 0

    def pause(self) -> bool:
        self.paused, self.pauses = True, self.pauses + 1
        return True

    def resume(self) -> None:
        self.paused = False

    async def generate(self) -> None:
        left, pauses = self.delay_s, self.pauses
        while left > 0:
            await asyncio.sleep(0.005)
            left -= 0.0 if self.paused else 0.005
        self.spanned += self.pauses > pauses


def toy_problem(folder: Path, seed_code: str = SEED, **search) -> Problem:
    """The toy problem in `folder`: two literals to bring to a target, one component."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "scorer.py").write_text(SCORER)
    budget = search.pop("budget", {})
    data = {
        "name": "toy", "description": "Bring the two numbers solve() returns to the target.",
        "program_code": seed_code, "entry_point": "solve", "scorer": "scorer.py",
        "components": [{"name": "fit", "args": {}, "reference": 1.0}], "headline": "fit",
        "descriptors": [{"name": "x", "low": 0.0, "high": 1.0, "bins": 4}],
        "search": {"islands": 2, "migration_every": 2, "tuning": {"enabled": False}, **search},
        # (the call cap: a run whose answers were all copies would otherwise never spend its budget)
        "budget": {"max_evaluations": 40, "max_llm_calls": 400, "llm_concurrency": 1, "eval_concurrency": 2,
                   **budget},
    }
    path = folder / "toy.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load_problem(path)


def toy_policy(folder: Path) -> tuple[Policy, Path]:
    """The scripted runs' policy (a group of 4, no server)."""
    path = write_policy(folder)
    return load_policy(path), path


def toy_run(folder: Path, problem: Problem, sampler: ScriptedSampler | None = None,
            sandbox: LiteralSandbox | None = None, seed: int = 0) -> tuple[str, ProgramDatabase, list]:
    """One run of the real controller on the fakes; (stop reason, the open database, the events)."""
    policy, policy_path = toy_policy(folder)
    spec = {"policy": str(policy_path), "seed": seed, "db_url": f"sqlite:///{folder / 'evolve.db'}",
            "run_name": folder.name}
    db = open_database(spec, problem, policy, folder)
    events: list = []
    evaluator = Evaluator(problem, sandbox=sandbox or LiteralSandbox())
    controller = Controller(problem, policy, db, evaluator, sampler or ScriptedSampler(), problem.budget,
                            seed, events.append)
    return asyncio.run(controller.run()), db, events
