"""Benchmark: evaluations per second against the number of Ray workers, and against one host.

    python tests/benchmarks/ray_scale.py [--problem problems/circle_packing.yaml] [--workers 1 2 4]
                                         [--candidates 60]

For each worker count W: a local Ray cluster of W nodes of one CPU each (Ray's test-cluster
helper: W raylets on this machine), `sandbox.backend: ray` with one slot per node, and the
problem's seed evaluated `--candidates` times through the engine's Evaluator (Docker on each
node, the scorer in the engine), W at once. The same with the Docker sandbox of this host and
W evaluations at once is the baseline: the difference is what Ray costs. No LLM is involved.
On one machine the workers share its cores, so this measures the overhead and the plumbing;
on a cluster each node brings its own.
"""
from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

from evolve.config import load_problem
from evolve.judge.evaluator import Evaluator
from evolve.sandbox import make_sandbox


async def rate(evaluator: Evaluator, code: str, candidates: int, at_once: int) -> float:
    """Evaluations per second with `at_once` in flight (after one warm-up each)."""
    slots = asyncio.Semaphore(at_once)

    async def one():
        async with slots:
            result = await evaluator.evaluate(code)
            assert result.status == "ok", result.error

    await asyncio.gather(*(one() for _ in range(at_once)))
    started = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(candidates)))
    return candidates / (time.perf_counter() - started)


def on_ray(problem, code: str, workers: int, candidates: int) -> float:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    for _ in range(workers - 1):
        cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    limits = problem.sandbox.model_copy(update={"backend": "ray", "ray": problem.sandbox.ray.model_copy(
        update={"address": cluster.address, "slots_per_node": 1})})
    evaluator = Evaluator(problem, make_sandbox(limits))
    try:
        assert evaluator.sandbox.capacity == workers
        return asyncio.run(rate(evaluator, code, candidates, workers))
    finally:
        evaluator.sandbox.close()
        ray.shutdown()
        cluster.shutdown()


def on_host(problem, code: str, at_once: int, candidates: int) -> float:
    evaluator = Evaluator(problem)
    try:
        return asyncio.run(rate(evaluator, code, candidates, at_once))
    finally:
        evaluator.sandbox.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problem", type=Path, default=Path("problems/circle_packing.yaml"))
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--candidates", type=int, default=60)
    args = ap.parse_args()
    problem = load_problem(args.problem)
    code = problem.resolve(problem.program).read_text()
    print("| workers | Docker on this host (evals/s) | Ray, one node per worker (evals/s) |")
    print("|---|---|---|")
    for w in args.workers:
        host = on_host(problem, code, w, args.candidates)
        ray_rate = on_ray(problem, code, w, args.candidates)
        print(f"| {w} | {host:.2f} | {ray_rate:.2f} |", flush=True)


if __name__ == "__main__":
    main()
