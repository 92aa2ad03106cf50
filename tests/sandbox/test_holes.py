"""Hostile candidates written by someone who knows the launcher's code, through the real
Docker pool with one warm container lent again and again: after each one, the unmodified
seed must score exactly what it scores in a fresh container, in that same container or in
its replacement. And a fault of the sandbox's own machinery is never charged to a candidate.
"""
import asyncio
import textwrap
from pathlib import Path

import pytest

from evolve.config import SandboxLimits, load_problem
from evolve.faults import SandboxFault
from evolve.judge.evaluator import Evaluator
from evolve.sandbox.docker import DockerSandbox

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = load_problem(ROOT / "problems" / "circle_packing.yaml")
LIMITS = SandboxLimits(backend="docker", timeout_s=6.0, memory_mb=512, pids=64)
# pid 1's start time: differs between containers
CONTAINER = "def container_id():\n    return open('/proc/1/stat').read().rsplit(')', 1)[1].split()[19]\n"

HOSTILE = {
    # Survives as a thread of a process whose main thread left with the raw exit syscall: the
    # process shows as a zombie. The thread rewrites every later candidate's program.
    "zombie with a live thread": """
        import ctypes, os, platform, threading, time
        PLANT = "def construct_packing(n):\\n    return [[0.5, 0.5]] * n, [0.001] * n\\n"
        def tamper():
            while True:
                try:
                    with open("/work/candidate.py", "w") as f:
                        f.write(PLANT)
                except OSError:
                    pass
                time.sleep(0.0005)
        def construct_packing(n):
            if os.fork() == 0:
                threading.Thread(target=tamper).start()
                ctypes.CDLL(None).syscall({"x86_64": 60, "aarch64": 93}[platform.machine()], 0)
            time.sleep(0.2)
            return [[0.5, 0.5]], [0.1]
    """,
    # Empties the work dir and makes it read-only: nothing to wipe, and no later harness
    # could create its log.
    "read-only empty work dir": """
        import os
        def construct_packing(n):
            for name in os.listdir("/work"):
                os.unlink(os.path.join("/work", name))
            os.chmod("/work", 0o500)
            return [[0.5, 0.5]], [0.1]
    """,
    # A work dir nobody may enter, with a sub-folder nobody may list.
    "locked work dir": """
        import os
        def construct_packing(n):
            os.mkdir("/work/vault")
            open("/work/vault/x", "w").write("x")
            os.chmod("/work/vault", 0)
            os.chmod("/work", 0)
            return [[0.5, 0.5]], [0.1]
    """,
    # A daemon in a session of its own, waiting for the next candidate's file.
    "setsid daemon": """
        import os, time
        def construct_packing(n):
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    while True:
                        try:
                            open("/work/candidate.py", "a").write("\\nconstruct_packing = None\\n")
                        except OSError:
                            pass
                        time.sleep(0.001)
                os._exit(0)
            return [[0.5, 0.5]], [0.1]
    """,
    # Stopped processes and a fifo where the log goes.
    "stopped child and a fifo": """
        import os, signal
        def construct_packing(n):
            pid = os.fork()
            if pid == 0:
                os.kill(os.getpid(), signal.SIGSTOP)
                os._exit(0)
            os.mkfifo("/work/next.log")
            os.mkfifo("/dev/shm/x")
            return [[0.5, 0.5]], [0.1]
    """,
}


@pytest.fixture(scope="module")
def pool(docker_ready):
    """One warm container, lent to every evaluation in turn."""
    box = DockerSandbox(LIMITS, warm=1)
    yield Evaluator(PROBLEM.model_copy(update={"sandbox": LIMITS}), box), box
    box.close()


@pytest.fixture(scope="module")
def seed_raw(docker_ready):
    """The seed's raw scores in a fresh container of a pool of its own."""
    box = DockerSandbox(LIMITS, warm=1)
    try:
        result = asyncio.run(Evaluator(PROBLEM, box).evaluate(PROBLEM.seed_code()))
    finally:
        box.close()
    assert result.status == "ok", result.error
    return result.raw


async def container_of(evaluator) -> str:
    result = await evaluator.sandbox.run(CONTAINER, "container_id", [{"name": "a", "args": {}}])
    return result.outputs["a"]


@pytest.mark.parametrize("name", list(HOSTILE))
async def test_after_a_hostile_candidate_the_seed_scores_exactly_as_in_a_fresh_container(pool, seed_raw, name):
    evaluator, _ = pool
    await evaluator.evaluate(textwrap.dedent(HOSTILE[name]))
    for _ in range(3):
        again = await evaluator.evaluate(PROBLEM.seed_code())
        assert again.status == "ok" and again.raw == seed_raw, (name, again.error)


async def test_a_container_proven_clean_after_a_kill_is_lent_again(pool):
    evaluator, _ = pool
    before = await container_of(evaluator)
    await evaluator.evaluate(textwrap.dedent(HOSTILE["setsid daemon"]))
    assert await container_of(evaluator) == before  # killed, checked, reused: the cheap path


async def test_a_mixed_sequence_keeps_every_honest_score(pool, seed_raw):
    evaluator, _ = pool
    honest = PROBLEM.seed_code()
    shifted = honest.replace("margin = 0.5", "margin = 0.6")
    shifted_raw = (await evaluator.evaluate(shifted)).raw
    sequence = [HOSTILE["zombie with a live thread"], honest, HOSTILE["read-only empty work dir"], shifted,
                HOSTILE["setsid daemon"], honest, HOSTILE["locked work dir"], shifted, honest]
    for code in sequence:
        result = await evaluator.evaluate(textwrap.dedent(code))
        if code is honest:
            assert result.raw == seed_raw, result.error
        elif code is shifted:
            assert result.raw == shifted_raw, result.error


async def test_a_launcher_that_cannot_start_the_harness_is_a_sandbox_fault_not_the_candidate(pool, monkeypatch):
    evaluator, box = pool
    monkeypatch.setattr(box, "_environment", {"PATH": "/usr/bin\0"})  # execve refuses a NUL byte
    with pytest.raises(SandboxFault, match="could not start the harness"):
        await evaluator.evaluate(PROBLEM.seed_code())
    monkeypatch.undo()
    assert (await evaluator.evaluate(PROBLEM.seed_code())).status == "ok"


async def test_a_sigkill_says_whether_the_memory_limit_sent_it(pool):
    evaluator, box = pool
    own = await box.run("import os, signal\ndef f():\n    os.kill(os.getpid(), signal.SIGKILL)\n", "f",
                        [{"name": "a", "args": {}}])
    assert "SIGKILL (not by the memory limit" in own.detail, own
    bomb = await box.run("def f():\n    b = []\n    while True:\n        b.append(bytearray(1 << 25))\n", "f",
                         [{"name": "a", "args": {}}])
    if bomb.status == "error":  # or a MemoryError, where the allocator says no first
        assert "SIGKILL (out of memory: the memory limit of 512 MB)" in bomb.detail, bomb
