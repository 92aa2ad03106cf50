"""SIGTERM stops `evolve run` cleanly, through the real parts: the embedded vLLM server
(SmolLM2, fast to start) and the Docker sandbox. The server and the containers it started
are gone, the session says "interrupted", and a resume finishes the run with nothing lost."""
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import docker
import pytest

from evolve.sandbox.docker import LABEL

pytestmark = pytest.mark.real
ROOT = Path(__file__).resolve().parents[1]
PORT = 8134


def rows(db: Path, sql: str) -> list:
    try:
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            return conn.execute(sql).fetchall()
    except sqlite3.DatabaseError:  # created, not migrated yet (or its header half-written)
        return []


def port_open(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def sandbox_containers() -> int:
    return len(docker.from_env().containers.list(all=True, filters={"label": LABEL}))


def test_sigterm_stops_server_and_containers_and_the_run_resumes(tmp_path, docker_ready):
    policy = tmp_path / "policy.yaml"
    policy.write_text((ROOT / "policies" / "smollm2.yaml").read_text().replace("port: 8012", f"port: {PORT}"))
    run_dir, db = tmp_path / "run", tmp_path / "run" / "evolve.db"
    before = sandbox_containers()
    proc = subprocess.Popen([sys.executable, "-m", "evolve.cli", "run", ROOT / "problems" / "min_max_distance.yaml",
                             "--policy", policy, "--run-dir", run_dir, "--max-evaluations", "6",
                             "--max-llm-calls", "3", "--set", "search.tuning.enabled=false", "--no-dashboard",
                             # one call after another, as before the problem took the flagship's schedule
                             "--set", "budget.llm_concurrency=2", "--set", "budget.llm_batch=null"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 600
    while time.time() < deadline and not rows(db, "SELECT id FROM llm_calls"):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)  # what `kill`, systemd or docker stop send
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert "stopped: interrupted" in out and "evolve resume" in out
    assert rows(db, "SELECT stop_reason FROM sessions") == [("interrupted",)]
    assert not port_open(PORT), "the embedded server outlived the run"
    assert sandbox_containers() == before, "sandbox containers outlived the run"

    resumed = subprocess.run([sys.executable, "-m", "evolve.cli", "resume", run_dir, "--no-dashboard"],
                             cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert rows(db, "SELECT stop_reason FROM sessions")[-1][0] in ("budget reached", "llm call budget reached")
    evaluated = [r[0] for r in rows(db, "SELECT program_id FROM evaluations")]
    assert len(evaluated) == len(set(evaluated)), "a program was evaluated twice"
    assert rows(db, "SELECT count(*) FROM programs WHERE status = 'pending'") == [(0,)]
    assert not port_open(PORT) and sandbox_containers() == before
