"""Read-only views of a run for the inspection verbs: `status`, `best`, `show`.

Everything here reads through snapshot.readonly_engine: inspecting a run never writes to
its database (no WAL switch, no migration), so it is safe beside a running `evolve run`
and on a database from an older schema.
"""
from __future__ import annotations

import difflib
import sys
from pathlib import Path

from rich.console import Console, Group
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from evolve.events import printable
from evolve.rundir import InspectError
from evolve.store.schema import Completion, LLMCall, Program, Run
from evolve.store.schema import Session as RunSession
from evolve.views.panels import VERSION_ROWS, duration, islands_panel, models_table, num, pct, rl_panel, versions_table
from evolve.views.snapshot import LABELS, RunReader, Snapshot

ERROR_TAIL_LINES = 15
ANSWER_LINES = 40
LINEAGE_MAX = 200


def summary(s: Session) -> dict:
    """Numbers about a run, straight from the database (used by tests/benchmarks/overhead.py)."""
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


def _reader(run_dir: Path, spec: dict) -> RunReader:
    reader = RunReader(run_dir, spec)
    reader.engine  # raises InspectError with the reason when there is no database
    if not reader.ready():
        raise InspectError(f"{run_dir}: the database holds no run yet")
    return reader


def _snapshot(run_dir: Path, spec: dict) -> Snapshot:
    reader = _reader(run_dir, spec)
    try:
        snap = reader.snapshot()
    finally:
        reader.close()
    if snap is None:  # (_reader waited for the run's row)
        raise InspectError(f"{run_dir}: the database holds no run yet")
    return snap


# ---- status ------------------------------------------------------------------------------------
def print_status(run_dir: Path, spec: dict, console: Console | None = None) -> int:
    console = console or Console()
    s = _snapshot(run_dir, spec)
    head = Table(title=f"{s.run} ({s.problem})", show_header=False, title_justify="left")
    head.add_column(style="bold", no_wrap=True)
    head.add_column()
    for key, value in status_rows(s):
        head.add_row(key, value)
    console.print(head)
    console.print(islands_panel(s))
    console.print(rl_panel(s))
    if len(s.rl.versions) > VERSION_ROWS:  # the panel shows the newest: here, every version
        console.print(versions_table(s.rl.versions))
    if s.models:
        console.print(models_table(s.models))
    return 0


def status_rows(s: Snapshot) -> list[tuple[str, str]]:
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(s.children.items())) or "-"
    best = s.best
    filled = sum(len(g) for g in s.cells.values())
    size = 1
    for ax in s.axes:
        size *= ax.bins
    th = s.throughput
    return [
        ("run directory", s.run_dir),
        ("state", f"{s.state} ({s.sessions} session{'s' if s.sessions != 1 else ''}, "
                  f"elapsed {duration(s.elapsed_s)})"),
        ("policy", f"{s.policy} ({s.model}), version v{s.rl.version}"),
        ("seed", str(s.seed)),
        ("evaluations", f"{s.evaluations}/{s.budget}" + (f", ETA {duration(s.eta_s)}" if s.eta_s else "")),
        ("children", f"{sum(s.children.values())} ({statuses})"),
        ("valid mutation rate", pct(s.valid_diff_rate)),
        ("improving children", improving_line(s)),
        ("best", f"#{best.id} {s.headline} {num(best.headline)}, objective {best.objective:.4f}"
                 if best else "-"),
        ("seed program", f"{s.headline} {num(s.seed_headline)}"),
        ("llm calls", f"{s.llm_calls} ({s.tokens:,} tokens"
                      + (f", {s.tokens / s.llm_s:.0f} tok/s in flight)" if s.llm_s else ")")),
        ("throughput", f"{th.evals_per_s * 60:.1f} evaluations/min, {th.tokens_per_s:.0f} tok/s, "
                       f"{th.answers_per_s * 60:.1f} answers/min (last {duration(th.window_s)} of activity)"),
        ("MAP-Elites", f"{filled} elites over {len(s.islands)} islands x {size} cells"),
    ]


def improving_line(s: Snapshot) -> str:
    """Per operator: children that beat their parent, of those evaluated (and how many were the
    parent again); the one number that says whether a search is alive."""
    parts = []
    for origin, r in s.operators.items():
        label = LABELS.get(origin, origin)
        if not r.evaluated:
            continue
        text = f"{label} {r.better}/{r.evaluated} ({pct(r.improving_rate)}), same as parent {pct(r.same_rate)}"
        parts.append(text + (f", {r.trials} trials" if r.trials else ""))
    return "; ".join(parts) or "-"


# ---- best --------------------------------------------------------------------------------------
def print_best(run_dir: Path, spec: dict, code: bool, console: Console | None = None) -> int:
    console = console or Console()
    s = _snapshot(run_dir, spec)
    if s.best is None:
        console.print("no valid program yet")
        return 1
    b = s.best
    if code:
        reader = _reader(run_dir, spec)
        with reader.engine.connect() as conn:
            text = conn.execute(select(Program.code).where(Program.id == b.id)).scalar()
        reader.close()
        # plain print: the code must stay copy-pasteable (exact into a file or a pipe)
        print(printable(text or "") if sys.stdout.isatty() else text)
        return 0
    console.print(f"#{b.id} island {b.island} generation {b.generation}: "
                  f"{s.headline} {num(b.headline)}, objective {b.objective:.4f}")
    for name in s.components:
        value, raw = b.fitness.get(name, 0.0), b.raw.get(name)
        console.print(f"  {name:>8} {value:.4f}" + (f"  (raw {raw:.6f})" if raw is not None else "  (invalid)"))
    return 0


# ---- show --------------------------------------------------------------------------------------
def print_show(run_dir: Path, spec: dict, program_id: int, console: Console | None = None) -> int:
    console = console or Console()
    reader = _reader(run_dir, spec)
    try:
        with Session(reader.engine) as db:
            p = db.get(Program, program_id)
            if p is None or p.run_id != reader.run_id:
                raise InspectError(f"evolve show {run_dir} {program_id}: no program {program_id} in this run")
            parent = db.get(Program, p.parent_id) if p.parent_id else None
            components = [c.name for c in reader.problem.components]
            console.print(_show_head(p, db, reader.problem.headline))
            console.print(_scores(p, parent, components))
            console.print(_lineage(p, db))
            if p.error:
                tail = p.error.strip().splitlines()[-ERROR_TAIL_LINES:]
                console.print(Text(f"error (last {len(tail)} lines):", style="bold red"))
                console.print(Text(printable("\n".join(tail))))
            console.print(_diff(p, parent, db))
    finally:
        reader.close()
    return 0


def _show_head(p: Program, db: Session, headline: str) -> Text:
    t = Text()
    t.append(f"program #{p.id}", style="bold")
    t.append(f"  island {p.island} · generation {p.generation} · {p.origin} · ")
    t.append(p.status, style="green" if p.status == "ok" else "red")
    if p.duplicate_of:
        t.append(f" · duplicate of #{p.duplicate_of} (not evaluated again)")
    if p.cell:
        t.append(f" · cell {p.cell}")
    if p.descriptors:
        t.append(" · " + ", ".join(f"{k} {v:.3f}" for k, v in p.descriptors.items()))
    source = _source(p, db)
    if source:
        t.append("\n" + source, style="dim")
    return t


def _source(p: Program, db: Session) -> str:
    """Which LLM call and answer made the program (explicit columns: older schemas lack some)."""
    if p.completion_id is None:
        return ""
    row = db.execute(select(Completion.call_id, Completion.index, Completion.finish_reason,
                            LLMCall.policy_version, LLMCall.model)
                     .join(LLMCall, LLMCall.id == Completion.call_id)
                     .where(Completion.id == p.completion_id)).first()
    if row is None:
        return ""
    return (f"from LLM call #{row.call_id} (policy v{row.policy_version}, {row.model}), completion "
            f"{row.index}, answer {p.answer_index}, finish {row.finish_reason}")


def _scores(p: Program, parent: Program | None, components: list[str]) -> Table:
    t = Table(title="scores", title_justify="left", show_edge=False)
    for col in ("", "value", "raw", "parent", "change"):
        t.add_column(col, justify="right")
    pf = (parent.fitness or {}) if parent else {}
    rows = [("objective", p.objective, None, parent.objective if parent else None)]
    rows += [(name, (p.fitness or {}).get(name), (p.raw or {}).get(name), pf.get(name)) for name in components]
    for name, value, raw, before in rows:
        change = value - before if value is not None and before is not None else None
        t.add_row(name, num(value, 4), num(raw), num(before, 4),
                  Text(f"{change:+.4f}", style="green" if change > 0 else "red" if change < 0 else "")
                  if change is not None else "-")
    return t


def _lineage(p: Program, db: Session) -> Text:
    """The chain back to the seed: id, origin, island, objective (newest first)."""
    t = Text("lineage: ", style="bold")
    node: Program | None = p
    steps = 0
    while node is not None and steps < LINEAGE_MAX:
        if steps:
            t.append(" ← ", style="dim")
        obj = f"{node.objective:.4f}" if node.objective is not None else node.status
        t.append(f"#{node.id}", style="bold")
        t.append(f" {node.origin} i{node.island} {obj}")
        node = db.get(Program, node.parent_id) if node.parent_id else None
        steps += 1
    if node is not None:
        t.append(" ← ...", style="dim")
    return t


def _diff(p: Program, parent: Program | None, db: Session):
    if p.code is None:  # the answer could not be applied: show what the model wrote instead
        answer = db.execute(select(Completion.text).where(Completion.id == p.completion_id)).scalar() \
            if p.completion_id else None
        lines = printable(answer or "").splitlines()[:ANSWER_LINES]
        return Group(Text("no code (the answer could not be applied); the answer was:", style="bold"),
                     Text("\n".join(lines) or "(empty)", style="dim"))
    if parent is None:
        return Group(Text("code (no parent):", style="bold"),
                     Syntax(printable(p.code), "python", line_numbers=True, word_wrap=True))
    if parent.code == p.code:
        return Text(f"code identical to its parent #{parent.id} ({p.origin})", style="dim")
    diff = "".join(difflib.unified_diff((parent.code or "").splitlines(True), p.code.splitlines(True),
                                        fromfile=f"#{parent.id} (parent)", tofile=f"#{p.id}"))
    # wrapped, never cut: the whole diff is the point, even in an 80-column pipe
    return Group(Text("diff against its parent:", style="bold"), Syntax(printable(diff), "diff", word_wrap=True))
