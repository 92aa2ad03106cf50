"""A non-editable install (`pip install .`) runs: the migrations, the default policy and the
sandbox's harness and image recipe travel as package data, and nothing is looked up in the
repository."""
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(ROOT)], check=True, capture_output=True)
    (found,) = out.glob("evolve-*.whl")
    return found


def test_the_wheel_carries_its_data(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in ["evolve/policies/frozen.yaml", "evolve/store/migrations/env.py",
                   "evolve/store/migrations/script.py.mako",
                   "evolve/store/migrations/versions/0001_initial_schema.py",
                   "evolve/sandbox/harness.py", "evolve/sandbox/launcher.py",
                   "evolve/sandbox/image/Dockerfile", "evolve/sandbox/image/packages.txt"]:
        assert needed in names, needed


def test_an_installed_copy_runs_a_search_away_from_the_repository(wheel, tmp_path, docker_ready):
    """Installed into a folder of its own and run from elsewhere (tuning only: no policy server):
    the run migrates its database, records the packaged default policy and runs its candidates
    in the Docker image of the packaged recipe."""
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                   check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(site)}  # ahead of the repository's editable install
    run = tmp_path / "run"
    # a problem that names no policy, so the run takes the wheel's own default
    problem = yaml.safe_load((ROOT / "problems" / "min_max_distance.yaml").read_text())
    problem.pop("policy", None)
    problem.update({key: str(ROOT / "problems" / problem[key]) for key in ("program", "scorer")})
    problem_path = tmp_path / "problem.yaml"
    problem_path.write_text(yaml.safe_dump(problem, sort_keys=False))
    done = subprocess.run(
        [sys.executable, "-m", "evolve.cli", "run", str(problem_path),
         "--run-dir", str(run), "--max-evaluations", "4", "--no-dashboard",
         "--set", "search.llm=false"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "stopped: budget reached" in done.stdout
    spec = (run / "run.json").read_text()
    assert str(site / "evolve" / "policies" / "frozen.yaml") in spec
    where = subprocess.run([sys.executable, "-c", "import evolve; print(evolve.__file__)"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, check=True)
    assert where.stdout.strip().startswith(str(site))
