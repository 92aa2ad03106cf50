"""Benchmark: the mutation channel, one lever at a time (the ablation behind the defaults).

For each variant, the embedded server answers CALLS calls of n completions for the same
parents, and every child goes through the real sandbox and judge:

    python tests/benchmarks/mutation.py problems/circle_packing.yaml --calls 4
    python tests/benchmarks/mutation.py problems/circle_packing.yaml --variants diff rewrite

Per variant: answers, applied, valid, better than the parent, identical to the parent (its
outputs), the best child, tokens/s and seconds per call (repairs included: `rewrite_reask`
asks once more, with the reason, for each answer that could not be applied; `rewrite_continue`
continues each answer that stopped after its sentence, with the code fence opened). Parents: the problem's seed, and
with --parents RUN_DIR the best program of that run as well.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from evolve.config import load_policy, load_problem
from evolve.judge.evaluator import Evaluator
from evolve.mutation import pipeline
from evolve.mutation.code import UNCHANGED, split_answers
from evolve.mutation.literals import adds_knob, changes_structure
from evolve.mutation.pipeline import request_seed
from evolve.mutation.prompt import KNOB, _answer_instructions, build_messages
from evolve.rundir import RunDir
from evolve.search.tuning import Trial, tune
from evolve.serving.client import PolicyClient
from evolve.serving.server import start_policy_server
from evolve.store.database import connect
from evolve.store.schema import Program

# The `rewrite_directed` variant: each call asks for one kind of structural change (numbers
# are the tuner's job). Measured: the 0.5B model follows none of them reliably (README).
DIRECTIVES = (
    "Add one new idea to the construction, controlled by a new number that starts at a value "
    "that leaves the result unchanged (for example `bend = 0.0`): the numbers are tuned "
    "automatically afterwards.",
    "Treat one part of the construction differently from the rest: for example the first or "
    "the last row, the elements at the border, or every other element.",
    "Replace one formula of the construction with a different kind of formula.",
    "Take one idea from the problem description that the current program does not use yet and "
    "build it in.",
)

# name -> (policy field overrides, prompt overrides)
VARIANTS = {
    "diff": ({"answer_format": "diff"}, {}),
    "rewrite": ({"answer_format": "rewrite"}, {}),
    "diff_t1.0": ({"answer_format": "diff", "temperature": 1.0}, {}),
    "rewrite_t1.0": ({"answer_format": "rewrite", "temperature": 1.0}, {}),
    "rewrite_short": ({"answer_format": "rewrite", "max_tokens": 320}, {}),
    "rewrite_directed": ({"answer_format": "rewrite"}, {"directives": True}),
    "rewrite_knob": ({"answer_format": "rewrite"}, {"directive": KNOB}),
    # the knob request with the usual worked example (the knob example is copied whole)
    "rewrite_knob_plain": ({"answer_format": "rewrite"}, {"directive": KNOB, "plain_example": True}),
    "rewrite_block": ({"answer_format": "rewrite"}, {"view": "block"}),
    "diff_block": ({"answer_format": "diff"}, {"view": "block"}),
    "rewrite_block_directed": ({"answer_format": "rewrite"}, {"view": "block", "directives": True}),
    "complete": ({"answer_format": "complete"}, {}),
    "complete_t1.0": ({"answer_format": "complete", "temperature": 1.0}, {}),
    # the parent shown with its float literals rounded to 2 significant digits, the child given
    # the exact values back where it kept them (Policy.literal_digits): does a tuned parent's
    # noise (`0.826417`, `1.91435 * margin`) keep the model on numbers?
    "complete_rounded": ({"answer_format": "complete"}, {"round": 2}),
    # ShinkaEvolve's repair: an answer that does not apply is asked for once more, with the reason
    "rewrite_reask": ({"answer_format": "rewrite"}, {"reask": True}),
    # an answer that stopped after its sentence of intent is continued with the code fence opened
    "rewrite_continue": ({"answer_format": "rewrite"}, {"reask": True, "continue": True}),
}
FENCE = "\n\n```python\n"


async def continued(client, messages: list[dict], answer: str, seed: int) -> tuple[str, int]:
    """The answer with its code fence opened, continued by the model up to the closing fence."""
    s = client.policy.sampling
    prefix = answer.rstrip() + FENCE
    resp = await client.client.chat.completions.create(
        model=client.model, messages=[*messages, {"role": "assistant", "content": prefix}], n=1,
        temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens, seed=seed, stop=["\n```"],
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    return prefix + (resp.choices[0].message.content or "") + "\n```", resp.usage.completion_tokens


def reask(messages: list[dict], answer: str, error: str, m: int, fmt: str) -> list[dict]:
    """The same request, the failed answer and why it could not be applied, and the task again."""
    return [*messages, {"role": "assistant", "content": answer},
            {"role": "user", "content": f"That answer could not be applied: {error}.\n{_answer_instructions(m, fmt)}"}]


async def _tuned(evaluator, code: str, objective: float, trials: int, seed: int) -> float:
    async def trial(variant: str) -> Trial:
        r = await evaluator.evaluate(variant)
        return Trial(variant, r.objective if r.status == "ok" else 0.0, r, r.status == "ok")
    tuned = await tune(code, objective, trial, trials, 0.1, seed, 12, np.random.default_rng(seed))
    return max(objective, tuned.best.objective if tuned.best else objective)


async def probe(problem, policy, client, evaluator, parents, variant: str, calls: int, seed: int,
                log: Path, tune_trials: int = 0) -> dict:
    fields, prompt = VARIANTS[variant]
    sampling = policy.sampling.model_copy(update={k: v for k, v in fields.items() if k != "answer_format"})
    client.policy = policy.model_copy(update={"sampling": sampling})
    fmt = fields.get("answer_format", policy.answer_format)
    counts = dict(answers=0, applied=0, valid=0, better=0, same=0, structural=0, knobs=0, tokens=0, seconds=0.0,
                  tuned=0, better_tuned=0, reasked=0, reask_applied=0)
    best = None
    for k in range(calls):
        parent = parents[k % len(parents)]
        digits = prompt.get("round")  # as the search does it (pipeline.shown and apply)
        directive = DIRECTIVES[k % len(DIRECTIVES)] if prompt.get("directives") else prompt.get("directive")
        messages = build_messages(problem, pipeline.shown(parent, digits), [], policy.answers, sampling.max_prompt_tokens, fmt,
                                  directive, view=prompt.get("view", "whole"),
                                  plain_example=prompt.get("plain_example", False))
        started = time.time()
        sample = await client.sample(messages, sampling.group_size, seed=request_seed(seed, k))
        counts["seconds"] += time.time() - started
        counts["tokens"] += sample.completion_tokens or 0
        with open(log, "a") as f:
            f.writelines(json.dumps({"variant": variant, "text": t}) + "\n" for t in sample.texts)
        children, failed = [], []
        for text in sample.texts:
            for answer in split_answers(text, policy.answers):
                counts["answers"] += 1
                made = pipeline.apply(parent.code, answer, fmt, problem.entry_point, digits)
                if made.child is not None:
                    children.append(made.child)
                    counts["applied"] += 1
                    continue
                no_code = "code block" in made.error and "```" not in answer
                if prompt.get("reask") and not made.error.startswith(UNCHANGED) \
                        and (no_code or not prompt.get("continue")):
                    failed.append((answer, made.error))
        if failed:  # each repaired once; a child of the repair takes the failed answer's place
            started = time.time()
            seeds = [request_seed(seed, 10_000 + 100 * k + i) for i in range(len(failed))]
            if prompt.get("continue"):
                again = await asyncio.gather(*(continued(client, messages, a, sd) for (a, _), sd in zip(failed, seeds)))
            else:
                samples = await asyncio.gather(*(client.sample(reask(messages, a, e, 1, fmt), 1, seed=sd)
                                                 for (a, e), sd in zip(failed, seeds)))
                again = [(x.texts[0], x.completion_tokens or 0) for x in samples]
            counts["seconds"] += time.time() - started
            counts["reasked"] += len(failed)
            for text, tokens in again:
                counts["tokens"] += tokens
                with open(log, "a") as f:
                    f.write(json.dumps({"variant": variant, "repair": True, "text": text}) + "\n")
                made = pipeline.apply(parent.code, text, fmt, problem.entry_point, digits)
                if made.child is not None:
                    children.append(made.child)
                    counts["applied"] += 1
                    counts["reask_applied"] += 1
        results = await asyncio.gather(*(evaluator.evaluate(code) for code in children))
        for code, r in zip(children, results):
            if r.status != "ok":
                continue
            counts["valid"] += 1
            counts["same"] += r.raw == parent.raw
            counts["better"] += r.objective > parent.objective
            new_shape = changes_structure(parent.code, code)
            counts["structural"] += new_shape
            counts["knobs"] += r.raw == parent.raw and adds_knob(parent.code, code)
            if best is None or r.objective > best:
                best = r.objective
            if tune_trials and (r.raw != parent.raw or adds_knob(parent.code, code)):  # a knob too
                # The LLM's worth beside the tuner: the child tuned against the parent tuned,
                # with the same trials and optimiser seed (paired).
                s = request_seed(seed, counts["tuned"])
                mine = await _tuned(evaluator, code, r.objective, tune_trials, s)
                theirs = await _tuned(evaluator, parent.code, parent.objective, tune_trials, s)
                counts["tuned"] += 1
                counts["better_tuned"] += mine > theirs
                best = max(best, mine)
    counts["best_objective"] = best
    return counts


def parents_of(problem, evaluator, run_dir: Path | None, program_id: int | None = None) -> list:
    if program_id is not None:  # that program of the run alone
        with Session(connect(RunDir(run_dir).spec()["db_url"])) as s:
            p = s.get(Program, program_id)
            return [SimpleNamespace(code=p.code, status="ok", objective=p.objective, headline=p.headline,
                                    fitness=p.fitness, raw=p.raw, error=None)]
    code = problem.seed_code()
    seed = asyncio.run(evaluator.evaluate(code))
    out = [SimpleNamespace(code=code, status="ok", objective=seed.objective, headline=seed.headline,
                           fitness=seed.components, raw=seed.raw, error=None)]
    if run_dir is not None:
        spec = RunDir(run_dir).spec()
        with Session(connect(spec["db_url"])) as s:
            p = s.scalars(select(Program).where(Program.status == "ok")
                          .order_by(Program.objective.desc())).first()
            out.append(SimpleNamespace(code=p.code, status="ok", objective=p.objective, headline=p.headline,
                                       fitness=p.fitness, raw=p.raw, error=None))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("problem", type=Path)
    ap.add_argument("--policy", default="policies/frozen.yaml")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--parents", type=Path, help="a run directory whose best program is a parent too")
    ap.add_argument("--parent-id", type=int, help="with --parents: that program of the run is the only parent")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tune", type=int, default=0, metavar="TRIALS",
                    help="tune every valid child and its parent with TRIALS trials, and count the "
                         "children that beat their parent after both are tuned")
    ap.add_argument("--hint", default="",
                    help="text added to the problem's description (what a hint buys, e.g. naming a method)")
    ap.add_argument("--out", type=Path, default=Path("runs/mutation-probe"))
    args = ap.parse_args()
    problem, policy = load_problem(args.problem), load_policy(args.policy)
    if args.parent_id is not None and args.parents is None:
        ap.error("--parent-id needs --parents RUN_DIR")
    if policy.ensemble:  # one model per probe: the mix is measured by search.py --policy
        ap.error(f"{args.policy}: an ensemble; probe each member's policy, or run search.py --policy")
    if args.hint:
        problem = problem.model_copy(update={"description": f"{problem.description.rstrip()} {args.hint}\n"})
    args.out.mkdir(parents=True, exist_ok=True)
    rows = {}
    with ExitStack() as stack:
        evaluator = Evaluator(problem)
        stack.callback(evaluator.sandbox.close)
        parents = parents_of(problem, evaluator, args.parents, args.parent_id)
        base_url, model, _ = start_policy_server(policy, args.out, args.seed, stack)
        client = PolicyClient(policy, base_url, model)

        async def all_variants():
            for v in args.variants:
                rows[v] = await probe(problem, policy, client, evaluator, parents, v, args.calls, args.seed,
                                      args.out / "answers.jsonl", args.tune)
                print(v, rows[v], flush=True)
            await client.close()
        asyncio.run(all_variants())
    lines = ["| variant | answers | applied | valid | new shape | new shape, same outputs | better than parent | "
             "same as parent | better after tuning | repaired (applied) | best objective | tok/s | s/call |",
             "|" + "---|" * 13]
    for v, r in rows.items():
        a = max(r["answers"], 1)
        lines.append(f"| {v} | {r['answers']} | {r['applied'] / a:.0%} | {r['valid'] / a:.0%} | "
                     f"{r.get('structural', '-')} | {r.get('knobs', '-')} | "
                     f"{r['better']} ({r['better'] / a:.1%}) | {r['same']} | "
                     f"{r['better_tuned']}/{r['tuned']} | {r['reasked']} ({r['reask_applied']}) | "
                     f"{r['best_objective'] or 0:.4f} | {r['tokens'] / r['seconds']:.0f} | "
                     f"{r['seconds'] / args.calls:.0f} |")
    text = "\n".join(lines)
    (args.out / "report.md").write_text(text + "\n")
    (args.out / "results.json").write_text(json.dumps(rows, indent=1))
    print(text)


if __name__ == "__main__":
    main()
