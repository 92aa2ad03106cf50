"""Evaluations on a real local Ray cluster (Ray's own test-cluster helper: a head and a second
node, each its own raylet on this machine), each node's evaluator with the real Docker sandbox:
slots per node, a worker killed mid-evaluation, a node removed, and `evolve run` on it with
the archive on a real PostgreSQL server (the scripted LLM of tests/test_reliability.py),
killed with -9, resumed on fewer nodes."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time

import pytest
import ray
import yaml
from ray.cluster_utils import Cluster
from test_reliability import (
    archive,
    check_consistent,
    done,
    events,
    finish,
    setup_run,
    start,
    wait_for,
)

from evolve.config import SandboxLimits
from evolve.sandbox.ray import RaySandbox

pytestmark = pytest.mark.usefixtures("docker_ready")
SLOW = "import time\ndef f(x):\n    time.sleep(x)\n    return x\n"


@pytest.fixture
def cluster():
    """A head and one more node, one CPU each: two evaluation slots, one per node."""
    made = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    made.add_node(num_cpus=1)
    made.wait_for_nodes()
    yield made
    if ray.is_initialized():
        ray.shutdown()
    made.shutdown()


def limits(cluster, **ray_settings) -> SandboxLimits:
    return SandboxLimits(backend="ray", timeout_s=20, ray={"address": cluster.address, **ray_settings})


def evaluator_pids() -> list[int]:
    """The evaluators' processes (Ray names its actor workers after their class)."""
    out = subprocess.run(["pgrep", "-f", "ray::NodeSandbox"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


async def run_all(sandbox, xs) -> list:
    return await asyncio.gather(*(sandbox.run(SLOW, "f", [{"name": "c", "args": {"x": x}}]) for x in xs))


def test_every_node_evaluates_and_a_lost_worker_faults_only_its_candidate(cluster):
    said = []
    sandbox = RaySandbox(limits(cluster), said.append)
    try:
        assert sandbox.capacity == 2 and len(sandbox.workers) == 2  # a node each, one CPU each
        results = asyncio.run(run_all(sandbox, [1.0, 1.0]))
        assert [r.outputs for r in results] == [{"c": 1.0}, {"c": 1.0}]
        assert sorted(w.done for w in sandbox.workers.values()) == [1, 1]  # one on each node

        async def kill_one_mid_evaluation():
            runs = asyncio.gather(*(sandbox.run(SLOW, "f", [{"name": "c", "args": {"x": 3.0}}]) for _ in range(2)))
            await asyncio.sleep(1.5)
            os.kill(evaluator_pids()[0], signal.SIGKILL)
            return await runs

        results = asyncio.run(kill_one_mid_evaluation())
        faults = [r for r in results if r.fault]
        assert len(faults) == 1 and "ray worker lost" in faults[0].fault  # not the candidate's doing
        assert [r.outputs for r in results if not r.fault] == [{"c": 3.0}]
        assert any("was lost" in e.message and "1 slots on 1 nodes go on" in e.message for e in said)
        # The node is still there: its evaluator is started again, and both slots serve.
        time.sleep(5.5)
        results = asyncio.run(run_all(sandbox, [0.1, 0.1, 0.1]))
        assert all(not r.fault for r in results) and len(sandbox.workers) == 2
        assert any("started" in e.message for e in said)
    finally:
        sandbox.close()


def ray_run(tmp_path, cluster, budget: int, db_url: str):
    command, run_dir, _ = setup_run(tmp_path, budget)
    problem = command[command.index("run") + 1]
    data = yaml.safe_load(open(problem))
    data["sandbox"].update(backend="ray", timeout_s=10, ray={"address": cluster.address})
    with open(problem, "w") as f:
        yaml.safe_dump(data, f, sort_keys=False)
    return command + ["--db-url", db_url], run_dir


def test_a_run_on_ray_and_postgresql_survives_a_lost_worker_and_kill_9_and_resumes_on_one_node(
        tmp_path, cluster, postgres):
    """The scale-out as a user runs it: the archive on PostgreSQL, candidates on a two-node Ray
    cluster. A worker killed mid-run costs nothing; the engine killed with -9 loses nothing;
    the resume goes on with the one node the cluster has left."""
    db = postgres.new_database()
    command, run_dir = ray_run(tmp_path, cluster, budget=30, db_url=db)
    proc = start(command, SCRIPTED_DELAY="0.2")
    wait_for(lambda: done(db) >= 5, proc, timeout=180, what="5 evaluations on Ray")
    os.kill(evaluator_pids()[0], signal.SIGKILL)  # mid-run: an evaluation in flight is lost with it
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    assert "sandbox: ray (2 slots on 2 nodes, docker on each)" in out, out
    assert "was lost" in out and "Traceback" not in out, out
    check_consistent(db)  # nothing evaluated twice, nothing lost
    assert done(db) == 30

    more = command + ["--max-evaluations", "60"]
    proc = start(more, SCRIPTED_DELAY="0.2")
    wait_for(lambda: done(db) >= 35, proc, timeout=180, what="5 more evaluations")
    proc.kill()  # the engine itself, with -9: its writer lock goes with its connection
    proc.wait()
    check_consistent(db)
    kept = archive(db)

    # Resumed on a cluster with one node left: it goes on with what there is.
    node = next(n for n in cluster.list_all_nodes() if n is not cluster.head_node)
    cluster.remove_node(node)
    resumed = finish(more, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "sandbox: ray (1 slots on 1 node, docker on each)" in resumed.stdout, resumed.stdout
    check_consistent(db)
    assert all(archive(db).get(pid) == row for pid, row in kept.items())
    assert done(db) == 60
    assert [e for e in events(run_dir) if e["kind"] == "resume"]
