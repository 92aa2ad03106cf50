"""In-the-loop tuning: the float literals of a program's EVOLVE-BLOCK, improved by CMA-ES.

The small LLMs this engine runs on a CPU write structure acceptably and numbers badly: their
valid edits are mostly constant tweaks, each one a single random sample. A numeric optimiser
does that job far better (measured: CMA-ES took a ring construction from 1.838 to 1.996 in 100
scored trials, where the 1.5B model's best of 64 answers was 1.878). So the LLM proposes code
and this operator moves its numbers: every float literal of the block becomes one coordinate
of a vector, and each trial is an ordinary candidate scored through the same sandbox and judge.

CMA-ES (the `cma` package) rather than TPE or SMAC: the literals are continuous and few (a
handful to a dozen), the trials of one population can run in parallel, and it needs no model
of its own to fit between trials.
"""
from __future__ import annotations

import asyncio
import io
import math
import tokenize
import warnings
from dataclasses import dataclass
from typing import Awaitable, Callable

import numpy as np

from evolve.mutation.code import split_block


@dataclass(frozen=True)
class Literal:
    start: int  # character offsets in the program
    end: int
    value: float


def float_literals(program: str) -> list[Literal]:
    """The float literals of the EVOLVE-BLOCK, in order (ints are structure: counts, indices)."""
    prefix, body, _ = split_block(program)
    offsets = _line_offsets(body)
    found = []
    for tok in _tokens(body) or []:
        if tok.type != tokenize.NUMBER or not _is_float(tok.string):
            continue
        value = float(tok.string)
        if not math.isfinite(value):
            continue
        start = len(prefix) + offsets[tok.start[0] - 1] + tok.start[1]
        end = len(prefix) + offsets[tok.end[0] - 1] + tok.end[1]
        found.append(Literal(start, end, value))
    return found


_LAYOUT = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
           tokenize.ENDMARKER}


def shape(program: str) -> tuple[str, ...] | None:
    """The block's code tokens with every float literal masked, comments and docstrings dropped:
    two programs of one shape differ only in numbers the tuner moves anyway. None: not
    tokenizable."""
    tokens = _tokens(split_block(program)[1])
    if tokens is None:
        return None
    masked = ["<float>" if t.type == tokenize.NUMBER and _is_float(t.string) else t.string
              for i, t in enumerate(tokens) if t.type not in _LAYOUT and not _is_docstring(tokens, i)]
    out = []
    for token in masked:  # `(-0.5)` is how `substitute` writes a literal that turned negative
        out.append(token)
        if out[-4:] == ["(", "-", "<float>", ")"]:
            out[-4:] = ["<float>"]
    return tuple(out)


def changes_structure(parent: str, child: str) -> bool:
    """True if the child differs from its parent in more than its float literals and comments."""
    before, after = shape(parent), shape(child)
    return before is None or after is None or before != after


def adds_knob(parent: str, child: str) -> bool:
    """True if the child has more float literals than its parent and another shape: with its
    parent's outputs, a new number at its neutral value, a dimension for the tuner."""
    return len(float_literals(child)) > len(float_literals(parent)) and changes_structure(parent, child)


def _is_docstring(tokens: list[tokenize.TokenInfo], i: int) -> bool:
    """A string that is a statement of its own (a docstring): it says, it does nothing."""
    before = tokens[i - 1].type if i else tokenize.NEWLINE
    return (tokens[i].type == tokenize.STRING and before in _LAYOUT - {tokenize.COMMENT}
            and i + 1 < len(tokens) and tokens[i + 1].type in (tokenize.NEWLINE, tokenize.COMMENT))


def _tokens(body: str) -> list[tokenize.TokenInfo] | None:
    try:
        return list(tokenize.generate_tokens(io.StringIO(body).readline))
    except (tokenize.TokenError, SyntaxError):
        return None


def _is_float(text: str) -> bool:
    text = text.lower().replace("_", "")
    if text.startswith(("0x", "0o", "0b")) or text.endswith("j"):
        return False
    return "." in text or "e" in text


def _line_offsets(text: str) -> list[int]:
    offsets, total = [0], 0
    for line in text.splitlines(keepends=True):
        total += len(line)
        offsets.append(total)
    return offsets


def substitute(program: str, literals: list[Literal], values) -> str:
    """The program with each literal replaced by its new value (negatives in parentheses)."""
    out, last = [], 0
    for lit, value in zip(literals, values):
        # Six significant digits: far finer than a tuning's steps, and a program the LLM is
        # shown later carries `0.953553`, not `0.9535528293161163` (short to read and to copy).
        text = repr(float(f"{float(value):.6g}"))
        out += [program[last:lit.start], f"({text})" if value < 0 else text]
        last = lit.end
    out.append(program[last:])
    return "".join(out)


@dataclass
class Trial:
    code: str
    objective: float  # the judge's objective; a failed candidate scores what the judge gave it
    result: object  # the evaluator's result, kept so the best trial needs no second run


@dataclass
class Tuned:
    best: Trial | None  # None: nothing to tune, or no trial ran
    trials: int
    parameters: int
    start_objective: float


Evaluate = Callable[[str], Awaitable[Trial | None]]  # None: the budget is spent, stop


async def tune(program: str, objective: float, evaluate: Evaluate, trials: int, sigma: float,
               seed: int, max_parameters: int, rng: np.random.Generator) -> Tuned:
    """CMA-ES over the block's float literals, `trials` scored candidates at most.

    Each coordinate is a relative change: value = start + scale * z with scale = |start| (1 for
    a zero), so one sigma suits literals of every magnitude. With more literals than
    `max_parameters`, a random subset is tuned and the rest kept (CMA-ES needs far more trials
    than a tuning may spend once it has dozens of coordinates).
    """
    literals = float_literals(program)
    if len(literals) > max_parameters:
        keep = np.sort(rng.choice(len(literals), size=max_parameters, replace=False))
        literals = [literals[i] for i in keep]
    if not literals:
        return Tuned(None, 0, 0, objective)
    import cma

    start = np.array([lit.value for lit in literals])
    scale = np.where(start != 0, np.abs(start), 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # cma warns about one-dimensional problems
        es = cma.CMAEvolutionStrategy(np.zeros(len(literals)), sigma,
                                      {"seed": seed + 1, "verbose": -9, "popsize": _popsize(len(literals))})
    best: Trial | None = None
    spent = 0
    while spent < trials and not es.stop():
        zs = es.ask()[: trials - spent]
        results = await asyncio.gather(*(evaluate(substitute(program, literals, start + scale * z))
                                         for z in zs))
        ran = [r for r in results if r is not None]
        spent += len(ran)
        for trial in ran:
            if best is None or trial.objective > best.objective:
                best = trial
        if len(ran) < es.popsize:
            break  # the budget ran out, or the trials did: a partial population cannot be told
        es.tell(zs, [-r.objective for r in results])
    return Tuned(best, spent, len(literals), objective)


def _popsize(dims: int) -> int:
    """CMA-ES's default population (4 + 3 ln d), at least 6 so two evaluators stay busy."""
    return max(6, 4 + int(3 * math.log(dims)))
