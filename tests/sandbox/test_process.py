"""The process sandbox with real processes: limits, kills, isolation, strict parsing.

As root, the process backend runs each candidate as an unprivileged uid of its own, which
must be able to run the interpreter: the engine's own where it can (it has numpy), else the
system's python3 (standard library only), as on a machine whose Python lives under /root.
"""
import asyncio
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from evolve.config import SandboxLimits
from evolve.sandbox.process import CANDIDATE_UIDS, ProcessSandbox, processes_of
from evolve.sandbox.result import SandboxUnavailable

ROOT = os.geteuid() == 0


def _interpreter() -> str:
    for python in (sys.executable, shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin")):
        try:
            ProcessSandbox(SandboxLimits(), python=python)
            return python
        except SandboxUnavailable:
            continue
    pytest.skip("no Python that an unprivileged uid can run", allow_module_level=True)


PYTHON = _interpreter()
HAS_NUMPY = subprocess.run([PYTHON, "-c", "import numpy"], capture_output=True).returncode == 0

ONE_CASE = [{"name": "a", "args": {"n": 3}}]
FAKE_LINE = '{"case": "a", "output": 99}'


async def run(code, cases=ONE_CASE, entry_point="f", **limits):
    limits = {"timeout_s": 2.0, "memory_mb": 512, **limits}
    sandbox = ProcessSandbox(SandboxLimits(**limits), python=PYTHON)
    return await sandbox.run(textwrap.dedent(code), entry_point, cases)


def live_processes(pgid=None, pid=None):
    """Non-zombie processes in a process group (or with a pid), read from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while we looked
        state, pgrp = fields[0], int(fields[2])
        this_pid = int(stat.parent.name)
        if state != "Z" and (pgrp == pgid or this_pid == pid):
            found.append(this_pid)
    return found


def wait_until_gone(**which):
    deadline = time.monotonic() + 2.0  # SIGKILL is delivered asynchronously
    while live_processes(**which) and time.monotonic() < deadline:
        time.sleep(0.02)
    return live_processes(**which)


@pytest.fixture
def shared_dir():
    """A folder the candidate may write in (as root it runs as another uid, which cannot enter
    pytest's own temp folders)."""
    folder = Path(tempfile.mkdtemp(prefix="evolve-test-"))
    folder.chmod(0o777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(not HAS_NUMPY, reason=f"{PYTHON} has no numpy (the Docker tests cover numpy)")
async def test_normal_candidate_returns_plain_data():
    result = await run("""
        import numpy as np
        def f(n):
            print("working on", n)
            return np.arange(n) / 2, (1, True, None, "s", {"k": np.float64(2.5)})
    """, cases=[{"name": "a", "args": {"n": 3}}, {"name": "b", "args": {"n": 1}}])
    assert result.status == "ok", result
    assert result.outputs == {"a": [[0.0, 0.5, 1.0], [1, True, None, "s", {"k": 2.5}]],
                              "b": [[0.0], [1, True, None, "s", {"k": 2.5}]]}
    assert result.case_errors == {}
    assert "working on 3" in result.log_tail


async def test_unseeded_draws_are_the_same_in_every_run_and_case():
    code = """
        import random
        drawn_at_import = random.random()
        def f(n):
            return [drawn_at_import, random.random(), random.random()]
    """
    cases = [{"name": "a", "args": {"n": 1}}, {"name": "b", "args": {"n": 1}}]
    first, again = await run(code, cases=cases), await run(code, cases=cases)
    assert first.outputs == again.outputs
    assert first.outputs["a"] == first.outputs["b"]
    assert first.outputs["a"][1] != first.outputs["a"][2]  # seeded once per case, not per draw


async def test_nan_and_inf_pass_through_for_the_scorer_to_reject():
    result = await run("def f(n): return [float('nan'), float('inf')]")
    value = result.outputs["a"]
    assert value[0] != value[0] and value[1] == float("inf")


async def test_entry_point_raising_is_a_case_error():
    result = await run("""
        def f(n):
            if n == 3:
                raise ValueError("boom")
            return n
    """, cases=[{"name": "a", "args": {"n": 3}}, {"name": "b", "args": {"n": 4}}])
    assert result.status == "ok"
    assert result.outputs == {"b": 4}
    assert result.case_errors["a"].startswith("ValueError: boom")


async def test_import_failure_fails_every_case():
    result = await run("def f(n) return n", cases=[{"name": "a", "args": {}}, {"name": "b", "args": {}}])
    assert result.status == "ok" and result.outputs == {}
    assert all("SyntaxError" in error for error in result.case_errors.values())
    missing = await run("def g(n): return n")
    assert "AttributeError" in missing.case_errors["a"]


async def test_non_plain_output_and_sys_exit_are_case_errors():
    result = await run("""
        import sys
        def f(n):
            if n == 1:
                sys.exit(0)
            return object()
    """, cases=[{"name": "a", "args": {"n": 0}}, {"name": "b", "args": {"n": 1}}])
    assert result.case_errors["a"] == "output is not plain data: object"
    assert result.case_errors["b"].startswith("SystemExit")


async def test_infinite_loop_times_out_and_keeps_earlier_outputs():
    start = time.monotonic()
    result = await run("""
        def f(n):
            while n == 2:
                pass
            return n
    """, cases=[{"name": "a", "args": {"n": 1}}, {"name": "b", "args": {"n": 2}}], timeout_s=1.0)
    assert time.monotonic() - start < 10.0  # killed at the timeout, not left to run (generous: loaded CI)
    assert result.status == "timeout"
    assert result.outputs == {"a": 1}
    assert "no result" in result.case_errors["b"]


async def test_sleep_forever_times_out():
    result = await run("import time\ndef f(n):\n    time.sleep(1000)\n", timeout_s=1.0)
    assert result.status == "timeout" and result.elapsed_s < 2.0


async def test_fork_bomb_is_killed_with_its_whole_group(shared_dir):
    pgid_file = shared_dir / "pgid"
    result = await run(f"""
        import os, time
        def f(n):
            open({str(pgid_file)!r}, "w").write(str(os.getpgid(0)))
            for _ in range(7):  # bounded: up to 128 processes, all sleeping
                try:
                    os.fork()
                except OSError:
                    pass
            while True:
                time.sleep(1)
    """, timeout_s=1.0)
    assert result.status in ("timeout", "error")
    pgid = int(pgid_file.read_text())
    assert wait_until_gone(pgid=pgid) == []


async def test_background_process_is_killed_after_the_run():
    result = await run("""
        import subprocess
        def f(n):
            return subprocess.Popen(["sleep", "1000"], start_new_session=False).pid
    """)
    assert result.status == "ok", result
    assert wait_until_gone(pid=result.outputs["a"]) == []


async def test_forgotten_multiprocessing_pool_does_not_wait_for_the_timeout():
    # Forked workers hold the results pipe; the run must end at the harness's last line.
    result = await run("""
        import multiprocessing
        def square(x):
            return x * x
        def f(n):
            return multiprocessing.get_context("fork").Pool(2).map(square, range(n))
    """, timeout_s=3.0)
    assert result.status == "ok" and result.outputs == {"a": [0, 1, 4]}
    assert result.elapsed_s < 2.0


async def test_memory_bomb_fails_cleanly():
    result = await run("""
        def f(n):
            blocks = []
            while True:
                blocks.append(bytearray(64 * 1024 * 1024))
    """, memory_mb=256)
    assert result.status == "error" or "MemoryError" in result.case_errors["a"], result


async def test_engine_environment_is_not_visible(monkeypatch):
    monkeypatch.setenv("EVOLVE_SECRET_TEST", "hunter2")
    result = await run("import os\ndef f(n): return [os.environ.get('EVOLVE_SECRET_TEST'), sorted(os.environ)]")
    secret, names = result.outputs["a"]
    assert secret is None
    assert set(names) <= {"PATH", "HOME", "TMPDIR", "LANG", "OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                          "MKL_NUM_THREADS", "PYTHONDONTWRITEBYTECODE", "LC_CTYPE"}


async def test_printing_megabytes_does_not_flood_the_engine():
    result = await run("""
        import os, sys
        def f(n):
            chunk = "x" * (1 << 20)
            for _ in range(40):  # 40 MB, over the 16 MiB file-size limit of the log
                print(chunk)
                os.write(2, chunk.encode())
            return n
    """, timeout_s=5.0)
    assert result.status == "ok"
    assert result.outputs.get("a") == 3 or "File too large" in result.case_errors["a"]
    assert len(result.log_tail) <= 2048


async def test_output_over_the_cap_is_an_error():
    result = await run("def f(n): return [0.5] * 1_000_000", output_kb=64)
    assert result.status == "error" and "output over 64 KB" in result.detail
    assert result.outputs == {}


async def test_fake_result_lines_on_stdout_go_to_the_log():
    result = await run("""
        import os
        FAKE = '{"case": "a", "output": 99}'
        print(FAKE)
        def f(n):
            print(FAKE, flush=True)
            os.write(1, (FAKE + "\\n").encode())
            os.write(2, (FAKE + "\\n").encode())
            return 1
    """)
    assert result.outputs == {"a": 1}
    assert FAKE_LINE in result.log_tail


async def test_work_dir_is_private_and_removed_and_files_are_size_capped(shared_dir):
    # Not a filesystem jail (see sandbox.py); what holds: the work dir is fresh and deleted,
    # and no single file the candidate writes can grow past the file-size limit.
    outside = shared_dir / "big.bin"
    result = await run(f"""
        import os
        def f(n):
            here = os.getcwd()
            listing = sorted(os.listdir(here))
            with open({str(outside)!r}, "wb") as big:
                try:
                    for _ in range(32):
                        big.write(b"x" * (1 << 20))
                        big.flush()
                except OSError as exc:
                    return [here, listing, str(exc)]
            return [here, listing, "wrote it all"]
    """)
    here, listing, outcome = result.outputs["a"]
    assert listing == ["candidate.log", "candidate.py", "harness.py"]
    assert not os.path.exists(here)
    assert "File too large" in outcome
    assert outside.stat().st_size <= 16 * 1024 * 1024


async def test_crash_without_finishing_is_an_error_with_the_reason():
    result = await run("""
        import os
        def f(n):
            if n == 2:
                os._exit(3)
            return n
    """, cases=[{"name": "a", "args": {"n": 1}}, {"name": "b", "args": {"n": 2}}])
    assert result.status == "error" and "exited with code 3" in result.detail
    assert result.outputs == {"a": 1} and "no result" in result.case_errors["b"]


async def test_killed_by_signal_is_named():
    result = await run("import os, signal\ndef f(n): os.kill(os.getpid(), signal.SIGSEGV)")
    assert result.status == "error" and "SIGSEGV" in result.detail


async def test_concurrent_runs_do_not_mix():
    code = "def f(n): return n"
    results = await asyncio.gather(*(run(code, cases=[{"name": "a", "args": {"n": i}}]) for i in range(4)))
    assert [r.outputs["a"] for r in results] == [0, 1, 2, 3]


def test_harness_is_standalone():
    source = (Path(__file__).resolve().parents[2] / "evolve" / "sandbox" / "harness.py").read_text()
    imports = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert imports and not any("evolve" in line for line in imports)


# ---- as root: a uid of its own, and nothing of it left afterwards ----------------------------
needs_root = pytest.mark.skipif(not ROOT, reason="the privilege drop happens only as root")


@needs_root
async def test_as_root_the_candidate_runs_unprivileged_and_cannot_read_the_engine():
    result = await run(f"""
        import os
        def f(n):
            try:
                open("/proc/{os.getpid()}/environ").read()
                environ = "read"
            except OSError as exc:
                environ = exc.strerror
            return [os.getuid(), os.getgid(), os.getgroups(), environ]
    """)
    uid, gid, groups, environ = result.outputs["a"]
    assert uid in CANDIDATE_UIDS and gid == uid and groups == [] and environ == "Permission denied"


@needs_root
async def test_as_root_escaped_and_half_dead_processes_are_killed_after_the_run():
    # A setsid() grandchild leaves the process group; a child whose main thread leaves with the
    # raw exit syscall shows as a zombie while its other thread keeps running.
    result = await run("""
        import ctypes, os, platform, threading, time
        def f(n):
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    time.sleep(1000)
                os._exit(0)
            if os.fork() == 0:
                threading.Thread(target=time.sleep, args=(1000,)).start()
                exit_call = {"x86_64": 60, "aarch64": 93}[platform.machine()]
                ctypes.CDLL(None).syscall(exit_call, 0)  # this thread only
            time.sleep(0.3)
            return os.getuid()
    """)
    uid = result.outputs["a"]
    assert uid in CANDIDATE_UIDS
    assert processes_of(uid) == []


def test_as_root_an_interpreter_the_candidate_cannot_run_is_refused_in_one_line(tmp_path):
    if not ROOT:
        pytest.skip("the privilege drop happens only as root")
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    python = private / "python3"
    python.symlink_to(sys.executable)
    with pytest.raises(SandboxUnavailable, match=r"does not run candidates as root.*sandbox.backend: docker"):
        ProcessSandbox(SandboxLimits(), python=str(python))


def test_a_process_that_exits_while_its_uid_is_searched_is_skipped(monkeypatch):
    """/proc changes under the search: a process whose folder is gone by the time its threads are
    listed is skipped (a glob over /proc raised FileNotFoundError in CI, on a busy machine)."""
    import evolve.sandbox.process as process

    listdir, me = os.listdir, f"/proc/{os.getpid()}/task"

    def gone_but_me(path):
        if str(path).endswith("/task") and str(path) != me:
            raise FileNotFoundError(path)
        return listdir(path)

    monkeypatch.setattr(process.os, "listdir", gone_but_me)
    assert processes_of(os.getuid()) == [os.getpid()]
