"""The `complete` answer format: FunSearch's prompt for models too small to follow an edit
format (Romera-Paredes et al., Nature 2023).

The model is not asked to edit anything. It is shown the entry function in versions
`construct_packing_v0 .. v{k-1}`, the parent last and the others sorted by score, and the
reply is the body of `construct_packing_v{k}` that it continues writing (the final
assistant message is a prefix it completes). Nothing has to be copied exactly, and code
continuation is what a small code model does best. The new body replaces the parent's
entry function; the rest of the parent's block is kept.
"""
from __future__ import annotations

import ast
import re

from evolve.mutation.code import (
    MutationError,
    evolve_block,
    is_docstring,
    outline,
    parse,
    split_block,
    with_block,
)

SYSTEM = "You are an expert programmer. You write the next, improved version of a function.\n"

# Where the completed function ends: the next version (or its score comment), or the end of
# the fence. At most 4 (the OpenAI API's limit, which vLLM enforces); any other line back at
# column 0 ends the function too (_function_body).
STOP = ["\ndef ", "\nclass ", "\n```", "\n#"]

INSTRUCTIONS = """Below are versions of `{entry}`, the function that solves the problem, each \
with its scores; the last one is the current program. Write `{entry}_v{k}`, an improved version \
of `{entry}_v{last}`. Change how it works, not only its numbers: the numbers are tuned \
automatically afterwards. Keep the arguments and the return format."""


def _defined(block: str) -> list[str]:
    """Names of the functions and classes the block defines at its top level."""
    try:
        tree = parse(block)
    except SyntaxError:
        return []
    return [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def _versioned(block: str, names: list[str], k: int) -> str:
    """The block with every name it defines suffixed `_v{k}`, so versions can sit side by side."""
    for name in names:
        block = re.sub(rf"\b{re.escape(name)}\b", f"{name}_v{k}", block)
    return block


def _entry_node(block: str, entry: str) -> ast.FunctionDef | ast.AsyncFunctionDef:
    try:
        tree = parse(block)
    except SyntaxError as exc:
        raise MutationError(f"the parent's EVOLVE-BLOCK does not parse: {exc.msg}") from None
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry:
            if node.body[0].lineno == node.lineno:
                raise MutationError(f"{entry} is written on one line: no body to replace")
            return node
    raise MutationError(f"the parent's EVOLVE-BLOCK defines no function {entry!r}")


def _header(block: str, node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    """The def line(s) of the entry function as written, up to its docstring or first statement."""
    lines = block.splitlines(keepends=True)
    first = node.body[0]
    return "".join(lines[node.lineno - 1 : first.lineno - 1])


def _body_indent(block: str, node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    line = block.splitlines()[node.body[0].lineno - 1]
    return line[: len(line) - len(line.lstrip())]


REPAIR_INSTRUCTIONS = """Below are versions of `{entry}`, the function that solves the problem, each \
with its scores. The last one, `{entry}_v{last}`, fails: the judge's error is in the comment above \
it. Write `{entry}_v{k}`: `{entry}_v{last}` with that error fixed, keeping its idea. Keep the \
arguments and the return format."""
MAX_ERROR_LINES, MAX_ERROR_CHARS = 4, 160  # what a failing version's comment quotes of the judge


def _error_lines(error: str | None) -> list[str]:
    """The judge's reason in a few lines: its first line, then the traceback's last frame (the
    failing line of code) and the exception, without the caret lines."""
    lines = [line.rstrip() for line in (error or "").splitlines() if line.strip()]
    if not lines:
        return []
    frame = [line for line in lines[1:] if not line.strip().startswith(("Traceback", "^", "~"))]
    return [line[:MAX_ERROR_CHARS] for line in (lines[:1] + frame[-(MAX_ERROR_LINES - 1):])]


def _short_scores(program, problem) -> str:
    if program.status != "ok":
        why = "".join(f"\n#   {line}" for line in _error_lines(getattr(program, "error", None)))
        return f"status {program.status}{why}"
    head = "" if problem.headline == "objective" or program.headline is None else (
        f"{problem.headline} = {program.headline:.6f}, ")
    return f"{head}objective {program.objective:.4f}"


def versions_prefix(problem, parent, inspirations: list, purpose: str = "Improved") -> str:
    """The code the model continues: the fixed code around the block as an outline, the
    versions (inspirations by score, then the parent), and the new version's header."""
    entry = problem.entry_point
    ordered = sorted((p for p in inspirations if p.code), key=lambda p: p.objective or 0.0) + [parent]
    parts = [outline(parent.code).strip() + "\n"]
    for k, program in enumerate(ordered):
        block = evolve_block(program.code).strip("\n")
        names = _defined(block) or [entry]
        parts.append(f"\n# {entry}_v{k}: {_short_scores(program, problem)}\n{_versioned(block, names, k)}\n")
    block = evolve_block(parent.code)
    node = _entry_node(block, entry)
    k = len(ordered)
    header = _versioned(_header(block, node), [entry], k)
    doc = f'{_body_indent(block, node)}"""{purpose} version of {entry}_v{k - 1}."""\n'
    return "```python\n" + "\n".join(parts) + f"\n\n{header}{doc}"


def versions_messages(problem, parent, inspirations: list) -> list[dict]:
    """Chat messages whose last (assistant) message the server continues."""
    k = len([p for p in inspirations if p.code]) + 1
    task = INSTRUCTIONS.format(entry=problem.entry_point, k=k, last=k - 1)
    user = f"## Problem\n{problem.description.strip()}\n\n## Task\n{task}"
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user},
            {"role": "assistant", "content": versions_prefix(problem, parent, inspirations)}]


def repair_messages(problem, parent, broken) -> list[dict]:
    """The re-ask of a broken answer: the parent as v0, the broken child as v1 with the judge's
    error above it, and v2 to write (the fix of v1)."""
    task = REPAIR_INSTRUCTIONS.format(entry=problem.entry_point, k=2, last=1)
    user = f"## Problem\n{problem.description.strip()}\n\n## Task\n{task}"
    # versions_prefix sorts the others by score and puts its `parent` last: the broken child
    prefix = versions_prefix(problem, broken, [parent], purpose="Fixed")
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user},
            {"role": "assistant", "content": prefix}]


def _function_body(completion: str) -> str:
    """The completion up to the end of the function: its first line back at column 0."""
    kept = []
    for line in completion.replace("\r\n", "\n").split("\n"):
        if line.strip() and not line[0].isspace():
            break
        kept.append(line)
    body = "\n".join(kept).rstrip()
    if not body.strip():
        raise MutationError("the completion has no function body")
    return body + "\n"


def apply_completion(parent: str, completion: str, entry: str) -> str:
    """The child: the parent with its entry function's body replaced by the completion."""
    prefix, block, suffix = split_block(parent.replace("\r\n", "\n"))
    node = _entry_node(block, entry)
    body = _function_body(completion)
    # Calls to a version (`helper_v1`, `construct_packing_v0`) mean the block's own names.
    names = "|".join(re.escape(n) for n in _defined(parent.replace("\r\n", "\n")))
    body = re.sub(rf"\b({names})_v\d+\b", r"\1", body)
    lines = block.splitlines(keepends=True)
    start = (node.decorator_list[0].lineno if node.decorator_list else node.lineno) - 1
    first = node.body[0]
    # The prompt replaced the docstring by "Improved version of ..."; the parent's stays unless
    # the model wrote its own, so that a copy of the parent is seen as one (and not run).
    doc = "".join(lines[first.lineno - 1 : first.end_lineno]) if is_docstring(first) else ""
    if body.lstrip().startswith(('"""', "'''", 'r"""')):
        doc = ""
    function = "".join(lines[start : first.lineno - 1]) + doc + body
    new_block = "".join(lines[:start]) + function + "".join(lines[node.end_lineno :])
    return with_block(parent, new_block)
