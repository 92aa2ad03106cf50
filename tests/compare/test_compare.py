"""`evolve compare`: the harness, its resume, the held-out measurement and the report.

Fast tests run the real engine (controller, SQLite, process sandbox, scorer) in each arm's own
`evolve run` child process, with a scripted LLM in place of vLLM (tests/scripted_run.py). The
`real` test at the end runs two SmolLM2 arms, one of them training, on the real vLLM server.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from argparse import Namespace
from contextlib import closing
from pathlib import Path

import pytest
import yaml
from scripted_run import ScriptedClient, shared_run, write_problem  # noqa: E402

from evolve.cli import main
from evolve.cli import parser as cli_parser
from evolve.compare import plan as compare
from evolve.compare import report as compare_report
from evolve.compare import stats
from evolve.config import Server, load_policy, load_problem
from evolve.mutation import pipeline
from evolve.rl import heldout
from evolve.rundir import DONE
from evolve.serving.models import ensure_model
from evolve.serving.server import VLLMServer

ROOT = Path(__file__).resolve().parents[2]
SMOL_MODEL = "smollm2-135m-instruct"
TESTS = Path(__file__).resolve().parents[1]

# `evolve` with the scripted LLM: what each arm's child process runs in the fast tests.
SCRIPTED_CLI = f"""
import asyncio, os, sys
sys.path[:0] = [{str(ROOT)!r}, {str(TESTS)!r}]
from scripted_run import ScriptedClient
import evolve.run as runner

class Client(ScriptedClient):
    async def sample(self, messages, n, seed=None, max_tokens=None, model=None, on_answer=None):
        await asyncio.sleep(float(os.environ.get("SCRIPTED_DELAY", "0")))
        return await super().sample(messages, n, seed)

runner.PolicyClient = lambda policy, base_url, model, clock=None: Client()
runner.start_policy_server = lambda policy, run_dir, seed, stack: ("http://127.0.0.1:9/v1", policy.model, None)
from evolve.cli import main
sys.exit(main(sys.argv[1:]))
"""


def running_in_group(pgid: int) -> list[str]:
    """Processes still alive in the comparison's session (its arms), zombies aside."""
    out = subprocess.run(["ps", "-o", "pid=,stat=", "-g", str(pgid)], capture_output=True, text=True).stdout
    return [line for line in out.splitlines() if line.split()[1:2] != ["Z"]]


# ---- fixtures ------------------------------------------------------------------------------------------
@pytest.fixture
def scripted(tmp_path, monkeypatch):
    """Arms run `evolve run` with the scripted LLM; held-out calls go to the scripted LLM too."""
    script = tmp_path / "scripted_cli.py"
    script.write_text(SCRIPTED_CLI)
    real = compare.arm_command
    monkeypatch.setattr(compare, "arm_command",
                        lambda *a, **k: [sys.executable, str(script)] + real(*a, **k)[3:])
    import evolve.serving.client
    import evolve.serving.server
    monkeypatch.setattr(evolve.serving.server, "start_policy_server",
                        lambda policy, run_dir, seed, stack: ("http://127.0.0.1:9/v1", policy.model, None))
    monkeypatch.setattr(evolve.serving.client, "PolicyClient", lambda policy, base_url, model, clock=None: ScriptedClient())
    problem = write_problem(tmp_path, 10)
    policies = []
    for name, group in (("alpha", 4), ("beta", 2)):  # two frozen mutators that answer differently
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"name: {name}\nmodel: scripted\n"
                        "server: {embedded: false, base_url: 'http://127.0.0.1:9/v1'}\n"
                        f"sampling: {{group_size: {group}, max_prompt_tokens: 4000}}\n")
        policies.append(path)
    return Namespace(problem=problem, policies=policies, out=tmp_path / "cmp")


def compare_args(s, *extra) -> list[str]:
    return ["compare", str(s.problem), "--policies", *map(str, s.policies), "--out", str(s.out),
            "--no-dashboard", *map(str, extra)]


def query(db: Path, sql: str, *args):
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return conn.execute(sql, args).fetchall()


def calls_made(db: Path) -> bool:
    """Polling a run that is starting: its database may exist before its tables do."""
    try:
        return db.exists() and query(db, "SELECT count(*) FROM llm_calls")[0][0] > 0
    except sqlite3.DatabaseError:  # no tables yet, or a header half-written ("not a database")
        return False


def sessions(arm_dir: Path) -> list[str]:
    return [r for (r,) in query(arm_dir / "evolve.db", "SELECT stop_reason FROM sessions ORDER BY id")]


def db_numbers(arm_dir: Path) -> dict:
    """What the report must say about an arm, straight from its database."""
    db = arm_dir / "evolve.db"
    best = query(db, "SELECT id, objective, headline FROM programs WHERE status='ok' "
                     "ORDER BY objective DESC, id LIMIT 1")[0]
    evaluations = query(db, "SELECT count(*) FROM programs WHERE origin='mutation' AND duplicate_of IS NULL "
                            "AND status IN ('ok','invalid','error','timeout')")[0][0]
    answers, failed = query(db, "SELECT count(*), sum(status='mutation_failed') FROM programs "
                                "WHERE origin='mutation'")[0]
    calls, tokens = query(db, "SELECT count(*), coalesce(sum(completion_tokens), 0) FROM llm_calls")[0]
    cells = query(db, "SELECT cell, max(objective) FROM cells GROUP BY cell")
    steps, train = query(db, "SELECT count(*), coalesce(sum(train_s), 0) + coalesce(sum(load_s), 0) "
                             "FROM training_steps")[0]
    wall = query(db, "SELECT sum(ended_at - started_at) FROM sessions")[0][0]
    return {"best_id": best[0], "best_objective": best[1], "best_headline": best[2], "evaluations": evaluations,
            "answers": answers, "applied": answers - (failed or 0), "llm_calls": calls, "completion_tokens": tokens,
            "cells_filled": len(cells), "qd_score": sum(o for _, o in cells), "training_steps": steps,
            "training_s": train, "wall_s": wall}


# ---- the harness with a scripted LLM ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def other_run(tmp_path_factory):
    """A finished run of the same problem: where held-out parents come from when tiny arms have few."""
    return shared_run(tmp_path_factory)


def test_compare_runs_every_arm_then_reports_numbers_from_the_databases(scripted, other_run):
    args = compare_args(scripted, "--seeds", 2, "--budget", 6, "--heldout-parents", 2, "--heldout-samples", 5,
                        "--k-max", 4, "--heldout-from", other_run)
    assert main(args) == 0
    plan = json.loads((scripted.out / "compare.json").read_text())
    assert plan["budget"] == 6 and plan["seeds"] == [0, 1] and plan["heldout"]["k_max"] == 4
    names = ["alpha-s0", "beta-s0", "alpha-s1", "beta-s1"]
    arm_dirs = {n: scripted.out / "arms" / n for n in names}
    for name, d in arm_dirs.items():  # ordinary run directories, created as `evolve run` creates them
        spec = json.loads((d / "run.json").read_text())
        assert spec["seed"] == int(name[-1]) and spec["budget"] == {"max_evaluations": 6}
        assert sessions(d) == ["budget reached"]
    report = scripted.out / "report"
    for f in ("report.md", "figures.json", "best_vs_evaluations.png", "final_best.png", "heldout.png",
              "diversity.png", "archive.png", "cost.png"):
        assert (report / f).stat().st_size > 0, f
    fig = json.loads((report / "figures.json").read_text())
    md = (report / "report.md").read_text()
    for name, d in arm_dirs.items():
        arm, truth = fig["arms"][name], db_numbers(d)
        for key, value in truth.items():
            assert arm[key] == pytest.approx(value), (name, key)
        assert arm["evaluations"] == 6 and len(arm["curve_objective"]) == 7  # the seed, then 6 evaluations
        assert arm["curve_objective"][-1] == pytest.approx(truth["best_objective"])
        assert arm["curve_objective"] == sorted(arm["curve_objective"])
        assert f"| {name} | budget reached | 6 | {truth['best_objective']:.4f} |" in md
        found = arm["curve_objective"].index(arm["curve_objective"][-1])  # the curve is non-decreasing
        assert f"| {found} | #{truth['best_id']} |" in md
    # per policy: the median curve and the final best over the two seeds
    for policy in ("alpha", "beta"):
        finals = [fig["arms"][f"{policy}-s{s}"]["best_objective"] for s in (0, 1)]
        assert fig["final_best"][policy]["objective"]["values"] == pytest.approx(finals)
        assert fig["final_best"][policy]["objective"]["mean"] == pytest.approx(sum(finals) / 2)
        assert fig["best_vs_evaluations"][policy]["objective"]["median"][-1] == pytest.approx(sum(finals) / 2)
    # a frozen policy's pool is measured once: its other seed's arm, asked with the same request
    # seeds, gets the same pool, named for itself
    for policy in ("alpha", "beta"):
        first, other = (json.loads((scripted.out / "heldout" / f"{policy}-s{s}.json").read_text()) for s in (0, 1))
        assert "pool_of" not in first and (other["pool_of"], other["arm"]) == (f"{policy}-s0", f"{policy}-s1")
        assert other["parents"] == first["parents"] and other["run_evaluations"] == 6
        assert fig["heldout_arms"][f"{policy}-s1"] == fig["heldout_arms"][f"{policy}-s0"]
    # verdicts: the arms share their two seeds, so they are paired by seed; two pairs cannot support
    # a claim at 0.05 (2 / 2^2), and the report says so
    [line] = fig["verdicts"]["final best objective"]
    assert "no significant difference between alpha and beta" in line and "paired by seed" in line
    assert "smallest possible p is 0.5" in line
    assert line in md


def test_heldout_pools_and_their_estimates(scripted, other_run):
    assert main(compare_args(scripted, "--seeds", 1, "--budget", 6, "--heldout-parents", 2,
                             "--heldout-samples", 5, "--k-max", 4, "--heldout-from", other_run)) == 0
    parents = json.loads((scripted.out / "heldout" / "parents.json").read_text())["parents"]
    # elites of the frozen arms and of the other run, never the seed
    seed_code = load_problem(scripted.problem).seed_code()
    assert len(parents) == 2 and all(p["held_out"] and p["code"] != seed_code for p in parents)
    assert {p["source"] for p in parents} <= {"alpha-s0", "beta-s0", f"from:{other_run.name}"}
    fig = json.loads((scripted.out / "report" / "figures.json").read_text())
    for arm in ("alpha-s0", "beta-s0"):
        record = json.loads((scripted.out / "heldout" / f"{arm}.json").read_text())
        assert record["policy_version"] == 0 and record["run_evaluations"] == 6
        best1, pass2 = [], []
        for p in parents:
            answers = record["parents"][p["key"]]["answers"]
            assert len(answers) == 5  # n answers per parent, whatever the group size
            values = [a["objective"] for a in answers]
            best1.append(sum(values) / 5)
            pass2.append(stats.pass_at_k(5, sum(a["beats_parent"] for a in answers), 2))
            for a in answers:
                assert a["beats_parent"] == (a["status"] == "ok" and a["objective"] > p["objective"])
        summary = fig["heldout_arms"][arm]
        assert summary["k"] == [1, 2, 3, 4]
        assert summary["best_at_k"][0] == pytest.approx(sum(best1) / len(best1))
        assert summary["pass_at_k"][1] == pytest.approx(sum(pass2) / len(pass2))
        assert summary["best_at_k"] == sorted(summary["best_at_k"])
    # the arms' databases know nothing of the held-out calls
    for arm in ("alpha-s0", "beta-s0"):
        assert db_numbers(scripted.out / "arms" / arm)["evaluations"] == 6
    # a program any training arm stored is never held out (and the seed never is)
    problem = load_problem(scripted.problem)
    url = f"sqlite:///{scripted.out / 'arms' / 'alpha-s0' / 'evolve.db'}"
    assert heldout.choose_parents(problem, [("alpha-s0", url)], [url], 3) == []
    picked = heldout.choose_parents(problem, [("alpha-s0", url)], [], 3)
    assert picked == heldout.choose_parents(problem, [("alpha-s0", url)], [], 3)  # a fixed draw
    elites = {i for (i,) in query(scripted.out / "arms" / "alpha-s0" / "evolve.db",
                                  "SELECT program_id FROM cells c JOIN programs p ON p.id = c.program_id "
                                  "WHERE p.origin != 'seed'")}
    assert {p["id"] for p in picked if p["held_out"]} <= elites
    # parents kept when seeds are added must still be held out from every training arm
    assert heldout.stored_by(picked, [url]) and not heldout.stored_by(picked, [])


def test_too_few_heldout_parents_is_one_clear_error_and_heldout_from_fixes_it(scripted, other_run, capsys, tmp_path):
    base = compare_args(scripted, "--seeds", 1, "--budget", 3, "--heldout-samples", 2, "--k-max", 2)
    assert main(base + ["--heldout-parents", "50"]) != 0  # two frozen arms of 3 evaluations: too few
    err = capsys.readouterr().err
    assert "held-out: " in err and "where 50 are needed" in err and "--heldout-from RUN_DIR" in err
    assert main(base + ["--heldout-parents", "3", "--heldout-from", str(other_run)]) == 0
    parents = json.loads((scripted.out / "heldout" / "parents.json").read_text())["parents"]
    seed_code = load_problem(scripted.problem).seed_code()
    assert len(parents) == 3 and all(p["code"] != seed_code for p in parents)
    assert {p["source"] for p in parents} <= {"alpha-s0", "beta-s0", f"from:{other_run.name}"}
    # the comparison remembers where its parents came from
    assert json.loads((scripted.out / "compare.json").read_text())["heldout"]["from"] == [str(other_run.resolve())]
    # a run of another problem is refused
    wrong = tmp_path / "wrong"
    shutil.copytree(other_run, wrong)
    with sqlite3.connect(wrong / "evolve.db") as conn:
        conn.execute("UPDATE runs SET problem = 'something_else'")
    spec = json.loads((wrong / "run.json").read_text())
    spec["db_url"] = f"sqlite:///{wrong / 'evolve.db'}"
    (wrong / "run.json").write_text(json.dumps(spec))
    (scripted.out / "heldout" / "parents.json").unlink()
    assert main(["compare", "--resume", str(scripted.out), "--heldout-from", str(wrong), "--no-dashboard"]) != 0
    assert "a run of problem 'something_else'" in capsys.readouterr().err


def test_rerun_resumes_only_unfinished_arms_and_a_raised_budget_continues_every_arm(scripted):
    args = compare_args(scripted, "--seeds", 1, "--budget", 4, "--skip-heldout")
    assert main(args) == 0
    alpha, beta = arms = [scripted.out / "arms" / n for n in ("alpha-s0", "beta-s0")]
    assert all(sessions(d) == ["budget reached"] for d in arms)
    assert main(args) == 0  # every arm is done: nothing runs again
    assert all(sessions(d) == ["budget reached"] for d in arms)
    with closing(sqlite3.connect(alpha / "evolve.db")) as conn:  # as if kill -9 had stopped it
        conn.execute("UPDATE sessions SET stop_reason=NULL, ended_at=NULL, heartbeat_at=started_at + 5")
        conn.commit()
    assert main(args) == 0
    assert sessions(alpha) == [None, "budget reached"] and sessions(beta) == ["budget reached"]
    assert main(["compare", "--resume", str(scripted.out), "--budget", "7", "--no-dashboard"]) == 0
    assert sessions(alpha)[-1] == sessions(beta)[-1] == "budget reached" and len(sessions(beta)) == 2
    assert all(db_numbers(d)["evaluations"] == 7 for d in arms)
    fig = json.loads((scripted.out / "report" / "figures.json").read_text())
    assert fig["settings"]["budget"] == 7 and len(fig["best_vs_evaluations"]["alpha"]["objective"]["x"]) == 8
    # the killed session's wall time counts up to its last heartbeat
    ended = query(alpha / "evolve.db", "SELECT sum(ended_at - started_at) FROM sessions WHERE ended_at IS NOT NULL")
    assert fig["arms"]["alpha-s0"]["wall_s"] == pytest.approx(5 + ended[0][0])


def test_seeds_can_be_dropped_to_report_those_done_and_added_back(scripted):
    assert main(compare_args(scripted, "--seeds", 2, "--budget", 3, "--skip-heldout", "--report-only")) == 0
    resume = ["compare", "--resume", str(scripted.out), "--no-dashboard"]
    assert main(resume + ["--seeds", "1"]) == 0  # the comparison is done at one seed: it reports
    assert sorted(p.name for p in (scripted.out / "arms").iterdir()) == ["alpha-s0", "beta-s0"]
    fig = json.loads((scripted.out / "report" / "figures.json").read_text())
    assert fig["settings"]["seeds"] == [0] and sorted(fig["arms"]) == ["alpha-s0", "beta-s0"]
    assert main(resume + ["--seeds", "2"]) == 0  # seed 1 is added: seed 0's arms do not run again
    assert sessions(scripted.out / "arms" / "alpha-s0") == ["budget reached"]
    assert sessions(scripted.out / "arms" / "alpha-s1") == ["budget reached"]
    assert main(compare_args(scripted, "--budget", 3, "--skip-heldout")) == 0  # no --seeds: the plan's
    assert json.loads((scripted.out / "compare.json").read_text())["seeds"] == [0, 1]
    assert main(resume + ["--seeds", "0"]) == 2


def test_a_later_seed_runs_on_its_own(scripted):
    # e.g. on another machine, or after the one that ran seed 0 was lost: seed 0 does not run again
    assert main(compare_args(scripted, "--seeds", "1-1", "--budget", 3, "--skip-heldout")) == 0
    assert sorted(p.name for p in (scripted.out / "arms").iterdir()) == ["alpha-s1", "beta-s1"]
    fig = json.loads((scripted.out / "report" / "figures.json").read_text())
    assert fig["settings"]["seeds"] == [1] and sorted(fig["arms"]) == ["alpha-s1", "beta-s1"]
    resume = ["compare", "--resume", str(scripted.out), "--no-dashboard", "--report-only"]
    assert main(resume + ["--seeds", "0,2"]) == 0
    assert json.loads((scripted.out / "compare.json").read_text())["seeds"] == [0, 2]


@pytest.mark.parametrize("text", ["0", "2-1", "1,1", "a", "-1", "1-"])
def test_seeds_that_mean_nothing_get_one_message(text):
    with pytest.raises(compare.CompareError, match=r"--seeds .*: expected a count N"):
        compare.parse_seeds(text)
    assert compare.parse_seeds("3") == [0, 1, 2] and compare.parse_seeds("2-3") == [2, 3]
    assert compare.parse_seeds("2,0") == [0, 2]


def compare_cli(tmp_path) -> Path:
    """`evolve` whose compare runs its arms with the scripted LLM (for tests of a whole process)."""
    script = tmp_path / "compare_cli.py"
    script.write_text(f"""
import sys
sys.path[:0] = [{str(ROOT)!r}, {str(TESTS)!r}]
from evolve.compare import plan as compare
real = compare.arm_command
compare.arm_command = lambda *a, **k: [sys.executable, {str(tmp_path / "scripted_cli.py")!r}] + real(*a, **k)[3:]
from evolve.cli import main
sys.exit(main(sys.argv[1:]))
""")
    return script


@pytest.mark.parametrize("stop", ["ctrl-c", "term"])
def test_a_stop_signal_stops_the_comparison_and_its_arm_and_it_resumes(scripted, tmp_path, stop):
    """Ctrl-C reaches the process group (compare and its arm); SIGTERM (kill, a scheduler) reaches
    compare alone, which passes it on. Either way the arm stops cleanly and compare exits 130."""
    runner = compare_cli(tmp_path)
    args = compare_args(scripted, "--seeds", 1, "--budget", 8, "--skip-heldout")
    env = {**os.environ, "SCRIPTED_DELAY": "3.0"}  # the window for Ctrl-C, wide enough on a loaded machine
    proc = subprocess.Popen([sys.executable, str(runner), *args], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    alpha = scripted.out / "arms" / "alpha-s0"
    deadline = time.time() + 120
    while time.time() < deadline:
        if calls_made(alpha / "evolve.db"):
            break
        time.sleep(0.3)
    if stop == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    else:
        proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert not running_in_group(proc.pid), "an arm outlived the comparison"
    assert "Continue with `evolve compare --resume" in out
    assert sessions(alpha) == ["interrupted"]
    assert not (scripted.out / "arms" / "beta-s0" / "run.json").exists()  # never started
    assert main(["compare", "--resume", str(scripted.out), "--no-dashboard"]) == 0
    assert sessions(alpha) == ["interrupted", "budget reached"]
    assert sessions(scripted.out / "arms" / "beta-s0") == ["budget reached"]
    assert db_numbers(alpha)["evaluations"] == 8


def test_the_live_view_shows_the_running_arm_and_the_overall_progress(scripted, tmp_path):
    pexpect = pytest.importorskip("pexpect")
    args = compare_args(scripted, "--seeds", 1, "--budget", 4, "--skip-heldout")
    args.remove("--no-dashboard")
    child = pexpect.spawn(sys.executable, [str(compare_cli(tmp_path)), *args], cwd=str(ROOT),
                          dimensions=(50, 160), encoding="utf-8", codec_errors="replace",
                          env={**os.environ, "TERM": "xterm-256color", "SCRIPTED_DELAY": "0.5"}, timeout=120)
    child.expect(r"arm 1/2: alpha-s0 · overall \d+/8 evaluations")  # the header line of the view
    child.expect("MAP-Elites cells")  # the arm's own dashboard under it
    child.expect(r"arm 2/2: beta-s0 · overall [4-8]/8 evaluations")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
    text = child.before
    assert "compare   arm 2/2: beta seed 0" in text  # the comparison's lines, printed after the screen
    assert all(sessions(scripted.out / "arms" / n) == ["budget reached"] for n in ("alpha-s0", "beta-s0"))
    assert (scripted.out / "arms" / "alpha-s0" / "compare-arm.log").exists()


def test_parallel_arms(scripted, monkeypatch):
    monkeypatch.setattr(compare, "POLL_S", 0.2)
    assert main(compare_args(scripted, "--seeds", 1, "--budget", 4, "--skip-heldout", "--parallel", 2)) == 0
    for n in ("alpha-s0", "beta-s0"):
        d = scripted.out / "arms" / n
        assert sessions(d) == ["budget reached"] and (d / "compare-arm.log").exists()


# ---- plan checks ----------------------------------------------------------------------------------------
def test_a_different_comparison_in_the_same_directory_is_refused(scripted, capsys):
    base = compare_args(scripted, "--seeds", 1, "--budget", 3, "--skip-heldout", "--report-only")
    assert main(base) == 0  # creates the plan; --report-only runs nothing
    assert main(compare_args(scripted, "--seeds", 1, "--budget", 3, "--report-only", "--max-llm-calls", 5)) == 2
    assert "compares max_llm_calls None, not 5" in capsys.readouterr().err
    scripted.policies[0].write_text(scripted.policies[0].read_text().replace("group_size: 4", "group_size: 3"))
    assert main(base) == 2
    assert "changed since" in capsys.readouterr().err
    assert main(["compare", "--resume", str(scripted.out), "--budget", "2"]) == 2
    assert "raised, not lowered" in capsys.readouterr().err


def test_arm_policy_moves_an_embedded_server_for_parallel_arms(tmp_path):
    src = tmp_path / "p.yaml"
    src.write_text((ROOT / "policies" / "smollm2.yaml").read_text())
    plan = compare.Plan(tmp_path, "problem.yaml", [{"name": "smollm2", "source": str(src), "path": str(src)}],
                        [0], 3, None, {})
    arm = compare.Arm(0, "smollm2", 0, tmp_path / "arms" / "smollm2-s0", False)
    assert compare.arm_policy(plan, arm).read_text() == src.read_text()  # sequential: the policy as it is
    moved = yaml.safe_load(compare.arm_policy(plan, arm, port=8151).read_text())
    assert moved["server"]["port"] == 8151 and moved["sampling"] == yaml.safe_load(src.read_text())["sampling"]


def test_heldout_versions_are_every_earlier_one_or_those_up_to_n():
    published = [{"version": v} for v in range(6)]  # v0 (the base model) to v5, the last
    for asked, measured in ((None, []), (0, [1, 2, 3, 4]), (3, [1, 2, 3]), (9, [1, 2, 3, 4])):
        plan = Namespace(heldout=compare._versions(asked))
        assert [v["version"] for v in compare._earlier(plan, published)] == measured, asked
    parse = cli_parser().parse_args
    assert parse(["compare", "--heldout-versions"]).heldout_versions == 0
    assert parse(["compare", "--heldout-versions", "4", "--no-dashboard"]).heldout_versions == 4
    assert parse(["compare"]).heldout_versions is None


@pytest.mark.parametrize("policy_file, completions", [("frozen.yaml", 16), ("frozen_m3.yaml", 6)])
def test_a_pool_is_one_seeded_call_per_parent_of_n_answers(tmp_path, policy_file, completions):
    # one call: n = 16 generates 1.7x the tokens/s of two calls of 8 on a CPU server, and one
    # seeded request is not batched differently from run to run; VPO: ceil(16 / 3) completions
    asked = []

    class Recording(ScriptedClient):
        async def sample(self, messages, n, seed=None, max_tokens=None, model=None, on_answer=None):
            asked.append((n, seed))
            return await super().sample(messages, n, seed)

    problem = load_problem(write_problem(tmp_path, 4))
    policy = load_policy(ROOT / "policies" / policy_file)
    parent = {"code": problem.seed_code(), "status": "ok", "objective": 0.5, "headline": 0.5, "fitness": {},
              "inspirations": []}
    answers, tokens = asyncio.run(heldout.sample_answers(Recording(), problem, policy, parent, 3, 16))
    assert asked == [(completions, pipeline.request_seed(heldout.SALT, 3, 0))]
    assert len(answers) == completions * policy.answers and tokens == 60 * completions  # whole completions: 16, 18


def test_a_pool_sampled_another_way_is_measured_again(tmp_path):
    settings = heldout.Settings(16, "digest")
    arm = {"name": "a-s0", "evaluations": 200, "version": {"version": 1, "model": "v1", "adapter_path": "x"}}
    out = tmp_path / "a-s0.json"
    record = heldout._load(out, arm, settings)
    record["parents"]["p1"] = {"answers": []}
    out.write_text(json.dumps(record))
    assert heldout._load(out, arm, settings)["parents"] == {"p1": {"answers": []}}  # resumed
    out.write_text(json.dumps({**record, "sampling": None}))  # written by the two-call sampling
    assert heldout._load(out, arm, settings)["parents"] == {}


def test_equal_updates_reads_each_training_arm_after_the_fewest_steps_any_made():
    curve = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]
    arm = {"trains": True, "seed": 0, "curve_objective": curve}
    arms = [arm | {"policy": "frozen", "trains": False, "step_evaluations": []},
            arm | {"policy": "grpo", "step_evaluations": [2, 4, 6]},
            arm | {"policy": "grpo", "seed": 1, "step_evaluations": [1, 3]},
            arm | {"policy": "vpo", "step_evaluations": [5, 6], "curve_objective": curve[:6]}]
    eq = compare_report.equal_updates(arms)
    assert eq["updates"] == 2  # the frozen arm never trains and does not count
    assert eq["policies"]["grpo"]["objective"]["values"] == [0.5, 0.4]
    assert eq["policies"]["grpo"]["evaluations"]["values"] == [4, 3]
    assert eq["policies"]["vpo"]["objective"]["values"] == [0.6]  # the curve's last point
    assert eq["verdicts"] == ["grpo vs vpo: one seed: no statistical claim (median best objective after "
                              "2 updates grpo 0.4500 vs vpo 0.6000)"]
    assert compare_report.equal_updates(arms[:1]) == {"updates": 0, "policies": {}}


def test_a_refused_training_step_is_no_update(tmp_path):
    """A step the guard refused is stored, but nothing the search used changed: the updates (and
    the equal-updates reading) count published steps only."""
    from sqlalchemy.orm import Session

    from evolve.config import Descriptor, Search
    from evolve.store.database import ProgramDatabase
    from evolve.store.schema import Evaluation, Program, TrainingStep

    db = ProgramDatabase.open(f"sqlite:///{tmp_path / 'evolve.db'}", "t", "p: 1", "q: 2", 0,
                              [Descriptor(name="a", low=0, high=1, bins=2)], Search(islands=1), "toy")
    seed = db.add_seed(Program(island=0, origin="seed", status="ok", objective=0.0, headline=0.0,
                               code="x = 0\n", descriptors={"a": 0.1}))[0]
    for k in range(6):  # an evaluated child finished at t = k + 1
        child = Program(run_id=db.run_id, island=0, origin="mutation", parent_id=seed.id, status="ok",
                        objective=0.1 * k, code=f"x = {k + 1}\n")
        db.add(child)
        db.add(Evaluation(program_id=child.id, backend="process", status="ok", started_at=float(k), elapsed_s=1.0))
    for end, published in ((2.5, True), (4.5, False), (5.5, True)):
        db.add(TrainingStep(run_id=db.run_id, version=1, algorithm="grpo", groups=1, rollouts=2, loss=0.0, kl=0.0,
                            clip_fraction=0.0, mean_abs_advantage=0.5, reward_mean=0.1, started_at=end - 1.0,
                            train_s=1.0, published=published))
    with Session(db.engine) as s:
        training = compare_report._training(s, db.run_id)
    db.close()
    assert training["training_steps"] == 3 and training["published_steps"] == 2
    assert training["step_evaluations"] == [2, 5]  # the refused step (ending at 4.5) is not an update


def test_a_rate_is_rounded_once_from_its_counts():
    """105/128 valid: 82.0 % with the interval [74.5, 87.7], so [74, 88]; rounding the interval to
    three places first (0.745) and then to a whole percent gave [75, 88] in a README table."""
    assert compare_report.percent(compare_report._rate({"valid_n": 105, "answers": 128}, None, "valid")) \
        == "82.0 % [74, 88]"
    assert compare_report.percent(compare_report._rate({"improving_n": 17, "answers": 128}, None, "improving")) \
        == "13.3 % [8, 20]"


def test_band_and_summary():
    b = compare_report.band([[1, 2, 3], [0, 4]], 4)
    assert b["median"] == [0.5, 3.0, 3.0, None] and b["min"] == [0, 2, 3, None] and b["max"] == [1, 4, 3, None]
    s = compare_report.summary([0.5, None, 0.7])
    assert s["mean"] == pytest.approx(0.6) and s["median"] == pytest.approx(0.6)
    assert compare_report.rolling([1, None, 3, 5], window=2) == [1, 1, 2, 4]


# ---- end to end with the real server ---------------------------------------------------------------------
SMOL_PORT = 8140
SMOL = f"""name: {{name}}
model: {SMOL_MODEL}
server: {{{{embedded: true, port: {SMOL_PORT}, max_model_len: 4096, extra_args: ["--enforce-eager"]}}}}
sampling: {{{{temperature: 1.0, max_tokens: 48, group_size: 2, max_prompt_tokens: 3000}}}}
"""
TRAIN = """train: {algorithm: grpo, train_every_answers: 1, lora_rank: 8, target_modules: [q_proj, v_proj],
        minibatches: 1, micro_batch: 2, guard: null}
"""  # no guard: SmolLM2's arms store no elite to measure on, and this test is about the plumbing


@pytest.mark.real
def test_compare_end_to_end_with_the_real_server(tmp_path, monkeypatch, other_run):
    """Two SmolLM2 arms (frozen, and GRPO training a LoRA after every group), one seed, a tiny budget.

    SmolLM2 makes almost no valid mutation, so the LLM-call guard usually ends the arms; what is
    tested is the plumbing: real runs, training, the last adapter served for the held-out pool, the
    report's numbers against the databases. One LoRA-enabled server, started here, is found on its
    port and reused by both arms and by the held-out measurement (as in tests/rl/test_rl_run.py):
    four start-ups on this shared 2-core machine would take the test over five minutes.
    """
    problem = write_problem(tmp_path, 10)
    frozen, grpo = tmp_path / "frozen.yaml", tmp_path / "grpo.yaml"
    frozen.write_text(SMOL.format(name="frozen"))
    grpo.write_text(SMOL.format(name="grpo") + TRAIN)
    out = tmp_path / "cmp"
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")  # the machine is shared: a small KV cache is plenty
    cmd = [sys.executable, "-m", "evolve.cli", "compare", str(problem), "--policies", str(frozen), str(grpo),
           "--seeds", "1", "--budget", "2", "--max-llm-calls", "2", "--heldout-parents", "1",
           "--heldout-samples", "2", "--k-max", "2", "--out", str(out), "--no-dashboard",
           "--heldout-from", str(other_run),  # SmolLM2's arms store almost no elite
           "--heldout-versions"]
    settings = Server(port=SMOL_PORT, max_model_len=4096, extra_args=["--enforce-eager"])
    with VLLMServer(ensure_model(SMOL_MODEL), SMOL_MODEL, settings, tmp_path / "vllm.log", lora_rank=8):
        started = time.time()
        done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "arm 1/2: frozen seed 0" in done.stdout and "arm 2/2: grpo seed 0" in done.stdout
    report = out / "report"
    for f in ("report.md", "figures.json", "best_vs_evaluations.png", "final_best.png", "heldout.png",
              "diversity.png", "archive.png", "cost.png"):
        assert (report / f).stat().st_size > 0, f
    fig = json.loads((report / "figures.json").read_text())
    md = (report / "report.md").read_text()
    for name in ("frozen-s0", "grpo-s0"):
        d = out / "arms" / name
        truth, arm = db_numbers(d), fig["arms"][name]
        for key, value in truth.items():
            assert arm[key] == pytest.approx(value), (name, key)
        assert sessions(d) == [arm["stop_reason"]] and arm["stop_reason"] in DONE
        assert f"| {name} | {arm['stop_reason']} | {truth['evaluations']} | {truth['best_objective']:.4f} |" in md
    # the training arm trained where its groups had a signal, and its held-out pool came from its
    # last adapter (SmolLM2's answers may all fail alike: then nothing is trained or served)
    grpo_arm = fig["arms"]["grpo-s0"]
    record = json.loads((out / "heldout" / "grpo-s0.json").read_text())
    assert record["policy_version"] == grpo_arm["policy_version"]
    steps_at = grpo_arm["step_evaluations"]  # the evaluated children by the end of each step
    assert len(steps_at) == grpo_arm["published_steps"] and steps_at == sorted(steps_at)
    assert all(0 <= i <= grpo_arm["evaluations"] for i in steps_at)
    assert fig["equal_updates"]["updates"] == len(steps_at)
    if grpo_arm["training_steps"]:
        assert grpo_arm["policy_version"] >= 1 and record["model"] == f"grpo-v{record['policy_version']}"
        assert f"| grpo | 1 | {grpo_arm['curve_objective'][steps_at[-1]]:.4f} [" in md
    else:
        assert "No training arm made a training step" in md
        events = (out / "arms" / "grpo-s0" / "events.jsonl").read_text()
        assert grpo_arm["policy_version"] == 0 and "no signal" in events
    assert json.loads((out / "heldout" / "frozen-s0.json").read_text())["policy_version"] == 0
    for name in ("frozen-s0", "grpo-s0"):
        pools = fig["heldout_arms"][name]
        assert pools["k"] == [1, 2] and all(len(p["best_at_k"]) == 2 for p in pools["parents"].values())
    # every version the training arm published measured on the same parents, on one server
    published = [v for (v,) in query(out / "arms" / "grpo-s0" / "evolve.db",
                                     "SELECT version FROM policy_versions ORDER BY version")]
    earlier = [v for v in published[:-1] if v > 0]
    for v in earlier:
        assert json.loads((out / "heldout" / f"grpo-s0@v{v}.json").read_text())["policy_version"] == v
    base, *rows = fig["versions"]  # the base model's row first: what each version is read against
    assert (base["arm"], base["base"]) == ("grpo-s0", "frozen-s0")
    assert [(r["arm"], r["version"]) for r in rows] == [("grpo-s0", v) for v in earlier + published[-1:]]
    assert all(r["answers"] == 2 and r["valid"]["vs_base"] in ("below", "level", "above") for r in rows)
    assert "## Held-out quality per policy version" in md
    [line] = fig["verdicts"]["final best objective"]
    assert line.startswith("frozen vs grpo: one seed: no statistical claim") and line in md
    print(f"compare end to end: {time.time() - started:.0f} s\n" + md)


def test_problem_overrides_reach_every_arm_and_pin_the_comparison(tmp_path):
    plan = compare.Plan(tmp_path, "problem.yaml", [], [0], 3, None, {}, sets=["task=HumanEval/7"])
    arm = compare.Arm(0, "frozen", 0, tmp_path / "arms" / "frozen-s0", False)
    assert "--set=task=HumanEval/7" in compare.arm_command(plan, arm, tmp_path / "p.yaml")
    plan.save()
    assert compare.Plan.load(tmp_path).sets == ["task=HumanEval/7"]


def test_each_training_arm_is_told_its_own_baseline():
    from evolve.compare.report import baselines
    frozen, frozen_m3, grpo, vpo = (load_policy(ROOT / "policies" / f"{n}.yaml")
                                    for n in ("frozen", "frozen_m3", "grpo", "vpo"))
    assert frozen_m3.answers == vpo.answers == 3 and frozen_m3.train is None
    assert frozen_m3.sampling == vpo.sampling and frozen_m3.answer_format == vpo.answer_format
    lines = baselines([frozen, frozen_m3, grpo, vpo])
    assert lines == ["grpo (m=1): its baseline is frozen (frozen, m=1)",
                     "vpo (m=3): its baseline is frozen_m3 (frozen, m=3)"]
    assert "no frozen arm with m=3" in baselines([frozen, grpo, vpo])[1]


def test_quality_per_version_against_the_baseline_with_the_same_m_and_seed(tmp_path):
    """Held-out pools of a training arm's versions, read against its frozen m-matched arm's pool,
    paired by parent (both answered the same parents with the same request seeds)."""
    from evolve.compare.report import learning_bar, slowdowns, version_quality

    parents = [{"key": f"from:x#{i}", "code": f"x = {i}", "inspirations": []} for i in range(8)]
    folder = tmp_path / "heldout"
    folder.mkdir()

    def pool(name: str, version: int, valid: int, wins: int | list[int], n: int = 20) -> None:
        wins = wins if isinstance(wins, list) else [wins] * len(parents)
        record = {"policy_version": version, "parents_digest": heldout.digest(parents), "parents": {
            p["key"]: {"answers": [{"status": "ok" if i < valid else "error", "beats_parent": i < w}
                                   for i in range(n)]} for p, w in zip(parents, wins)}}
        (folder / f"{name}.json").write_text(json.dumps(record))

    pool("frozen-s0", 0, valid=10, wins=2)
    pool("frozen_m3-s0", 0, valid=19, wins=2)  # another m: not grpo's baseline
    pool("grpo-s0@v1", 1, valid=1, wins=[2, 2, 2, 2, 1, 3, 2, 2])  # fewer valid on every parent: below
    pool("grpo-s0@v2", 2, valid=10, wins=[3, 2, 2, 2, 2, 2, 2, 2])  # one parent better: level
    pool("grpo-s0", 10, valid=20, wins=12)
    policies = [load_policy(ROOT / "policies" / f"{n}.yaml") for n in ("frozen", "frozen_m3", "grpo")]
    plan = compare.Plan(tmp_path, "problem.yaml", [], [0], 3, None, {})
    base, *rows = version_quality(plan, policies, parents)
    assert (base["base"], base["version"], base["valid"]["rate"]) == ("frozen-s0", 0, 0.5)  # the row read against
    assert [r["version"] for r in rows] == [1, 2, 10]  # v10 sorts after v2: by number, the last from ARM.json
    assert [r["answers"] for r in rows] == [160, 160, 160]
    assert [r["valid"]["vs_base"] for r in rows] == ["below", "level", "above"]
    assert [r["improving"]["vs_base"] for r in rows] == ["level", "level", "above"]
    assert {r["valid"]["test"] for r in rows} == {"paired by parent"}
    assert rows[0]["valid"]["p"] == pytest.approx(2 / 2 ** 8)  # 8 parents, every one lower: the exact floor
    assert rows[1]["improving"]["diff"] == pytest.approx(0.05 / 8)
    assert rows[1]["valid"]["rate"] == 0.5 and rows[1]["valid"]["ci95"] == pytest.approx(stats.wilson(80, 160))
    assert version_quality(plan, policies, parents[:1]) == []  # pools of another parent set are stale
    # issue 21's bar over the first versions: v1 is below the base, so it is not met
    assert learning_bar([base, *rows], versions=3)["grpo-s0"] == {
        "met": False, "never_below": False, "above_at_last": True, "measured": [1, 2, 10]}
    assert learning_bar([base, *rows[1:]], versions=2)["grpo-s0"]["met"] is True  # level, then above
    assert learning_bar([base, *rows])["grpo-s0"] == {"met": None, "measured": [1, 2, 10]}  # v4 not yet
    # what learning costs in search speed: evaluations per minute against the same baseline
    arms = {"frozen-s0": {"arm": "frozen-s0", "evaluations": 200, "wall_s": 1200.0},
            "grpo-s0": {"arm": "grpo-s0", "evaluations": 200, "wall_s": 6000.0}}
    assert slowdowns(plan, policies, arms) == {"grpo-s0": pytest.approx(
        {"base": "frozen-s0", "evals_per_min": 2.0, "base_evals_per_min": 10.0, "slowdown": 5.0})}


def test_a_held_out_answer_with_its_parents_outputs_is_not_counted_valid():
    """Valid means new and valid: an answer that ran with the parent's very components changed
    nothing the judge can see (GRPO's valid rate could rise on such answers alone)."""
    from types import SimpleNamespace as Result

    parent, names = {"objective": 0.5, "fitness": {"x": 0.5, "y": 0.5}}, ["x", "y"]
    same = heldout._answer_record(Result(status="ok", components={"x": 0.5, "y": 0.5}, objective=0.5,
                                         headline=0.5), parent, names)
    new = heldout._answer_record(Result(status="ok", components={"x": 0.6, "y": 0.5}, objective=0.55,
                                        headline=0.6), parent, names)
    assert same["same"] and not heldout.new_valid(same)
    assert heldout.new_valid(new) and new["beats_parent"] and not new["same"]
    assert not heldout.new_valid(heldout._answer_record(None, parent, names))
    assert heldout.new_valid({"status": "ok", "beats_parent": False})  # a pool of before the field: as it was


def test_held_out_reward_per_answer_and_set_reward_are_apart(tmp_path):
    """m = 1 and m = 3 pools: every arm gets the reward per answer; only m > 1 a set reward over
    its whole completions (a set of 3 is worth more than one answer by construction)."""
    from evolve.compare.report import read_heldout

    parents = [{"key": "p", "code": "x = 0", "inspirations": []}]
    vectors = [[1, 0], [0, 1], [0, 0], [0.3, 0.3], [0.3, 0.3], [0.3, 0.3]]
    answers = [{"status": "ok", "objective": sum(v) / 2, "vector": v, "beats_parent": False} for v in vectors]
    for m in (1, 3):
        path = tmp_path / f"m{m}.json"
        path.write_text(json.dumps({"policy_version": 0, "parents_digest": heldout.digest(parents),
                                    "answers_per_completion": m, "parents": {"p": {"answers": answers, "tokens": 1}}}))
        pool = read_heldout(path, parents, 4)
        assert pool["answer_reward"] == pytest.approx((0.5 + 0.5 + 0 + 0.9) / 6, abs=0.01)
        if m == 1:
            assert pool["set_reward"] is None
        else:  # {(1,0), (0,1), (0,0)}: E max(w1, w2) = 3/4; {(0.3,0.3) x 3}: 0.3
            assert pool["set_reward"] == pytest.approx((0.75 + 0.3) / 2, abs=0.01)


def test_a_version_measured_on_every_seed_is_pooled_over_their_parents_still_paired():
    """Two seeds of 4 parents: the version one answer ahead on every parent is above its base when
    the 8 pairs are pooled (2/256), not on either seed alone (2/16 each)."""
    from evolve.compare.report import _pooled_table, pooled_versions

    def row(arm, version, valid, base=None):
        per_parent = {"keys": [f"{arm}#{i}" for i in range(4)], "answers": [16] * 4, "valid_n": [valid] * 4,
                      "improving_n": [1, 0, 0, 1]}
        return {"arm": arm, "version": version, "per_parent": per_parent, **({"base": base} if base else {})}

    arms = {f"{p}-s{s}": {"policy": p, "seed": s} for p in ("frozen", "grpo") for s in (0, 1)}
    rows = [row("grpo-s0", 0, 8, base="frozen-s0"), row("grpo-s0", 1, 9), row("grpo-s0", 2, 9),
            row("grpo-s1", 0, 8, base="frozen-s1"), row("grpo-s1", 1, 9)]  # v2 only on seed 0
    [pooled] = pooled_versions(rows, arms)
    assert (pooled["policy"], pooled["version"], pooled["seeds"]) == ("grpo", 1, 2)
    assert pooled["valid"]["parents"] == 8 and pooled["valid"]["diff"] == pytest.approx(1 / 16)
    assert pooled["valid"]["p"] == pytest.approx(2 / 2 ** 8) and pooled["valid"]["vs_base"] == "above"
    assert pooled["improving"]["vs_base"] == "level" and pooled["improving"]["p"] == 1.0
    assert pooled_versions(rows[:3], {k: v for k, v in arms.items() if k.endswith("s0")}) == []  # one seed
    assert "| grpo | v1 | 2 | 8 | 56.2% (50.0%) | +6.2% [+6.2%, +6.2%] | 0.00781 | above |" in "\n".join(
        _pooled_table([pooled]))


def test_the_arm_table_says_when_the_best_was_found_and_names_the_headline_once():
    from evolve.compare.report import _arm_table

    arm = {"arm": "a-s0", "stop_reason": "budget reached", "evaluations": 3, "best_objective": 0.5,
           "best_headline": 0.25, "curve_objective": [0.0, 0.2, 0.5, 0.5], "best_id": 7, "applied": 2,
           "answers": 3, "llm_calls": 1, "completion_tokens": 10, "wall_s": 1.0, "training_steps": 0,
           "training_s": 0.0, "coverage": 0.1, "qd_score": 0.2}
    for headline, columns in (("n26", 15), ("objective", 14)):  # HumanEval's headline is its objective
        header, rule, row = _arm_table({"arms": {"a-s0": arm}}, headline)[2:]
        assert header.count("|") == rule.count("|") == row.count("|") == columns + 1
        assert "| 2 | #7 |" in row  # reached 0.5 at the second evaluation
        assert ("best n26" in header) == (headline == "n26") and "best objective | best objective" not in header


def test_seeds_run_apart_merge_into_the_report_of_one_comparison(scripted, tmp_path, capsys):
    # each seed in a comparison of its own (two machines, or one lost after seed 0 was reported):
    # merged, their reports are one comparison's, over both seeds
    apart = []
    for seed in (0, 1):
        alone = Namespace(**{**vars(scripted), "out": tmp_path / f"seed-{seed}"})
        assert main(compare_args(alone, "--seeds", f"{seed}-{seed}", "--budget", 3, "--skip-heldout")) == 0
        apart.append(alone.out)
    each = [json.loads((d / "report" / "figures.json").read_text()) for d in apart]
    out = tmp_path / "merged"
    assert main(["compare", "--merge", str(apart[0]), str(apart[1] / "report"), "--out", str(out)]) == 0
    fig = json.loads((out / "figures.json").read_text())
    assert fig["settings"]["seeds"] == [0, 1]
    assert fig["arms"] == {**each[0]["arms"], **each[1]["arms"]}
    assert list(fig["arms"]) == ["alpha-s0", "beta-s0", "alpha-s1", "beta-s1"]
    for policy in ("alpha", "beta"):
        finals = [e["arms"][f"{policy}-s{s}"]["best_objective"] for s, e in enumerate(each)]
        assert fig["final_best"][policy]["objective"]["values"] == pytest.approx(finals)
        assert fig["best_vs_evaluations"][policy]["objective"]["median"][-1] == pytest.approx(sum(finals) / 2)
    [line] = fig["verdicts"]["final best objective"]  # two seeds, paired: the report says it can claim nothing
    assert "paired by seed" in line and "smallest possible p is 0.5" in line
    assert all("one seed: no statistical claim" in e["verdicts"]["final best objective"][0] for e in each)
    md = (out / "report.md").read_text()
    assert f"`{apart[0]}` (seeds [0])" in md and f"`{apart[1]}` (seeds [1])" in md and line in md
    for f in ("best_vs_evaluations.png", "final_best.png", "diversity.png", "archive.png", "cost.png"):
        assert (out / f).stat().st_size > 0, f

    def refused(*sources) -> str:
        capsys.readouterr()
        assert main(["compare", "--merge", *map(str, sources), "--out", str(tmp_path / "refused")]) == 2
        return capsys.readouterr().err

    assert "each seed belongs in one report" in refused(apart[0], apart[0] / "report" / "figures.json")
    assert "no figures.json there" in refused(apart[0], tmp_path / "nowhere")
    other = tmp_path / "other.json"  # another budget: another comparison
    data = json.loads((apart[1] / "report" / "figures.json").read_text())
    other.write_text(json.dumps({**data, "settings": {**data["settings"], "budget": 4}}))
    assert "compares budget 4" in refused(apart[0], other)
    # a report from before merging existed says nothing of its headline: n26 here, not the objective
    old = {k: v for k, v in data["settings"].items() if k not in ("headline", "parent_sets", "sources")}
    other.write_text(json.dumps({**data, "settings": {**old, "heldout_parents": []}}))
    assert "does not say its headline" in refused(apart[0], other)
    assert not (tmp_path / "refused").exists()


def test_a_merged_report_lists_each_seeds_own_heldout_parents():
    parent = lambda key, held_out: {"key": key, "objective": 0.5, "held_out": held_out}  # noqa: E731
    fig = {"heldout": {"alpha": {}}, "settings": {
        "heldout": {"samples": 4, "k_max": 4}, "parent_sets": [
            {"seeds": [0], "parents": [parent("seed", False), parent("p7", True)]},
            {"seeds": [1], "parents": [parent("p9", True)]}]}}
    text = "\n".join(compare_report._heldout_section(fig, ["alpha"]))
    assert "Seeds [0]:" in text and "Seeds [1]:" in text and "drew their parents apart" in text
    assert text.index("`p7`") < text.index("Seeds [1]:") < text.index("`p9`")
    assert "NOT held out" in text.split("Seeds [1]:")[0]
