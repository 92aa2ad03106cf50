"""The strict judge for a peer engine's candidates (tests/benchmarks/peer.py): one program file
through this project's sandbox and trusted scorer, the verdict appended to a log and printed.

    python tests/benchmarks/peer_judge.py PROBLEM PROGRAM_FILE LOG.jsonl

Runs in this project's environment (the peer runs in a virtual environment of its own and calls
this as a subprocess), so the peer's children are scored exactly as this engine's are.
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from evolve.config import load_problem
from evolve.judge.evaluator import Evaluator


def main() -> None:
    problem_path, program_path, log_path = map(Path, sys.argv[1:4])
    problem = load_problem(problem_path)
    evaluator = Evaluator(problem)
    try:
        result = asyncio.run(evaluator.evaluate(program_path.read_text()))
    finally:
        evaluator.sandbox.close()
    verdict = {"t": time.time(), "status": result.status,
               "objective": result.objective if result.status == "ok" else 0.0,
               "headline": result.headline if result.status == "ok" else None,
               "error": (result.error or "")[:300]}
    with open(log_path, "a") as log:
        log.write(json.dumps(verdict) + "\n")
    print(json.dumps(verdict))


if __name__ == "__main__":
    main()
