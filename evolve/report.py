"""Read-only views of a run for the inspection verbs (`status`, `best`)."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.table import Table
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from .database import connect
from .schema import Cell, Island, LLMCall, Program, Run
from .schema import Session as RunSession


def _open(spec: dict) -> Session:
    # No migration here: inspection never writes to a run's database.
    return Session(connect(spec["db_url"]))


def summary(s: Session) -> dict:
    """Numbers about a run, straight from the database."""
    run = s.scalars(select(Run)).first()
    by_status = dict(s.execute(select(Program.status, func.count()).where(Program.origin == "mutation")
                               .group_by(Program.status)).all())
    answers = sum(by_status.values())
    failed = by_status.get("mutation_failed", 0)
    best = s.scalars(select(Program).where(Program.status == "ok")
                     .order_by(Program.objective.desc(), Program.id).limit(1)).first()
    seed = s.scalars(select(Program).where(Program.origin == "seed").limit(1)).first()
    calls, tokens, llm_s = s.execute(select(func.count(LLMCall.id), func.sum(LLMCall.completion_tokens),
                                            func.sum(LLMCall.latency_s))).one()
    sessions = s.scalars(select(RunSession)).all()
    return {
        "run": run.name if run else "?", "problem": run.problem if run else "?",
        "by_status": by_status, "answers": answers,
        "valid_mutation_rate": (answers - failed) / answers if answers else None,
        "best": best, "seed": seed, "llm_calls": calls, "tokens": tokens or 0, "llm_s": llm_s or 0.0,
        "sessions": sessions,
    }


def print_status(run_dir: Path, spec: dict, console: Console | None = None) -> None:
    console = console or Console()
    with _open(spec) as s:
        info = summary(s)
        head = Table(title=f"{info['run']} ({info['problem']})", show_header=False)
        for key, value in _status_rows(info):
            head.add_row(key, value)
        console.print(head)
        console.print(_islands_table(s))


def _status_rows(info: dict) -> list[tuple[str, str]]:
    best, seed = info["best"], info["seed"]
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(info["by_status"].items())) or "-"
    rate = info["valid_mutation_rate"]
    last = info["sessions"][-1] if info["sessions"] else None
    return [
        ("children", f"{info['answers']} ({statuses})"),
        ("valid mutation rate", f"{rate:.0%}" if rate is not None else "-"),
        ("best", f"#{best.id} headline {best.headline:.6f}, objective {best.objective:.4f}" if best else "-"),
        ("seed", f"headline {seed.headline:.6f}, objective {seed.objective:.4f}" if seed else "-"),
        ("llm calls", f"{info['llm_calls']} ({info['tokens']} tokens, "
                      f"{info['tokens'] / info['llm_s']:.0f} tok/s)" if info["llm_s"] else str(info["llm_calls"])),
        ("sessions", f"{len(info['sessions'])}, last stopped: {last.stop_reason if last else '-'}"),
    ]


def _islands_table(s: Session) -> Table:
    t = Table(title="islands")
    for col in ("island", "programs", "cells", "best objective", "best headline", "generation"):
        t.add_column(col, justify="right")
    for isl in s.scalars(select(Island).order_by(Island.island)):
        size = s.scalar(select(func.count(Program.id)).where(Program.island == isl.island))
        cells = s.scalar(select(func.count()).select_from(Cell).where(Cell.island == isl.island))
        best = s.scalars(select(Program).where(Program.island == isl.island, Program.status == "ok")
                         .order_by(Program.objective.desc()).limit(1)).first()
        t.add_row(str(isl.island), str(size), str(cells),
                  f"{best.objective:.4f}" if best else "-", f"{best.headline:.6f}" if best else "-",
                  str(isl.generation))
    return t


def print_best(run_dir: Path, spec: dict, code: bool, console: Console | None = None) -> int:
    console = console or Console()
    with _open(spec) as s:
        best = summary(s)["best"]
        if best is None:
            console.print("no valid program yet")
            return 1
        if code:
            print(best.code)  # plain print: the code must stay copy-pasteable
            return 0
        console.print(f"#{best.id} island {best.island} generation {best.generation}: "
                      f"headline {best.headline:.6f}, objective {best.objective:.4f}")
        for name, value in (best.fitness or {}).items():
            raw = (best.raw or {}).get(name)
            console.print(f"  {name:>8} {value:.4f}" + (f"  (raw {raw:.6f})" if raw is not None else ""))
    return 0
