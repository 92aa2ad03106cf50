"""`evolve export RUN_DIR`: plots a person wants to look at, and the archive as plain files.

Writes into the output folder:
- best_vs_evaluations.png: the best program's headline and objective versus evaluations, with
  every valid candidate as a dot, the seed and the headline's reference value;
- map_elites.png: the MAP-Elites grids (every island and the aggregate) as heat maps;
- best_program.png: the best program's output drawn to scale by the problem's scorer hook
  `draw(ax, args, output)` (circle packing: the packings). Candidate code never runs in
  this process: the best program runs again in the problem's sandbox, exactly as in an
  evaluation, and only the plain data it returns is drawn;
- programs.csv: every program (no code), one row each; archive.json: the MAP-Elites elites
  with their code, the best program and the run's settings;
- policy_versions.csv and policy_versions.png (runs that train): per policy version, the
  answers, applied, valid, improving and same-as-parent rates and tokens/s: does learning help?

The run's database is only read.
"""
from __future__ import annotations

import asyncio
import csv
import json
import math
from pathlib import Path

from sqlalchemy import literal, select

from evolve.config import ConfigError, run_problem
from evolve.judge.evaluator import load_scorer
from evolve.rundir import InspectError
from evolve.store.counts import evaluation_units
from evolve.store.schema import Cell, Evaluation, Program, Tuning
from evolve.views.panels import num
from evolve.views.snapshot import RunReader, Snapshot

DPI = 130


def export(run_dir: Path, spec: dict, out: Path, backend: str | None = None) -> int:
    reader = RunReader(run_dir, spec)
    reader.engine  # raises with the reason when there is no database
    if not reader.ready():
        raise InspectError(f"{run_dir}: the database holds no run yet")
    try:
        snap, run_id = reader.snapshot(), reader.run_id
        assert snap is not None and run_id is not None, "ready() found the run"
        out.mkdir(parents=True, exist_ok=True)
        with reader.engine.connect() as conn:
            programs = conn.execute(select(*PROGRAM_COLUMNS).where(Program.run_id == run_id)
                                    .order_by(Program.id)).all()
            evaluated = _evaluated(conn, run_id, reader.has_table("tunings"))
            elites = _elites(conn, run_id)
            best = snap.best
            best_code = conn.execute(select(Program.code).where(Program.id == best.id)).scalar() if best else None
    finally:
        reader.close()
    written = [write_programs_csv(snap, programs, out / "programs.csv"),
               write_archive_json(snap, elites, out / "archive.json"),
               plot_progress(snap, evaluated, out / "best_vs_evaluations.png"),
               plot_grids(snap, out / "map_elites.png")]
    if snap.rl.versions:
        written += [write_versions_csv(snap, out / "policy_versions.csv"),
                    plot_versions(snap, out / "policy_versions.png")]
    drawing = draw_best(snap, best_code, spec, out / "best_program.png", backend)
    written.append(drawing)
    for path in written:
        if isinstance(path, Path):
            print(f"wrote {path}")
        else:
            print(path)  # why a file was not written
    return 0


# ---- reading -----------------------------------------------------------------------------------
PROGRAM_COLUMNS = (Program.id, Program.island, Program.parent_id, Program.generation, Program.origin,
                   Program.status, Program.duplicate_of, Program.objective, Program.headline,
                   Program.fitness, Program.raw, Program.descriptors, Program.cell, Program.created_at,
                   Program.error)


def _evaluated(conn, run_id: int, tunings: bool) -> list:
    """(program, status, headline, objective, origin, evaluations it stands for) in the order
    evaluations finished; a tuning that stored no child is a row of its own (program None).
    `tunings`: the schema has them (a run of an older evolve may not)."""
    query = select(Program.id, Evaluation.status, Program.headline, Program.objective, Program.origin,
                   Tuning.trials if tunings else literal(None).label("trials"),
                   (Evaluation.started_at + Evaluation.elapsed_s).label("end")) \
        .join(Program, Program.id == Evaluation.program_id)
    if tunings:
        query = query.outerjoin(Tuning, Tuning.child_id == Program.id)
    rows = [(row.end, (*row[:5], evaluation_units(row.origin, row.trials)))
            for row in conn.execute(query.where(Program.run_id == run_id).order_by(Evaluation.id))]
    if tunings:
        rows += [(row.end, (None, "none", None, None, "tuned", row.trials)) for row in conn.execute(
            select(Tuning.trials, (Tuning.started_at + Tuning.elapsed_s).label("end"))
            .where(Tuning.run_id == run_id, Tuning.child_id.is_(None)))]
    return [row for _, row in sorted(rows, key=lambda item: item[0])]


def _elites(conn, run_id: int) -> list:
    return conn.execute(select(Cell.island, Cell.cell, Program.id, Program.objective, Program.headline,
                               Program.fitness, Program.raw, Program.descriptors, Program.code)
                        .join(Program, Program.id == Cell.program_id)
                        .where(Cell.run_id == run_id).order_by(Cell.island, Cell.cell)).all()


# ---- the archive as files ----------------------------------------------------------------------
def write_programs_csv(snap: Snapshot, programs, path: Path) -> Path:
    names = list(snap.components)
    axes = [a.name for a in snap.axes]
    head = ["id", "island", "parent_id", "generation", "origin", "status", "duplicate_of", "objective",
            "headline", *names, *(f"raw_{n}" for n in names), *axes, "cell", "created_at", "error"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(head)
        for p in programs:
            fit, raw, desc = p.fitness or {}, p.raw or {}, p.descriptors or {}
            error = (p.error or "").strip().splitlines()
            w.writerow([p.id, p.island, p.parent_id, p.generation, p.origin, p.status, p.duplicate_of,
                        p.objective, p.headline, *(fit.get(n) for n in names), *(raw.get(n) for n in names),
                        *(desc.get(a) for a in axes), p.cell, p.created_at, error[0][:200] if error else ""])
    return path


def write_archive_json(snap: Snapshot, elites, path: Path) -> Path:
    doc = {
        "run": {"name": snap.run, "problem": snap.problem, "policy": snap.policy, "model": snap.model,
                "seed": snap.seed, "state": snap.state, "evaluations": snap.evaluations,
                "budget": snap.budget, "headline": snap.headline,
                "descriptors": [a.__dict__ for a in snap.axes]},
        "best": None if snap.best is None else {
            "id": snap.best.id, "island": snap.best.island, "objective": snap.best.objective,
            "headline": snap.best.headline, "fitness": snap.best.fitness, "raw": snap.best.raw},
        "elites": [{"island": e.island, "cell": e.cell, "program_id": e.id, "objective": e.objective,
                    "headline": e.headline, "fitness": e.fitness, "raw": e.raw,
                    "descriptors": e.descriptors, "code": e.code} for e in elites],
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


# ---- plots -------------------------------------------------------------------------------------
def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    return plt


def progress_points(evaluated) -> tuple[list, list, int]:
    """x = evaluations so far (the dashboard's count: a tuning's trials included); the best (by
    objective) after each one; every valid LLM child."""
    x, best_rows, valid = 0, [], []
    best = None
    for pid, status, headline, objective, origin, units in evaluated:
        x += units
        if status == "ok":
            if origin == "mutation":
                valid.append((x, headline, objective))
            if best is None or objective > best[1]:
                best = (headline, objective)
        if best is not None:
            best_rows.append((x, *best))
    return best_rows, valid, x


def plot_progress(snap: Snapshot, evaluated, path: Path) -> Path:
    plt = _pyplot()
    best_rows, valid, total = progress_points(evaluated)
    failed, x = [], 0
    for _, status, _, _, origin, units in evaluated:
        x += units
        if origin == "mutation" and status != "ok":
            failed.append(x)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.2), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    for ax, col, label in ((top, 1, f"{snap.headline} of the best (raw)"), (bottom, 2, "objective (weighted, normalised)")):
        if valid:
            ax.scatter([v[0] for v in valid], [v[col] for v in valid], s=9, color="0.65",
                       label="valid candidates", zorder=2)
        if best_rows:
            ax.step([b[0] for b in best_rows], [b[col] for b in best_rows], where="post", color="#1f77b4",
                    linewidth=2, label="best program", zorder=3)
            ax.axhline(best_rows[0][col], color="0.4", linestyle="--", linewidth=0.8, label="seed", zorder=1)
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    if failed:  # a rug of the evaluations that failed: where the search wasted its budget
        rug = bottom.scatter(failed, [0.03] * len(failed), marker="|", s=60, color="#d62728", alpha=0.6,
                             transform=bottom.get_xaxis_transform(), label="failed (invalid/error/timeout)",
                             zorder=4)
        bottom.legend(handles=[rug], loc="lower right", fontsize=8)
    reference = snap.reference
    if reference is not None:
        top.axhline(reference, color="#d62728", linestyle=":", linewidth=1,
                    label=f"reference {reference:.4f}")
    top.legend(loc="lower right", fontsize=8)
    best = snap.best
    top.set_title(f"{snap.problem} · {snap.run}: best {snap.headline} "
                  f"{num(best.headline)} (#{best.id})" if best else f"{snap.problem} · {snap.run}", fontsize=10)
    bottom.set_xlabel(f"evaluations ({total} of a budget of {snap.budget})")
    bottom.set_xlim(0, max(total, 1))
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


VERSION_RATES = (("applied", "applied"), ("valid", "valid"), ("improving", "better"), ("same as parent", "same"))


def write_versions_csv(snap: Snapshot, path: Path) -> Path:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["version", "calls", "answers", "applied", "valid", "improving", "same", "tokens", "tokens_per_s"])
        for v in snap.rl.versions:
            w.writerow([v.version, v.calls, v.answers, v.applied, v.valid, v.better, v.same, v.tokens,
                        "" if v.tokens_per_s is None else f"{v.tokens_per_s:.1f}"])
    return path


def plot_versions(snap: Snapshot, path: Path) -> Path:
    """The rates of each policy version's answers: does the mutator get better as it learns?"""
    plt = _pyplot()
    versions = snap.rl.versions
    x = [v.version for v in versions]
    fig, (rates, speed) = plt.subplots(2, 1, figsize=(8, 6), sharex=True, gridspec_kw={"height_ratios": [3, 1]})
    for label, field in VERSION_RATES:
        rates.plot(x, [v.rate(getattr(v, field)) for v in versions], marker="o", label=label)
    rates.set_ylabel("share of the version's answers")
    rates.set_ylim(0, 1)
    rates.grid(alpha=0.3)
    rates.legend(fontsize=8)
    rates.set_title(f"{snap.problem} · {snap.run}: mutator quality per policy version "
                    f"({snap.rl.algorithm})", fontsize=10)
    speed.plot(x, [v.tokens_per_s for v in versions], marker="o", color="0.3")
    speed.set_ylabel("tokens/s")
    speed.set_xlabel("policy version (0 = base model)")
    speed.set_xticks(x)
    speed.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def grid_array(snap: Snapshot, cells: dict):
    """A (bins_y, bins_x) array of objectives, NaN where a cell is empty (two axes shown)."""
    import numpy as np

    nx = snap.axes[0].bins
    ny = snap.axes[1].bins if len(snap.axes) > 1 else 1
    grid = np.full((ny, nx), np.nan)
    for idx, obj in cells.items():
        y = idx[1] if len(idx) > 1 else 0
        grid[y, idx[0]] = obj if math.isnan(grid[y, idx[0]]) else max(obj, grid[y, idx[0]])
    return grid


def _cell_centre(snap: Snapshot, cell: tuple) -> tuple[float, float]:
    """Where a cell's centre lies in descriptor units (the axes of the heat map)."""
    x = snap.axes[0]
    cx = x.low + (cell[0] + 0.5) * (x.high - x.low) / x.bins
    if len(snap.axes) < 2:
        return cx, 0.5
    y = snap.axes[1]
    return cx, y.low + (cell[1] + 0.5) * (y.high - y.low) / y.bins


def plot_grids(snap: Snapshot, path: Path) -> Path:
    from evolve.views.panels import aggregate

    plt = _pyplot()
    panels = [("all islands", aggregate(snap.cells))] + \
             [(f"island {r.island}", snap.cells.get(r.island, {})) for r in snap.islands]
    values = [o for g in snap.cells.values() for o in g.values()]
    vmin, vmax = (min(values), max(values)) if values else (0.0, 1.0)
    cols = min(len(panels), 3)
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols + 0.8, 3.4 * rows), squeeze=False)
    x_ax = snap.axes[0]
    y_ax = snap.axes[1] if len(snap.axes) > 1 else None
    extent = (x_ax.low, x_ax.high, y_ax.low if y_ax else 0, y_ax.high if y_ax else 1)
    image = None
    best = snap.best
    for i, (ax, (title, cells)) in enumerate(zip(axes.flat, panels)):
        holds_best = i == 0 or (best is not None and i - 1 == best.island)  # the aggregate, or its island
        image = ax.imshow(grid_array(snap, cells), origin="lower", extent=extent, aspect="auto",
                          cmap="viridis", vmin=vmin, vmax=vmax, interpolation="nearest")
        if holds_best and best is not None and best.cell is not None and best.cell in cells:
            ax.plot(*_cell_centre(snap, best.cell), marker="*", markersize=13, color="white",
                    markeredgecolor="black", label=f"best #{best.id}")
            ax.legend(loc="upper right", fontsize=7, framealpha=0.8)
        ax.set_facecolor("#eeeeee")  # empty cells: light grey, not a colour of the scale
        ax.set_title(f"{title}: {len(cells)}/{x_ax.bins * (y_ax.bins if y_ax else 1)} cells", fontsize=9)
        ax.set_xlabel(x_ax.name, fontsize=8)
        ax.set_ylabel(y_ax.name if y_ax else "", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(f"MAP-Elites elites by cell, coloured by objective ({snap.run}, "
                 f"{snap.evaluations} evaluations)", fontsize=10)
    fig.tight_layout(rect=(0, 0, 0.9, 0.95))
    fig.colorbar(image, cax=fig.add_axes((0.92, 0.15, 0.02, 0.7)), label="objective")
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


# ---- the best program, drawn ---------------------------------------------------------------------
def draw_best(snap: Snapshot, code: str | None, spec: dict, path: Path, backend: str | None = None):
    """Run the best program in the sandbox and draw what it returns; a string says why not."""
    if snap.best is None or code is None:
        return "best_program.png: no valid program to draw"
    try:
        problem = run_problem(spec)
    except ConfigError as exc:
        return f"best_program.png: not drawn: {exc}"
    scorer = load_scorer(problem)
    if not hasattr(scorer, "draw"):
        return f"best_program.png: not drawn: the scorer of {problem.name} has no draw(ax, args, output) hook"
    outputs, errors = run_in_sandbox(problem, code, backend)
    if not outputs:
        return f"best_program.png: not drawn: the sandbox returned no output ({errors})"
    plt = _pyplot()
    cases = [c for c in problem.components if c.name in outputs]
    cases.sort(key=lambda c: c.name != problem.headline)  # the headline case first, drawn large
    fig = plt.figure(figsize=(12, 5.6))
    small = len(cases) - 1
    cols = 2 + max(math.ceil(small / 2), 1)
    grid = fig.add_gridspec(2, cols)
    per_row = cols - 2
    axes = [fig.add_subplot(grid[:, :2])] + [fig.add_subplot(grid[i // per_row, 2 + i % per_row])
                                             for i in range(small)]
    for ax, case in zip(axes, cases):
        scorer.draw(ax, case.args, outputs[case.name])
    axes[0].title.set_fontsize(11)
    fig.suptitle(f"best program #{snap.best.id} ({snap.run}): objective {snap.best.objective:.4f}; "
                 f"drawn from its output in the sandbox", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def run_in_sandbox(problem, code: str, backend: str | None = None) -> tuple[dict, str]:
    """The candidate's outputs per case, from a fresh sandbox (the evaluation path, not this process)."""
    from evolve.sandbox import make_sandbox

    limits = problem.sandbox if backend is None else problem.sandbox.model_copy(update={"backend": backend})
    sandbox = make_sandbox(limits)
    try:
        result = asyncio.run(sandbox.run(code, problem.entry_point, problem.cases()))
    finally:
        sandbox.close()
    return result.outputs, result.detail or "; ".join(result.case_errors.values())
