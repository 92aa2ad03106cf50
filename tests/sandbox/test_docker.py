"""The Docker sandbox against a real engine: isolation, hostile candidates, pool hygiene, outages.

No mocks. Where no engine (or no sandbox image) is available the Docker tests are skipped
with the reason, except in CI (CI=true): there they must run, so that is a failure.
"""
import asyncio
import shutil
import socket
import textwrap
import time
from pathlib import Path

import docker
import pytest

from evolve.config import SandboxLimits, load_problem
from evolve.judge.evaluator import Evaluator
from evolve.sandbox import image as sandbox_image
from evolve.sandbox import make_sandbox
from evolve.sandbox.docker import (
    LABEL,
    DockerSandbox,
    DockerUnavailable,
    connect,
    owner_id,
)

ROOT = Path(__file__).resolve().parents[2]
ONE_CASE = [{"name": "a", "args": {"n": 3}}]
FAKE_LINE = '{"case": "a", "output": 99}'
LIMITS = dict(backend="docker", timeout_s=3.0, memory_mb=256, pids=64)
# A candidate's view of "who else is here": non-root processes other than itself.
OTHERS = """
import os
def others():
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            status = open(f"/proc/{pid}/status").read()
            uid = status.split("Uid:")[1].split()[0]
            if uid != "0" and "State:\\tZ" not in status:
                found.append(int(pid))
    return found
def container_id():  # pid 1's start time: differs between containers
    return open("/proc/1/stat").read().rsplit(")", 1)[1].split()[19]
"""


def with_others(code):
    return OTHERS + textwrap.dedent(code)


@pytest.fixture(scope="module")
def sandbox(docker_ready):
    box = DockerSandbox(SandboxLimits(**LIMITS))
    yield box
    box.close()


@pytest.fixture
def make(docker_ready):
    """DockerSandbox factory for tests that need their own limits or pool; closed afterwards."""
    made = []

    def factory(warm=1, **limits):
        box = DockerSandbox(SandboxLimits(**{**LIMITS, **limits}), warm=warm)
        made.append(box)
        return box

    yield factory
    for box in made:
        box.close()


async def run(box, code, cases=ONE_CASE, entry_point="f"):
    return await box.run(textwrap.dedent(code), entry_point, cases)


async def wait_until_idle(box, seconds=5.0):
    """Until the pool has wiped (or replaced) what the last evaluation used."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pool = box._pool
        if pool._busy == 0 and pool._starting == 0 and pool._idle:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the pool did not settle")


def pool_containers(owner=None) -> set[str]:
    """Ids of the pool containers that still exist (or are being removed)."""
    value = f"{LABEL}={owner}" if owner else LABEL
    return {c["Id"] for c in connect().api.containers(all=True, filters={"label": value})}


def gone(ids: set[str], seconds=10.0) -> bool:
    """Whether all of ids disappear within seconds (Docker removes killed ones by itself)."""
    deadline = time.monotonic() + seconds
    while ids & pool_containers() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not ids & pool_containers()


# ---- plain runs ------------------------------------------------------------------------------
async def test_numpy_and_scipy_results_come_back_as_plain_data(sandbox):
    result = await run(sandbox, """
        import numpy as np
        from scipy.optimize import minimize
        def f(n):
            print("optimising", n)
            best = minimize(lambda x: ((x - n) ** 2).sum(), np.zeros(2)).x
            return {"x": np.round(best, 3), "n": np.int64(n), "ok": np.bool_(True)}
    """, cases=[{"name": "a", "args": {"n": 3}}, {"name": "b", "args": {"n": 1}}])
    assert result.status == "ok", result
    assert result.outputs == {"a": {"x": [3.0, 3.0], "n": 3, "ok": True},
                              "b": {"x": [1.0, 1.0], "n": 1, "ok": True}}
    assert "optimising 3" in result.log_tail


async def test_failures_are_case_errors_with_their_reason(sandbox):
    result = await run(sandbox, """
        import sys
        def f(n):
            if n == 1:
                raise ValueError("boom")
            if n == 2:
                sys.exit(0)
            return object()
    """, cases=[{"name": k, "args": {"n": n}} for k, n in (("a", 1), ("b", 2), ("c", 3))])
    assert result.status == "ok"
    assert result.case_errors["a"].startswith("ValueError: boom")
    assert result.case_errors["b"].startswith("SystemExit")
    assert result.case_errors["c"] == "output is not plain data: object"
    broken = await run(sandbox, "def f(n) return n")
    assert "SyntaxError" in broken.case_errors["a"]


async def test_nan_and_inf_pass_through_for_the_scorer_to_reject(sandbox):
    result = await run(sandbox, "def f(n): return [float('nan'), float('inf'), -float('inf')]")
    value = result.outputs["a"]
    assert value[0] != value[0] and value[1] == float("inf") and value[2] == -float("inf")


UNSEEDED = """
    import random
    import numpy as np
    drawn_at_import = random.random()
    def f(n):
        return [drawn_at_import, random.random(), np.random.rand(n), np.random.default_rng(0).random()]
"""


async def test_unseeded_draws_are_the_same_in_every_run_and_case(sandbox):
    """A candidate's unseeded draws cannot earn it a lucky score: each case starts from the
    same random state, so the same code returns the same outputs every time."""
    cases = [{"name": "a", "args": {"n": 2}}, {"name": "b", "args": {"n": 2}}]
    first, again = await run(sandbox, UNSEEDED, cases), await run(sandbox, UNSEEDED, cases)
    assert first.status == "ok", first
    assert first.outputs == again.outputs
    assert first.outputs["a"] == first.outputs["b"]


async def test_concurrent_runs_do_not_mix(sandbox):
    code = "def f(n): return n"
    results = await asyncio.gather(*(run(sandbox, code, [{"name": "a", "args": {"n": i}}])
                                     for i in range(4)))
    assert [r.outputs["a"] for r in results] == [0, 1, 2, 3]


# ---- the jail --------------------------------------------------------------------------------
async def test_candidate_runs_as_nobody_on_a_read_only_root(sandbox):
    result = await run(sandbox, """
        import os
        def attempt(path):
            try:
                with open(path, "w") as out:
                    out.write("x")
                return "written"
            except OSError as exc:
                return exc.strerror
        def f(n):
            return [os.getuid(), os.getgid(), os.getcwd(), sorted(os.listdir(".")),
                    attempt("/etc/evolve"), attempt("/tmp/evolve"), attempt("/evolve"),
                    attempt("/work/note.txt"), open("/proc/self/status").read().split("CapEff:")[1].split()[0]]
    """)
    uid, gid, cwd, listing, etc, tmp, root, work, caps = result.outputs["a"]
    assert (uid, gid, cwd) == (65534, 65534, "/work")
    assert listing == ["candidate.log", "candidate.py"]
    assert etc == tmp == root == "Read-only file system"
    assert work == "written"
    assert int(caps, 16) == 0  # no capabilities at all


async def test_no_network_not_even_to_the_host(sandbox):
    result = await run(sandbox, """
        import socket
        def attempt(host, port):
            try:
                socket.create_connection((host, port), timeout=1).close()
                return "connected"
            except OSError as exc:
                return type(exc).__name__
        def f(n):
            return [attempt(h, p) for h, p in [("127.0.0.1", 8011), ("172.17.0.1", 2375),
                                               ("1.1.1.1", 53), ("deb.debian.org", 80)]]
    """)
    assert result.status == "ok", result
    assert "connected" not in result.outputs["a"], result.outputs


async def test_engine_environment_is_not_visible(sandbox, monkeypatch):
    monkeypatch.setenv("EVOLVE_SECRET_TEST", "hunter2")
    result = await run(sandbox, """
        import os
        def f(n):
            try:
                init = open("/proc/1/environ").read()
            except OSError as exc:
                init = exc.strerror
            return [os.environ.get("EVOLVE_SECRET_TEST"), sorted(os.environ), init]
    """)
    secret, names, init_environment = result.outputs["a"]
    assert secret is None and "hunter2" not in init_environment
    assert set(names) <= {"PATH", "HOME", "TMPDIR", "LANG", "OMP_NUM_THREADS", "HOSTNAME",
                          "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "PYTHONDONTWRITEBYTECODE",
                          "LC_CTYPE"}


# ---- hostile candidates ----------------------------------------------------------------------
async def test_infinite_loop_times_out_and_keeps_earlier_outputs(sandbox):
    start = time.monotonic()
    result = await run(sandbox, """
        def f(n):
            while n == 2:
                pass
            return n
    """, cases=[{"name": "a", "args": {"n": 1}}, {"name": "b", "args": {"n": 2}}])
    assert result.status == "timeout" and result.outputs == {"a": 1}
    assert "no result" in result.case_errors["b"]
    assert time.monotonic() - start < LIMITS["timeout_s"] + 2.0


async def test_sleep_forever_times_out(sandbox):
    result = await run(sandbox, "import time\ndef f(n):\n    time.sleep(1000)\n")
    assert result.status == "timeout" and result.elapsed_s < LIMITS["timeout_s"] + 2.0


async def test_fork_bomb_is_contained_and_the_next_run_works(sandbox):
    result = await run(sandbox, """
        import os
        def f(n):
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
    """)
    assert result.status in ("timeout", "error"), result
    after = await run(sandbox, "def f(n): return n")
    assert after.outputs == {"a": 3}


async def test_memory_bomb_is_killed(sandbox):
    result = await run(sandbox, """
        def f(n):
            blocks = []
            while True:
                blocks.append(bytearray(32 * 1024 * 1024))
    """)
    assert result.status == "error" or "MemoryError" in result.case_errors["a"], result
    if result.status == "error":
        assert "SIGKILL (out of memory: the memory limit" in result.detail


async def test_printing_megabytes_is_capped(sandbox):
    result = await run(sandbox, """
        import os, sys
        def f(n):
            chunk = "x" * (1 << 20)
            for _ in range(40):  # 40 MB, over the 16 MB cap on each file (the log too)
                print(chunk)
                os.write(2, chunk.encode())
            return n
    """)
    assert result.status == "ok" and "File too large" in result.case_errors["a"], result
    assert len(result.log_tail) <= 2048
    some = await run(sandbox, "def f(n):\n    print('y' * 500_000)\n    return n\n")
    assert some.status == "ok" and some.outputs == {"a": 3}


async def test_output_over_the_cap_is_an_error(make):
    box = make(output_kb=64)
    result = await run(box, "def f(n): return [0.5] * 1_000_000")
    assert result.status == "error" and "output over 64 KB" in result.detail
    assert result.outputs == {}


async def test_fake_result_lines_on_stdout_and_stderr_go_to_the_log(sandbox):
    result = await run(sandbox, """
        import os, subprocess
        FORGED = '{"case": "a", "output": 99}\\n{"done": true}\\n'
        for fd in (1, 2):  # at import time, and from a child process too
            os.write(fd, FORGED.encode())
        subprocess.run(["echo", FORGED])
        def f(n):
            print(FORGED, end="", flush=True)
            return 1
    """)
    assert result.status == "ok" and result.outputs == {"a": 1}
    assert result.log_tail.count(FAKE_LINE) == 4


async def test_forged_last_line_ends_only_its_own_run(make):
    # The candidate finds the private results fd and ends the stream early, then keeps
    # running. It reports its own data (it could have returned that anyway); the next
    # candidate gets a fresh container.
    box = make(warm=1)
    result = await run(box, with_others("""
        import os, time
        def f(n):
            for fd in range(3, 20):
                try:
                    os.write(fd, b'{"case": "a", "output": 99}\\n{"done": true}\\n')
                except OSError:
                    pass
            time.sleep(1000)
    """))
    assert result.status == "ok" and result.outputs == {"a": 99}
    assert result.elapsed_s < 4.0  # the engine waits 2 s for the harness to end, then kills
    await wait_until_idle(box)
    after = await run(box, OTHERS + "def f(n): return [container_id(), others()]")
    assert after.outputs["a"][1] == []


async def test_background_process_is_gone_before_the_next_evaluation(make):
    box = make(warm=1)  # one container: a leftover would have to be met by the next run
    first = await run(box, with_others("""
        import subprocess
        def f(n):
            subprocess.Popen(["sleep", "1000"], start_new_session=True)
            if os.fork() == 0:  # a daemon-style double fork too
                os.setsid()
                if os.fork() == 0:
                    import time
                    time.sleep(1000)
                os._exit(0)
            return container_id()
    """))
    assert first.status == "ok", first
    await wait_until_idle(box)
    second = await run(box, OTHERS + "def f(n): return [container_id(), others()]")
    container, others = second.outputs["a"]
    assert others == []  # only its own harness runs: the leftovers were killed (or the container replaced)


async def test_clean_container_is_reused_and_wiped(make):
    box = make(warm=1)
    first = await run(box, with_others("""
        import os
        def f(n):
            open("/work/secret.txt", "w").write("left for the next one")
            os.mkdir("/work/sub")
            open("/work/sub/deeper", "w").write("x")
            open("/dev/shm/secret", "w").write("also")
            return container_id()
    """))
    assert first.status == "ok", first
    await wait_until_idle(box)
    second = await run(box, with_others("""
        def f(n):
            return [container_id(), sorted(os.listdir("/work")), os.listdir("/dev/shm")]
    """))
    container, work, shm = second.outputs["a"]
    assert container == first.outputs["a"]  # reused: the cheap path
    assert work == ["candidate.log", "candidate.py"] and shm == []


async def test_signals_to_the_parent_and_to_everyone(sandbox):
    for attack in ("os.kill(os.getppid(), signal.SIGKILL)", "os.kill(-1, signal.SIGKILL)",
                   "os.kill(1, signal.SIGKILL)", "os.system('kill -9 -1')"):
        result = await run(sandbox, f"""
            import os, signal
            def f(n):
                {attack}
                return n
        """)
        assert result.status in ("ok", "error"), (attack, result)
        if result.status == "ok":  # the signal did not reach the harness: pid 1 is root's
            assert result.outputs == {"a": 3} or "PermissionError" in result.case_errors["a"]
        after = await run(sandbox, "def f(n): return n")
        assert after.outputs == {"a": 3}, attack


# ---- through the evaluator, on circle packing ------------------------------------------------
@pytest.fixture(scope="module")
def evaluator(docker_ready):
    problem = load_problem(ROOT / "problems" / "circle_packing.yaml")
    limits = problem.sandbox.model_copy(update={"backend": "docker", "timeout_s": 20})
    box = make_sandbox(limits)
    assert isinstance(box, DockerSandbox)
    yield Evaluator(problem, box), problem
    box.close()


async def test_seed_scores_the_same_as_in_the_process_backend(evaluator):
    evaluator, problem = evaluator
    result = await evaluator.evaluate(problem.resolve(problem.program).read_text())
    assert result.status == "ok", result.error
    assert result.headline == pytest.approx(26 / 12, rel=1e-6)


async def test_patching_the_scorer_or_numpy_does_not_raise_the_score(evaluator):
    evaluator, _ = evaluator
    result = await evaluator.evaluate(textwrap.dedent("""
        import builtins, glob, os, sys
        import numpy as np
        found = [path for top in ("/work", "/home", "/root", "/opt", "/srv", "/mnt")
                 for path in glob.glob(top + "/**/scorer.py", recursive=True)]
        print("found", found, os.path.exists("/work/main"))
        try:
            import evolve  # the engine is not in the image
        except ImportError:
            pass
        np.sqrt = lambda x: 100.0  # patches only this process's numpy
        builtins.sum = lambda *a, **k: 1e9
        print('{"case": "n26", "output": 13.0}')
        def construct_packing(n):
            os.write(1, b'{"case": "n26", "output": [[[0.5, 0.5]], [13.0]]}\\n')
            return [[0.5, 0.5]] * n, [0.5] * n
    """))
    assert result.status == "invalid", result.error
    assert result.objective == 0.0 and result.headline is None
    assert "found [] False" in result.error  # nothing of the engine is in the container


HOSTILE = {  # bodies of construct_packing(n); none may ever score
    "infinite loop": "while True:\n    pass",
    "sleep forever": "import time\ntime.sleep(1000)",
    "fork bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "memory bomb": "blocks = []\nwhile True:\n    blocks.append(bytearray(1 << 25))",
    "network": "import socket\nsocket.create_connection(('127.0.0.1', 8011), timeout=1)",
    "write outside /work": "open('/etc/evolve', 'w')",
    "environment": "import os\nreturn [[0.5, 0.5]] * n, [float(len(os.environ['EVOLVE_SECRET_TEST']))] * n",
    "megabytes of prints": "for _ in range(40):\n    print('x' * (1 << 20))",
    "background process": "import subprocess\nsubprocess.Popen(['sleep', '1000'])\nreturn [[0.5, 0.5]] * n, [0.5] * n",
    "signal the parent": "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)",
    "kill -9 -1": "import os, signal\nos.kill(-1, signal.SIGKILL)",
    "fake result lines": "print('{\"case\": \"n26\", \"output\": [[[0.5, 0.5]], [0.5]]}')\nreturn 13.0",
    "NaN": "return [[float('nan')] * 2] * n, [float('nan')] * n",
    "inf": "return [[0.5, 0.5]] * n, [float('inf')] * n",
    "not plain data": "return object()",
}


@pytest.fixture(scope="module")
def strict_evaluator(docker_ready):
    """Circle packing with short limits, so the hostile candidates end quickly."""
    problem = load_problem(ROOT / "problems" / "circle_packing.yaml")
    limits = SandboxLimits(**{**LIMITS, "timeout_s": 4.0})
    box = DockerSandbox(limits)
    yield Evaluator(problem.model_copy(update={"sandbox": limits}), box), problem
    box.close()


@pytest.mark.parametrize("name", list(HOSTILE))
async def test_hostile_candidates_never_score(strict_evaluator, name, monkeypatch):
    evaluator, _ = strict_evaluator
    monkeypatch.setenv("EVOLVE_SECRET_TEST", "x" * 100)
    body = textwrap.indent(HOSTILE[name], "    ")
    result = await evaluator.evaluate(f"def construct_packing(n):\n{body}\n")
    assert result.status in ("timeout", "invalid", "error"), (name, result)
    assert result.objective == 0.0 and result.headline is None


async def test_the_seed_still_scores_after_the_hostile_ones(strict_evaluator):
    evaluator, problem = strict_evaluator
    result = await evaluator.evaluate(problem.resolve(problem.program).read_text())
    assert result.status == "ok" and result.headline == pytest.approx(26 / 12, rel=1e-6)


async def test_nan_centres_are_invalid(evaluator):
    evaluator, _ = evaluator
    result = await evaluator.evaluate(
        "def construct_packing(n):\n    return [[float('nan')] * 2] * n, [0.01] * n\n")
    assert result.status == "invalid" and result.objective == 0.0


# ---- the pool's life: containers that die, engines that go away, leftovers -------------------
async def test_a_pool_container_killed_behind_its_back_is_replaced(make):
    box = make(warm=1)
    assert (await run(box, "def f(n): return n")).outputs == {"a": 3}
    await wait_until_idle(box)
    client = connect()
    for container_id in pool_containers(owner_id()) & {idle.id for idle in box._pool._idle}:
        client.api.kill(container_id)  # what a dockerd restart does to every container
    result = await run(box, "def f(n): return n")
    assert result.status == "ok" and result.outputs == {"a": 3}


async def test_a_container_killed_under_a_running_candidate_is_retried_not_blamed(make):
    """A `docker kill` (or a dockerd restart) mid-evaluation says nothing about the candidate:
    it runs again in a fresh container, and its true result comes back."""
    box = make(warm=1)
    busy = asyncio.create_task(run(box, "import time\ndef f(n):\n    time.sleep(1.0)\n    return n\n"))
    await asyncio.sleep(0.5)
    client = connect()
    for container_id in {b.id for b in box._pool._idle} ^ pool_containers(owner_id()):
        client.api.kill(container_id)  # the one lent out, not the warm spare
    result = await busy
    assert result.status == "ok" and result.outputs == {"a": 3} and not result.fault, result


async def test_engine_going_away_fails_evaluations_clearly_then_recovers(engine_proxy):
    box = DockerSandbox(SandboxLimits(**LIMITS), base_url=f"unix://{engine_proxy.path}", warm=1)
    try:
        assert (await run(box, "def f(n): return n")).status == "ok"
        slow = asyncio.create_task(run(box, "import time\ndef f(n):\n    time.sleep(1.5)\n    return n\n"))
        await asyncio.sleep(0.7)
        engine_proxy.stop()  # mid-run
        cut = await slow
        assert cut.status == "error" and "lost the Docker engine mid-run" in cut.detail, cut
        assert cut.fault.startswith("lost the Docker engine"), "the candidate must not be scored for it"
        down = await run(box, "def f(n): return n")
        assert down.status == "error" and down.detail.startswith("Docker engine unreachable"), down
        assert down.fault and not down.fault_permanent
        assert "no result" in down.case_errors["a"]
        engine_proxy.start()
        back = await run(box, "def f(n): return n")
        assert back.status == "ok" and back.outputs == {"a": 3} and not back.fault, back
        made = set(box._pool._owned)
    finally:
        box.close()
    # Every container it made, the one cut off mid-run included, is gone.
    assert box._pool._owned == set() and gone(made)


async def test_close_removes_the_pool_and_leftovers_of_dead_engines_are_removed(docker_ready):
    client = connect()
    dead_owner = f"{socket.gethostname()}:999999999:0"
    stale = client.containers.create(sandbox_image.image_tag(), labels={LABEL: dead_owner})
    box = DockerSandbox(SandboxLimits(**LIMITS), warm=2)
    with pytest.raises(docker.errors.NotFound):
        client.containers.get(stale.id)
    assert (await run(box, "def f(n): return n")).status == "ok"
    owned = set(box._pool._owned)
    assert owned
    box.close()
    assert box._pool._owned == set() and gone(owned)


def test_without_docker_there_is_no_silent_fallback(monkeypatch, capsys):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(DockerUnavailable, match="no Docker engine reachable.*set sandbox.backend: process"):
        make_sandbox(SandboxLimits())
    assert capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="'docker', 'process' or 'ray'"):
        SandboxLimits(backend="auto")  # it used to fall back in silence: gone


def test_docker_is_the_default_backend(docker_ready):
    box = make_sandbox(SandboxLimits())
    try:
        assert isinstance(box, DockerSandbox) and box.backend == "docker"
    finally:
        box.close()


def test_image_tag_follows_the_recipe(tmp_path, monkeypatch):
    before = sandbox_image.image_tag()
    assert before == sandbox_image.image_tag()
    recipe = tmp_path / "recipe"
    shutil.copytree(sandbox_image.RECIPE_DIR, recipe)
    monkeypatch.setattr(sandbox_image, "RECIPE_DIR", recipe)
    assert sandbox_image.image_tag() == before
    with open(recipe / "packages.txt", "a") as packages:
        packages.write("python3-sympy\n")
    assert sandbox_image.image_tag() != before
