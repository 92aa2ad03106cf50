"""Benchmark: is the tuner never worse than plain CMA-ES, on seeds it was not chosen on?

Each arm spends the same number of scored trials on one program's float literals, every trial
through the problem's real sandbox and judge (two at a time, as a run's evaluators):

  tuner   the search's tuner (evolve/search/tuning.py): tunings of `search.tuning.trials`,
          each from the best so far, as the search tunes its archive's bests again (with
          `tuning.resume`, each goes on with the last one's CMA-ES state; --stall overrides
          the problem's `stall_trials`)
  fresh   the tuner before `tuning.resume` (e453dd9 and earlier): chained tunings, each from a
          fresh CMA-ES state, a descent restarted after 100 trials without a gain (the later
          descent rules, such as the redraws of 08c5825, apply; --redraws 0 turns those off)
  old     the same chained tunings with the tuner of a git revision (--old REV), which drew
          one first step per tuning from `--old-sigma` and had no restarts
  cma     plain CMA-ES: the `cma` package's defaults on the literals themselves (absolute
          coordinates), first step 5 % of their median size (zeros and tolerances left out,
          as the search does), one run (restarted only when cma stops)

    python tests/benchmarks/tuner.py problems/circle_packing.yaml problems/circle_packing_ring.yaml \\
        --trials 1500 --seeds 0 1 --out runs/tuner
    python tests/benchmarks/tuner.py problems/circle_packing_ring.yaml --arms cma --minutes 30 \\
        --out runs/cma-ring   # a search run's wall time instead of trials (search.py's baseline)

Prints and writes (OUT/report.md) the best objective and headline after each 300 trials (with
--minutes: after each 5 minutes, and the trials spent).
"""
from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np

from evolve.config import load_problem
from evolve.judge.evaluator import Evaluator
from evolve.mutation.literals import float_literals, substitute
from evolve.mutation.pipeline import request_seed
from evolve.search import tuning as tuning_module
from evolve.search.tuning import STALL_TRIALS, Trial, TuningState, literal_size, tune

CHECKPOINT = 300


class Trials:
    """The judge behind a budget of trials (or of seconds): two at a time, the best so far after each."""

    def __init__(self, evaluator: Evaluator, budget: int, start: float, start_headline: float | None,
                 seconds: float | None = None):
        self.evaluator, self.budget, self.spent = evaluator, budget, 0
        self.started, self.seconds = time.time(), seconds
        self.slots = asyncio.Semaphore(2)
        self.best, self.headline = start, start_headline
        self.start = (start, start_headline)  # the best before any trial
        self.curve: list[tuple[int, float, float, float | None]] = []  # (trials, seconds, best, headline)

    @property
    def left(self) -> bool:
        if self.seconds is not None:
            return time.time() - self.started < self.seconds
        return self.spent < self.budget

    async def __call__(self, code: str) -> Trial | None:
        if not self.left:
            return None
        self.spent += 1
        async with self.slots:
            r = await self.evaluator.evaluate(code)
        ok = r.status == "ok"
        trial = Trial(code, r.objective if ok else 0.0, r, ok)
        if ok and r.objective > self.best:
            self.best, self.headline = r.objective, r.headline
        self.curve.append((self.spent, time.time() - self.started, self.best, self.headline))
        return trial

    def at(self, trials: int) -> tuple[float, float | None]:
        """The best objective and its headline after `trials` trials (the last point if fewer ran)."""
        return self._last([p for p in self.curve if p[0] <= trials])

    def by(self, seconds: float) -> tuple[float, float | None]:
        """The best objective and its headline after `seconds` of wall time."""
        return self._last([p for p in self.curve if p[1] <= seconds])

    def _last(self, points: list[tuple[int, float, float, float | None]]) -> tuple[float, float | None]:
        return (points[-1][2], points[-1][3]) if points else self.start


async def chained(tune_fn, sigma, code: str, objective: float, judge: Trials, trials: int, seed: int,
                  max_literals: int) -> None:
    """Tunings of `trials` each from the best so far until the budget is spent."""
    best_code, best, k = code, objective, 0
    while judge.left:
        s = request_seed(seed, k)
        rng = np.random.default_rng(s)
        step = sigma(rng) if callable(sigma) else sigma
        tuned = await tune_fn(best_code, best, judge, trials, step, s, max_literals, rng)
        if tuned.best is not None and tuned.best.objective > best:
            best_code, best = tuned.best.code, tuned.best.objective
        k += 1
        if not tuned.trials:
            break


async def resumed(code: str, objective: float, judge: Trials, trials: int, seed: int, sigma,
                  max_literals: int, stall: int | None) -> None:
    """Tunings of `trials` each from the best so far, each going on with the last one's state
    (the search's `tuning.resume`: the best is where the last tuning ended)."""
    s = request_seed(seed, 0)
    tuning = TuningState(code, objective, sigma, s, max_literals, np.random.default_rng(s), stall)
    while judge.left and not tuning.exhausted:
        if not (await tuning.run(judge, trials)).trials:
            break


async def plain_cma(code: str, judge: Trials, seed: int) -> None:
    """`cma`'s defaults on the literals' own values; a new run (new seed) only when one stops."""
    import cma
    literals = float_literals(code)
    x0 = np.array([lit.value for lit in literals])
    sigma0 = 0.05 * literal_size(x0)  # the search's measure of scale: zeros and tolerances left out
    k = 0
    while judge.left:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            # request_seed: seed + 1 + k made seed 3's first run seed 2's second
            es = cma.CMAEvolutionStrategy(x0, sigma0, {"seed": request_seed(seed, k), "verbose": -9})
        while not es.stop() and judge.left:
            xs = es.ask()
            trials = await asyncio.gather(*(judge(substitute(code, literals, x)) for x in xs))
            if any(t is None for t in trials):
                return
            es.tell(xs, [-t.objective for t in trials])
        k += 1


def old_tuner(rev: str):
    """tune() of evolve/search/tuning.py at git revision `rev`, loaded from its text."""
    text = subprocess.run(["git", "show", f"{rev}:evolve/search/tuning.py"], check=True,
                          capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "old_tuning.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location("old_tuning", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["old_tuning"] = module
    spec.loader.exec_module(module)

    async def tune_old(code, objective, judge, trials, sigma, seed, max_literals, rng):
        async def trial(variant):  # the old Trial has no `ok`
            t = await judge(variant)
            if t is None:
                return None
            has_ok = "ok" in getattr(module.Trial, "__dataclass_fields__", {})
            return module.Trial(t.code, t.objective, t.result, **({"ok": t.ok} if has_ok else {}))
        return await module.tune(code, objective, trial, trials, sigma, seed, max_literals, rng)
    return tune_old


def log_uniform(low: float, high: float):
    return lambda rng: float(np.exp(rng.uniform(np.log(low), np.log(high))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("problems", type=Path, nargs="+")
    ap.add_argument("--trials", type=int, default=1500, help="scored trials per arm")
    ap.add_argument("--minutes", type=float, help="wall time per arm instead of trials (a search run's)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--arms", nargs="+", default=["tuner", "fresh", "cma"])
    ap.add_argument("--old", default="aca3fef", help="the git revision of the old tuner")
    ap.add_argument("--old-sigma", type=float, nargs=2, default=[0.1, 0.5])
    ap.add_argument("--stall", type=int, help="the tuner's stall_trials (0: restart only when cma stops)")
    ap.add_argument("--redraws", type=int, help="the tuner's REDRAWS (0: a descent that learned nothing "
                    "is followed by the restarts' next step, the tuner of 6dab6bb and earlier)")
    ap.add_argument("--out", type=Path, default=Path("runs/tuner"))
    args = ap.parse_args()
    if args.redraws is not None:
        tuning_module.REDRAWS = args.redraws
    args.out.mkdir(parents=True, exist_ok=True)
    results_path = args.out / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    for path in args.problems:
        problem = load_problem(path)
        tuning = problem.search.tuning
        evaluator = Evaluator(problem)
        try:
            start = asyncio.run(evaluator.evaluate(problem.seed_code()))
            for seed in args.seeds:
                for arm in args.arms:
                    key = f"{problem.name}|{arm}|{seed}"
                    if key in results:
                        continue
                    seconds = args.minutes * 60 if args.minutes else None
                    judge = Trials(evaluator, args.trials, start.objective, start.headline, seconds)
                    code = problem.seed_code()
                    stall = tuning.stall_trials if args.stall is None else args.stall
                    if arm == "tuner" and tuning.resume:
                        job = resumed(code, start.objective, judge, tuning.trials, seed, tuning.sigma,
                                      tuning.max_literals, stall or None)
                    elif arm in ("tuner", "fresh"):
                        stall = STALL_TRIALS if arm == "fresh" else stall
                        job = chained(functools.partial(tune, stall=stall or None), tuning.sigma, code,
                                      start.objective, judge, tuning.trials, seed, tuning.max_literals)
                    elif arm == "old":
                        job = chained(old_tuner(args.old), log_uniform(*args.old_sigma), code, start.objective,
                                      judge, tuning.trials, seed, tuning.max_literals)
                    else:
                        job = plain_cma(code, judge, seed)
                    asyncio.run(job)
                    if seconds is None:
                        marks = {str(m): judge.at(m) for m in range(CHECKPOINT, args.trials + 1, CHECKPOINT)}
                    else:
                        marks = {f"{m} min": judge.by(m * 60) for m in range(5, int(args.minutes) + 1, 5)}
                        marks["trials"] = (judge.spent, None)
                    results[key] = {"start": [start.objective, start.headline], "at": marks,
                                    "rises": rises(judge)}
                    print(key, results[key], flush=True)
                    results_path.write_text(json.dumps(results, indent=1))
        finally:
            evaluator.sandbox.close()
    report(results, args.out / "report.md")


def rises(judge: Trials) -> list[list]:
    """(trials, seconds, best objective, its headline) at each rise of the best: the curve that
    search.py draws beside a search's (--cma)."""
    out, best = [], judge.start[0]
    for trials, seconds, objective, headline in judge.curve:
        if objective > best:
            out.append([trials, round(seconds, 2), objective, headline])
            best = objective
    return out


def report(results: dict, path: Path) -> None:
    lines = ["| program | arm | seed | start (headline) | " + " | ".join(
        m if m == "trials" else f"after {m}" for m in next(iter(results.values()))["at"]) + " |"]
    lines.append("|" + "---|" * (len(lines[0].split("|")) - 2))
    for key, r in results.items():
        name, arm, seed = key.split("|")
        cells = [f"{obj:.4f} ({head or 0:.4f})" if mark != "trials" else f"{obj:,}"
                 for mark, (obj, head) in r["at"].items()]
        lines.append(f"| {name} | {arm} | {seed} | {r['start'][0]:.4f} ({r['start'][1] or 0:.4f}) | "
                     + " | ".join(cells) + " |")
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
