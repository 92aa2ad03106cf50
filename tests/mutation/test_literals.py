"""The LLM's view of a tuned program: literals shown rounded, exact values back in the child."""
from evolve.mutation import pipeline
from evolve.mutation.literals import float_literals, restored, rounded
from evolve.mutation.prompt import ProgramText

TUNED = '''import numpy as np
SCALE = 2.54321  # outside the block: never shown rounded

# EVOLVE-BLOCK-START
def f(n):
    """Spacing 0.123456 in the docstring is text."""
    margin = 0.486352
    rise = 0.82628 * n
    return margin + rise * 1.91435 + 1e-7
# EVOLVE-BLOCK-END
'''


def test_rounded_rounds_only_the_blocks_literals():
    shown = rounded(TUNED, 2)
    assert "margin = 0.49" in shown and "rise = 0.83 * n" in shown and "rise * 1.9 + 1e-07" in shown
    assert "SCALE = 2.54321" in shown and "0.123456 in the docstring" in shown
    assert [round(lit.value, 9) for lit in float_literals(shown)] == [0.49, 0.83, 1.9, 1e-7]


def test_a_child_gets_the_exact_values_back_where_it_kept_the_literals():
    shown = rounded(TUNED, 2)
    child = shown.replace("margin = 0.49", "margin = 0.3").replace(
        "return margin", "bend = 0.05\n    return bend + margin")
    back = restored(TUNED, shown, child)
    assert "margin = 0.3" in back and "bend = 0.05" in back  # what it wrote stays
    assert "rise = 0.82628 * n" in back and "rise * 1.91435 + 1e-7" in back  # what it kept is exact
    assert restored(TUNED, shown, shown) == TUNED  # a copy of what it was shown is the parent


def test_the_pipeline_shows_rounded_programs_and_applies_to_what_it_showed():
    from evolve.config import Policy, load_problem
    problem = load_problem("problems/circle_packing.yaml")
    policy = Policy(name="p", model="m", answer_format="rewrite", literal_digits=2)
    parent = ProgramText(TUNED, "ok", 0.5, 1.0, {}, None)
    messages, fmt = pipeline.prompt(problem, policy, parent, [parent], 0)
    text = "\n".join(m["content"] for m in messages)
    assert "0.486352" not in text and "margin = 0.49" in text
    answer = "```python\ndef f(n):\n    margin = 0.49\n    rise = 0.83 * n\n    return margin + rise * 3.0 + 1e-07\n```"
    child = pipeline.apply(TUNED, answer, fmt, "f", policy.literal_digits).child
    assert "margin = 0.486352" in child and "rise = 0.82628 * n" in child and "rise * 3.0" in child
    plain = pipeline.apply(TUNED, answer, fmt, "f").child  # shown as stored: taken as written
    assert "margin = 0.49" in plain
