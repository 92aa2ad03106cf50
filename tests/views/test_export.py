"""`evolve export`: the archive as CSV/JSON and the PNG plots, from a real (scripted-LLM) run."""
import builtins
import csv
import json
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.image as mpimg  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
from scripted_run import HOLES, shared_run  # noqa: E402

from evolve.cli import main
from evolve.config import load_problem
from evolve.judge.evaluator import load_scorer
from evolve.views.export import export, progress_points


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    return shared_run(tmp_path_factory)


@pytest.fixture(scope="module")
def exported(run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("export")
    spec = json.loads((run / "run.json").read_text())
    assert export(run, spec, out, backend="docker") == 0
    return out


def rows(run: Path, query: str, *args):
    with closing(sqlite3.connect(f"file:{run / 'evolve.db'}?mode=ro", uri=True)) as conn:
        return conn.execute(query, args).fetchall()


def test_programs_csv_is_every_program(run, exported):
    with open(exported / "programs.csv") as f:
        table = list(csv.DictReader(f))
    db = rows(run, "SELECT id, status, objective FROM programs ORDER BY id")
    assert [int(r["id"]) for r in table] == [r[0] for r in db]
    assert [r["status"] for r in table] == [r[1] for r in db]
    for r, (_, _, objective) in zip(table, db):
        assert (float(r["objective"]) if r["objective"] else None) == objective
    assert {"n26", "raw_n26", "n32", "radius_cv", "border_share", "cell"} <= set(table[0])
    failed = next(r for r in table if r["status"] == "timeout")
    assert failed["error"]  # the first line of why


def test_archive_json_holds_the_elites_with_code(run, exported):
    doc = json.loads((exported / "archive.json").read_text())
    cells = rows(run, "SELECT island, cell, program_id, objective FROM cells ORDER BY island, cell")
    assert [(e["island"], e["cell"], e["program_id"], e["objective"]) for e in doc["elites"]] == cells
    assert all("EVOLVE-BLOCK-START" in e["code"] for e in doc["elites"])
    [(best,)] = rows(run, "SELECT id FROM programs WHERE status='ok' ORDER BY objective DESC, id LIMIT 1")
    assert doc["best"]["id"] == best and doc["run"]["problem"] == "circle_packing"


@pytest.mark.parametrize("name, min_size", [("best_vs_evaluations.png", (700, 900)),
                                            ("map_elites.png", (400, 1000)),
                                            ("best_program.png", (650, 1400))])
def test_pngs_are_images(exported, name, min_size):
    image = mpimg.imread(exported / name)
    assert image.shape[0] >= min_size[0] and image.shape[1] >= min_size[1]
    assert image[..., :3].std() > 0.05  # not a blank canvas


def test_progress_points_follow_the_evaluation_order():
    evaluated = [(1, "ok", 2.0, 0.8, "seed", 0), (5, "error", None, 0.0, "mutation", 1),
                 (6, "ok", 2.5, 0.9, "mutation", 1), (9, "ok", 2.55, 0.95, "tuned", 30),
                 (7, "ok", 2.6, 0.85, "mutation", 1), (8, "invalid", None, 0.0, "mutation", 1)]
    best, valid, total = progress_points(evaluated)
    assert total == 34  # a tuning counts its trials, as the dashboard and the budget do
    assert [b[0] for b in best] == [0, 1, 2, 32, 33, 34]
    assert [b[1] for b in best] == [2.0, 2.0, 2.5, 2.55, 2.55, 2.55]  # the headline of the best by objective
    assert valid == [(2, 2.5, 0.9), (33, 2.6, 0.85)]


def test_the_best_program_runs_in_the_sandbox_not_here(run, tmp_path):
    """A candidate that marks whatever process runs it: export must leave this process unmarked."""
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    marked = HOLES.replace("    k = int(", "    import builtins\n    builtins.EVOLVE_RAN_HERE = True\n    k = int(", 1)
    with closing(sqlite3.connect(copy / "evolve.db")) as conn, conn:
        [(best, code)] = conn.execute("SELECT id, code FROM programs WHERE status='ok' "
                                      "ORDER BY objective DESC, id LIMIT 1").fetchall()
        conn.execute("UPDATE programs SET code=? WHERE id=?", (code.replace(HOLES, marked), best))
    spec = json.loads((copy / "run.json").read_text())
    spec["db_url"] = f"sqlite:///{copy / 'evolve.db'}"
    assert export(copy, spec, tmp_path / "out", backend="docker") == 0
    assert not hasattr(builtins, "EVOLVE_RAN_HERE")
    assert (tmp_path / "out" / "best_program.png").stat().st_size > 10_000


def test_scorer_draw_hook_draws_to_scale(run):
    problem = load_problem(json.loads((run / "run.json").read_text())["problem"])
    scorer = load_scorer(problem)
    centers, radii = [[0.25, 0.25], [0.75, 0.75]], [0.25, 0.25]
    fig, ax = plt.subplots()
    scorer.draw(ax, {"n": 2}, [centers, radii])
    circles = [p for p in ax.patches if p.__class__.__name__ == "Circle"]
    assert [c.radius for c in circles] == radii and [list(c.center) for c in circles] == centers
    assert ax.get_title() == "n=2: sum of radii 0.500000"
    ax.clear()
    scorer.draw(ax, {"n": 2}, [centers, [0.3, 0.25]])
    assert "invalid" in ax.get_title()
    plt.close(fig)


def test_export_cli_reports_where_it_wrote(run, tmp_path, capsys, monkeypatch):
    import evolve.views.export as module
    monkeypatch.setattr(module, "draw_best", lambda *a, **k: "best_program.png: not drawn (test)")
    assert main(["export", str(run), "--out", str(tmp_path / "x")]) == 0
    out = capsys.readouterr().out
    assert f"wrote {tmp_path / 'x' / 'map_elites.png'}" in out and "not drawn (test)" in out


def test_export_without_database_is_one_line(tmp_path, capsys):
    (tmp_path / "run.json").write_text(json.dumps({"db_url": None}))
    assert main(["export", str(tmp_path)]) == 1
    assert capsys.readouterr().err.strip().endswith("no database (has the run started?)")
    assert not (tmp_path / "export").exists()
