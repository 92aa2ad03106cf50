"""Benchmark: answers per minute on the embedded CPU server, lever by lever (issue 60).

Each variant changes one lever against the run's own policy: speculative decoding (a
`complete` answer repeats much of the prompt: what prompt-lookup n-gram speculation is made
for), the calls in flight, the answers kept running (`budget.llm_batch`), the answers per call,
`max_tokens`, eager against compiled. The
server is started afresh per variant (no prefix cache carried over) and answers the prompts a
real run stored, as a run asks them: `calls` workers, each starting its next call as soon as its
last is answered (with `batch`: once fewer answers than that are running), until `--seconds` have
passed; the wall ends with the last answer.

    python tests/benchmarks/throughput.py RUN_DIR --variants none calls3 calls4 ngram4
    python tests/benchmarks/throughput.py --report OUT

Per variant: completion tokens/s and answers per minute, the mean answer length, how many
answers ended on their own (`stop`), mean call latency, and for a speculating server the share
of drafted tokens the model accepted (the server's /metrics). Call i of every variant answers
stored prompt i mod P with the same request seed, so the answers compare across variants.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import re
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from sqlalchemy import select
from sqlalchemy.orm import Session

from evolve.config import Policy, load_policy
from evolve.mutation.pipeline import request_seed
from evolve.rundir import RunDir
from evolve.serving.client import PolicyClient
from evolve.serving.server import start_policy_server
from evolve.store.database import connect
from evolve.store.schema import LLMCall


@dataclass(frozen=True)
class Variant:
    """One lever moved from the run's policy; None: as the policy (or --calls) has it."""
    speculative: dict | None = None  # vLLM's --speculative-config
    calls: int | None = None  # calls in flight (a run's `budget.llm_concurrency`)
    batch: int | None = None  # answers kept running (a run's `budget.llm_batch`)
    n: int | None = None  # answers per call (`sampling.group_size`)
    max_tokens: int | None = None
    eager: bool = True  # --enforce-eager, as every shipped policy serves


def _ngram(k: int, longest: int = 4) -> dict:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": longest}


VARIANTS: dict[str, Variant] = {
    "none": Variant(),
    "calls1": Variant(calls=1), "calls3": Variant(calls=3), "calls4": Variant(calls=4), "calls6": Variant(calls=6),
    "batch16": Variant(calls=3, batch=16), "batch24": Variant(calls=4, batch=24),
    "n16": Variant(n=16),
    "max384": Variant(max_tokens=384),
    "compiled": Variant(eager=False),
    "ngram2": Variant(speculative=_ngram(2)), "ngram4": Variant(speculative=_ngram(4)),
    "ngram8": Variant(speculative=_ngram(8, 5)),
    "suffix": Variant(speculative={"method": "suffix", "num_speculative_tokens": 8}),
}
COUNTERS = ("vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total")


def stored_prompts(run_dir: Path, limit: int) -> tuple[list[list[dict]], str]:
    """The run's first successful calls' messages and the run's policy file."""
    spec = RunDir(run_dir).spec()
    with Session(connect(spec["db_url"])) as s:
        calls = s.scalars(select(LLMCall).where(LLMCall.error.is_(None), LLMCall.n > 1)
                          .order_by(LLMCall.id).limit(limit)).all()
    if not calls:
        raise SystemExit(f"{run_dir}: no successful LLM call of n > 1 is stored")
    return [json.loads(c.prompt) for c in calls], spec["policy"]


def counters(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=30).text
    out = {}
    for name in COUNTERS:
        found = re.findall(rf"^{re.escape(name)}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M)
        out[name] = sum(float(v) for v in found)
    return out


async def measure(client: PolicyClient, base_url: str, prompts: list[list[dict]], n: int, calls: int,
                  seconds: float, max_tokens: int | None, batch: int | None = None) -> dict:
    try:
        return await _measure(client, base_url, prompts, n, calls, seconds, max_tokens, batch)
    finally:
        await client.close()  # in the loop that opened its connections


async def _measure(client: PolicyClient, base_url: str, prompts: list[list[dict]], n: int, calls: int,
                   seconds: float, max_tokens: int | None, batch: int | None) -> dict:
    await client.sample(prompts[0], 1, seed=1, max_tokens=8)  # the prefix cache warm, as in a run
    before, started, by_index = counters(base_url), time.time(), {}
    next_call, running = iter(range(10**9)), [0]

    def answered() -> None:
        running[0] -= 1

    async def worker() -> None:
        while time.time() - started < seconds:
            if batch is not None and running[0] >= batch:
                await asyncio.sleep(0.2)  # as the run's scheduler: start once an answer ends
                continue
            i = next(next_call)
            running[0] += n
            by_index[i] = await client.sample(prompts[i % len(prompts)], n, seed=request_seed(0, i),
                                              max_tokens=max_tokens, on_answer=answered)

    await asyncio.gather(*(worker() for _ in range(calls)))
    samples = [by_index[i] for i in sorted(by_index)]  # call order: call i compares across variants
    wall, after = time.time() - started, counters(base_url)
    tokens = sum(s.completion_tokens or 0 for s in samples)
    answers = sum(len(s.texts) for s in samples)
    drafted, accepted = (after[c] - before[c] for c in COUNTERS)
    return {"texts": [t for s in samples for t in s.texts],  # whether a lever changed what is sampled
            "calls": len(samples), "answers": answers, "tokens": tokens, "wall_s": round(wall, 1),
            "tok_s": tokens / wall, "answers_per_min": 60 * answers / wall, "mean_tokens": tokens / max(answers, 1),
            "latency_s": sum(s.latency_s for s in samples) / max(len(samples), 1),
            "stopped": sum(f == "stop" for s in samples for f in s.finish_reasons),
            "drafted": drafted, "accepted": accepted, "acceptance": accepted / drafted if drafted else None}


def served(policy: Policy, variant: Variant) -> Policy:
    """The policy with the variant's server arguments."""
    extra = [a for a in policy.server.extra_args if variant.eager or a != "--enforce-eager"]
    if variant.speculative is not None:
        extra += ["--speculative-config", json.dumps(variant.speculative)]
    return policy.model_copy(update={"server": policy.server.model_copy(update={"extra_args": extra})})


def run_variant(name: str, policy_path: str, prompts: list[list[dict]], calls: int, seconds: float,
                out: Path) -> dict:
    variant = VARIANTS[name]
    policy = served(load_policy(policy_path), variant)
    n, in_flight = variant.n or policy.sampling.group_size, variant.calls or calls
    folder = out / name
    folder.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        started = time.time()
        base_url, model, _ = start_policy_server(policy, folder, 0, stack)
        startup = time.time() - started
        client = PolicyClient(policy, base_url, model)
        result = asyncio.run(measure(client, base_url, prompts, n, in_flight, seconds, variant.max_tokens,
                                     variant.batch))
    result |= {"variant": name, "startup_s": round(startup, 1), "n": n, "in_flight": in_flight,
               "config": asdict(variant)}
    (folder / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def same_answers(r: dict, base: dict | None) -> str:
    """Answers identical to the plain server's for the same call and choice (same prompt, same
    request seed): a lever that leaves the sampler alone keeps most of them (the batch it shares
    moves the floating-point sums a little), one that corrupts it keeps none."""
    if base is None or r is base or r["n"] != base["n"]:
        return "-"
    pairs = list(zip(r["texts"], base["texts"]))
    return f"{sum(a == b for a, b in pairs)}/{len(pairs)}"


def table(results: list[dict]) -> str:
    base = next((r for r in results if r["variant"] == "none"), None)
    rows = ["| variant | in flight x n | calls | tok/s | answers/min | mean answer (tokens) | ended by stop | "
            "call latency (s) | acceptance | same answers as `none` | start-up (s) |",
            "|" + "---|" * 11]
    for r in results:
        acc = "-" if r["acceptance"] is None else f"{r['acceptance']:.0%} ({r['accepted']:.0f}/{r['drafted']:.0f})"
        rows.append(f"| {r['variant']} | {r['in_flight']} x {r['n']} | {r['calls']} | {r['tok_s']:.1f} | "
                    f"{r['answers_per_min']:.1f} | {r['mean_tokens']:.0f} | {r['stopped']}/{r['answers']} | "
                    f"{r['latency_s']:.0f} | {acc} | {same_answers(r, base)} | {r['startup_s']:.0f} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", nargs="?", type=Path, help="a run whose stored prompts are answered")
    ap.add_argument("--variants", nargs="+", default=["none", "calls4", "ngram4"], choices=list(VARIANTS))
    ap.add_argument("--calls", type=int, default=2, help="calls in flight (the run's llm_concurrency)")
    ap.add_argument("--seconds", type=float, default=240, help="new calls start until this much time has passed")
    ap.add_argument("--prompts", type=int, default=8, help="the run's first P stored prompts, asked in turn")
    ap.add_argument("--out", type=Path, default=Path("runs/bench-throughput"))
    ap.add_argument("--report", type=Path, help="only print the table of an existing OUT")
    args = ap.parse_args()
    if args.report:
        results = [json.loads(p.read_text()) for p in sorted(args.report.glob("*/result.json"))]
    else:
        prompts, policy = stored_prompts(args.run_dir, args.prompts)
        results = []
        for name in args.variants:
            done = args.out / name / "result.json"
            results.append(json.loads(done.read_text()) if done.exists() else
                           run_variant(name, policy, prompts, args.calls, args.seconds, args.out))
            print(table(results[-1:]), flush=True)
    results.sort(key=lambda r: r["variant"] != "none")  # the plain server first: the others compare with it
    print(table(results))


if __name__ == "__main__":
    main()
