"""Select the "hard" HumanEval tasks: those the embedded model fails at best@30 sampled directly.

For every task the policy's model is asked, without any evolution, for a complete function
(`--samples` answers at the policy's temperature, one request per task with vLLM's n, a seed
per task). Each answer runs in the real sandbox and is judged by the trusted scorer; a task
is solved at best@n when at least one answer passes every test case. The unsolved ones are
the hard list (problems/humaneval_hard.yaml records this script's output in its comments).

    .venv/bin/python problems/humaneval/select_hard.py --out runs/select-hard.jsonl

Resumable: tasks already in --out are skipped. Work stops at a task's first passing answer
(best@n only needs one): answers are drawn in rounds (--round at a time, each round with its
own request seed) and judged as they come; answers identical to one already judged are not
run again. Generation stops at the end of the answer's code block.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from contextlib import ExitStack
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from openai import AsyncOpenAI  # noqa: E402

from evolve.config import load_policy, load_problem
from evolve.judge.evaluator import Evaluator
from evolve.serving.server import start_policy_server

PROBLEM = ROOT / "problems" / "humaneval.yaml"
SYSTEM = "You are an expert Python programmer. Answer with code only."


def messages(prompt: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Complete the following Python function. Reply with the whole "
                                        f"function (signature included) in one ```python block.\n\n"
                                        f"```python\n{prompt.rstrip()}\n```"}]


def program(prompt: str, entry_point: str, answer: str) -> str:
    """The prompt's imports and helpers, then the answer's code (or the prompt plus a body)."""
    blocks = re.findall(r"```(?:python|py)?\s*\n(.*?)```", answer, re.S)
    code = max(blocks, key=len) if blocks else answer
    head = re.search(rf"^def {re.escape(entry_point)}\(", prompt, re.M).start()
    if re.search(rf"^def {re.escape(entry_point)}\(", code, re.M):
        return prompt[:head] + code
    return prompt + code  # a body only


async def draw(client: AsyncOpenAI, model: str, policy, prompt: str, n: int, seed: int) -> tuple[list[str], int]:
    """n answers at the policy's sampling settings, cut at the end of the code block."""
    s = policy.sampling
    resp = await client.chat.completions.create(
        model=model, messages=messages(prompt), n=n, temperature=s.temperature, top_p=s.top_p,
        max_tokens=s.max_tokens, seed=seed, stop=["\n```"])
    texts = [c.message.content or "" for c in sorted(resp.choices, key=lambda c: c.index)]
    return [t if t.rstrip().endswith("```") else t + "\n```" for t in texts], resp.usage.completion_tokens


async def best_at_n(args, client, model, policy, task: str, prompt: str) -> dict:
    """Draw answers round by round until one passes every test or n have been drawn."""
    sets = [f"task={task}"] + ([f"sandbox.backend={args.backend}"] if args.backend else [])
    problem = load_problem(PROBLEM, sets)
    evaluator = Evaluator(problem)
    seen: dict[str, float] = {}
    drawn = tokens = 0
    try:
        while drawn < args.samples and max(seen.values(), default=0.0) < 1.0:
            n = min(args.round, args.samples - drawn)
            seed = (args.seed * 1000 + int(task.split("/")[1])) * 100 + drawn
            answers, used = await draw(client, model, policy, prompt, n, seed)
            drawn, tokens = drawn + n, tokens + used
            for answer in answers:
                code = program(prompt, problem.entry_point, answer)
                if code not in seen:
                    result = await evaluator.evaluate(code)
                    seen[code] = result.objective if result.status == "ok" else 0.0
                if seen[code] == 1.0:
                    break
    finally:
        evaluator.sandbox.close()
    best = max(seen.values(), default=0.0)
    return {"task": task, "solved": best == 1.0, "best_objective": best, "drawn": drawn,
            "judged": len(seen), "tokens": tokens}


async def select(args, client: AsyncOpenAI, model: str, policy, tasks: list[str], done: set[str]) -> None:
    sys.path.insert(0, str(ROOT / "problems" / "humaneval"))
    from template import dataset

    rows = dataset()
    todo = [t for t in tasks if t not in done]
    queue: asyncio.Queue = asyncio.Queue()
    for t in todo:
        queue.put_nowait(t)

    async def worker() -> None:
        while not queue.empty():
            task = queue.get_nowait()
            started = time.time()
            record = await best_at_n(args, client, model, policy, task, rows[task]["prompt"])
            record.update(samples=args.samples, seconds=round(time.time() - started, 1))
            with open(args.out, "a") as out:
                out.write(json.dumps(record) + "\n")
            print(json.dumps(record), flush=True)

    try:
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
    finally:
        await client.close()


def summary(path: Path, model: str, samples: int) -> str:
    records = {r["task"]: r for r in map(json.loads, path.read_text().splitlines())}
    hard = sorted((t for t, r in records.items() if not r["solved"]), key=lambda t: int(t.split("/")[1]))
    return "\n".join([
        f"model {model}, best@{samples} sampled directly: {len(records) - len(hard)} of "
        f"{len(records)} tasks solved, {len(hard)} hard:",
        ", ".join(hard)])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policy", type=Path, default=ROOT / "policies" / "frozen.yaml")
    p.add_argument("--out", type=Path, default=Path("runs/select-hard.jsonl"))
    p.add_argument("--samples", type=int, default=30, help="answers per task (best@n)")
    p.add_argument("--tasks", nargs="*", help="default: all 164")
    p.add_argument("--round", type=int, default=10, help="answers drawn per request (default: %(default)s)")
    p.add_argument("--concurrency", type=int, default=6, help="tasks sampled at once (default: %(default)s)")
    p.add_argument("--backend", choices=["docker", "process"], help="default: the problem's (auto)")
    p.add_argument("--port", type=int, help="embedded server port (default: the policy's)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    policy = load_policy(args.policy)
    if args.port:
        policy.server.port = args.port
    sys.path.insert(0, str(ROOT / "problems" / "humaneval"))
    from template import dataset, task_id
    tasks = [task_id(t) for t in args.tasks] if args.tasks else list(dataset())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    done = {json.loads(line)["task"] for line in args.out.read_text().splitlines()} if args.out.exists() else set()
    with ExitStack() as stack:
        base_url, model, _ = start_policy_server(policy, args.out.parent, args.seed, stack)
        client = AsyncOpenAI(base_url=base_url, api_key="EMPTY", timeout=3600)
        asyncio.run(select(args, client, model, policy, tasks, done))
    print(summary(args.out, policy.model, args.samples))
    return 0


if __name__ == "__main__":
    sys.exit(main())
