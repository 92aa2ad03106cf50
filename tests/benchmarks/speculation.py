"""Benchmark: speculative decoding on the embedded CPU server, against none (issue 60).

A `complete` answer is a new version of the parent's function, so most of its lines repeat text
that is already in the prompt: what prompt-lookup (n-gram) speculation is made for. For each
variant the server is started afresh with the run's policy (its model, dtype, n, temperature),
plus the variant's `--speculative-config`, and answers the prompts a real run stored:

    python tests/benchmarks/speculation.py RUN_DIR --variants none ngram4 --calls 2
    python tests/benchmarks/speculation.py --report OUT

Per variant: completion tokens/s and answers per minute with `--calls` calls in flight (the
run's `llm_concurrency`), the mean answer length, how many answers ended on their own (`stop`),
and for a speculating server the share of drafted tokens the model accepted (the server's
/metrics). The prompts' request seeds are the same for every variant, so the lengths compare.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from contextlib import ExitStack
from pathlib import Path

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from evolve.config import load_policy
from evolve.mutation.pipeline import request_seed
from evolve.rundir import RunDir
from evolve.serving.client import PolicyClient
from evolve.serving.server import start_policy_server
from evolve.store.database import connect
from evolve.store.schema import LLMCall

# name -> vLLM's --speculative-config (None: no speculation)
VARIANTS: dict[str, dict | None] = {
    "none": None,
    "ngram2": {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
    "ngram4": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4},
    "ngram8": {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 5},
    "suffix": {"method": "suffix", "num_speculative_tokens": 8},
}
COUNTERS = ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total")


def stored_prompts(run_dir: Path, limit: int) -> tuple[list[list[dict]], int, str]:
    """The run's first successful calls' messages, their n, and the run's policy file."""
    spec = RunDir(run_dir).spec()
    with Session(connect(spec["db_url"])) as s:
        calls = s.scalars(select(LLMCall).where(LLMCall.error.is_(None), LLMCall.n > 1)
                          .order_by(LLMCall.id).limit(limit)).all()
    if not calls:
        raise SystemExit(f"{run_dir}: no successful LLM call of n > 1 is stored")
    return [json.loads(c.prompt) for c in calls], calls[0].n, spec["policy"]


def counters(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=30).text
    out = {}
    for name in COUNTERS:
        found = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
        out[name] = sum(float(v) for v in found)
    return out


async def measure(client: PolicyClient, base_url: str, prompts: list[list[dict]], n: int, calls: int,
                  rounds: int) -> dict:
    try:
        return await _measure(client, base_url, prompts, n, calls, rounds)
    finally:
        await client.close()  # in the loop that opened its connections


async def _measure(client: PolicyClient, base_url: str, prompts: list[list[dict]], n: int, calls: int,
                   rounds: int) -> dict:
    await client.sample(prompts[0], 1, seed=1, max_tokens=8)  # the prefix cache warm, as in a run
    before, started, samples = counters(base_url), time.time(), []
    for r in range(rounds):
        batch = [prompts[(r * calls + i) % len(prompts)] for i in range(calls)]
        samples += await asyncio.gather(*(client.sample(m, n, seed=request_seed(0, r * calls + i))
                                          for i, m in enumerate(batch)))
    wall, after = time.time() - started, counters(base_url)
    tokens = sum(s.completion_tokens or 0 for s in samples)
    answers = sum(len(s.texts) for s in samples)
    drafted, accepted = (after[c] - before[c] for c in COUNTERS)
    return {"texts": [t for s in samples for t in s.texts],  # whether speculation changed what is sampled
            "calls": len(samples), "answers": answers, "tokens": tokens, "wall_s": round(wall, 1),
            "tok_s": tokens / wall, "answers_per_min": 60 * answers / wall, "mean_tokens": tokens / max(answers, 1),
            "stopped": sum(f == "stop" for s in samples for f in s.finish_reasons),
            "drafted": drafted, "accepted": accepted, "acceptance": accepted / drafted if drafted else None}


def run_variant(name: str, policy_path: str, prompts: list[list[dict]], n: int, calls: int, rounds: int,
                out: Path) -> dict:
    policy = load_policy(policy_path)
    extra = list(policy.server.extra_args)
    if VARIANTS[name] is not None:
        extra += ["--speculative-config", json.dumps(VARIANTS[name])]
    policy = policy.model_copy(update={"server": policy.server.model_copy(update={"extra_args": extra})})
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        started = time.time()
        base_url, model, _ = start_policy_server(policy, folder, 0, stack)
        startup = time.time() - started
        client = PolicyClient(policy, base_url, model)
        result = asyncio.run(measure(client, base_url, prompts, n, calls, rounds))
    result |= {"variant": name, "startup_s": round(startup, 1), "n": n, "in_flight": calls,
               "config": VARIANTS[name]}
    (folder / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def table(results: list[dict]) -> str:
    rows = ["| variant | calls x n | tok/s | answers/min | mean answer (tokens) | ended by stop | acceptance | start-up (s) |",
            "|---|---|---|---|---|---|---|---|"]
    for r in results:
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.0%} ({r['accepted']:.0f}/{r['drafted']:.0f})"
        rows.append(f"| {r['variant']} | {r['calls']} x {r['n']} | {r['tok_s']:.1f} | {r['answers_per_min']:.1f} | "
                    f"{r['mean_tokens']:.0f} | {r['stopped']}/{r['answers']} | {acc} | {r['startup_s']:.0f} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", nargs="?", type=Path, help="a run whose stored prompts are answered")
    ap.add_argument("--variants", nargs="+", default=["none", "ngram4"], choices=list(VARIANTS))
    ap.add_argument("--calls", type=int, default=2, help="calls in flight (the run's llm_concurrency)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("runs/bench-speculation"))
    ap.add_argument("--report", type=Path, help="only print the table of an existing OUT")
    args = ap.parse_args()
    if args.report:
        results = [json.loads(p.read_text()) for p in sorted(args.report.glob("*/result.json"))]
    else:
        prompts, n, policy = stored_prompts(args.run_dir, args.calls * args.rounds)
        results = []
        for name in args.variants:
            done = args.out / name / "result.json"
            results.append(json.loads(done.read_text()) if done.exists() else
                           run_variant(name, policy, prompts, n, args.calls, args.rounds, args.out))
            print(table(results[-1:]), flush=True)
    print(table(results))


if __name__ == "__main__":
    main()
