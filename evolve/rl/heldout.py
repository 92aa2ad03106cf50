"""Held-out measurement for `evolve compare`: best@k and pass@k of an arm's final policy (and,
with --heldout-versions, of every version it published).

The protocol (docs/design.md §8, the VPO paper's): give the policy a fixed set of parents it never
trained on, sample a pool of n answers for each, evaluate every answer in the sandbox, and
estimate from the pool what k answers would achieve (evolve/compare/stats.py: best@k, pass@k).

Held-out parents: the MAP-Elites elites of the comparison's frozen arms and of any run given with
`--heldout-from` (the programs the search itself would pick as parents), drawn with a fixed rng,
minus any program (by code) that a training arm ever stored, so no trained policy saw it in a
prompt. Never the seed: every arm started from it and trained on its children. When fewer
elites exist than asked for, the comparison says so and how to get more (a frozen arm, a larger
budget, or `--heldout-from` a finished run of the same problem).

Nothing here writes to an arm's database: the calls and evaluations made here are not part of
any run's budget or training data. The pools go to COMPARE_DIR/heldout/<arm>.json (the final
version) and <arm>@v<N>.json (the earlier ones), written after each parent so an interrupted
measurement resumes where it stopped.

Cost, on two CPU cores: a pool of 8 parents x 30 answers was about 20 minutes. So a version is
served as its run served it (merged into the weights where the run merged: through a LoRA the
server runs at half speed), and a frozen policy is measured once: every request seed is the same
for every arm, so its other seeds' arms would get the same answers again (`share_pool`).
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import math
import shutil
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, TypedDict

import numpy as np
from sqlalchemy import select

from evolve.config import Policy, Problem
from evolve.mutation import pipeline
from evolve.mutation.code import normalise
from evolve.mutation.prompt import ProgramText, answer_format
from evolve.store.connection import readonly_engine
from evolve.store.database import code_hash
from evolve.store.schema import Cell, PolicyVersion, Program, Run

SALT = 0x6E1D  # request seeds of held-out calls: the same for every arm, apart from the runs'
# How a pool is sampled; a pool sampled otherwise (two calls of 8 before 2026-11; cut to n answers,
# splitting a completion of m, before 2026-12) is measured again, so that every pool of a
# comparison answers the same request with the same seed, in whole completions.
SAMPLING = "one call per parent, whole completions"


# ---- choosing the parents -----------------------------------------------------------------------
def choose_parents(problem: Problem, sources: list[tuple[str, str]], trained: list[str],
                   count: int, seed: int = 0) -> list[dict]:
    """Up to `count` held-out parents, as plain dicts (code, scores, inspirations, origin).

    sources: (name, db url) of frozen arms and other runs; trained: db urls of training arms.
    """
    seen = set().union(*(_code_hashes(url) for url in trained)) if trained else set()
    pool = []
    for arm, url in sources:
        for program in _elites(url):
            if program.code_hash not in seen:
                pool.append((arm, url, program))
                seen.add(program.code_hash)  # one copy of each program
    rng = np.random.default_rng([seed, SALT])
    picked = [pool[i] for i in sorted(rng.choice(len(pool), size=min(count, len(pool)), replace=False))]
    return [_parent(arm, program, _inspirations(url, program, problem, rng), True)
            for arm, url, program in picked]


def stored_by(parents: list[dict], trained: list[str]) -> bool:
    """Whether a training arm (db urls) stored the code of one of these parents."""
    codes = {code_hash(p["code"]) for p in parents}
    return any(codes & _code_hashes(url) for url in trained)


def _query(url: str, statement) -> list:
    engine = readonly_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(statement).all())
    finally:
        engine.dispose()


def _code_hashes(url: str) -> set[str]:
    return {h for (h,) in _query(url, select(Program.code_hash).where(Program.code_hash.is_not(None)))}


def _elites(url: str) -> list:
    """Elites other than the seed and its copies (migration copies a seed to other islands)."""
    seeds = select(Program.code_hash).where(Program.origin == "seed")
    return _query(url, select(Program).join(Cell, Cell.program_id == Program.id)
                  .where(Program.origin != "seed", Program.code_hash.not_in(seeds)).order_by(Program.id))


def run_problem_name(url: str) -> str:
    """The problem a stored run solved (for --heldout-from: it must be the comparison's)."""
    return _query(url, select(Run.problem).order_by(Run.id).limit(1))[0][0]


def _inspirations(url: str, parent, problem: Problem, rng) -> list[dict]:
    """As the search would show them: the island's top programs, then a random other elite."""
    top_n, diverse_n = problem.search.top_inspirations, problem.search.diverse_inspirations
    island = [p for p in _query(url, select(Program).where(
        Program.island == parent.island, Program.status == "ok", Program.id != parent.id)
        .order_by(Program.objective.desc(), Program.id)) if p.code_hash != parent.code_hash]
    top = island[:top_n]
    taken = {parent.id, *(p.id for p in top)}
    others = [p for p in _elites(url) if p.island == parent.island and p.id not in taken
              and p.code_hash != parent.code_hash]
    k = min(diverse_n, len(others))
    diverse = [others[i] for i in rng.choice(len(others), size=k, replace=False)] if k else []
    return [_program_dict(p) for p in top + diverse]


def _program_dict(p) -> dict:
    return {"id": p.id, "code": p.code, "status": p.status, "objective": p.objective,
            "headline": p.headline, "fitness": p.fitness, "error": p.error}


def _parent(source: str, program, inspirations: list[dict], held_out: bool) -> dict:
    key = f"{source}#{program.id}"
    return {"key": key, "source": source, **_program_dict(program), "held_out": held_out,
            "inspirations": inspirations}


def digest(parents: list[dict]) -> str:
    """Identifies a parent set: held-out pools measured on another set are stale."""
    text = json.dumps([[p["key"], p["code"], [i["code"] for i in p["inspirations"]]] for p in parents])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# ---- the arm's policy versions ---------------------------------------------------------------------
def versions(db_url: str, run_name: str) -> list[dict]:
    """The arm's published policy versions, oldest first: {version, model (served name), adapter_path}."""
    rows = _query(db_url, select(PolicyVersion).join(Run, Run.id == PolicyVersion.run_id)
                  .where(Run.name == run_name).order_by(PolicyVersion.version))
    return [{"version": v.version, "model": v.model, "adapter_path": v.adapter_path} for v in rows]


# ---- sampling and scoring a pool ------------------------------------------------------------------
@dataclass
class Settings:
    samples: int  # n: answers in each parent's pool
    parents_digest: str

    def matches(self, record: dict) -> bool:
        return (record.get("samples") == self.samples and record.get("parents_digest") == self.parents_digest
                and record.get("sampling") == SAMPLING)


def completions(samples: int, answers_per_completion: int) -> int:
    """ceil(n / m): a VPO completion holds m answers, so a pool of about n answers costs every arm
    about the same n evaluations (the fair budget of docs/design.md §8), not the same number of
    completions; whole completions (18 answers for n = 16, m = 3), since a set is what VPO trains."""
    return math.ceil(samples / answers_per_completion)


async def sample_answers(client, problem: Problem, policy: Policy, parent: dict, parent_index: int,
                         samples: int, model: str | None = None) -> tuple[list[str | None], int]:
    """ceil(n / m) whole completions of m answers for one parent from the served name `model`
    (None: the base model), where None is a slot the completion left empty, and the tokens spent.

    One call per parent: on two CPU cores a call of n = 16 generates 1.7x the tokens/s of a
    call of 8 (tests/benchmarks/serving.py --batches), and one seeded request is batched the
    same in every run, where two could be batched differently from run to run."""
    m = policy.answers
    inspirations = [ProgramText.of(i) for i in parent["inspirations"]]
    messages, _ = pipeline.prompt(problem, policy, ProgramText.of(parent), inspirations, parent_index)
    sample = await client.sample(messages, completions(samples, m), seed=pipeline.request_seed(SALT, parent_index, 0),
                                 model=model)
    answers: list[str | None] = []
    for text in sample.texts:
        parts = pipeline.answers(text, m)
        answers += parts + [None] * (m - len(parts))  # a missing answer is a failed one
    # every completion whole: cut at n, the last set of m was one answer (16 = 5 x 3 + 1)
    return answers, sample.completion_tokens or 0


class Answer(TypedDict):
    """One answer of a pool, as scored (a pool's JSON holds a list of them per parent)."""
    status: str  # the judge's, or mutation_failed
    objective: float  # 0 unless ok
    headline: float | None
    vector: list[float]  # the components, each >= 0; zeros unless ok
    beats_parent: bool
    same: bool  # ran with the parent's very outputs (its components): valid, but nothing new


def new_valid(answer: Answer | dict) -> bool:
    """An answer that ran and found something of its own: what a held-out valid rate counts (one
    with its parent's outputs would count code that changed nothing, or only its comments)."""
    return answer["status"] == "ok" and not answer.get("same", False)


async def score_answers(evaluator, problem: Problem, parent: dict, answers: list[str | None],
                        concurrency: int, fmt: str, digits: int | None = None) -> list[Answer]:
    """Apply (answers in format `fmt`, to the parent shown with `digits`) and evaluate every
    answer; each distinct child runs once."""
    components = [c.name for c in problem.components]
    children = [pipeline.apply(parent["code"], a, fmt, problem.entry_point, digits).child if a is not None else None
                for a in answers]
    slots = asyncio.Semaphore(concurrency)
    results: dict[str, object] = {}

    async def evaluate(code: str) -> None:
        async with slots:
            results[normalise(code)] = await evaluator.evaluate(code)

    await asyncio.gather(*(evaluate(c) for c in pipeline.distinct(children).values()))
    return [_answer_record(results[normalise(c)] if c else None, parent, components) for c in children]


def _answer_record(result, parent: dict, components: list[str]) -> Answer:
    """An answer's outcome; a failed mutation or evaluation scores objective 0, the zero vector."""
    if result is None:
        return {"status": "mutation_failed", "objective": 0.0, "headline": None,
                "vector": [0.0] * len(components), "beats_parent": False, "same": False}
    ok = result.status == "ok"
    vector = [max(float(result.components.get(c, 0.0)), 0.0) if ok else 0.0 for c in components]
    objective = float(result.objective) if ok else 0.0
    same = ok and result.components == (parent.get("fitness") or {})
    return {"status": result.status, "objective": objective, "headline": result.headline if ok else None,
            "vector": vector, "beats_parent": ok and objective > parent["objective"], "same": same}


# ---- one arm -----------------------------------------------------------------------------------------
def measure_arm(jobs: list[tuple[Path, dict]], problem: Problem, policy: Policy, parents: list[dict],
                settings: Settings, say) -> list[dict]:
    """Serve the arm's policy versions in turn on one server, each filling its own held-out JSON.

    jobs: (out, arm) per version, arm["version"] naming it; the server (and its log) is started
    only if some pool is incomplete. Returns the records, in the order of the jobs."""
    from evolve.judge.evaluator import Evaluator
    from evolve.serving.adapters import serve_mode
    from evolve.serving.server import start_policy_server

    records = [(out, _load(out, arm, settings)) for out, arm in jobs]
    todo = [(out, record, [i for i, p in enumerate(parents) if p["key"] not in record["parents"]])
            for out, record in records]
    todo = [job for job in todo if job[2]]
    if todo:
        server_dir = jobs[-1][0].with_suffix("")  # the server's log goes next to the final pools
        server_dir.mkdir(parents=True, exist_ok=True)
        with ExitStack() as stack:
            base_url, model, server = start_policy_server(policy, server_dir, jobs[-1][1]["seed"], stack)
            evaluator = Evaluator(problem)
            stack.callback(evaluator.sandbox.close)
            # served as the run served them: merged into the weights where the run merged (a CPU
            # server loses half its speed to a LoRA), hot-loaded otherwise
            merge = policy.train is not None and serve_mode(policy.train.serve, server) == "merge"
            if merge:
                stack.callback(shutil.rmtree, server_dir / "merged", True)
            for out, record, missing in todo:
                record["answers_per_completion"] = policy.answers  # pools are in completions of m answers
                if merge:
                    _serve_merged(server, policy, record, server_dir / "merged", say)
                bench = Bench(problem, policy, parents, settings, evaluator, base_url, model, say)
                asyncio.run(_measure(bench, out, record, missing, hot_load=not merge))
    return [record for _, record in records]


def _serve_merged(server, policy: Policy, record: dict, folder: Path, say) -> None:
    """Restart the server on the version's adapter merged into the weights (the base for v0)."""
    from evolve.rl.trainer import serve_merged
    from evolve.serving.models import policy_model_path

    started = time.time()
    if serve_merged(server, policy_model_path(policy), policy.model, record["policy_version"], record["model"],
                    record["adapter_path"], folder):
        say(f"  serving {record['model']} merged into the weights ({time.time() - started:.0f} s)")


def share_pool(source: Path, target: Path, arm: dict) -> None:
    """A frozen arm's pool, given to another seed's arm of the same policy: held-out calls use the
    same request seeds for every arm, so the same weights answer the same, and measuring them
    again would only cost time (a pool is about 20 minutes of a 2-core CPU)."""
    record = json.loads(source.read_text())
    record.update(arm=arm["name"], run_evaluations=arm["evaluations"], pool_of=record["arm"])
    target.write_text(json.dumps(record, indent=1) + "\n")


def _load(out: Path, arm: dict, settings: Settings) -> dict:
    """The pools measured so far, unless they belong to another parent set, n or policy version."""
    version = arm["version"]
    fresh = {"arm": arm["name"], "policy_version": version["version"], "model": version["model"],
             "adapter_path": version["adapter_path"], "run_evaluations": arm["evaluations"],
             "samples": settings.samples, "parents_digest": settings.parents_digest, "sampling": SAMPLING,
             "parents": {}}
    if out.exists():
        old = json.loads(out.read_text())
        same_arm = all(old.get(k) == fresh[k] for k in ("policy_version", "run_evaluations"))
        if settings.matches(old) and same_arm:
            return old
    return fresh


@dataclass
class Bench:
    """What every pool of an arm is measured with: the parents, the server and the sandbox."""
    problem: Problem
    policy: Policy
    parents: list[dict]
    settings: Settings
    evaluator: Any  # evolve.judge.evaluator.Evaluator (imported with the sandbox, when measuring)
    base_url: str
    model: str  # the base model's served name
    say: Callable[[str], None]


async def _measure(bench: Bench, out: Path, record: dict, todo: list[int], hot_load: bool = True) -> None:
    """Fill the record's pools of the parents `todo` (indices), saving it after each parent."""
    from evolve.serving.adapters import load_adapter, unload_adapter
    from evolve.serving.client import PolicyClient
    from evolve.serving.link import PolicyLink

    problem, policy, parents, say, base_url = bench.problem, bench.policy, bench.parents, bench.say, bench.base_url
    version = record["policy_version"]
    client = PolicyLink(PolicyClient(policy, base_url, bench.model), lambda event: say("  " + event.message))
    server_url = base_url.removesuffix("/").removesuffix("/v1")
    loaded = False
    try:
        if version > 0 and hot_load:  # a trained version: its adapter, loaded as the run's hook loads it
            await load_adapter(server_url, record["model"], record["adapter_path"])
            loaded = True
        served = record["model"] if version > 0 else None  # by its name, as an adapter or merged
        for i in todo:
            parent, started = parents[i], time.time()
            answers, tokens = await sample_answers(client, problem, policy, parent, i, bench.settings.samples, served)
            scored = await score_answers(bench.evaluator, problem, parent, answers, problem.budget.eval_concurrency,
                                         answer_format(policy, i), policy.literal_digits)
            record["parents"][parent["key"]] = {"parent_objective": parent["objective"], "tokens": tokens,
                                                "seconds": round(time.time() - started, 1), "answers": scored}
            out.write_text(json.dumps(record, indent=1) + "\n")
            wins = sum(a["beats_parent"] for a in scored)
            valid = sum(a["status"] == "ok" for a in scored)
            say(f"  held-out parent {i + 1}/{len(parents)} ({parent['key']}): {len(scored)} answers, "
                f"{valid} valid, {wins} beat the parent, best objective "
                f"{max(a['objective'] for a in scored):.4f} (parent {parent['objective']:.4f})")
    finally:
        if loaded:  # the arm's next version is measured on the same server
            await unload_adapter(server_url, record["model"])
        await client.close()
