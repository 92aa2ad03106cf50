"""Program text handling: the EVOLVE-BLOCK, parsing LLM answers, applying mutations.

A program holds one EVOLVE-BLOCK between a ``# EVOLVE-BLOCK-START`` line and a
``# EVOLVE-BLOCK-END`` line; only its body may change. The LLM answers with
SEARCH/REPLACE blocks against that body or, as a fallback, with a full rewrite
of it in a fenced code block. With m > 1 answers per response, each answer sits
in an ``<answer_k>`` section (docs/design.md §6).

Small models make many formatting mistakes, so the parsers here are tolerant
about layout (fences, marker lengths, trailing spaces, CRLF, indentation) but
never about content: a SEARCH text that is not in the parent is an error, with
a message that ends up in the database as the failure reason.

Standard library only.
"""
from __future__ import annotations

import ast
import re
import threading
import warnings
from dataclasses import dataclass
from typing import Callable, Iterator

BLOCK_START = "# EVOLVE-BLOCK-START"
BLOCK_END = "# EVOLVE-BLOCK-END"


# CPython 3.11 keeps ast.parse's recursion depth per interpreter, not per thread: a parse
# that a garbage collection interrupts for another thread's parse fails with "SystemError: AST
# constructor recursion depth mismatch" (python/cpython#106905). Generation loops are threads.
_PARSING = threading.RLock()  # reentrant: a finalizer that parses must not deadlock


def parse(code: str) -> ast.Module:
    """ast.parse, one thread at a time (see _PARSING)."""
    with _PARSING:
        return ast.parse(code)


# Failed answers that got furthest: the reward grades them (evolve/rl/rollouts.py).
UNCHANGED = ("the child is identical to its parent", "the edit changes nothing")
NOT_PARSED = "child does not parse"


class MutationError(ValueError):
    """Why a mutation could not be applied (message is stored in the database as the failure reason)."""


@dataclass(frozen=True)
class Edit:
    """One SEARCH/REPLACE block; both texts are whole lines ending in a newline."""

    search: str
    replace: str


# ---------------------------------------------------------------------------
# Text helpers
# ---------------------------------------------------------------------------

def _lf(text: str) -> str:
    """Convert CRLF (and lone CR) line endings to LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _lines(text: str) -> list[str]:
    """Split into lines that keep their "\\n" (the last one may lack it).

    Unlike str.splitlines this splits on "\\n" only: form feeds and other
    exotic separators inside source lines must survive untouched.
    """
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def _join(lines: list[str]) -> str:
    """Lines without newlines -> text with one "\\n" after each line."""
    return "".join(line + "\n" for line in lines)


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip(" \t"))]


def _trim_blank_edges(text: str) -> str:
    """Drop whitespace-only lines at the start and the end of a text."""
    lines = _lines(text)
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "".join(lines)


def _squash(text: str) -> str:
    """Text with trailing spaces and blank edge lines removed (for no-op checks)."""
    return "\n".join(line.rstrip() for line in _lf(text).split("\n")).strip("\n")


def _first_line(text: str, limit: int = 80) -> str:
    """The first non-blank line, stripped and shortened, for error messages."""
    for line in text.split("\n"):
        if line.strip():
            line = line.strip()
            return line if len(line) <= limit else line[: limit - 3] + "..."
    return ""


# ---------------------------------------------------------------------------
# The EVOLVE-BLOCK
# ---------------------------------------------------------------------------

# Marker lines may be indented and carry trailing text ("# EVOLVE-BLOCK-END  (do not edit)").
_START_RE = re.compile(r"^[ \t]*#[ \t]*EVOLVE-BLOCK-START\b.*$", re.MULTILINE)
_END_RE = re.compile(r"^[ \t]*#[ \t]*EVOLVE-BLOCK-END\b.*$", re.MULTILINE)


def _after_line(text: str, match: re.Match) -> int:
    """Index just past the newline that ends the matched line (or the end of text)."""
    newline = text.find("\n", match.end())
    return len(text) if newline < 0 else newline + 1


def split_block(program: str) -> tuple[str, str, str]:
    """Split into (prefix incl. start marker line, block body, suffix incl. end marker line).

    prefix + body + suffix == program. Without markers the whole program is
    the body. Only the first block counts; a lone or misordered marker is an
    error because guessing where the block ends could let an edit escape it.
    """
    start = _START_RE.search(program)
    if start is None:
        if _END_RE.search(program):
            raise MutationError(f"{BLOCK_END} without {BLOCK_START}")
        return "", program, ""
    body_start = _after_line(program, start)
    end = _END_RE.search(program, body_start)
    if end is None:
        raise MutationError(f"{BLOCK_START} without {BLOCK_END}")
    return program[:body_start], program[body_start : end.start()], program[end.start() :]


def evolve_block(program: str) -> str:
    """The EVOLVE-BLOCK body (the whole program when it has no markers)."""
    return split_block(program)[1]


def outline(program: str) -> str:
    """The code outside the EVOLVE-BLOCK as a reader of the block needs it: imports,
    constants, and each function or class as its signature and the first line of its
    docstring. Small models asked to rewrite the block copy whatever they are shown; a
    whole helper shown in full is copied instead of the block (docs/benchmarks/mutation.md)."""
    prefix, _, suffix = split_block(program)
    lines = []
    for part in (prefix, suffix):
        try:
            tree = parse(part)
        except SyntaxError:  # a block split inside a statement: show that part as it is
            lines.append(part.strip())
            continue
        lines.extend(_outline_node(node) for node in tree.body if not is_docstring(node))
    return "\n".join(line for line in lines if line)


def is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(
        node.value.value, str)


def _outline_node(node: ast.stmt) -> str:
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return ast.unparse(node)
    # the def or class line itself: decorators come first in the unparsed text
    head = next(line for line in ast.unparse(node).splitlines()
                if line.startswith(("def ", "async def ", "class ")))
    doc = (ast.get_docstring(node) or "").strip().split("\n", 1)[0]
    body = f'    """{doc}"""\n    ...' if doc else "    ..."
    return f"\n{head}\n{body}\n"


def _has_marker(text: str) -> bool:
    return bool(_START_RE.search(text) or _END_RE.search(text))


# ---------------------------------------------------------------------------
# Parsing answers
# ---------------------------------------------------------------------------

# At least 5 marker characters: models often miscount the canonical 7.
_SEARCH_RE = re.compile(r"^\s*<{5,}\s*SEARCH\s*$", re.IGNORECASE)
_DIVIDER_RE = re.compile(r"^\s*={5,}\s*$")
_REPLACE_RE = re.compile(r"^\s*>{5,}\s*REPLACE\s*$", re.IGNORECASE)
_FENCE_OPEN_RE = re.compile(r"^\s*`{3,}\s*([\w+.-]*)\s*$")
_FENCE_CLOSE_RE = re.compile(r"^\s*`{3,}\s*$")
_PYTHON_TAGS = {"", "python", "python3", "py"}


def _unfence(lines: list[str]) -> list[str]:
    """Remove a ``` fence wrapped around the inside of a SEARCH or REPLACE section."""
    filled = [i for i, line in enumerate(lines) if line.strip()]
    if len(filled) >= 2:
        first, last = filled[0], filled[-1]
        if _FENCE_OPEN_RE.match(lines[first]) and _FENCE_CLOSE_RE.match(lines[last]):
            return lines[:first] + lines[first + 1 : last] + lines[last + 1 :]
    return lines


def _trim_unclosed(lines: list[str]) -> list[str]:
    """Tail of a REPLACE section that had no closing marker: drop trailing blanks and fences.

    The fence is the one the model wrapped the whole block in; it is not code.
    """
    lines = list(lines)
    while lines and (not lines[-1].strip() or _FENCE_OPEN_RE.match(lines[-1])):
        lines.pop()
    return lines


def _parse_blocks(answer: str) -> list[tuple[str, str | None]]:
    """All SEARCH/REPLACE blocks as (search, replace); replace is None when truncated.

    A line-by-line state machine, so text and fences between blocks are
    ignored. A block whose REPLACE marker is missing ends at the next SEARCH
    marker or at the end of the text (truncated generation).
    """
    blocks: list[tuple[str, str | None]] = []
    state, search, replace = "out", list[str](), list[str]()

    def close(closed: bool) -> None:
        if state == "search":  # never reached the ======= divider
            blocks.append((_join(_unfence(search)), None))
        elif state == "replace":
            tail = replace if closed else _trim_unclosed(replace)
            blocks.append((_join(_unfence(search)), _join(_unfence(tail))))

    for line in _lf(answer).split("\n"):
        if _SEARCH_RE.match(line):
            close(closed=False)
            state, search, replace = "search", [], []
        elif state == "search" and _DIVIDER_RE.match(line):
            state = "replace"
        elif state != "out" and _REPLACE_RE.match(line):
            close(closed=True)
            state = "out"
        elif state == "search":
            search.append(line)
        elif state == "replace":
            replace.append(line)
    close(closed=False)
    return blocks


def parse_edits(answer: str) -> list[Edit]:
    """All complete SEARCH/REPLACE blocks in the text, in order."""
    return [Edit(s, r) for s, r in _parse_blocks(answer) if r is not None]


def _fenced_blocks(text: str) -> list[str]:
    """Bodies of the Python (or untagged) fenced code blocks, in order.

    A fence left open at the end of the text (truncated generation) still
    counts: its code will fail the syntax check with a clearer message than
    "no code block".
    """
    bodies: list[str] = []
    inside, python, current = False, False, list[str]()
    for line in _lf(text).split("\n"):
        if not inside:
            opener = _FENCE_OPEN_RE.match(line)
            if opener:
                inside, python, current = True, opener.group(1).lower() in _PYTHON_TAGS, []
        elif _FENCE_CLOSE_RE.match(line):
            if python:
                bodies.append(_join(current))
            inside = False
        else:
            current.append(line)
    if inside and python and any(line.strip() for line in current):
        bodies.append(_join(_trim_unclosed(current)))
    return bodies


def parse_rewrite(answer: str) -> str | None:
    """Body of the last ```python (or bare ```) fenced block; None if there is none."""
    bodies = _fenced_blocks(answer)
    return bodies[-1] if bodies else None


_ANSWER_OPEN_RE = re.compile(r"<\s*answer[\s_-]*(\d+)\s*>", re.IGNORECASE)
_ANSWER_CLOSE_RE = re.compile(r"<\s*/\s*answer[\s_-]*\d*\s*>", re.IGNORECASE)


def split_answers(response: str, m: int) -> list[str]:
    """Split a multi-answer response into its ``<answer_k>`` sections.

    Sections are returned in order of appearance whatever their numbers, with
    text outside them dropped. A section runs to its closing tag, else to the
    next opening tag, else to the end of the text (truncated generation). At
    most m sections are returned, since each one costs an evaluation. With
    m == 1, or when no section is present, the whole response is one answer.
    """
    opens = list(_ANSWER_OPEN_RE.finditer(response))
    if m <= 1 or not opens:
        return [response]
    answers = []
    for k, opener in enumerate(opens):
        limit = opens[k + 1].start() if k + 1 < len(opens) else len(response)
        closer = _ANSWER_CLOSE_RE.search(response, opener.end(), limit)
        end = closer.start() if closer else limit
        answers.append(response[opener.end() : end].strip())
    return answers[:m]


# ---------------------------------------------------------------------------
# Applying answers
# ---------------------------------------------------------------------------

_COMMENT_RE = re.compile(r"""\s+#[^'"]*$""")


def _code_only(line: str) -> str:
    """The line without indentation and without a trailing comment (one holding no quote, so
    a '#' inside a string is never cut). Small models drop the comments they copy."""
    return _COMMENT_RE.sub("", line.strip())


# Line comparisons from strictest to loosest; the last two ignore indentation, in which case
# the REPLACE lines are re-indented (see _reindent), and the last one trailing comments too.
_MATCHERS: tuple[Callable[[str], str], ...] = (
    lambda line: line.rstrip("\n"),
    lambda line: line.rstrip(),
    lambda line: line.strip(),
    _code_only,
)
_IGNORES_INDENT = _MATCHERS[2:]


def _find(body: list[str], search: list[str], key: Callable[[str], str]) -> int | None:
    """Index of the first window of body lines equal to search under key."""
    wanted = [key(line) for line in search]
    keys = [key(line) for line in body]
    for at in range(len(body) - len(search) + 1):
        if keys[at : at + len(search)] == wanted:
            return at
    return None


def _reindent(lines: list[str], found: str, written: str) -> list[str]:
    """Shift lines by the width difference between the parent's indent and the model's.

    The model wrote the SEARCH text with indentation `written` where the
    parent has `found`; its REPLACE text is assumed to share the model's
    offset, so it is moved by the same amount (lines less indented than the
    first one move too, which keeps dedents inside the replacement right).
    """
    shift = len(found) - len(written)
    pad = ("\t" if found.startswith("\t") else " ") * max(shift, 0)
    out = []
    for line in lines:
        if not line.strip():
            out.append(line)
        elif shift >= 0:
            out.append(pad + line)
        else:
            out.append(line[min(-shift, len(_indent(line))) :])
    return out


def _candidates(edit: Edit) -> Iterator[Edit]:
    """The edit as written, then with blank lines at its edges dropped.

    Models often add or drop a blank line right after the SEARCH marker or
    before the divider; the REPLACE text is trimmed the same way so the
    child does not gain stray blank lines.
    """
    yield edit
    trimmed = Edit(_trim_blank_edges(edit.search), _trim_blank_edges(edit.replace))
    if trimmed.search != edit.search:
        yield trimmed


def _apply_edit(body: str, edit: Edit) -> str | None:
    """The body with the edit applied at the first match, or None if it does not match."""
    body_lines = _lines(body)
    for key in _MATCHERS:
        for cand in _candidates(edit):
            search, replace = _lines(cand.search), _lines(cand.replace)
            at = _find(body_lines, search, key)
            if at is None:
                continue
            if key in _IGNORES_INDENT:
                k = next(i for i, line in enumerate(search) if line.strip())
                replace = _reindent(replace, _indent(body_lines[at + k]), _indent(search[k]))
            after = body_lines[at + len(search) :]
            if replace and after and not replace[-1].endswith("\n"):
                replace[-1] += "\n"
            return "".join(body_lines[:at] + replace + after)
    return None


def _apply_edits(body: str, blocks: list[tuple[str, str | None]]) -> str:
    """Apply SEARCH/REPLACE blocks in order; each sees the result of the previous ones."""
    for i, (search, replace) in enumerate(blocks, 1):
        if replace is None:
            raise MutationError(f"SEARCH block {i} has no ======= divider (truncated answer?)")
        if not search.strip():
            raise MutationError(f"SEARCH block {i} is empty")
    edits = [Edit(s, r) for s, r in blocks if r is not None]
    if all(_squash(e.search) == _squash(e.replace) for e in edits):
        raise MutationError(UNCHANGED[1])
    for i, edit in enumerate(edits, 1):
        changed = _apply_edit(body, edit)
        if changed is None:
            raise MutationError(f"SEARCH block {i} not found in the parent: {_first_line(edit.search)}")
        body = changed
    return body


def _rewrite_body(code: str) -> str:
    """The new block body from a full rewrite: between the markers if it has any."""
    if not code.strip():
        raise MutationError("the code block in the answer is empty")
    start, end = _START_RE.search(code), _END_RE.search(code)
    if start and end and end.start() > start.start():
        return split_block(code)[1]
    if start:  # end marker lost (truncated): keep everything after the start
        return code[_after_line(code, start) :]
    if end:
        return code[: end.start()]
    return code


def apply_answer(parent: str, answer: str) -> str:
    """The child program produced by one answer; raises MutationError with the reason.

    SEARCH/REPLACE blocks take precedence over a fenced rewrite. Only the
    EVOLVE-BLOCK body changes; the parent's prefix and suffix are kept byte
    for byte, and a CRLF parent gives a CRLF child.
    """
    body = evolve_block(_lf(parent))
    blocks = _parse_blocks(answer)
    if blocks:
        return with_block(parent, _apply_edits(body, blocks))
    code = parse_rewrite(answer)
    if code is None:
        raise MutationError("no SEARCH/REPLACE block or code block in the answer")
    return with_block(parent, _rewrite_body(_lf(code)))


def with_block(parent: str, new_body: str) -> str:
    """The parent with a new EVOLVE-BLOCK body: checked to parse and to differ from it."""
    crlf = "\r\n" in parent
    prefix, _, suffix = split_block(_lf(parent))
    if _has_marker(new_body):
        # A second marker would make the child's block ambiguous for every later mutation.
        raise MutationError("the new EVOLVE-BLOCK body contains an EVOLVE-BLOCK marker")
    if suffix and new_body and not new_body.endswith("\n"):
        new_body += "\n"  # keep the end marker on its own line
    child = prefix + new_body + suffix
    if crlf:
        child = child.replace("\n", "\r\n")
    check_syntax(child)
    # Changes of layout or comments only are the same program: not worth an evaluation (a
    # rewrite that copies the parent often adds a comment saying what it meant to change).
    if normalise(child) == normalise(parent) or _syntax(child) == _syntax(_lf(parent)):
        raise MutationError(UNCHANGED[0])
    return child


def _syntax(code: str) -> str | None:
    """The program's syntax tree, comments and layout left out (None: it does not parse)."""
    try:
        return ast.dump(parse(code))
    except (SyntaxError, ValueError):
        return None


# ---------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------

def normalise(code: str) -> str:
    """Canonical form for duplicate detection.

    Line endings become LF, trailing whitespace is stripped from every line
    and blank lines are dropped; programs equal after this are duplicates.
    """
    lines = (line.rstrip() for line in _lf(code).split("\n"))
    return _join([line for line in lines if line])


def check_syntax(code: str) -> None:
    """Raise MutationError if the code does not compile.

    compile() rather than ast.parse(): it also rejects what only the compiler
    sees, such as `return` outside a function.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. SyntaxWarning for invalid escapes
            compile(code, "<child>", "exec", dont_inherit=True)
    except SyntaxError as exc:  # IndentationError and TabError included
        raise MutationError(f"{NOT_PARSED}: {exc.msg} (line {exc.lineno})") from None
    except (ValueError, RecursionError) as exc:  # null bytes, absurd nesting
        raise MutationError(f"{NOT_PARSED}: {exc}") from None
