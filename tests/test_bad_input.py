"""Bad input gets one clear line (file, field, what was expected), exit status 2, and never
touches an existing run's data. Through the real CLI, sandbox and SQLite database."""
import hashlib
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from scripted_run import make_run

ROOT = Path(__file__).resolve().parents[1]
PROBLEM = ROOT / "problems" / "min_max_distance.yaml"


def evolve(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evolve.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def problem_file(tmp_path: Path, **changes) -> Path:
    data = yaml.safe_load(PROBLEM.read_text())
    data.update({key: str(PROBLEM.parent / data[key]) for key in ("program", "scorer", "policy") if key in data})
    data.update(changes)
    path = tmp_path / "problem.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def one_error_line(result: subprocess.CompletedProcess, *parts: str) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for part in parts:
        assert part in lines[0], (part, lines[0])
    return lines[0]


def test_malformed_yaml(tmp_path):
    bad = tmp_path / "problem.yaml"
    bad.write_text("name: x\n  entry_point: [\n")
    one_error_line(evolve("run", bad, "--run-dir", tmp_path / "run"), "problem.yaml", "not valid YAML", "line 2")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("changes, parts", [
    ({"tolerance": 0.1}, ["field 'tolerance'", "Extra inputs are not permitted"]),
    ({"seed": "zero"}, ["field 'seed'", "valid integer", "'zero'"]),
    ({"budget": {"max_evaluations": -3}}, ["field 'budget.max_evaluations'", "greater than or equal to 1"]),
    ({"headline": "n99"}, ["headline 'n99' is not a component name"]),
    ({"program": "/nonexistent/seed.py"}, ["field 'program'", "does not exist"]),
    ({"policy": "/nonexistent/policy.yaml"}, ["field 'policy'", "does not exist"]),
    ({"program_code": "def construct_points(n, d):\n    return [[0.0] * d] * n\n", "program": None},
     ["field 'program'", "seed program is not valid (invalid)", "coincide"]),
])
def test_bad_problem_fields(tmp_path, changes, parts):
    path = problem_file(tmp_path, **changes)
    one_error_line(evolve("run", path, "--run-dir", tmp_path / "run"), str(path.name), *parts)
    assert not (tmp_path / "run").exists()  # nothing is created for a run that cannot start


def test_policy_naming_a_model_that_is_not_there(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("name: p\nmodel: no-such-model\n")
    one_error_line(evolve("run", problem_file(tmp_path), "--policy", policy, "--run-dir", tmp_path / "run"),
                   "policy.yaml: field 'model'", "no-such-model", "shipped model")
    assert not (tmp_path / "run").exists()


def test_without_policy_a_run_serves_the_problems_own(tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("name: p\nmodel: no-such-model\n")
    problem = problem_file(tmp_path, policy=str(policy))
    one_error_line(evolve("run", problem, "--run-dir", tmp_path / "run"), "policy.yaml: field 'model'", "no-such-model")
    assert not (tmp_path / "run").exists()


def test_bad_set_override(tmp_path):
    one_error_line(evolve("run", problem_file(tmp_path), "--set", "budget.max_evaluations=many"),
                   "field 'budget.max_evaluations'", "valid integer")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def contents(run_dir: Path) -> dict:
    """Every file of a run, by digest. Not evolve.db-shm: SQLite's shared-memory index of the
    WAL, which any reader (a read-only one too) may rewrite; it holds no data."""
    return {p.name: digest(p) for p in run_dir.iterdir() if p.is_file() and not p.name.endswith("-shm")}


@pytest.fixture
def finished_run(tmp_path):
    return make_run(tmp_path / "run", evaluations=4)


def test_run_dir_from_a_newer_schema_is_refused_and_untouched(finished_run):
    db = finished_run / "evolve.db"
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999_future'")
    before = contents(finished_run)
    one_error_line(evolve("resume", finished_run, "--max-evaluations", 9), "schema revision 9999_future",
                   "newer evolve", "upgrade evolve")
    assert contents(finished_run) == before


def test_resume_whose_policy_now_names_a_missing_model_touches_nothing(finished_run):
    spec = json.loads((finished_run / "run.json").read_text())
    Path(spec["policy"]).write_text("name: p\nmodel: gone-model\n")
    before = contents(finished_run)
    one_error_line(evolve("resume", finished_run, "--max-evaluations", 8), "field 'model'", "gone-model")
    assert contents(finished_run) == before
