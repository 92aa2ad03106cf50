"""Prompt building: worked example, scores, multi-answer instructions, length budget."""
from pathlib import Path

from evolve.config import load_problem
from evolve.mutation.code import apply_answer
from evolve.mutation.prompt import EXAMPLE_PROGRAM, build_messages, estimate_tokens
from evolve.store.schema import Program

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = load_problem(ROOT / "problems" / "circle_packing.yaml")
SEED = (ROOT / "problems" / "circle_packing" / "seed.py").read_text()


def prog(objective, code=SEED):
    return Program(code=code, status="ok", objective=objective, headline=objective * 2.6,
                   fitness={c.name: objective for c in PROBLEM.components})


def test_prompt_has_problem_parent_scores_and_example():
    msgs = build_messages(PROBLEM, prog(0.8), [prog(0.9)], m=1, max_prompt_tokens=6000)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    user = msgs[-1]["content"]
    assert "SEARCH" in msgs[0]["content"] and "Pack n disjoint circles" in user
    assert "Current program (n26 = 2.080000; objective 0.8000" in user
    assert "Inspiration 1" in user and "n27=0.9000" in user
    assert user.index("Inspiration 1") < user.index("Current program")  # parent last, next to the task


def test_a_program_valid_but_not_on_its_headline_component_is_described():
    # status ok needs one valid component; the headline's may have failed (seen in a run)
    partial = Program(code=SEED, status="ok", objective=0.7, headline=None,
                      fitness={c.name: 0.0 if c.name == "n26" else 0.8 for c in PROBLEM.components})
    user = build_messages(PROBLEM, prog(0.8), [partial], m=1, max_prompt_tokens=6000)[-1]["content"]
    assert "Inspiration 1 (n26 invalid; objective 0.7000" in user


def test_multi_answer_prompt_names_numbered_sections():
    user = build_messages(PROBLEM, prog(0.8), [], m=3, max_prompt_tokens=6000)[-1]["content"]
    assert "3 genuinely different" in user
    assert all(f"<answer_{i}>" in user for i in (1, 2, 3))


def test_inspirations_dropped_to_fit_budget_but_parent_kept():
    big = SEED + "\n".join(f"# filler line {i} " + "x" * 80 for i in range(200))
    big = big.replace("# EVOLVE-BLOCK-END", "") + "\n# EVOLVE-BLOCK-END\n"
    insp = [prog(0.9, big), prog(0.85, big), prog(0.7, big)]
    full = build_messages(PROBLEM, prog(0.8), insp, m=1, max_prompt_tokens=100_000)
    tight = build_messages(PROBLEM, prog(0.8), insp, m=1, max_prompt_tokens=estimate_tokens(full) // 2)
    assert estimate_tokens(tight) <= estimate_tokens(full) // 2
    assert "Current program" in tight[-1]["content"] and "Inspiration 3" not in tight[-1]["content"]


def test_worked_example_is_a_valid_answer_in_the_format_asked():
    """The example turn must itself be a correct answer, or it teaches the wrong thing."""
    from evolve.mutation.code import split_answers
    for fmt in ("diff", "rewrite"):
        for m in (1, 3):
            example = build_messages(PROBLEM, prog(0.8), [], m, 6000, fmt)[2]["content"]
            answers = split_answers(example, m)
            assert len(answers) == m
            for answer in answers:
                assert apply_answer(EXAMPLE_PROGRAM, answer) != EXAMPLE_PROGRAM
                assert ("<<<<<<< SEARCH" in answer) == (fmt == "diff")


def test_block_view_shows_the_block_and_only_an_outline_of_the_code_around_it():
    user = build_messages(PROBLEM, prog(0.8), [], m=1, max_prompt_tokens=6000, fmt="rewrite",
                          view="block")[-1]["content"]
    assert "def max_radii(centers):" in user and "The radii with the largest sum" in user
    assert "linprog(-np.ones(n)" not in user  # the helper's body is not shown, so it cannot be copied
    assert "Current EVOLVE-BLOCK (n26 = 2.080000" in user and "stagger = 0.0" in user
    whole = build_messages(PROBLEM, prog(0.8), [], m=1, max_prompt_tokens=6000, fmt="rewrite")
    assert estimate_tokens(whole) > estimate_tokens(
        build_messages(PROBLEM, prog(0.8), [], m=1, max_prompt_tokens=6000, fmt="rewrite", view="block"))


def test_block_view_of_a_program_without_markers_shows_it_whole():
    code = "def f(n):\n    return n\n"
    user = build_messages(PROBLEM, prog(0.8, code), [], m=1, max_prompt_tokens=6000,
                          view="block")[-1]["content"]
    assert "### Current program (" in user and "def f(n):" in user


def test_a_knob_request_asks_for_it_and_its_example_adds_one():
    """The knob example must apply and add a new literal at a neutral value, used in the formula."""
    from evolve.mutation.code import split_answers
    from evolve.mutation.literals import changes_structure, float_literals
    from evolve.mutation.prompt import KNOB
    for fmt in ("diff", "rewrite"):
        msgs = build_messages(PROBLEM, prog(0.8), [], 1, 6000, fmt, KNOB)
        assert KNOB in msgs[1]["content"] and KNOB in msgs[-1]["content"]
        child = apply_answer(EXAMPLE_PROGRAM, split_answers(msgs[2]["content"], 1)[0])
        assert changes_structure(EXAMPLE_PROGRAM, child)
        assert len(float_literals(child)) == len(float_literals(EXAMPLE_PROGRAM)) + 1
        plain = build_messages(PROBLEM, prog(0.8), [], 1, 6000, fmt)
        assert KNOB not in plain[1]["content"] + plain[-1]["content"]


def test_the_judges_notes_on_the_parent_follow_it_and_can_be_turned_off():
    parent = prog(0.8)
    parent.error = "n26: invalid: circles 3 and 5 overlap\n" + "\n".join(f"line {i}" for i in range(20))
    user = build_messages(PROBLEM, parent, [prog(0.9)], m=1, max_prompt_tokens=6000, fmt="rewrite")[-1]["content"]
    notes = user[user.index("### What the judge said about the current program"):]
    assert user.index("Current program") < user.index("What the judge said") < user.index("## Task")
    assert "circles 3 and 5 overlap" in notes and "line 4" in notes and "line 5" not in notes
    assert "(15 more)" in notes  # the first lines only
    quiet = build_messages(PROBLEM, parent, [], m=1, max_prompt_tokens=6000, fmt="rewrite", notes=False)
    assert "What the judge said" not in quiet[-1]["content"]
    assert "What the judge said" not in build_messages(PROBLEM, prog(0.8), [], m=1, max_prompt_tokens=6000)[-1]["content"]
