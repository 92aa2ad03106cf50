"""Benchmark: what the absolute and the parent-relative reward teach, on a run's stored groups.

GRPO's advantage of an answer is its reward against its group's mean. With the absolute reward
(`train.reward: absolute`, an answer's normalised fitness) a valid answer worse than its parent
still earns most of what a better one does, and more than a copy or a failure: a policy can
learn to write valid regressions. With `improvement` only the gain over the parent pays. Per
reward, over every complete group of the runs given (any run with LLM calls of n > 1):

- groups with a signal (some advantage not 0), and the answers in them;
- the mean advantage of answers by outcome: better than the parent, valid but worse, the
  parent's outputs or a copy (`same`), failed;
- the share of valid-but-worse answers with a positive advantage (rewarded for regressing).

    python tests/benchmarks/reward.py RUN_DIR... [--weights uniform]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from evolve.config import load_problem
from evolve.rl import advantages
from evolve.rl.rollouts import complete_groups
from evolve.rundir import RunDir
from evolve.store.database import connect, rollout_rows
from evolve.store.schema import Run

KINDS = ("better", "worse", "same", "failed")


def kind(program) -> str:
    if program.status != "ok":
        return "failed"
    return program.outcome if program.outcome in ("better", "same") else "worse"


def measure(run_dirs: list[Path], reward: str) -> dict:
    by_kind: dict[str, list[float]] = {k: [] for k in KINDS}
    groups = signal = 0
    for run_dir in run_dirs:
        spec = RunDir(run_dir).spec()
        problem = load_problem(spec["problem"], spec.get("set"))
        components = [c.name for c in problem.components]
        weights = problem.weight_vector()
        w = [weights[c] for c in components]
        with Session(connect(spec["db_url"])) as s:
            run_id = s.scalar(select(func.min(Run.id)))  # a run directory holds one run
            rows = rollout_rows(s, run_id)
            children = rows.children
            for group in complete_groups(rows, components, reward=reward):
                if len(group.rollouts) < 2:
                    continue  # a re-ask of n = 1: no group to compare with
                answers = [children.get(r.completion_id, []) for r in group.rollouts]
                rewards = advantages.scalar_rewards([r.answers[0] if len(r.answers) else None
                                                     for r in group.rollouts], w)
                adv = advantages.normalize(rewards)
                groups += 1
                signal += bool(np.any(adv != 0))
                for a, kids in zip(adv, answers):
                    by_kind[kind(kids[0]) if kids else "failed"].append(float(a))
    return {"groups": groups, "signal": signal, "by_kind": by_kind}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dirs", type=Path, nargs="+")
    args = ap.parse_args()
    print("| reward | groups with a signal | answers: better / worse / same / failed | mean advantage: better | "
          "worse | same | failed | worse answers with a positive advantage |")
    print("|---|---|---|---|---|---|---|---|")
    for reward in ("absolute", "improvement"):
        m = measure(args.run_dirs, reward)
        k = m["by_kind"]
        mean = lambda x: f"{np.mean(x):+.2f}" if x else "-"  # noqa: E731
        positive = f"{sum(a > 0 for a in k['worse'])}/{len(k['worse'])}" if k["worse"] else "-"
        print(f"| {reward} | {m['signal']}/{m['groups']} | {' / '.join(str(len(k[x])) for x in KINDS)} | "
              f"{mean(k['better'])} | {mean(k['worse'])} | {mean(k['same'])} | {mean(k['failed'])} | {positive} |")


if __name__ == "__main__":
    main()
