"""The package's layering (README, Layout): no import cycles, and no import from a lower layer
to a higher one. Lazy imports inside functions count: they are still dependencies."""
import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "evolve"
# Lowest first. A module may import its own layer (without a cycle) and any lower one.
LAYERS = [
    {"config", "events", "faults", "rundir"},
    {"archive", "store", "mutation", "sandbox", "serving"},
    {"judge"},
    {"search", "rl"},
    {"compare", "run"},
    {"views"},
    {"cli", "suite"},
]
RANK = {room: level for level, rooms in enumerate(LAYERS) for room in rooms}


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if "migrations" in parts or "policies" in parts:
            continue
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """The evolve modules a file imports, anywhere in it."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
            out |= {n for n in names if n in known} or {node.module}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
    return {m for m in out if m in known}


def room(module: str) -> str:
    return module.split(".")[1] if module.count(".") else "evolve"


def read_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {m: imports(p, known) - {m, "evolve"} for m, p in found.items()}


@functools.cache
def graph() -> dict[str, set[str]]:
    """Read in a fresh interpreter: CPython 3.11's ast.parse can fail with "AST constructor
    recursion depth mismatch" in a process where an earlier test hit a RecursionError."""
    done = subprocess.run([sys.executable, __file__], capture_output=True, text=True, check=True)
    return {m: set(deps) for m, deps in json.loads(done.stdout).items()}


def test_every_module_has_a_layer():
    missing = {room(m) for m in graph()} - set(RANK) - {"evolve"}
    assert not missing, f"add {sorted(missing)} to LAYERS (and to the README's layout section)"


def test_no_import_reaches_up_a_layer():
    upward = [f"{m} ({room(m)}, layer {RANK[room(m)]}) imports {d} ({room(d)}, layer {RANK[room(d)]})"
              for m, deps in graph().items() if room(m) in RANK
              for d in deps if room(d) in RANK and RANK[room(d)] > RANK[room(m)]]
    assert not upward, "\n".join(upward)


def test_no_import_cycles():
    edges = graph()
    cycles, state = [], {}

    def visit(m, stack):
        state[m] = "open"
        for d in sorted(edges[m]):
            if state.get(d) == "open":
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d, stack + [d])
        state[m] = "done"

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(cycles)


@pytest.mark.parametrize("sub", sorted(RANK))
def test_each_sub_package_or_module_exists(sub):
    assert (PACKAGE / sub).is_dir() or (PACKAGE / f"{sub}.py").is_file()


def _tool(*args: str):
    return subprocess.run([sys.executable, "-m", *args], cwd=PACKAGE.parent, capture_output=True, text=True)


def test_ruff_finds_nothing():
    """Unused or undefined names, syntax errors, import order (pyproject.toml [tool.ruff])."""
    done = _tool("ruff", "check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout + done.stderr


def test_mypy_finds_nothing():
    """The typed boundaries hold (pyproject.toml [tool.mypy])."""
    done = _tool("mypy", "--no-incremental")
    assert done.returncode == 0, done.stdout + done.stderr


if __name__ == "__main__":
    print(json.dumps({m: sorted(deps) for m, deps in read_graph().items()}))
