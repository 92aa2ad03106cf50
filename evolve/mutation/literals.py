"""The float literals of a program's EVOLVE-BLOCK: found, replaced, masked, and rounded for the
LLM's eyes. Tuning moves them (evolve/search/tuning.py); the prompt shows them rounded."""
from __future__ import annotations

import difflib
import io
import math
import tokenize
from dataclasses import dataclass

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
        if not _is_literal(tok):
            continue
        value = float(tok.string)
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


def _is_literal(tok: tokenize.TokenInfo) -> bool:
    """A float literal the tuner moves: ints are structure (counts, indices), inf and nan fixed."""
    return tok.type == tokenize.NUMBER and _is_float(tok.string) and math.isfinite(float(tok.string))


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


def rounded(program: str, digits: int) -> str:
    """The program with the float literals of its block rounded to `digits` significant digits:
    how the LLM is shown a tuned program (Policy.literal_digits). The tuner owns the numbers;
    `0.826417` and `1.91435 * margin` only draw the model's edits to them."""
    literals = float_literals(program)
    return substitute(program, literals, [float(f"{lit.value:.{digits}g}") for lit in literals])


def restored(exact: str, shown: str, child: str) -> str:
    """`child`, written against `shown` (`exact` with its literals rounded), with `exact`'s value
    back in every float literal that the child kept where `shown` has it: the model reads short
    numbers, and the tuned values survive wherever it left them. Literals it wrote or moved stay
    as written."""
    before, after = _literal_tokens(shown), _literal_tokens(child)
    if shown == exact or before is None or after is None:
        return child
    exact_texts = [exact[lit.start:lit.end] for lit in float_literals(exact)]
    kept = {}  # the child's literal index -> the parent's text for it
    matcher = difflib.SequenceMatcher(None, before[0], after[0], autojunk=False)
    for block in matcher.get_matching_blocks():
        for i in range(block.size):
            was, now = before[1][block.a + i], after[1][block.b + i]
            if was is not None and now is not None:
                kept[now] = exact_texts[was]
    out, last = [], 0
    for k, lit in enumerate(float_literals(child)):
        if k in kept:
            out += [child[last:lit.start], kept[k]]
            last = lit.end
    return "".join(out) + child[last:]


def _literal_tokens(program: str) -> tuple[list[str], list[int | None]] | None:
    """The block's token texts, and for each token its index among the float literals (None:
    not one). None: not tokenizable."""
    tokens = _tokens(split_block(program)[1])
    if tokens is None:
        return None
    texts, which, count = [], [], 0
    for tok in tokens:
        literal = _is_literal(tok)
        texts.append(tok.string)
        which.append(count if literal else None)
        count += literal
    return texts, which
