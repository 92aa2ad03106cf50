"""The PNG figures of `evolve compare`, drawn from the figure data of evolve/compare/report.py.

Per policy over its seeds: a median line with a min-max band for curves, each seed as a dot and
the mean with its 95% bootstrap CI for final values. matplotlib's Agg backend: files only.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

DPI = 120


def draw_all(fig: dict, names: list[str], headline: str, out: Path) -> list[Path]:
    """Every figure into `out`; the held-out one only when pools were measured."""
    plots = [plot_best(fig, names, headline, out / "best_vs_evaluations.png"),
             plot_final(fig, names, headline, out / "final_best.png"),
             plot_heldout(fig, names, out / "heldout.png"),
             plot_diversity(fig, names, out / "diversity.png"),
             plot_archive(fig, names, out / "archive.png"), plot_cost(fig, names, out / "cost.png")]
    return [p for p in plots if p is not None]


def _plt():
    import matplotlib
    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt
    return plt


def _colour(i: int) -> str:
    return f"C{i % 10}"


def _band_plot(ax, x, b: dict, label: str, colour: str) -> None:
    med = np.array([np.nan if v is None else v for v in b["median"]], dtype=float)
    lo = np.array([np.nan if v is None else v for v in b["min"]], dtype=float)
    hi = np.array([np.nan if v is None else v for v in b["max"]], dtype=float)
    marker = "." if len(med) < 40 else None  # a run with one point must still show
    ax.plot(x[:len(med)], med, color=colour, label=label, drawstyle="steps-post", marker=marker)
    ax.fill_between(x[:len(med)], lo, hi, color=colour, alpha=0.2, step="post", linewidth=0)


def own_headline(headline: str) -> bool:
    """Whether the headline gets a panel (and a column) of its own: not when it is the objective
    itself, as in HumanEval."""
    return headline != "objective"


def _best_panels(headline: str, objective: str, of_headline: str) -> list[tuple[str, str]]:
    """(figure key, axis label) per panel."""
    return [("objective", objective)] + ([("headline", of_headline)] if own_headline(headline) else [])


def plot_best(fig: dict, names: list[str], headline: str, path: Path) -> Path:
    plt = _plt()
    panels = _best_panels(headline, "best objective", f"{headline} of the best program")
    f, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (key, what) in zip(axes[0], panels):
        for i, name in enumerate(names):
            data = fig["best_vs_evaluations"][name]
            _band_plot(ax, np.array(data["objective"]["x"]), data[key], name, _colour(i))
        ax.set_xlabel("evaluated candidates")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
    axes[0][0].legend(title="median, min-max over seeds")
    return _save(f, path)


def _dots(ax, names: list[str], summaries: dict, ylabel: str) -> None:
    """Each seed as a dot, the mean with its 95% bootstrap CI as an error bar."""
    for i, name in enumerate(names):
        s = summaries[name]
        values = [v for v in s["values"] if v is not None]
        ax.scatter(np.full(len(values), i) + np.linspace(-0.08, 0.08, len(values)), values,
                   color=_colour(i), alpha=0.7, zorder=3)
        if s["mean"] is not None:
            ax.errorbar(i + 0.2, s["mean"], yerr=[[s["mean"] - s["ci95"][0]], [s["ci95"][1] - s["mean"]]],
                        fmt="s", color=_colour(i), capsize=4)
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3, axis="y")


def plot_final(fig: dict, names: list[str], headline: str, path: Path) -> Path:
    plt = _plt()
    panels = _best_panels(headline, "final best objective", f"final best {headline}")
    f, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (key, what) in zip(axes[0], panels):
        _dots(ax, names, {n: fig["final_best"][n][key] for n in names}, what)
    f.suptitle("final best per seed (dots); mean and 95% bootstrap CI (squares)")
    return _save(f, path)


def plot_heldout(fig: dict, names: list[str], path: Path) -> Path | None:
    if not fig["heldout"]:
        return None
    plt = _plt()
    f, axes = plt.subplots(1, 2, figsize=(11, 4))
    for i, name in enumerate(names):
        data = fig["heldout"].get(name)
        if data is None:
            continue
        k = np.array(data["k"])
        for ax, key in zip(axes, ("best_at_k", "pass_at_k")):
            med = np.array(data[key]["median"], dtype=float)
            ax.plot(k, med, marker=".", color=_colour(i), label=name)
            ax.fill_between(k, np.array(data[key]["min"], float), np.array(data[key]["max"], float),
                            color=_colour(i), alpha=0.2, linewidth=0)
    axes[0].set_ylabel("best@k: expected best objective of k answers")
    axes[1].set_ylabel("pass@k: P(one of k answers beats its parent)")
    for ax in axes:
        ax.set_xlabel("k")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    axes[0].legend(title="held-out parents; median, min-max over seeds")
    return _save(f, path)


def plot_diversity(fig: dict, names: list[str], path: Path) -> Path:
    plt = _plt()
    f, ax = plt.subplots(figsize=(7, 4))
    for i, name in enumerate(names):
        b = fig["diversity"][name]["smoothed"]
        if b["x"]:
            _band_plot(ax, np.array(b["x"]), b, name, _colour(i))
    ax.set_xlabel("LLM call (group), in order")
    ax.set_ylabel("diversity: mean pairwise L1 (moving mean)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(title="median, min-max over seeds")
    return _save(f, path)


def _panels(fig_data: dict, names: list[str], keys: list[tuple[str, str]], title: str, path: Path) -> Path:
    plt = _plt()
    f, axes = plt.subplots(1, len(keys), figsize=(3.6 * len(keys), 3.8))
    for ax, (key, label) in zip(np.atleast_1d(axes), keys):
        _dots(ax, names, {n: fig_data[n][key] for n in names}, label)
    f.suptitle(title)
    return _save(f, path)


def plot_archive(fig: dict, names: list[str], path: Path) -> Path:
    return _panels(fig["archive"], names, [("coverage", "coverage (cells filled, all islands)"),
                                           ("qd_score", "QD-score (sum of cell elites)")],
                   "MAP-Elites archive at the end of each run", path)


def plot_cost(fig: dict, names: list[str], path: Path) -> Path:
    return _panels(fig["cost"], names, [("valid_mutation_rate", "valid mutation rate"),
                                        ("completion_tokens", "completion tokens"), ("wall_s", "wall time (s)"),
                                        ("training_s", "training + loading (s)")],
                   "what each run spent", path)


def _save(f, path: Path) -> Path:
    f.tight_layout()
    f.savefig(path, dpi=DPI)
    _plt().close(f)
    return path
