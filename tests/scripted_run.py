"""A real run for the dashboard and export tests, made in seconds.

Everything is the real engine (Controller, ProgramDatabase on SQLite, EventLog, the Docker
sandbox, the circle-packing scorer) except the LLM: a scripted client answers with a fixed
rotation of diffs against the seed, chosen to produce every outcome a dashboard shows
(improvements, worse and duplicate children, invalid, error, timeout, failed mutations,
several MAP-Elites cells, migrations between two islands).
"""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import yaml

from evolve.config import load_policy, load_problem
from evolve.events import EventLog
from evolve.judge.evaluator import Evaluator
from evolve.run import open_database
from evolve.search.controller import Controller
from evolve.serving.client import Sample

ROOT = Path(__file__).resolve().parent.parent
PROBLEM = ROOT / "problems" / "circle_packing.yaml"
_BUILT: dict[str, Path] = {}

# The scripted answers are diffs against this seed (equal circles on a square grid, n26 2.1667),
# kept here so that they do not depend on the shipped seed.
SEED = '''import numpy as np


# EVOLVE-BLOCK-START
def construct_packing(n):
    """Equal circles on the smallest square grid with at least n cells."""
    side = int(np.ceil(np.sqrt(n)))
    cell = 1.0 / side
    # Slightly smaller than half a cell: the judge has zero tolerance for rounding errors.
    radius = 0.5 * cell * (1 - 1e-9)
    index = np.arange(n)
    centers = np.stack([(index % side + 0.5) * cell, (index // side + 0.5) * cell], axis=1)
    radii = np.full(n, radius)
    return centers, radii
# EVOLVE-BLOCK-END
'''


def diff(intent: str, search: str, replace: str) -> str:
    return f"{intent}\n<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE"


BODY = """    side = int(np.ceil(np.sqrt(n)))
    cell = 1.0 / side
    # Slightly smaller than half a cell: the judge has zero tolerance for rounding errors.
    radius = 0.5 * cell * (1 - 1e-9)
    index = np.arange(n)
    centers = np.stack([(index % side + 0.5) * cell, (index // side + 0.5) * cell], axis=1)
    radii = np.full(n, radius)
    return centers, radii"""

# 25 circles on a 5 x 5 grid plus small ones in the holes between them: 2.54 for n=26 (seed 2.17)
HOLES = """    k = int(np.floor(np.sqrt(n)))
    cell = 1.0 / k
    radius = 0.5 * cell * (1 - 1e-9)
    index = np.arange(k * k)
    big = np.stack([(index % k + 0.5) * cell, (index // k + 0.5) * cell], axis=1)
    gap = (np.sqrt(2) - 1) * 0.5 * cell * (1 - 1e-6)
    holes = [((i + 1) * cell, (j + 1) * cell) for j in range(k - 1) for i in range(k - 1)]
    extra = np.array(holes[: n - k * k]).reshape(-1, 2)
    centers = np.concatenate([big, extra])
    radii = np.concatenate([np.full(k * k, radius), np.full(len(extra), gap)])
    return centers, radii"""

RADIUS = "    radius = 0.5 * cell * (1 - 1e-9)"
ANSWERS = {
    "better": diff("Fill the holes of a 5x5 grid.", BODY, HOLES),
    "smaller": diff("Shrink the circles.", RADIUS, "    radius = 0.45 * cell"),
    "mixed": diff("Mix two sizes.", "    radii = np.full(n, radius)",
                  "    radii = np.where(index % 2 == 0, radius, 0.7 * radius)"),
    "overlap": diff("Grow the circles.", RADIUS, "    radius = 0.6 * cell"),
    "raise": diff("Fail.", "    index = np.arange(n)", "    raise RuntimeError('scripted failure')"),
    "sleep": diff("Think hard.", "    index = np.arange(n)",
                  "    import time\n    time.sleep(30)\n    index = np.arange(n)"),
    "missing": diff("Edit a line that is not there.", "    this line is not in the parent", "    pass"),
}
GROUPS = [["better", "smaller", "overlap", "missing"], ["raise", "mixed", "smaller", "sleep"],
          ["mixed", "better", "overlap", "missing"], ["smaller", "mixed", "raise", "missing"]]


class ScriptedClient:
    """Stands in for PolicyClient: the same interface, answers from GROUPS in turn."""
    model = "scripted"

    def __init__(self):
        self.calls = 0

    async def sample(self, messages, n, seed=None, max_tokens=None, model=None, on_answer=None) -> Sample:
        group = GROUPS[self.calls % len(GROUPS)]
        self.calls += 1
        texts = [ANSWERS[group[i % len(group)]] for i in range(n)]
        await asyncio.sleep(0.05)
        return Sample(texts=texts, finish_reasons=["stop"] * n, prompt_tokens=900,
                      completion_tokens=60 * n, started_at=time.time() - 0.05, latency_s=0.05)

    async def close(self) -> None:
        pass


def write_problem(folder: Path, evaluations: int, tuning: dict | None = None,
                  calls: int | None = None) -> Path:
    """The circle-packing problem on SEED in the Docker sandbox; tuning off unless given, no
    repair (its re-asks would be calls these tests do not script)."""
    data = yaml.safe_load(PROBLEM.read_text())
    del data["program"], data["policy"]  # a scripted run names its own policy
    data["program_code"] = SEED
    data["scorer"] = str(PROBLEM.parent / data["scorer"])
    data["sandbox"] = {"backend": "docker", "timeout_s": 3, "memory_mb": 1024, "cpus": 1}
    data["search"].update(islands=2, migration_every=2, tuning=tuning or {"enabled": False},
                          repair={"attempts": 0})
    data["budget"] = {"max_evaluations": evaluations, "max_llm_calls": calls, "llm_concurrency": 1,
                      "eval_concurrency": 2}
    path = folder / "problem.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def write_policy(folder: Path) -> Path:
    path = folder / "policy.yaml"
    path.write_text("name: scripted\nmodel: scripted\n"
                    "server: {embedded: false, base_url: 'http://127.0.0.1:9/v1'}\n"
                    "sampling: {group_size: 4, max_prompt_tokens: 4000}\n")
    return path


def make_run(run_dir: Path, evaluations: int = 14, tuning: dict | None = None, client=None,
             calls: int | None = None) -> Path:
    """A finished run in run_dir (run.json, evolve.db, evolve.log, events.jsonl); `client`
    stands in for the LLM (ScriptedClient by default), `calls`: the budget's max_llm_calls."""
    run_dir.mkdir(parents=True, exist_ok=True)
    problem_path, policy_path = write_problem(run_dir, evaluations, tuning, calls), write_policy(run_dir)
    spec = {"problem": str(problem_path), "policy": str(policy_path), "seed": 0,
            "db_url": f"sqlite:///{run_dir.resolve() / 'evolve.db'}", "run_name": run_dir.resolve().name,
            "budget": {}}
    (run_dir / "run.json").write_text(json.dumps(spec, indent=2))
    problem, policy = load_problem(problem_path), load_policy(policy_path)
    db = open_database(spec, problem, policy, run_dir)
    try:
        evaluator = Evaluator(problem)
        with EventLog(run_dir, lambda event: None) as log:
            controller = Controller(problem, policy, db, evaluator, client or ScriptedClient(), problem.budget,
                                    0, log)
            asyncio.run(controller.run())
    finally:
        if "evaluator" in locals():
            evaluator.sandbox.close()
        db.close()
    return run_dir


def shared_run(tmp_path_factory) -> Path:
    """One scripted run per test session, shared by the test modules that only read it."""
    if "run" not in _BUILT:
        _BUILT["run"] = make_run(tmp_path_factory.mktemp("scripted") / "run")
    return _BUILT["run"]
