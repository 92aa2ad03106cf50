"""`evolve suite SUITE.yaml`: one problem, many instances, a fixed budget each; how many solved.

A suite file names a problem YAML, the field that varies (e.g. `task`) and its values:

    name: humaneval_hard
    problem: humaneval.yaml
    vary: task
    values: [HumanEval/10, HumanEval/32, ...]
    max_evaluations: 200

Every value becomes an ordinary run directory, OUT/runs/<value> (inspect it with `evolve
status`, `evolve show`...), made with `--set vary=value`, and all of them share one policy
server, started once. An instance is solved when its best objective reaches the problem's
`budget.target_objective` (HumanEval: 1.0, every test passes), which also stops its run.
Re-running the same command resumes: finished instances are kept, the others go on.
OUT/suite.md and OUT/suite.json hold the result table.
"""
from __future__ import annotations

import json
import re
import time
from contextlib import ExitStack
from pathlib import Path

from pydantic import Field
from rich.console import Console
from rich.table import Table

from evolve.config import ConfigError, Strict, load_policy, load_problem, load_yaml
from evolve.faults import FAULT_EXIT
from evolve.rundir import DB_FILE, DONE, FINISHED, RunDir, Stop
from evolve.views.snapshot import RunReader

SUITE_FILE = "suite-plan.json"


class Suite(Strict):
    name: str
    problem: Path  # relative to the suite YAML
    vary: str  # the problem field each value is set to (a dotted key works too)
    values: list[str | int] = Field(min_length=1)
    max_evaluations: int = Field(default=200, ge=1)  # per instance
    seed: int = 0
    source_path: Path | None = Field(default=None, exclude=True)

    def problem_path(self) -> Path:
        base = self.source_path.parent if self.source_path else Path.cwd()
        return (base / self.problem).resolve()

    def sets(self, value) -> list[str]:
        return [f"{self.vary}={value}"]


def main(args) -> int:
    from evolve.run import run_search
    from evolve.serving.server import start_policy_server

    suite = load_yaml(args.suite, Suite)
    policy_path = args.policy
    load_policy(policy_path)
    budget = args.max_evaluations or suite.max_evaluations
    problems = {v: load_problem(suite.problem_path(), suite.sets(v)) for v in suite.values}  # all valid first
    out = args.out or Path("runs") / f"suite-{suite.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    _check_plan(out, {"suite": str(Path(args.suite).resolve()), "policy": str(Path(policy_path).resolve()),
                      "seed": suite.seed})
    todo = [v for v in suite.values if not _finished(_run_dir(out, v), budget)]
    console = Console()
    console.print(f"suite {suite.name}: {len(suite.values)} instances, {budget} evaluations each, "
                  f"{len(suite.values) - len(todo)} already finished; results in {out}")
    interrupted = None  # or why the suite stopped early
    if todo:
        with ExitStack() as stack:
            server = start_policy_server(load_policy(policy_path), out, suite.seed, stack)
            for value in todo:
                run_dir = _run_dir(out, value)
                run = RunDir(run_dir)
                if not run.exists():
                    run = RunDir.create(run_dir, suite.problem_path(), suite.sets(value), policy_path, suite.seed)
                spec = run.update_budget({"max_evaluations": budget})
                console.print(f"[bold]{value}[/]: {problems[value].name} -> {run_dir}")
                try:
                    reason = run_search(run_dir, spec, server=server)
                except KeyboardInterrupt:
                    reason = Stop.INTERRUPTED
                if reason not in FINISHED:  # interrupted, or a fault: the rest waits for a resume
                    interrupted = reason
                    break
    rows = [_result(out, v, problems[v], budget) for v in suite.values]
    _write(out, suite, budget, rows)
    console.print(_table(suite, budget, rows))
    if interrupted:
        console.print(f"stopped: {interrupted}; continue with the same command (--out {out})")
        return 130 if interrupted == Stop.INTERRUPTED else FAULT_EXIT
    return 0


def _run_dir(out: Path, value) -> Path:
    return out / "runs" / re.sub(r"[^A-Za-z0-9_.-]+", "_", str(value))


def _check_plan(out: Path, plan: dict) -> None:
    """A suite directory belongs to one suite file, policy and seed; a budget may be raised."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / SUITE_FILE
    if path.exists():
        stored = json.loads(path.read_text())
        if stored != plan:
            raise ConfigError(f"{out}: holds a different suite ({stored}); choose another --out")
    else:
        path.write_text(json.dumps(plan, indent=2) + "\n")


def _snapshot(run_dir: Path):
    run = RunDir(run_dir)
    if not run.exists():
        return None
    reader = RunReader(run_dir, run.spec())
    try:
        return reader.snapshot() if (run_dir / DB_FILE).exists() else None
    finally:
        reader.close()


def _finished(run_dir: Path, budget: int) -> bool:
    snap = _snapshot(run_dir)
    if snap is None or not snap.state.startswith("stopped: "):
        return False
    reason = snap.state.removeprefix("stopped: ")
    return reason == Stop.TARGET or (reason in DONE and snap.budget >= budget)


def _result(out: Path, value, problem, budget: int) -> dict:
    snap = _snapshot(_run_dir(out, value))
    target = problem.budget.target_objective
    best = snap.best.objective if snap and snap.best else None
    return {"instance": str(value), "run_dir": str(_run_dir(out, value)),
            "state": snap.state if snap else "not started",
            "evaluations": snap.evaluations if snap else 0,
            "best_objective": best, "seed_objective": snap.series[0][2] if snap and snap.series else None,
            "solved": None if target is None else (best is not None and best >= target - 1e-12)}


def _write(out: Path, suite: Suite, budget: int, rows: list[dict]) -> None:
    solved = sum(bool(r["solved"]) for r in rows)
    (out / "suite.json").write_text(json.dumps({"suite": suite.name, "budget": budget, "solved": solved,
                                                "instances": rows}, indent=2) + "\n")
    lines = [f"# Suite {suite.name}", "",
             f"**Solved {solved} of {len(rows)}** within {budget} evaluated candidates each.", "",
             "| instance | solved | best objective | seed objective | evaluations | state |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['instance']} | {_mark(r['solved'])} | {_num(r['best_objective'])} | "
              f"{_num(r['seed_objective'])} | {r['evaluations']} | {r['state']} |" for r in rows]
    (out / "suite.md").write_text("\n".join(lines) + "\n")


def _table(suite: Suite, budget: int, rows: list[dict]) -> Table:
    solved = sum(bool(r["solved"]) for r in rows)
    t = Table(title=f"{suite.name}: solved {solved} of {len(rows)} within {budget} evaluations each",
              title_justify="left")
    for col in ("instance", "solved", "best objective", "seed", "evaluations", "state"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["instance"], _mark(r["solved"]), _num(r["best_objective"]), _num(r["seed_objective"]),
                  str(r["evaluations"]), r["state"])
    return t


def _mark(solved) -> str:
    return "-" if solved is None else ("yes" if solved else "no")


def _num(value) -> str:
    return "-" if value is None else f"{value:.4f}"
