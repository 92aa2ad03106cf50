"""What the dashboard and `evolve status` draw: pure render functions over a `Snapshot`
(evolve/views/snapshot.py) that return rich renderables. They never touch the database, so tests
render them into a recording Console.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from rich.columns import Columns
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.layout import Layout
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from evolve.events import PARTS, Event, printable
from evolve.views.snapshot import LABELS, Snapshot

HIDDEN = {"progress"}  # every panel already shows what a progress line says
KIND_STYLE = {"best": "bold green", "migration": "cyan", "llm_error": "bold red", "error": "bold red",
              "llm_down": "bold red", "llm_retry": "red", "llm_restart": "bold yellow", "llm_up": "green",
              "sandbox_down": "bold red", "sandbox_retry": "red", "sandbox_up": "green", "fault": "bold red",
              "database_down": "bold red", "database_retry": "red", "database_up": "green",
              "llm_endpoint": "yellow",
              "training": "magenta", "adapter": "bold magenta", "stop": "yellow", "seed": "green",
              "output": "dim", "log": "dim"}
SPARK = "▁▂▃▄▅▆▇█"
EIGHTHS = " ▏▎▍▌▋▊▉█"
# viridis, sampled: dark = low objective, yellow = high; readable on dark and light terminals
VIRIDIS = [(68, 1, 84), (72, 40, 120), (62, 74, 137), (49, 104, 142), (38, 130, 142),
           (31, 158, 137), (53, 183, 121), (109, 205, 89), (180, 222, 44), (253, 231, 37)]


# ---- small formatting helpers ------------------------------------------------------------------
def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def num(value: float | None, digits: int = 6) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def colour(t: float) -> str:
    """A viridis colour for t in [0, 1]."""
    t = min(max(t, 0.0), 1.0) * (len(VIRIDIS) - 1)
    i = min(int(t), len(VIRIDIS) - 2)
    f = t - i
    r, g, b = (round(a + (b_ - a) * f) for a, b_ in zip(VIRIDIS[i], VIRIDIS[i + 1]))
    return f"#{r:02x}{g:02x}{b:02x}"


# ---- grid views --------------------------------------------------------------------------------
@dataclass
class View:
    """Which MAP-Elites grid is shown: every island and the aggregate, the aggregate, or one island."""
    grid: str | int = "all"

    def cycle(self, islands: int) -> None:
        order: list[str | int] = ["all", "aggregate", *range(islands)]
        i = order.index(self.grid) if self.grid in order else 0
        self.grid = order[(i + 1) % len(order)]


# ---- panels ------------------------------------------------------------------------------------
def outages(events) -> list[str]:
    """A line per part that is down now (evolve.faults events): since when, and why."""
    down: dict[str, tuple[Event, Event]] = {}  # part -> (the outage's first event, its latest)
    for e in events:
        part, _, what = e.kind.rpartition("_")
        if part not in PARTS or what not in ("down", "retry", "restart", "up"):
            continue
        if what == "up":
            down.pop(part, None)
        else:
            down[part] = (down.get(part, (e, e))[0], e)
    lines = []
    for part, (first, last) in down.items():
        label = PARTS[part]
        since = time.strftime("%H:%M:%S", time.localtime(first.time))
        reason = last.fields.get("reason") or last.message
        attempt = f", attempt {last.fields['attempt']}" if "attempt" in last.fields else ""
        lines.append(f"⚠ {label} DOWN since {since}{attempt}: {reason} (the run waits; nothing is lost)")
    return lines


def sandbox_warning(s: Snapshot) -> list[str]:
    """A standing line while candidates run in the process backend, which is not a jail."""
    if s.backend != "process":
        return []
    return ["⚠ sandbox: the process backend is not a jail: candidates run on this host "
            "(README, Sandbox; sandbox.backend: docker for the jail)"]


def header(s: Snapshot, hint: str = "", fixed: bool = False, alerts: tuple[str, ...] | list[str] = ()) -> Panel:
    """Run, policy, state and the budget bar; `fixed`: one line each (the live header's height is fixed)."""
    version = f"v{s.rl.version}" + (" (base model)" if s.rl.version == 0 else "")
    state_style = "green" if s.state == "running" else "yellow"
    top = Text.assemble(
        (s.problem, "bold"), "  ·  ", (s.run_dir, "cyan"), f"  ·  seed {s.seed}  ·  policy ",
        (s.policy, "bold"), f" ({s.model}) {version}  ·  ", (s.state, state_style))
    top.no_wrap, top.overflow = fixed, "ellipsis"
    bar = Table.grid(padding=(0, 1))
    for _ in range(3):
        bar.add_column(no_wrap=fixed, overflow="ellipsis")
    bar.add_row(ProgressBar(total=max(s.budget, 1), completed=min(s.evaluations, s.budget), width=36),
                Text(f"{s.evaluations}/{s.budget} evaluations ({s.evaluations / max(s.budget, 1):.0%})",
                     style="bold"),
                Text(f"elapsed {duration(s.elapsed_s)}  ·  ETA {duration(s.eta_s)}  ·  "
                     f"LLM calls {s.llm_calls}" + (f"/{s.max_llm_calls}" if s.max_llm_calls else "")))
    parts: list[RenderableType] = [top, bar]
    parts += [Text(a, style="bold red", no_wrap=fixed, overflow="ellipsis") for a in alerts]
    parts += [Text(hint, style="dim")] if hint else []
    return Panel(Group(*parts), title="evolve", title_align="left", border_style="blue")


def islands_panel(s: Snapshot) -> Panel:
    t = Table(box=None, header_style="bold", pad_edge=False, padding=(0, 1))
    for name in ("isl", "progs", "valid", "cells", f"best {s.headline}", "best obj",
                 "mean obj", "gen", "stale", "migrated"):
        t.add_column(name, justify="right", no_wrap=True)
    best_id = s.best.id if s.best else None
    for r in s.islands:
        since = f"{r.generation - r.last_migration} ago" if r.last_migration else "never"
        style = "bold green" if r.best_objective is not None and s.best and \
            r.best_objective >= s.best.objective else ""
        t.add_row(str(r.island), str(r.programs), str(r.ok), str(r.cells), num(r.best_headline),
                  num(r.best_objective, 4), num(r.mean_objective, 4), str(r.generation),
                  str(r.since_improvement), since, style=style)
    note = Text(f"gen = groups finished on the island; stale = generations since its best appeared; "
                f"migrated = generations since its best last moved on; overall best #{best_id}",
                style="dim") if best_id else Text("")
    return Panel(Group(t, note), title="islands", title_align="left", border_style="blue")


def grid_text(s: Snapshot, cells: dict, low: float, high: float) -> Text:
    """One MAP-Elites grid: columns = first descriptor's bins, rows = second's (high at the top)."""
    nx = s.axes[0].bins
    ny = s.axes[1].bins if len(s.axes) > 1 else 1
    flat: dict[tuple[int, int], float] = {}
    for idx, obj in cells.items():  # more than two descriptors: show the best over the others
        key = (idx[0], idx[1] if len(idx) > 1 else 0)
        flat[key] = max(obj, flat.get(key, obj))
    text = Text()
    for y in reversed(range(ny)):
        for x in range(nx):
            obj = flat.get((x, y))
            if obj is None:
                text.append("··", style="grey35")
            else:
                text.append("██", style=colour((obj - low) / (high - low) if high > low else 1.0))
        if y:
            text.append("\n")
    return text


def aggregate(cells: dict) -> dict:
    out: dict[tuple, float] = {}
    for grid in cells.values():
        for idx, obj in grid.items():
            out[idx] = max(obj, out.get(idx, obj))
    return out


def heatmap_panel(s: Snapshot, view: View | None = None) -> Panel:
    view = view or View()
    values = [o for grid in s.cells.values() for o in grid.values()]
    low, high = (min(values), max(values)) if values else (0.0, 1.0)
    size = 1
    for ax in s.axes[:2]:
        size *= ax.bins
    shown: list[tuple[str, dict]] = []
    if view.grid in ("all", "aggregate"):
        shown.append(("all islands", aggregate(s.cells)))
    if view.grid == "all":
        shown += [(f"island {r.island}", s.cells.get(r.island, {})) for r in s.islands]
    elif isinstance(view.grid, int):
        shown.append((f"island {view.grid}", s.cells.get(view.grid, {})))
    blocks = [Group(Text(f"{title} {len(cells)}/{size}", style="bold"), grid_text(s, cells, low, high))
              for title, cells in shown]
    x = s.axes[0]
    legend = Text(f"→ {x.name} {x.low:g}..{x.high:g}")
    if len(s.axes) > 1:
        y = s.axes[1]
        legend.append(f"   ↑ {y.name} {y.low:g}..{y.high:g}")
    legend.append("   objective ")
    legend.append(f"{low:.3f} ")
    for i in range(10):
        legend.append("█", style=colour(i / 9))
    legend.append(f" {high:.3f}")
    return Panel(Group(Columns(blocks, padding=(0, 3)), legend), title="MAP-Elites cells",
                 title_align="left", border_style="blue")


class Sparkline:
    """The best headline versus evaluations, as wide as the space it is given."""

    def __init__(self, series, total: int):
        self.series, self.total = series, max(total, 1)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(options.max_width, 8)
        values = [point[1] for point in self.series if point[1] is not None]
        if not values:
            yield Text("no valid program yet", style="dim")
            return
        low, high = min(values), max(values)
        out, i, current = [], 0, None
        for col in range(width):  # step function: the best known after (col+1)/width of the x range
            limit = self.total * (col + 1) / width
            while i < len(self.series) and self.series[i][0] <= limit:
                current = self.series[i][1] if self.series[i][1] is not None else current
                i += 1
            if current is None:
                out.append(" ")
            else:
                level = (current - low) / (high - low) if high > low else 0.0
                out.append(SPARK[min(int(level * (len(SPARK) - 1) + 0.5), len(SPARK) - 1)])
        yield Text("".join(out), style="green")


def bar(value: float, width: int) -> str:
    """A horizontal bar with eighth-block resolution; 1.0 (the reference) fills it."""
    cells = min(max(value, 0.0), 1.0) * width
    full = int(cells)
    rest = EIGHTHS[int((cells - full) * 8)] if full < width else ""
    return ("█" * full + rest).ljust(width)


def best_panel(s: Snapshot) -> Panel:
    b = s.best
    if b is None:
        return Panel(Text("no valid program yet", style="dim"), title="best", title_align="left")
    first_line = Text.assemble(("#%d" % b.id, "bold"), f" island {b.island} gen {b.generation}:  ",
                               (f"{s.headline} = {num(b.headline)}", "bold green"), f"  objective {b.objective:.4f}")
    first_line.no_wrap, first_line.overflow = True, "ellipsis"  # the panel's height is fixed
    lines: list = [first_line]
    first = s.series[0][1] if s.series else None
    gain = f"  (+{b.headline - first:.6f} over {first:.6f})" if (first is not None and b.headline is not None
                                                               and b.headline > first) else ""
    lines.append(Text(f"{s.headline} of the best versus evaluations (0..{s.evaluations}){gain}", style="dim",
                      no_wrap=True, overflow="ellipsis"))
    lines.append(Sparkline(s.series, s.evaluations))
    t = Table.grid(padding=(0, 1))
    t.add_column(no_wrap=True)
    t.add_column(no_wrap=True)
    t.add_column(justify="right", no_wrap=True)
    t.add_column(justify="right", no_wrap=True, style="dim")
    for name in s.components:
        value = b.fitness.get(name, 0.0)
        raw = b.raw.get(name)
        t.add_row(name, Text(bar(value, 20), style=colour(value)), f"{value:.4f}",
                  f"{raw:.6f}" if raw is not None else "invalid")
    lines += [Text("vector fitness (1.0 = reference), raw value", style="dim"), t]
    return Panel(Group(*lines), title="best", title_align="left", border_style="blue")


def throughput_panel(s: Snapshot) -> Panel:
    th = s.throughput
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column(justify="right")
    t.add_column(style="dim")
    t.add_row("LLM calls/s", f"{th.llm_calls_per_s:.3f}", f"{s.llm_calls} calls")
    t.add_row("tokens/s", f"{th.tokens_per_s:.1f}", f"{s.tokens:,} tokens")
    t.add_row("answers/min", f"{th.answers_per_s * 60:.1f}", "")
    t.add_row("evaluations/s", f"{th.evals_per_s:.3f}", f"{s.evaluations} evaluated")
    t.add_row("valid diffs", pct(th.valid_diff_rate), f"{pct(s.valid_diff_rate)} of all answers")
    for origin, r in s.operators.items():
        t.add_row(f"improving ({LABELS.get(origin, origin)})", pct(r.improving_rate), f"{r.better}/{r.evaluated}, same {pct(r.same_rate)}")
    for status in ("invalid", "error", "timeout"):
        t.add_row(status, pct(th.failure_rates.get(status)), f"{s.children.get(status, 0)} in all")
    return Panel(Group(t, Text(f"rates over the last {duration(th.window_s)} of activity", style="dim")),
                 title="throughput", title_align="left", border_style="blue")


def rl_panel(s: Snapshot) -> Panel:
    rl = s.rl
    if not rl.trains and not rl.steps:
        body: RenderableType = Text(f"frozen policy: no training (version v{rl.version})", style="dim")
    elif rl.last is None:
        body = Text(f"{rl.algorithm}: no training step yet; policy version v{rl.version}", style="dim")
    else:
        last = rl.last
        t = Table.grid(padding=(0, 2))
        t.add_column(style="bold")
        t.add_column(justify="right")
        t.add_row("last step", f"{last['algorithm']} -> v{last['version']} at "
                               f"{time.strftime('%H:%M:%S', time.localtime(last['started_at']))}")
        if last.get("guard"):
            verdict = "served" if last.get("published") else "NOT served"
            t.add_row("guard", Text(f"{verdict}: {last['guard'].get('why', '')}",
                                    style="green" if last.get("published") else "bold red"))
        t.add_row("loss", f"{last['loss']:.4g}")
        t.add_row("KL", f"{last['kl']:.4g}")
        if last.get("sampler_kl") is not None:  # how far the served distribution is from the trained one
            t.add_row("sampler KL", f"{last['sampler_kl']:.4g}")
        check = last.get("served_check")
        if check and check.get("tokens"):  # the first call after the load, against the trainer
            t.add_row("served vs trained", Text(f"Δ log p {check['mean']:.3f} mean, {check['max']:.3f} max",
                                                style="green" if check["ok"] else "bold red"))
        t.add_row("mean |advantage|", f"{last['mean_abs_advantage']:.4g}")
        t.add_row("clip fraction", f"{last['clip_fraction']:.3f}")
        t.add_row("reward mean", f"{last['reward_mean']:.4g}")
        t.add_row("groups / rollouts", f"{last['groups']} / {last['rollouts']}")
        load = last.get("load_s")
        t.add_row("step time", f"train {last['train_s']:.1f}s" + (f", load {load:.2f}s" if load is not None else ""))
        t.add_row("adapter", f"v{rl.version}" + (f"  {Path(rl.adapter).name}" if rl.adapter else ""))
        t.add_row("training total", f"{rl.steps} steps, {duration(rl.train_s)}")
        body = t
    if rl.versions:
        body = Group(body, versions_table(rl.versions[-VERSION_ROWS:]))
    return Panel(body, title="RL hook", title_align="left", border_style="blue")


VERSION_ROWS = 5  # the newest versions in the dashboard; `evolve status` and export show all


def versions_table(versions) -> Table:
    """Per policy version: does learning help? (evolve.views.snapshot.VersionRates)"""
    return rates_table("mutator quality per policy version", [(f"v{v.version}", v) for v in versions], "version")


def models_table(models) -> Table:
    """Per model of an ensemble, with its calls: the draw decides how many each answered
    (evolve.views.snapshot.ModelRates)."""
    return rates_table("mutator quality per model", [(m.model, m) for m in models], "model", calls=True)


def rates_table(title: str, rows, label: str, calls: bool = False) -> Table:
    t = Table(title=title, title_justify="left", show_edge=False, pad_edge=False)
    for col in (label, *(["calls"] if calls else []), "answers", "applied", "valid", "improving", "same", "tok/s"):
        t.add_column(col, justify="right")
    for name, r in rows:
        t.add_row(name, *([str(r.calls)] if calls else []), str(r.answers), pct(r.rate(r.applied)),
                  pct(r.rate(r.valid)), pct(r.rate(r.better)), pct(r.rate(r.same)),
                  f"{r.tokens_per_s:.0f}" if r.tokens_per_s is not None else "-")
    return t


def events_panel(events, lines: int = 8, height: int | None = None) -> Panel:
    shown = [e for e in events if e.kind not in HIDDEN][-lines:]
    text = Text(no_wrap=True, overflow="ellipsis")
    for i, e in enumerate(shown):
        if e.kind != "log":  # a line of an old evolve.log carries its own time stamp
            text.append(time.strftime("%H:%M:%S ", time.localtime(e.time)), style="dim")
            text.append(f"{e.kind:<9} ", style=KIND_STYLE.get(e.kind, "bold"))
        text.append(printable(e.message.splitlines()[0]) if e.message else "", style=KIND_STYLE.get(e.kind, ""))
        if i < len(shown) - 1:
            text.append("\n")
    return Panel(text if shown else Text("no events yet", style="dim"), title="recent events",
                 title_align="left", border_style="blue", height=height)


class FittedEvents:
    """The recent-events panel showing as many of the newest events as its region has rows."""

    def __init__(self, events):
        self.events = events

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield events_panel(self.events, max((options.height or 10) - 2, 1), options.height)


def waiting(run_dir: str, events, hint: str = "") -> Group:
    """Before the run's database exists (the policy server may take a minute to start)."""
    return Group(Panel(Text(f"{run_dir}: waiting for the run's database ..." + (f"\n{hint}" if hint else "")),
                       title="evolve", title_align="left", border_style="blue"), events_panel(events, 12))


# ---- whole screens -----------------------------------------------------------------------------
def with_best_events(events, s: Snapshot) -> list[Event]:
    """The events, plus a "best" line for each improvement the database shows that no event announced.

    The database is the truth: a run from another process, an older run without events.jsonl,
    or an engine that missed an announcement still gets every new best (with its delta) listed.
    """
    announced = {e.fields.get("program") for e in events if e.kind == "best"}
    found = []
    for before, point in zip(s.series, s.series[1:]):
        evals, headline, objective, pid, when = point
        if pid not in announced:
            found.append(Event("best", f"new best #{pid}: {s.headline} = {num(headline)}, objective "
                                       f"{objective:.4f} (+{objective - before[2]:.4f}) after {evals} evaluations",
                               {"program": pid}, time=when))
    if not found:
        return list(events)
    return sorted([*events, *found], key=lambda e: e.time)


def stacked(s: Snapshot, events, view: View | None = None) -> Group:
    """Every panel, one under the other: for `--once`, `status` and tests (nothing is cropped)."""
    alerts = (outages(events) + sandbox_warning(s)) if s.state == "running" else []
    events = with_best_events(events, s)
    return Group(header(s, alerts=alerts), islands_panel(s), heatmap_panel(s, view), best_panel(s), throughput_panel(s),
                 rl_panel(s), events_panel(events))


def screen(s: Snapshot, events, view: View | None = None, hint: str = "") -> Layout:
    """The full-terminal arrangement used by the live display; recent events take the spare rows."""
    grid_rows = (s.axes[1].bins if len(s.axes) > 1 else 1) + 4
    islands_rows = len(s.islands) + 6
    versions = min(len(s.rl.versions), VERSION_ROWS)
    rl_rows = (14 if s.rl.last else 3) + (versions + 4 if versions else 0)  # title, header, rule, gap
    right_rows = [len(s.components) + 6, 11, rl_rows]
    body_rows = max(islands_rows + grid_rows, sum(right_rows))
    left = Layout(name="left", ratio=3)
    left.split_column(Layout(islands_panel(s), size=islands_rows), Layout(heatmap_panel(s, view)))
    right = Layout(name="right", ratio=2)
    right.split_column(Layout(best_panel(s), size=right_rows[0]), Layout(throughput_panel(s), size=right_rows[1]),
                       Layout(rl_panel(s)))
    body = Layout(name="body", size=body_rows)
    body.split_row(left, right)
    alerts = (outages(events) + sandbox_warning(s)) if s.state == "running" else []
    events = with_best_events(events, s)
    root = Layout()
    root.split_column(Layout(header(s, hint, fixed=True, alerts=alerts), size=4 + bool(hint) + len(alerts)), body,
                      Layout(FittedEvents(events), minimum_size=5))
    return root


def summary_line(s: Snapshot) -> str:
    best = (f"best {s.headline} {num(s.best.headline)} (#{s.best.id}, objective {s.best.objective:.4f})"
            if s.best else "no valid program")
    return (f"{s.problem} · {s.run_dir} · {s.evaluations}/{s.budget} evaluations · {best} · "
            f"valid diffs {pct(s.valid_diff_rate)} · {s.llm_calls} LLM calls · elapsed {duration(s.elapsed_s)}")
