"""The `complete` answer format: FunSearch's versions prompt and the child its completion makes."""
from pathlib import Path

import pytest
from pydantic import ValidationError

from evolve.config import Policy, load_problem
from evolve.mutation.code import MutationError, evolve_block
from evolve.mutation.prompt import build_messages, make_child
from evolve.mutation.versions import apply_completion, versions_prefix
from evolve.store.schema import Program

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = load_problem(ROOT / "problems" / "circle_packing.yaml")
SEED = (ROOT / "problems" / "circle_packing" / "seed.py").read_text()
ENTRY = "construct_packing"

PARENT = '''import numpy as np


def helper(n):
    return n


# EVOLVE-BLOCK-START
def spread(n):
    return np.linspace(0.1, 0.9, n)


@staticmethod
def construct_packing(n,
                      scale=1.0):
    """Old docstring."""
    x = spread(n)
    return x * scale
# EVOLVE-BLOCK-END
'''


def prog(objective, code=SEED):
    return Program(code=code, status="ok", objective=objective, headline=objective * 2.6,
                   fitness={c.name: objective for c in PROBLEM.components})


def test_versions_put_the_parent_last_and_the_others_by_score():
    better, worse = prog(0.9, SEED.replace("stagger = 0.0", "stagger = 0.5")), prog(0.7, SEED.replace(
        "rise = 1.0", "rise = 0.9"))
    text = versions_prefix(PROBLEM, prog(0.8), [better, worse])
    v0, v1, v2 = (text.index(f"def construct_packing_v{k}(n):") for k in range(3))
    assert v0 < v1 < v2 < text.index("def construct_packing_v3(n):")
    assert "rise = 0.9" in text[v0:v1] and "stagger = 0.5" in text[v1:v2] and "stagger = 0.0" in text[v2:]
    assert "# construct_packing_v2: n26 = 2.080000, objective 0.8000" in text
    # the code around the block is an outline, and the prefix ends where the new body begins
    assert "def max_radii(centers):" in text and "linprog(-np.ones(n)" not in text
    assert text.endswith('def construct_packing_v3(n):\n    """Improved version of construct_packing_v2."""\n')


def test_complete_messages_end_with_the_prefix_the_model_continues():
    msgs = build_messages(PROBLEM, prog(0.8), [prog(0.9)], m=1, max_prompt_tokens=6000, fmt="complete")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant"]
    assert "Write `construct_packing_v2`, an improved version of `construct_packing_v1`" in msgs[1]["content"]
    assert msgs[2]["content"].startswith("```python\n")


def test_complete_prompt_drops_inspirations_to_fit_its_budget():
    many = [prog(0.5 + i / 100) for i in range(4)]
    tight = build_messages(PROBLEM, prog(0.8), many, m=1, max_prompt_tokens=1400, fmt="complete")
    assert "construct_packing_v1(n)" in tight[2]["content"]
    assert "construct_packing_v4(n)" not in tight[2]["content"]


def test_versions_rename_every_function_of_the_block():
    text = versions_prefix(PROBLEM, prog(0.8, PARENT), [])
    assert "def spread_v0(n):" in text and "x = spread_v0(n)" in text
    assert "def helper(n):" in text  # outside the block: the name stays
    assert text.endswith('def construct_packing_v1(n,\n                      scale=1.0):\n'
                         '    """Improved version of construct_packing_v0."""\n')


def test_completion_replaces_the_entry_function_and_keeps_the_rest():
    completion = "    x = spread_v0(n) ** 2  # squares\n    return helper_v3(x) * scale\n\n\nprint('after')\n"
    child = apply_completion(PARENT, completion, ENTRY)
    block = evolve_block(child)
    assert "def spread(n):\n    return np.linspace(0.1, 0.9, n)" in block  # the block's other code
    assert ("@staticmethod\ndef construct_packing(n,\n                      scale=1.0):\n"
            '    """Old docstring."""\n'
            "    x = spread(n) ** 2  # squares\n    return helper(x) * scale\n") in block
    assert "print('after')" not in child  # the function ends at column 0
    assert child.endswith("# EVOLVE-BLOCK-END\n")


def test_completion_errors_are_mutation_failures():
    with pytest.raises(MutationError, match="no function body"):
        apply_completion(PARENT, "\n\nprint('no body')\n", ENTRY)
    with pytest.raises(MutationError, match="does not parse"):
        apply_completion(PARENT, "    x = (\n", ENTRY)
    with pytest.raises(MutationError, match="identical"):  # the parent's docstring is kept
        apply_completion(PARENT, "    x = spread(n)\n    return x * scale\n", ENTRY)
    with pytest.raises(MutationError, match="defines no function 'solve'"):
        apply_completion(PARENT, "    return 1\n", "solve")


def test_a_docstring_written_by_the_model_replaces_the_parents():
    child = apply_completion(PARENT, '    """New idea."""\n    return spread(n)\n', ENTRY)
    assert '"""New idea."""' in child and "Old docstring" not in child


def test_make_child_dispatches_on_the_format():
    assert "return x * scale * 2" in make_child(PARENT, "    x = spread(n)\n    return x * scale * 2\n",
                                                 "complete", ENTRY)
    with pytest.raises(MutationError, match="no SEARCH/REPLACE block"):
        make_child(PARENT, "    return 1\n", "diff", ENTRY)


def test_complete_format_asks_for_one_answer():
    with pytest.raises(ValidationError, match="answer_format complete continues one function"):
        Policy(name="p", model="m", answer_format="complete", answers=3)


def test_a_repair_shows_the_broken_version_last_with_the_judges_error_and_asks_for_its_fix():
    from evolve.mutation.pipeline import apply, repair_prompt
    from evolve.mutation.prompt import ProgramText
    broken_code = SEED.replace("    centers = np.stack([x, y], axis=1)",
                               "    centers = np.stack([x, y], axis=1) + offset")
    error = ("n26: NameError: name 'offset' is not defined\nTraceback (most recent call last):\n"
             '  File "/work/candidate.py", line 70, in construct_packing\n'
             "    centers = np.stack([x, y], axis=1) + offset\n              ^^^^^^\n"
             "NameError: name 'offset' is not defined")
    broken = ProgramText(broken_code, "error", None, None, None, error)
    parent = ProgramText(SEED, "ok", 0.9, 2.3, {"n26": 0.9})
    policy = Policy(name="p", model="m", answer_format="complete")
    messages, fmt = repair_prompt(PROBLEM, policy, broken, parent, 0)
    prefix = messages[-1]["content"]
    assert fmt == "complete" and "`construct_packing_v1`, fails" in messages[1]["content"]
    v0, v1 = prefix.index("# construct_packing_v0: n26 = 2.3"), prefix.index("# construct_packing_v1: status error")
    assert v0 < v1 < prefix.index('"""Fixed version of construct_packing_v1."""')
    comment = prefix[v1:prefix.index("def construct_packing_v1")]
    assert "NameError: name 'offset' is not defined" in comment and "+ offset" in comment and "^" not in comment
    body = "    return np.zeros((n, 2)), np.zeros(n)\n"
    assert apply(broken_code, body, fmt, ENTRY).child.count("offset") == 0  # the fix applies to the broken child
