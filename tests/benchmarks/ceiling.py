"""Benchmark: how high can tuning alone take a program's shape?

In-the-loop tuning climbs the numbers of one construction until it stops; after that only a
new shape (code that differs in more than its float literals) can raise the best. So the LLM
adds something to the search only where it writes a shape whose tuned ceiling lies above the
ceiling of the shapes already in the archive. This measures those ceilings: each program is
tuned for ROUNDS rounds of TRIALS CMA-ES trials (every round starts from the best so far with
a new optimiser seed, as the search tunes its archive's bests again), every trial through the
problem's real sandbox and judge:

    python tests/benchmarks/ceiling.py problems/circle_packing.yaml --rounds 6 --seeds 0 1
    python tests/benchmarks/ceiling.py problems/circle_packing.yaml --trials 40 --rounds 45 --sigma 0.1
    python tests/benchmarks/ceiling.py problems/circle_packing.yaml --families --run runs/bench-x/evolve-s0 runs/bench-x/llm_only-s0

With the problem's own `search.tuning` (trials, sigma) it shows what the search's tunings can
reach; `--trials` and `--sigma` compare other settings on the same budget of trials.

Programs: the problem's seed; with `--families`, hand-written shapes made from the seed (below:
one idea each, every new number at a value that leaves the seed's outputs unchanged, so each
starts where the seed starts); with `--run RUN_DIR ...`, the valid LLM children of that run whose
shape differs from their parent's (one per shape, the best scored), as the model wrote them.
"""
from __future__ import annotations

import argparse
import asyncio
import json
from contextlib import ExitStack
from pathlib import Path

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from evolve.config import load_problem
from evolve.judge.evaluator import Evaluator
from evolve.mutation.literals import changes_structure, shape
from evolve.mutation.pipeline import request_seed
from evolve.rundir import RunDir
from evolve.search.tuning import Trial, tune
from evolve.store.database import connect
from evolve.store.schema import Program

STACK = "    centers = np.stack"
RETURN = "    return centers, max_radii(centers)"
# circle_packing: one structural idea each, as edits of the seed (old text, new text). Every
# new number starts at its neutral value, so a family starts from the seed's own score.
FAMILIES = {
    "circle_packing": {
        "tilt": (STACK, "    tilt = 0.0\n    y = y + tilt * (x - 0.5)\n" + STACK),
        "last_row_shift": (STACK, "    last_shift = 0.0\n    x = x + last_shift * (row == rows - 1)\n" + STACK),
        "squeeze": (STACK, "    squeeze = 1.0\n    x = 0.5 + squeeze * (x - 0.5)\n" + STACK),
        "wave": (STACK, "    wave = 0.0\n    y = y + wave * np.sin(3.0 * x)\n" + STACK),
        "column_stagger": (STACK, "    col_stagger = 0.0\n    y = y + col_stagger * (col % 2)\n" + STACK),
        "row_shifts": (STACK, "    shifts = np.array([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])\n"
                              "    y = y + shifts[row % 7] / rows\n" + STACK),
        # Not neutral: the layout refined by the seed's optimiser (`refine`: SLSQP over centres
        # and radii), the kind of code the packings near 2.63 run; what an LLM that calls it opens.
        "optimiser": (RETURN, "    centers = refine(centers)\n" + RETURN),
    },
}


def families(problem) -> dict[str, str]:
    seed = problem.seed_code()
    out = {}
    for name, (old, new) in FAMILIES.get(problem.name, {}).items():
        assert old in seed, f"family {name}: the seed no longer has {old!r}"
        out[name] = seed.replace(old, new, 1)
    return out


def llm_shapes(run_dir: Path, limit: int) -> dict[str, str]:
    """The best-scored valid LLM child of each shape that differs from its parent's (and whose
    outputs differ too: a new shape with the parent's outputs is the parent's ceiling again)."""
    spec = RunDir(run_dir).spec()
    with Session(connect(spec["db_url"])) as s:
        parents = dict(s.execute(select(Program.id, Program.code)).all())
        rows = s.execute(select(Program.id, Program.parent_id, Program.code)
                         .where(Program.origin == "mutation", Program.status == "ok",
                                Program.outcome != "same")
                         .order_by(Program.objective.desc())).all()
    out, seen = {}, set()
    for pid, parent, code in rows:
        key = shape(code)
        if key in seen or parent is None or not changes_structure(parents[parent], code):
            continue
        seen.add(key)
        out[f"{run_dir.name}#{pid}"] = code
        if len(out) >= limit:
            break
    return out


async def ceiling(evaluator: Evaluator, code: str, rounds: int, trials: int, tuning, seed: int) -> dict:
    """Tune `code` for `rounds` rounds chained on the best, with the search's steps (`tuning`:
    the problem's search.tuning, or another sigma)."""
    async def trial(variant: str) -> Trial:
        r = await evaluator.evaluate(variant)
        return Trial(variant, r.objective if r.status == "ok" else 0.0, r, r.status == "ok")
    start = await evaluator.evaluate(code)
    best_code, best = code, start.objective if start.status == "ok" else 0.0
    headline, curve = start.headline, [best]
    for k in range(rounds):
        s = request_seed(seed, k)
        rng = np.random.default_rng(s)
        tuned = await tune(best_code, best, trial, trials, tuning.sigma, s, tuning.max_literals, rng)
        if tuned.best is not None and tuned.best.objective > best:
            best_code, best, headline = tuned.best.code, tuned.best.objective, tuned.best.result.headline
        curve.append(best)
    return {"start": curve[0], "ceiling": best, "headline": headline, "curve": curve, "code": best_code}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("problem", type=Path)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--trials", type=int, help="CMA-ES trials per round (default: the problem's)")
    ap.add_argument("--sigma", type=float, nargs="+", help="one first step, or SMALL LARGE for the restarts "
                    "(default: the problem's search.tuning.sigma)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="optimiser seeds (a row each)")
    ap.add_argument("--families", nargs="*", metavar="NAME",
                    help="the hand-written shapes as well (all, or those named)")
    ap.add_argument("--run", type=Path, nargs="+", default=[], help="run directories: their LLM children's new shapes")
    ap.add_argument("--max-shapes", type=int, default=8)
    ap.add_argument("--out", type=Path, default=Path("runs/ceiling"))
    args = ap.parse_args()
    problem = load_problem(args.problem)
    tuning = problem.search.tuning
    if args.sigma:
        tuning = tuning.model_copy(update={"sigma": args.sigma[0] if len(args.sigma) == 1 else tuple(args.sigma)})
    args.trials = args.trials or tuning.trials
    programs = {"seed": problem.seed_code()}
    if args.families is not None:
        shapes = families(problem)
        if unknown := set(args.families) - set(shapes):
            ap.error(f"--families: {problem.name} has no family {sorted(unknown)}; it has {sorted(shapes)}")
        programs |= {k: v for k, v in shapes.items() if not args.families or k in args.families}
    for run_dir in args.run:
        programs |= llm_shapes(run_dir, args.max_shapes)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = {}
    with ExitStack() as stack:
        evaluator = Evaluator(problem)
        stack.callback(evaluator.sandbox.close)

        async def all_programs():
            for name, code in programs.items():
                for seed in args.seeds:
                    key = f"{name} (seed {seed})"
                    rows[key] = await ceiling(evaluator, code, args.rounds, args.trials, tuning, seed)
                    print(key, {k: v for k, v in rows[key].items() if k != "code"}, flush=True)
        asyncio.run(all_programs())
    trials = args.rounds * args.trials
    lines = [f"sigma {tuning.sigma}, {args.rounds} rounds of {args.trials} trials", "",
             f"| program | start objective | best after {trials} trials | {problem.headline} there | "
             "after each round |", "|---|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['start']:.4f} | {r['ceiling']:.4f} | {r['headline'] or 0:.4f} | "
                     + " ".join(f"{v:.4f}" for v in r["curve"][1:]) + " |")
    text = "\n".join(lines)
    (args.out / "report.md").write_text(text + "\n")
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    print(text)


if __name__ == "__main__":
    main()
