"""The mutator's prompts: the chat built from a parent and its inspirations, the answer
formats it asks for, and the child an answer makes of the parent."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol

from evolve.config import Policy, Problem
from evolve.mutation.code import apply_answer, evolve_block, outline
from evolve.mutation.versions import apply_completion, versions_messages

SYSTEM = """You are an expert programmer improving a program by evolution.
You change only the code between `# EVOLVE-BLOCK-START` and `# EVOLVE-BLOCK-END`.
"""

# How an answer is written. Small models copy the worked example whatever its format, so each
# format has its own (docs/design.md §6: 0/10 valid diffs zero-shot, 6-10/10 with one example).
RULES = {
    "diff": """Answer with SEARCH/REPLACE blocks. SEARCH copies lines of the current program exactly,
indentation included; REPLACE holds the new lines:

<<<<<<< SEARCH
exact lines from the current program
=======
new lines that replace them
>>>>>>> REPLACE

Keep the function names and the return format. Write one short sentence of intent, then
the blocks, nothing else.""",
    "rewrite": """Answer with one short sentence of intent, then the complete new code of the block in one
```python fenced block: every line between the markers, changed or not, nothing outside them.
Keep the function names and the return format.""",
}
FORMATS = tuple(RULES)  # what `mix` alternates; `complete` (evolve/mutation/versions.py) has no rules
MAX_NOTE_LINES, MAX_NOTE_CHARS = 6, 900  # the judge's notes on the parent: a few failures, not all

# A worked example given as a previous chat turn is followed far more reliably than one
# embedded in the instructions.
EXAMPLE_PROGRAM = """import math

# EVOLVE-BLOCK-START
def place_points(n):
    \"\"\"Return n points in the unit interval, as far apart as possible.\"\"\"
    step = 1.0 / n
    points = [i * step for i in range(n)]
    return points
# EVOLVE-BLOCK-END
"""

EXAMPLE_EDITS = [
    ("Centre the points so the end gaps are equal.",
     "    points = [i * step for i in range(n)]", "    points = [(i + 0.5) * step for i in range(n)]"),
    ("Use the whole interval, both ends included.",
     "    step = 1.0 / n\n    points = [i * step for i in range(n)]",
     "    step = 1.0 / max(n - 1, 1)\n    points = [i * step for i in range(n)]"),
    ("Spread the points with a cosine law.",
     "    points = [i * step for i in range(n)]",
     "    points = [0.5 - 0.5 * math.cos(math.pi * (i + 0.5) / n) for i in range(n)]"),
]


# The knob request (search.tuning.knobs): the LLM adds a dimension, the tuner moves along it.
# Concrete forms, since the small models follow an example far better than an abstract ask.
KNOB = ("Add one new number to the construction that the tuner can adjust later: a named "
        "parameter set to a value that leaves the result unchanged for now (0.0 for a shift or "
        "a bend, 1.0 for a scale) and used in the formula of some of the elements, for example "
        "`tilt = 0.0` with `y = y + tilt * x`, or `squeeze = 1.0` with `x = 0.5 + squeeze * (x - 0.5)`. "
        "Keep everything else as it is.")


# The re-ask of a broken answer (search.repair): the current program is the broken child, and
# the judge's notes below it say why it failed.
REPAIR = ("The current program fails: the judge's words are below it. Fix that error and keep the "
          "idea of the program; change nothing else.")


# The worked example of a knob request: a new number at its neutral value, used in the formula.
KNOB_EDIT = ("Add a shift of every other point, neutral at 0.0, for the tuner to set.",
             "    points = [i * step for i in range(n)]",
             "    shift = 0.0\n    points = [i * step + shift * (i % 2) for i in range(n)]")


def _diff(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE"


def _rewrite(search: str, replace: str) -> str:
    block = EXAMPLE_PROGRAM.split("# EVOLVE-BLOCK-START\n")[1].split("# EVOLVE-BLOCK-END")[0]
    return f"```python\n{block.replace(search, replace).rstrip()}\n```"


def example_turns(m: int, fmt: str = "diff", directive: str | None = None) -> list[dict]:
    """A worked example as one user/assistant exchange, in the answer format asked for; a
    knob request's example adds a knob."""
    user = (f"## Problem\nPlace n points in [0, 1] with the largest minimum gap.\n\n"
            f"### Current program (min gap 0.0000)\n```python\n{EXAMPLE_PROGRAM}```\n\n"
            f"## Task\n" + (f"{directive}\n" if directive else "") + _answer_instructions(m, fmt))
    shown = [KNOB_EDIT] if directive == KNOB else EXAMPLE_EDITS
    edits = [shown[i % len(shown)] for i in range(m)]
    write = _diff if fmt == "diff" else _rewrite
    if m == 1:
        intent, search, replace = edits[0]
        answer = f"{intent}\n{write(search, replace)}"
    else:
        answer = "\n".join(f"<answer_{i}>\n{intent}\n{write(search, replace)}\n</answer_{i}>"
                           for i, (intent, search, replace) in enumerate(edits, 1))
    return [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]


class Shown(Protocol):
    """What a prompt shows of a program (read only): a stored Program, or a held-out parent's record."""
    @property
    def code(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def objective(self) -> float | None: ...

    @property
    def headline(self) -> float | None: ...

    @property
    def fitness(self) -> dict | None: ...

    @property
    def error(self) -> str | None:
        """The judge's notes: why components failed or fell short."""


@dataclass(frozen=True)
class ProgramText:
    """A program known by its record only (held-out parents and their inspirations)."""
    code: str
    status: str
    objective: float | None
    headline: float | None
    fitness: dict | None
    error: str | None = None

    @classmethod
    def of(cls, record: dict) -> "ProgramText":
        return cls(record["code"], record["status"], record["objective"], record["headline"], record["fitness"],
                   record.get("error"))


def scores_line(program: Shown, problem: Problem) -> str:
    """What the model is told about a program: its status, headline and vector fitness."""
    if program.status != "ok":
        return f"status {program.status}"
    comps = ", ".join(f"{k}={v:.4f}" for k, v in (program.fitness or {}).items())
    if problem.headline == "objective":
        head = ""
    elif program.headline is None:  # valid on other components, not on the headline's
        head = f"{problem.headline} invalid; "
    else:
        head = f"{problem.headline} = {program.headline:.6f}; "
    return f"{head}objective {program.objective:.4f}; normalised components: {comps}"


def _program_section(title: str, program, problem: Problem, whole: bool) -> str:
    code = program.code if whole else evolve_block(program.code)
    return f"### {title} ({scores_line(program, problem)})\n```python\n{code.rstrip()}\n```\n"


def _current_section(parent, problem: Problem, view: str, notes: bool = True) -> str:
    """The parent whole, or (view "block") the code around its block as an outline, then the
    block; then what the judge said about it (`notes`)."""
    context = outline(parent.code) if view == "block" else ""
    if not context:
        shown = _program_section("Current program", parent, problem, view == "whole")
    else:
        shown = (f"### Code outside the EVOLVE-BLOCK (fixed; the block may use it)\n```python\n"
                 f"{context.strip()}\n```\n"
                 + _program_section("Current EVOLVE-BLOCK", parent, problem, False))
    return shown + (judge_notes(parent) if notes else "")


def judge_notes(program) -> str:
    """The judge's notes on a program (why components failed or fell short: a test call that
    raised, a scorer's reason), the first lines only: what an answer should fix."""
    text = (getattr(program, "error", None) or "").strip()
    if not text:
        return ""
    lines = text.splitlines()
    shown = "\n".join(lines[:MAX_NOTE_LINES])[:MAX_NOTE_CHARS]
    more = f"\n({len(lines) - MAX_NOTE_LINES} more)" if len(lines) > MAX_NOTE_LINES else ""
    return f"### What the judge said about the current program\n```\n{shown}{more}\n```\n"


def _answer_instructions(m: int, fmt: str = "diff") -> str:
    how = ("SEARCH/REPLACE blocks against the current program" if fmt == "diff"
           else "the complete new code of the EVOLVE-BLOCK in a ```python block")
    if m == 1:
        return f"Propose one improvement as {how}."
    tags = " ".join(f"<answer_{i}>...</answer_{i}>" for i in range(1, m + 1))
    return (f"Propose {m} genuinely different improvements, each aiming at a different trade-off "
            f"between the components. Write each as {how}, inside numbered sections: {tags}. "
            f"Later answers should differ from earlier ones.")


def build_messages(problem: Problem, parent, inspirations: list, m: int,
                   max_prompt_tokens: int, fmt: str = "diff", directive: str | None = None,
                   view: str = "whole", plain_example: bool = False, notes: bool = True) -> list[dict]:
    """Chat messages for one mutation request in answer format `fmt` (diff | rewrite | complete),
    dropping inspirations to stay in budget. `directive`: the kind of change asked for, which
    the worked example follows too unless `plain_example`; `view`: how the parent is shown
    (Policy.program_view); `notes`: show the judge's notes on the parent (Policy.judge_notes)."""
    insp = list(inspirations)
    current = _current_section(parent, problem, view, notes) if fmt != "complete" else ""
    while True:
        if fmt == "complete":
            messages = versions_messages(problem, parent, insp)
        else:
            messages = _chat(problem, current, insp, m, fmt, directive, plain_example)
        if not insp or estimate_tokens(messages) <= max_prompt_tokens:
            return messages
        insp.pop()  # the last inspirations are the least useful (diverse ones come last)


def _chat(problem: Problem, current: str, insp: list, m: int, fmt: str, directive: str | None,
          plain_example: bool = False) -> list[dict]:
    """The instructions, a worked example in the answer format, then the request."""
    user = (f"## Problem\n{problem.description.strip()}\n\n"
            + "".join(_program_section(f"Inspiration {i + 1}", p, problem, False) for i, p in enumerate(insp))
            + current
            + "\n## Task\n" + (f"{directive}\n" if directive else "") + _answer_instructions(m, fmt))
    return [{"role": "system", "content": SYSTEM + "\n" + RULES[fmt]}, *example_turns(m, fmt, None if plain_example else directive),
            {"role": "user", "content": user}]


def answer_format(policy: Policy, call_index: int) -> str:
    """The format of one call: the policy's, or alternating diff / rewrite for `mix`."""
    if policy.answer_format != "mix":
        return policy.answer_format
    return FORMATS[call_index % len(FORMATS)]


def make_child(parent: str, answer: str, fmt: str, entry: str) -> str:
    """The child program an answer in format `fmt` makes of the parent (MutationError if none)."""
    return apply_completion(parent, answer, entry) if fmt == "complete" else apply_answer(parent, answer)


def estimate_tokens(messages: list[dict]) -> int:
    # ~3.5 characters per token for code with BPE tokenizers; only used for budgeting.
    return int(sum(len(m["content"]) for m in messages) / 3.5) + 8


def dump_messages(messages: list[dict]) -> str:
    """Prompts are stored as the exact chat messages so training can re-render them."""
    return json.dumps(messages, ensure_ascii=False)
