"""Faults injected into real runs: kill -9, a full disk, a locked database, the Docker engine
going away, sandbox containers killed, the sandbox image removed. Each test runs `evolve run`
as its own process on the real SQLite database, with the LLM scripted (tests/scripted_run.py)
so that only the fault varies; the policy-server faults, which need the real vLLM, are in
test_llm_faults.py. After every fault the archive is checked against the programs table.
"""
from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import docker
import pytest
import yaml
from scripted_run import write_policy, write_problem  # noqa: E402

from evolve.sandbox.docker import LABEL, connect
from evolve.sandbox.image import image_tag

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
FAULT_EXIT = 75

# `evolve` with the scripted LLM. Its answers follow the request seed, so a call redone after
# a kill gets the same answers as the one that was lost.
SCRIPT = f"""
import asyncio, os, sys
sys.path[:0] = [{str(ROOT)!r}, {str(TESTS)!r}]
from scripted_run import ScriptedClient
import evolve.run as runner, evolve.sandbox.docker as docker_sandbox

class Client(ScriptedClient):
    async def sample(self, messages, n, seed=None, max_tokens=None, model=None, on_answer=None):
        self.calls = seed or 0
        await asyncio.sleep(float(os.environ.get("SCRIPTED_DELAY", "0.3")))
        sample = await super().sample(messages, n, seed)
        # a radius of its own per call: the search never runs out of new children
        radius = f"{{0.40 + (seed or 0) % 997 * 1e-4:.4f}} * cell"
        sample.texts = [text.replace("0.45 * cell", radius) for text in sample.texts]
        return sample

runner.PolicyClient = lambda policy, base_url, model, clock=None: Client()
runner.start_policy_server = lambda policy, run_dir, seed, stack: ("http://127.0.0.1:9/v1", policy.model, None)
if os.environ.get("SANDBOX_IMAGE"):
    docker_sandbox.image_tag = lambda: os.environ["SANDBOX_IMAGE"]
from evolve.cli import main
sys.exit(main(sys.argv[1:]))
"""


# ---- helpers ---------------------------------------------------------------------------------------
def setup_run(tmp_path: Path, evaluations: int, backend: str = "docker", run_dir: Path | None = None):
    problem = write_problem(tmp_path, evaluations)
    data = yaml.safe_load(problem.read_text())
    data["sandbox"].update(backend=backend, timeout_s=1.5)  # the scripted sleeper times out sooner
    problem.write_text(yaml.safe_dump(data, sort_keys=False))
    script = tmp_path / "scripted_evolve.py"
    script.write_text(SCRIPT)
    run_dir = run_dir or tmp_path / "run"
    command = [sys.executable, str(script), "run", str(problem), "--policy", str(write_policy(tmp_path)),
               "--run-dir", str(run_dir), "--no-dashboard"]
    return command, run_dir, run_dir / "evolve.db"


def start(command, **env) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **env})


def finish(command, timeout: float = 600, **env) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env})


def query(db: Path | str, sql: str, *args) -> list:
    """Rows of a read-only query on the run's SQLite file, or on a server database's URL."""
    if isinstance(db, str):
        return _server_query(db, sql, args)
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            return conn.execute(sql, args).fetchall()
    except sqlite3.DatabaseError:  # not created yet, or its header half-written
        return []


def _server_query(url: str, sql: str, args) -> list:
    import psycopg
    from sqlalchemy.engine import make_url

    u = make_url(url)
    try:
        with psycopg.connect(host=u.host, port=u.port, user=u.username, dbname=u.database) as conn:
            return [tuple(row) for row in conn.execute(sql.replace("?", "%s"), args).fetchall()]
    except psycopg.Error:  # the schema is not made yet, or the server is restarting
        return []


def evaluations(db: Path) -> int:
    rows = query(db, "SELECT count(*) FROM evaluations")
    return rows[0][0] if rows else 0


def wait_for(condition, proc: subprocess.Popen | None = None, timeout: float = 120, what: str = ""):
    deadline = time.time() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"evolve exited ({proc.returncode}) before {what}:\n{proc.stdout.read()}")
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def archive(db: Path) -> dict[int, tuple]:
    """Every evaluated program: id -> (status, objective, code hash)."""
    return {pid: rest for pid, *rest in query(
        db, "SELECT id, status, objective, code_hash FROM programs WHERE status != 'pending'")}


def check_consistent(db: Path) -> dict:
    """The invariants a kill or a fault must never break; returns a few counts."""
    if not query(db, "SELECT id FROM runs"):  # killed before the database was made: nothing to keep
        return {"evaluations": 0, "pending": 0}
    evaluated = [r[0] for r in query(db, "SELECT program_id FROM evaluations")]
    assert len(evaluated) == len(set(evaluated)), "a program was evaluated twice"
    # Every program that ran in the sandbox has its evaluation row, and only those.
    ran = {r[0] for r in query(db, "SELECT id FROM programs WHERE status IN ('ok','invalid','error','timeout') "
                                   "AND duplicate_of IS NULL AND origin = 'mutation'")}
    seed = {r[0] for r in query(db, "SELECT min(id) FROM programs WHERE origin = 'seed'") if r[0] is not None}
    assert set(evaluated) == ran | seed, "evaluations and evaluated programs disagree"
    assert not query(db, "SELECT p.id FROM programs p JOIN evaluations e ON e.program_id = p.id "
                         "WHERE p.status = 'pending'"), "a pending program has an evaluation"
    # A call is stored with all its completions, and every completion with its child.
    for call_id, n in query(db, "SELECT id, n FROM llm_calls WHERE error IS NULL"):
        assert query(db, "SELECT count(*) FROM completions WHERE call_id = ?", call_id) == [(n,)], \
            f"call {call_id} is stored without all its completions"
    assert not query(db, "SELECT c.id FROM completions c LEFT JOIN programs p ON p.completion_id = c.id "
                         "WHERE p.id IS NULL"), "a completion is stored without its child"
    # The MAP-Elites archive is the best of each cell of each island, as the programs table says.
    cells = {(i, c): (pid, obj) for i, c, pid, obj in query(db, "SELECT island, cell, program_id, objective FROM cells")}
    best = {(i, c): obj for i, c, obj in query(
        db, "SELECT island, cell, max(objective) FROM programs WHERE status = 'ok' AND cell IS NOT NULL "
            "GROUP BY island, cell")}
    assert set(cells) == set(best), "cells and the programs table disagree on which cells are held"
    for key, (pid, obj) in cells.items():
        row = query(db, "SELECT island, cell, status, objective FROM programs WHERE id = ?", pid)
        assert row == [(key[0], key[1], "ok", obj)], f"cell {key} points at {row}"
        assert obj == best[key], f"cell {key} holds {obj}, the best there is {best[key]}"
    islands = query(db, "SELECT count(*) FROM islands")[0][0]
    assert islands == 2 and not query(db, f"SELECT id FROM programs WHERE island >= {islands}")
    return {"evaluations": len(evaluated),
            "pending": query(db, "SELECT count(*) FROM programs WHERE status = 'pending'")[0][0]}


def done(db: Path) -> int:
    """Evaluated candidates as the budget counts them."""
    rows = query(db, "SELECT count(*) FROM programs WHERE origin = 'mutation' AND duplicate_of IS NULL "
                     "AND status IN ('ok','invalid','error','timeout')")
    return rows[0][0] if rows else 0


def events(run_dir: Path) -> list[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def owned_containers(pids) -> list:
    """Sandbox containers whose owner is one of these evolve processes."""
    found = connect().api.containers(all=True, filters={"label": LABEL})
    return [c for c in found if c["Labels"][LABEL].split(":")[1] in {str(p) for p in pids}]


def kill_containers(pid: int) -> int:
    """What a dockerd restart does to a run's containers."""
    killed = 0
    for container in owned_containers([pid]):
        try:
            connect().api.kill(container["Id"])
            killed += 1
        except docker.errors.APIError:  # not running (any more), or already removed
            pass
    return killed


# ---- kill -9 -------------------------------------------------------------------------------------
KILLS = 20


def test_kill_9_twenty_times_loses_nothing_and_the_run_finishes(tmp_path, docker_ready):
    """SIGKILL at seeded random moments (starting, evaluating the seed, mid-call, mid-evaluation,
    mid-commit), then `evolve run` again on the same run directory: every evaluated program
    survives, none is evaluated twice, the archive matches the programs table, and the last
    session finishes the budget. Containers of the killed processes are cleared by the next."""
    budget = 120
    command, run_dir, db = setup_run(tmp_path, budget)
    rng = random.Random(8)
    kept: dict[int, tuple] = {}
    pids, pending_at_kill, progress = [], 0, []
    for _ in range(KILLS):
        proc = start(command)
        pids.append(proc.pid)
        time.sleep(rng.uniform(1.0, 6.0))  # starting takes ~2 s
        assert proc.poll() is None, f"the run finished before {KILLS} kills:\n{proc.stdout.read()}"
        proc.kill()
        proc.wait()
        counts = check_consistent(db)
        now = archive(db)
        lost = {pid: row for pid, row in kept.items() if now.get(pid) != row}
        assert not lost, f"evaluated programs lost or changed by a kill: {lost}"
        kept, pending_at_kill = now, pending_at_kill + bool(counts["pending"])
        progress.append(done(db))
    final = finish(command)
    assert final.returncode == 0, final.stdout + final.stderr
    assert "stopped: budget reached" in final.stdout
    check_consistent(db)
    assert all(archive(db).get(pid) == row for pid, row in kept.items())
    assert done(db) == budget, "the run did not finish its budget"
    # Children a kill left pending were evaluated first by the next session (no code is lost).
    redone = [e["fields"]["pending"] for e in events(run_dir) if e["kind"] == "resume" and e["fields"]["pending"]]
    assert pending_at_kill >= 3 and len(redone) >= 3, (pending_at_kill, redone)
    assert progress[-1] > progress[0], progress
    assert owned_containers(pids) == [], "containers of killed runs were left behind"
    print(f"kill -9 x{KILLS}: budget reached; evaluations done after each kill {progress}; "
          f"{pending_at_kill} kills left children pending; resumes evaluated {redone} pending children first")


# ---- disk and database -----------------------------------------------------------------------------
@pytest.fixture
def small_disk(tmp_path):
    """A 16 MB tmpfs: a disk that can really be filled (needs root, as in CI)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI=true but no tmpfs can be mounted: {made.stderr.strip()}", pytrace=False)
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> Path:
    """Take every free byte of the disk."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT)
    try:
        for size in (1 << 20, 4096, 1):  # big blocks, then the last pages, then the last bytes
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


def test_a_full_disk_stops_the_run_with_one_line_and_it_resumes_once_space_is_back(tmp_path, small_disk):
    budget = 30
    command, run_dir, db = setup_run(tmp_path, budget, run_dir=small_disk / "run")
    proc = start(command, SCRIPTED_DELAY="0.2")
    wait_for(lambda: evaluations(db) >= 5, proc, what="5 evaluations")
    kept = archive(db)
    filler = fill(small_disk)
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == FAULT_EXIT, out
    stopped = [line for line in out.splitlines() if line.startswith("stopped:")]
    assert len(stopped) == 1 and "disk full" in stopped[0] and "evolve resume" in stopped[0], out
    assert "Traceback" not in out, out
    check_consistent(db)
    assert all(archive(db).get(pid) == row for pid, row in kept.items())

    # Still full: resuming says so in one line and changes nothing.
    before = archive(db)
    again = finish(command)
    assert again.returncode == FAULT_EXIT and "disk full" in again.stdout + again.stderr, again
    assert archive(db) == before

    filler.unlink()
    resumed = finish(command)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    check_consistent(db)
    assert all(archive(db).get(pid) == row for pid, row in kept.items())
    assert done(db) == budget


def test_a_database_locked_by_another_process_stops_the_run_and_it_resumes(tmp_path):
    budget = 20
    command, run_dir, db = setup_run(tmp_path, budget)
    proc = start(command, SCRIPTED_DELAY="0.2")
    wait_for(lambda: evaluations(db) >= 3, proc, what="3 evaluations")
    kept = archive(db)
    locker = sqlite3.connect(db, timeout=60)
    locker.execute("BEGIN EXCLUSIVE")  # e.g. a sqlite3 shell left in a write transaction
    try:
        out, _ = proc.communicate(timeout=300)  # the run waits 30 s for the lock, then stops
    finally:
        locker.rollback()
        locker.close()
    assert proc.returncode == FAULT_EXIT, out
    assert "stopped: the database is locked by another process" in out and "evolve resume" in out, out
    assert "Traceback" not in out, out
    check_consistent(db)
    assert all(archive(db).get(pid) == row for pid, row in kept.items())
    stopped_at = done(db)
    resumed = finish(command)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    check_consistent(db)
    assert done(db) == budget
    # The resume says where it went on from, pending children or not.
    said = [e for e in events(run_dir) if e["kind"] == "resume"]
    assert len(said) == 1 and said[0]["fields"]["evaluations"] == stopped_at, said
    assert said[0]["message"] in resumed.stdout, resumed.stdout


# ---- the sandbox ---------------------------------------------------------------------------------
def test_the_docker_engine_going_away_mid_run_is_waited_out_and_blames_no_candidate(tmp_path, engine_proxy):
    """What a dockerd restart does to a run: the engine's socket goes away and every container
    dies. Evaluations wait (one line, and the dashboard says so), nothing is scored for it,
    and the run goes on when the engine is back."""
    budget = 24
    command, run_dir, db = setup_run(tmp_path, budget)
    proc = start(command, DOCKER_HOST=f"unix://{engine_proxy.path}", SCRIPTED_DELAY="0.2")
    wait_for(lambda: evaluations(db) >= 4, proc, what="4 evaluations")
    kept = archive(db)
    engine_proxy.stop()
    kill_containers(proc.pid)
    wait_for(lambda: any(e["kind"] == "sandbox_down" for e in events(run_dir)), proc, what="the outage event")
    time.sleep(4)  # a few retries
    board = finish([sys.executable, "-m", "evolve.cli", "dashboard", str(run_dir), "--once"])
    assert "sandbox DOWN" in board.stdout, board.stdout
    engine_proxy.start()
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    outage = [e["kind"] for e in events(run_dir) if e["kind"].startswith("sandbox_")]
    assert outage[0] == "sandbox_down" and outage[-1] == "sandbox_up", outage
    down = next(e for e in events(run_dir) if e["kind"] == "sandbox_down")
    assert "unreachable" in down["message"] or "lost the Docker engine" in down["message"], down
    blamed = query(db, "SELECT id, error FROM programs WHERE error LIKE '%Docker engine%' "
                       "OR error LIKE '%sandbox container%'")
    assert not blamed, f"candidates were scored for the outage: {blamed}"
    check_consistent(db)
    assert all(archive(db).get(pid) == row for pid, row in kept.items())
    assert done(db) == budget


def dockerd_pid() -> int | None:
    found = subprocess.run(["pgrep", "-x", "dockerd"], capture_output=True, text=True).stdout.split()
    return int(found[0]) if len(found) == 1 else None


def engine_up() -> bool:
    return subprocess.run(["docker", "info"], capture_output=True).returncode == 0


def test_a_real_dockerd_restart_mid_run_is_waited_out(tmp_path, docker_ready):
    """The real thing, where the engine is ours to restart (CI starts its own dockerd): SIGTERM
    dockerd mid-run, which kills every container, and start it again as it was started."""
    if os.environ.get("CI", "").lower() not in ("1", "true", "yes") and not os.environ.get("EVOLVE_RESTART_DOCKERD"):
        pytest.skip("restarts this machine's Docker engine: runs with CI=true or EVOLVE_RESTART_DOCKERD=1")
    pid = dockerd_pid()
    if pid is None or os.geteuid() != 0:
        pytest.skip("no dockerd of ours to restart (not root, or the engine is managed elsewhere)")
    command_line = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
    budget = 24
    command, run_dir, db = setup_run(tmp_path, budget)
    proc = start(command, SCRIPTED_DELAY="0.2")
    try:
        wait_for(lambda: evaluations(db) >= 4, proc, what="4 evaluations")
        kept = archive(db)
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), timeout=60, what="dockerd to stop")
        wait_for(lambda: any(e["kind"] == "sandbox_down" for e in events(run_dir)), proc, what="the outage event")
    finally:
        if dockerd_pid() is None:
            with open("/var/log/dockerd.log", "ab") as log:
                subprocess.Popen(command_line, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        wait_for(engine_up, timeout=60, what="dockerd to start again")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    outage = [e["kind"] for e in events(run_dir) if e["kind"].startswith("sandbox_")]
    assert outage[0] == "sandbox_down" and outage[-1] == "sandbox_up", outage
    assert not query(db, "SELECT id FROM programs WHERE error LIKE '%Docker engine%' "
                         "OR error LIKE '%sandbox container%'"), "candidates were scored for the restart"
    check_consistent(db)
    assert all(archive(db).get(pid) == row for pid, row in kept.items())
    assert done(db) == budget


def test_a_missing_sandbox_image_stops_the_run_in_one_line_and_it_resumes(tmp_path, docker_ready):
    tag = "evolve-sandbox:reliability-test"
    client = docker.from_env()
    client.images.get(image_tag()).tag(tag)
    try:
        budget = 20
        command, run_dir, db = setup_run(tmp_path, budget)
        proc = start(command, SANDBOX_IMAGE=tag, SCRIPTED_DELAY="0.2")
        wait_for(lambda: evaluations(db) >= 3, proc, what="3 evaluations")
        kept = archive(db)
        client.images.remove(tag)  # the engine's other tag keeps the layers
        kill_containers(proc.pid)  # so that new containers are needed
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == FAULT_EXIT, out
        stopped = [line for line in out.splitlines() if line.startswith("stopped:")]
        assert len(stopped) == 1 and "image is missing" in stopped[0] and "evolve sandbox build" in stopped[0], out
        assert "Traceback" not in out
        check_consistent(db)

        # Before the image is back, starting is refused in one line; after, the run finishes.
        refused = finish(command, SANDBOX_IMAGE=tag)
        assert refused.returncode == FAULT_EXIT and refused.stderr.count("\n") == 1, refused
        assert "not built" in refused.stderr
        client.images.get(image_tag()).tag(tag)
        resumed = finish(command, SANDBOX_IMAGE=tag)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        check_consistent(db)
        assert all(archive(db).get(pid) == row for pid, row in kept.items())
        assert done(db) == budget
    finally:
        try:
            client.images.remove(tag)
        except docker.errors.ImageNotFound:
            pass


def test_starting_without_a_docker_engine_is_one_line(tmp_path):
    command, run_dir, _ = setup_run(tmp_path, 5)
    refused = finish(command, DOCKER_HOST=f"unix://{tmp_path}/no-engine.sock")
    assert refused.returncode == FAULT_EXIT, refused
    assert refused.stderr.startswith("error: sandbox unavailable: no Docker engine reachable"), refused.stderr
    assert refused.stderr.count("\n") == 1 and not run_dir.exists()


def test_a_second_process_on_the_same_run_directory_is_refused_in_one_line(tmp_path):
    command, run_dir, db = setup_run(tmp_path, 20)
    first = start(command, SCRIPTED_DELAY="0.5")
    try:
        wait_for(lambda: evaluations(db) >= 1, first, what="the first evaluation")
        second = finish([sys.executable, "-m", "evolve.cli", "resume", str(run_dir), "--no-dashboard"])
        assert second.returncode == 2, second
        assert second.stderr == f"error: {run_dir} is already being run by pid {first.pid}; " \
                                f"watch it with `evolve dashboard {run_dir}`\n"
        out, _ = first.communicate(timeout=300)
        assert first.returncode == 0, out  # undisturbed
    finally:
        if first.poll() is None:
            first.kill()
    check_consistent(db)
    assert done(db) == 20


def test_the_wall_time_cuts_a_call_in_flight(tmp_path, docker_ready):
    """A call of 8 answers takes minutes on two CPU cores: at the wall time the run stops
    without waiting for it (each scripted call here would take 10 minutes)."""
    command, run_dir, db = setup_run(tmp_path, 10_000)
    done = finish(command + ["--wall-time", "5"], timeout=550, SCRIPTED_DELAY="600")
    assert done.returncode == 0 and "stopped: wall time reached" in done.stdout, done
    calls = query(db, "SELECT error, latency_s FROM llm_calls")
    assert calls and all(error == "cancelled" and latency < 300 for error, latency in calls), calls
    (started, ended), = query(db, "SELECT started_at, ended_at FROM sessions")
    assert ended - started < 300, ended - started  # the wall time, not the ten minutes of the call


def test_a_session_killed_with_9_counts_in_the_wall_time_up_to_its_last_heartbeat(tmp_path, docker_ready):
    command, run_dir, db = setup_run(tmp_path, 10_000)
    proc = start(command + ["--wall-time", "3600"], SCRIPTED_DELAY="0.2")
    try:
        wait_for(lambda: evaluations(db) >= 8, proc, what="eight evaluations")
        time.sleep(2.0)
    finally:
        proc.kill()
        proc.wait()
    (started, ended, beat), = query(db, "SELECT started_at, ended_at, heartbeat_at FROM sessions")
    assert ended is None and beat is not None and beat - started > 2.0  # it ran that long, at least
    # A budget the killed session already spent: the next session asks the LLM for nothing more
    # (it only evaluates the children the killed one had already asked for).
    calls = query(db, "SELECT count(*) FROM llm_calls")
    spent = f"{beat - started - 1.0:.1f}"
    resumed = finish([*command[:2], "resume", str(run_dir), "--no-dashboard", "--wall-time", spent])
    assert "stopped: wall time reached" in resumed.stdout + resumed.stderr, resumed
    assert query(db, "SELECT count(*) FROM llm_calls") == calls
    status = finish([sys.executable, "-m", "evolve.cli", "status", str(run_dir)])
    assert status.returncode == 0, status
