"""The search core's shape, in the figures issue 57 asks for: the controller's length, the
classes with the most attributes, the modules mypy exempts, and where evaluations are counted.

    python tests/benchmarks/shape.py [--repo DIR]

Reads the code only (ast and pyproject.toml); nothing runs. Compare two commits by pointing
--repo at a checkout of each (`git worktree add /tmp/before <rev>`).
"""
from __future__ import annotations

import argparse
import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def attributes(cls: ast.ClassDef) -> set[str]:
    """Instance attributes a class assigns (self.x = ...), in any of its methods."""
    return {node.attr for node in ast.walk(cls)
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name) and node.value.id == "self"}


def classes(package: Path) -> list[tuple[int, str]]:
    out = []
    for path in sorted(package.rglob("*.py")):
        if "migrations" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                out.append((len(attributes(node)), f"{path.relative_to(package.parent)}:{node.name}"))
    return sorted(out, reverse=True)


def exempt(repo: Path) -> list[str]:
    config = tomllib.loads((repo / "pyproject.toml").read_text())
    return [m for o in config["tool"]["mypy"].get("overrides", []) for m in o.get("module", [])]


def counting_places(package: Path) -> list[str]:
    """Lines that add to an evaluation count or define one (the budget's unit)."""
    pattern = re.compile(r"evaluations \+=|def evaluations_done|def evaluation_units|x \+= origin ==")
    return [f"{p.relative_to(package.parent)}:{i}" for p in sorted(package.rglob("*.py"))
            for i, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repo", type=Path, default=ROOT)
    repo = parser.parse_args().repo.resolve()
    package = repo / "evolve"
    controller = package / "search" / "controller.py"
    print(f"{repo}")
    print(f"controller.py: {len(controller.read_text().splitlines())} lines")
    print("most attributes per class:")
    for n, name in classes(package)[:5]:
        print(f"  {n:3d}  {name}")
    modules = exempt(repo)
    print(f"mypy exemptions: {len(modules)} modules")
    print("where evaluations are counted: " + ", ".join(counting_places(package)))


if __name__ == "__main__":
    main()
