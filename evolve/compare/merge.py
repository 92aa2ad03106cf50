"""`evolve compare --merge`: one report from the reports of one comparison's seeds, run apart.

A seed of a long comparison can run on a machine of its own (`--seeds 1-1 --out DIR`), and a
machine may be lost with the run directories of seeds already reported. What outlives them is
each seed's figures.json, which keeps everything the report is made of (report.MEASURED). This
reads those files, checks that they compare the same thing (problem, policies, budget, held-out
settings) on different seeds, and writes the report of all of them together:

    evolve compare --merge docs/compare-he141/seed-0 runs/compare-he141-s1 --out docs/compare-he141/seeds-0-1

Held-out numbers stay per seed, each against the parents its own comparison drew; the verdicts
compare per-seed values, so they need nothing more in common.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from evolve.compare.plan import CompareError
from evolve.compare.report import MEASURED, render

# Settings that make two reports one comparison ("from": where extra held-out parents came from,
# may differ by machine; "sets" and "policy_sha256" are checked where both reports have them).
SAME = ("problem", "policies", "budget", "max_llm_calls", "headline")
SAME_IF_KNOWN = ("sets", "policy_sha256")


def figures_file(source: Path) -> Path:
    """A comparison directory, its report folder, or figures.json itself."""
    for path in (source, source / "figures.json", source / "report" / "figures.json"):
        if path.is_file():
            return path
    raise CompareError(f"--merge {source}: no figures.json there (give a comparison directory, its report "
                       "folder or a figures.json; `evolve compare --resume DIR --report-only` writes one)")


def read(source: Path) -> dict:
    """What the report at `source` was made of, with the settings of reports older than this module."""
    path = figures_file(source)
    try:
        fig = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CompareError(f"--merge {path}: not JSON ({exc})") from None
    if missing := [k for k in MEASURED if k not in fig]:
        raise CompareError(f"--merge {path}: no {', '.join(missing)}: written before reports kept every "
                           "measurement; rewrite it with `evolve compare --resume DIR --report-only`")
    settings = fig["settings"]
    if "headline" not in settings:
        settings["headline"] = _old_headline(path, fig["arms"])
    if "parent_sets" not in settings:  # reports of one comparison, before merging existed
        settings["parent_sets"] = [{"seeds": settings["seeds"], "parents": settings.pop("heldout_parents", [])}]
    settings.setdefault("sources", [{"dir": str(source), "seeds": settings["seeds"]}])
    return {k: fig[k] for k in MEASURED}


def _old_headline(path: Path, arms: dict) -> str:
    """Older reports did not record the headline; where every arm's best headline is its objective,
    it was the objective."""
    if all(m["best_headline"] == m["best_objective"] for m in arms.values()):
        return "objective"
    raise CompareError(f"--merge {path}: the report does not say its headline; rewrite it with "
                       "`evolve compare --resume DIR --report-only`")


def check_same(first: tuple[Path, dict], other: tuple[Path, dict]) -> None:
    (a_path, a), (b_path, b) = first, other
    for key in SAME + SAME_IF_KNOWN:
        if key in SAME_IF_KNOWN and (key not in a or key not in b):
            continue
        if a.get(key) != b.get(key):
            raise CompareError(f"--merge: {b_path} compares {key} {b.get(key)!r}, {a_path} {a.get(key)!r}: "
                               "not the same comparison")
    held = lambda s: {k: v for k, v in s["heldout"].items() if k != "from"}  # noqa: E731
    if held(a) != held(b):
        raise CompareError(f"--merge: {b_path} measured held-out with {held(b)}, {a_path} with {held(a)}: "
                           "their held-out numbers are not comparable")


def merge(sources: list[Path], out: Path) -> Path:
    """The report of every seed of `sources` in `out`; returns report.md."""
    if len(sources) < 2:
        raise CompareError("--merge needs two reports or more")
    parts = [(source, read(source)) for source in sources]
    for source, part in parts[1:]:
        check_same((parts[0][0], parts[0][1]["settings"]), (source, part["settings"]))
    arms: dict = {}
    for source, part in parts:
        if clash := sorted(set(part["arms"]) & set(arms)):
            raise CompareError(f"--merge: {source} has arms {clash} that an earlier report has too: "
                               "each seed belongs in one report")
        arms.update(part["arms"])
    names = parts[0][1]["settings"]["policies"]
    order = lambda arm: (arms[arm]["seed"], names.index(arms[arm]["policy"]))  # noqa: E731
    return render({
        "arms": {arm: arms[arm] for arm in sorted(arms, key=order)},
        "heldout_arms": {k: v for _, part in parts for k, v in part["heldout_arms"].items()},
        "baselines": parts[0][1]["baselines"],
        # per policy, then seed, as one comparison lists them
        "versions": sorted((r for _, part in parts for r in part["versions"]),
                           key=lambda r: (names.index(arms[r["arm"]]["policy"]), arms[r["arm"]]["seed"])),
        "slowdown": {k: v for _, part in parts for k, v in part["slowdown"].items()},
        "settings": _settings([part["settings"] for _, part in parts]),
    }, out)


def _settings(each: list[dict]) -> dict:
    first = each[0]
    return {**first, "seeds": sorted(seed for s in each for seed in s["seeds"]),
            "heldout": {**first["heldout"], "from": sorted({d for s in each for d in s["heldout"].get("from", [])})},
            "parent_sets": [x for s in each for x in s["parent_sets"]],
            "sources": [x for s in each for x in s["sources"]],
            "arms_missing": [a for s in each for a in s["arms_missing"]]}


def main(args) -> int:
    """`evolve compare --merge REPORT... --out DIR`."""
    try:
        if args.out is None or args.resume or args.problem:
            raise CompareError("--merge REPORT... takes --out DIR (where the merged report goes), no PROBLEM "
                               "or --resume")
        print(f"report: {merge(args.merge, args.out)}")
    except CompareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
