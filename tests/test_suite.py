"""`evolve suite` through the real parts: the real vLLM server (Qwen2.5-Coder-0.5B, started
once by the suite), the Docker sandbox and SQLite; then the same command again resumes."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from evolve.rundir import RunDir

pytestmark = pytest.mark.real
ROOT = Path(__file__).resolve().parent.parent
PORT = 8133
MODEL = "qwen2.5-coder-0.5b-instruct"
TASKS = ["HumanEval/0", "HumanEval/7"]
SUITES = sorted(p for p in (ROOT / "problems").glob("*.yaml") if "vary:" in p.read_text())


def evolve(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evolve.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=1200)


@pytest.fixture
def files(tmp_path):
    suite = tmp_path / "suite.yaml"
    suite.write_text(f"name: two\nproblem: {ROOT / 'problems' / 'humaneval.yaml'}\nvary: task\n"
                     f"values: {json.dumps(TASKS)}\nmax_evaluations: 3\nseed: 0\n")
    policy = tmp_path / "policy.yaml"
    policy.write_text(f"name: test-qwen\nmodel: {MODEL}\n"
                      f"server: {{embedded: true, port: {PORT}, max_model_len: 8192, extra_args: [--enforce-eager]}}\n"
                      "sampling: {temperature: 0.7, max_tokens: 256, group_size: 2, max_prompt_tokens: 4000}\n")
    return suite, policy, tmp_path / "out"


def test_suite_runs_every_instance_reports_solved_and_resumes(files, docker_ready):
    suite, policy, out = files
    first = evolve("suite", suite, "--policy", policy, "--out", out)
    assert first.returncode == 0, first.stdout + first.stderr
    report = json.loads((out / "suite.json").read_text())
    assert [r["instance"] for r in report["instances"]] == TASKS and report["budget"] == 3
    for row in report["instances"]:
        assert row["state"] in ("stopped: budget reached", "stopped: target reached"), row
        assert 1 <= row["evaluations"] <= 3 and row["solved"] == (row["best_objective"] == 1.0)
        assert row["seed_objective"] == 0.0  # the empty function passes none of these tests
        spec = RunDir(Path(row["run_dir"])).spec()
        assert spec["set"] == [f"task={row['instance']}"]  # an ordinary, resumable run directory
    assert report["solved"] == sum(r["solved"] for r in report["instances"])
    assert f"**Solved {report['solved']} of 2**" in (out / "suite.md").read_text()
    assert "solved" in first.stdout and "of 2" in first.stdout

    again = evolve("suite", suite, "--policy", policy, "--out", out)
    assert again.returncode == 0 and "2 already finished" in again.stdout, again.stdout + again.stderr
    assert json.loads((out / "suite.json").read_text())["instances"] == report["instances"]

    other = evolve("suite", suite, "--policy", ROOT / "policies" / "smollm2.yaml", "--out", out)
    assert other.returncode == 2 and "holds a different suite" in other.stderr


@pytest.mark.parametrize("path", SUITES, ids=lambda p: p.stem)
def test_shipped_suites_name_valid_instances(path):
    from evolve.config import load_problem, load_yaml
    from evolve.suite import Suite

    suite = load_yaml(path, Suite)
    assert suite.values and len(set(suite.values)) == len(suite.values)
    for value in suite.values:
        problem = load_problem(suite.problem_path(), suite.sets(value))
        assert problem.budget.target_objective is not None  # "solved" is defined
