"""Run untrusted candidate code in a separate, limited process and collect plain data.

The process backend (`ProcessSandbox`, `sandbox.backend: process`) is an explicit opt-in for
hosts without Docker; Docker (evolve/sandbox/docker.py) is the default and the real jail.
Per run: a fresh temp dir holding candidate.py and a copy of harness.py; `python -I
harness.py` in its own session with a scrubbed environment (no engine secrets); rlimits on
CPU time, address space, file size, core dumps and open files; a wall-clock timeout and an
output cap; and the whole process group SIGKILLed at the end.

Results come back as JSON lines (see harness.py) and are parsed strictly; nothing the
candidate made is ever unpickled or executed here. The parsing and the verdict are shared
with the Docker backend; `make_sandbox` picks the backend and never falls back in silence.

What the process backend does not guarantee (README, "The sandbox"):
- it is not a filesystem jail: the candidate reads and writes what its uid may;
- run by an ordinary user, candidates run as that user: they can read the engine's files and
  /proc/<engine pid>/environ, and a child that calls setsid() escapes the group kill;
- run as root, each candidate gets an unprivileged uid of its own (leased per evaluation
  across the host), so it cannot read the engine's environment, and every process of that
  uid is killed afterwards, setsid() children included. Where that uid cannot run the
  engine's Python, the backend refuses rather than run candidates as root;
- RLIMIT_NPROC is not used: it counts every process of the user (and root ignores it).
  Fork bombs are contained by the wall-clock timeout killing the whole group instead.
"""
from __future__ import annotations

import asyncio
import fcntl
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evolve.config import SandboxLimits
from evolve.sandbox.result import (
    DRAIN_S,
    FILE_SIZE_LIMIT,
    HARNESS_SOURCE,
    LOG_NAME,
    LOG_TAIL_BYTES,
    Collected,
    SandboxResult,
    SandboxUnavailable,
    append_results,
    build_result,
    candidate_environment,
)

EXIT_POLL_S = 0.05

# The process backend run as root gives each candidate one of these uids (no passwd entries):
# one per evaluation in flight on this host, so that killing "every process of the uid"
# afterwards kills exactly one candidate's processes, whatever session or group they moved to.
# A uid is leased with a lock file, so that two engines on one host never share one.
CANDIDATE_UIDS = range(64900, 64964)
UID_LOCKS = Path(tempfile.gettempdir()) / "evolve-candidate-uids"


async def _lease_uid() -> tuple[int, int]:
    """(uid, the fd holding its lock): the first uid no evaluation on this host holds."""
    UID_LOCKS.mkdir(mode=0o700, exist_ok=True)
    while True:
        for uid in CANDIDATE_UIDS:
            fd = os.open(UID_LOCKS / str(uid), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # per open file: also within a process
                return uid, fd
            except BlockingIOError:
                os.close(fd)
        await asyncio.sleep(0.05)  # every uid is busy: as many evaluations in flight


class ProcessSandbox:
    backend = "process"

    def __init__(self, limits: SandboxLimits, python: str = sys.executable):
        self.limits = limits
        self.python = python  # runs the harness; as root, it must be runnable by the candidate uids
        self.drops = False  # as root: each candidate runs as a leased uid of CANDIDATE_UIDS
        if os.geteuid() == 0:
            if why := _cannot_run_as(CANDIDATE_UIDS[0], python):
                raise SandboxUnavailable(
                    f"the process backend does not run candidates as root, and uid {CANDIDATE_UIDS[0]} "
                    f"cannot run {python} ({why}); use sandbox.backend: docker, or run evolve as an "
                    "unprivileged user, or from a Python installed where every user can run it",
                    permanent=True)
            self.drops = True

    @property
    def warning(self) -> str:
        """What this backend does not guarantee, in one line (the dashboard shows it)."""
        who = ("as an unprivileged uid of its own" if self.drops
               else "as the engine's own user, which can read its environment and files")
        return f"process sandbox: not a jail; candidates run on this host {who}"

    def close(self) -> None:
        pass  # nothing outlives a run; here for symmetry with DockerSandbox

    async def run(self, code: str, entry_point: str, cases: list[dict]) -> SandboxResult:
        start = time.monotonic()
        uid, lock = await _lease_uid() if self.drops else (None, -1)
        workdir = Path(tempfile.mkdtemp(prefix="evolve-sandbox-"))
        try:
            (workdir / "candidate.py").write_text(code)
            (workdir / "harness.py").write_text(HARNESS_SOURCE)
            if uid is not None:
                os.chown(workdir, uid, uid)  # its own files only; the rest is the engine's
            spec = {"program": "candidate.py", "entry_point": entry_point, "cases": cases}
            collected = await self._execute(workdir, json.dumps(spec).encode(), uid)
            log_tail = _read_tail(workdir / LOG_NAME)
        finally:
            if uid is not None and not await asyncio.to_thread(kill_uid, uid):  # setsid children too
                os.close(lock)  # else the uid stays locked: its survivors must not meet a candidate
            shutil.rmtree(workdir, ignore_errors=True)
        return build_result(collected, cases, log_tail, self.limits, start)

    async def _execute(self, workdir: Path, spec: bytes, uid: int | None) -> Collected:
        command = [self.python, "-I", "harness.py"]
        user: dict = {}  # (the keywords of create_subprocess_exec, whose stubs overload them)
        if uid is not None:  # a process of another uid cannot be limited from outside without
            # CAP_SYS_RESOURCE: util-linux's prlimit, run as that uid, lowers its own and execs
            user = {"user": uid, "group": uid, "extra_groups": []}
            command = ["prlimit", *(f"--{name}={soft}:{hard}" for name, soft, hard in _limits(self.limits)),
                       "--", *command]
        with open(workdir / LOG_NAME, "wb") as log:  # catches harness errors before redirection
            if uid is not None:
                os.fchown(log.fileno(), uid, uid)  # the harness reopens it for its output
            proc = await asyncio.create_subprocess_exec(
                *command,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=log,
                cwd=workdir, env=self._environment(workdir), start_new_session=True, **user)
        pgid = proc.pid  # start_new_session: the harness leads its own group
        try:
            return await self._feed_and_collect(proc, pgid, spec)
        except BaseException:  # cancelled (engine shutting down) or an engine-side bug
            _kill_group(pgid)
            raise

    async def _feed_and_collect(self, proc, pgid: int, spec: bytes) -> Collected:
        try:
            # Limits are set from outside with prlimit rather than in a preexec_fn (which is
            # unsafe when the engine has threads). The harness runs no candidate code until
            # it has read the spec, and the spec is only written after this call.
            if not self.drops:  # else prlimit did it
                _apply_limits(proc.pid, self.limits)
            proc.stdin.write(spec)
            await proc.stdin.drain()
            proc.stdin.close()
        except (OSError, ValueError) as exc:  # harness died at once, or prlimit refused
            _kill_group(pgid)
            await _reap(proc)
            return Collected(returncode=proc.returncode, extra=[f"could not start: {exc}"])
        return await self._collect(proc, pgid)

    async def _collect(self, proc, pgid: int) -> Collected:
        collected = Collected()
        buffer = bytearray()
        cap = self.limits.output_kb * 1024
        reader = asyncio.create_task(_read_until_done(proc.stdout, buffer, cap))
        exited = asyncio.create_task(_wait_exit(proc))
        try:
            done, _ = await asyncio.wait({reader, exited}, timeout=self.limits.timeout_s,
                                         return_when=asyncio.FIRST_COMPLETED)
            collected.timed_out = not done
        except BaseException:
            reader.cancel()
            raise
        finally:
            # Always: background processes and forked workers of the candidate die here.
            _kill_group(pgid)
            exited.cancel()
        try:
            collected.overflow = await asyncio.wait_for(reader, DRAIN_S)
        except asyncio.TimeoutError:  # someone outside the group (setsid) holds the pipe
            collected.extra.append("results pipe still held by an escaped process")
        await _reap(proc)
        collected.stdout = bytes(buffer)
        collected.returncode = proc.returncode
        return collected

    def _environment(self, workdir: Path) -> dict[str, str]:
        path = os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        return candidate_environment(str(workdir), path, self.limits)


def _cannot_run_as(uid: int, python: str) -> str:
    """'' if uid can start `python` (its interpreter, libraries and standard library); else why not."""
    try:
        done = subprocess.run([python, "-I", "-c", "import json, importlib.util"], user=uid, group=uid,
                              extra_groups=[], cwd="/", capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    return "" if done.returncode == 0 else (done.stderr.strip().splitlines() or ["failed"])[-1]


def kill_uid(uid: int) -> list[int]:
    """SIGKILL every process of uid (sent as that uid: kill(-1) reaches exactly those), until
    /proc shows none; returns the survivors (none, but for a kernel that will not let go)."""
    for attempt in range(8):
        if not processes_of(uid):
            return []
        subprocess.run(["kill", "-KILL", "-1"], user=uid, group=uid, cwd="/",
                       extra_groups=[], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
        time.sleep(0.002 * 2 ** attempt)
    return processes_of(uid)


def processes_of(uid: int) -> list[int]:
    """Processes with a live thread whose real, effective or saved uid is uid. Thread by
    thread: a leader that exited with the raw exit syscall shows as a zombie while its other
    threads run on."""
    found = set()
    for pid in (d.name for d in os.scandir("/proc") if d.name.isdigit()):
        try:  # any process may exit while we look: its folder goes (a glob over /proc raised then)
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
            except OSError:
                continue
            uids = next((line.split()[1:4] for line in status.splitlines() if line.startswith("Uid:")), [])
            if str(uid) in uids and "\nState:\tZ" not in status:
                found.add(int(pid))
    return sorted(found)


def _limits(limits: SandboxLimits) -> list[tuple[str, int, int]]:
    """(prlimit name, soft, hard) of every rlimit a candidate runs under."""
    cpu_s = math.ceil(limits.timeout_s * limits.cpus) + 1
    memory = limits.memory_mb * 1024 * 1024
    return [("cpu", cpu_s, cpu_s + 1),  # SIGXCPU first, SIGKILL a second later
            ("as", memory, memory), ("fsize", FILE_SIZE_LIMIT, FILE_SIZE_LIMIT), ("core", 0, 0),
            ("nofile", 256, 256)]


def _apply_limits(pid: int, limits: SandboxLimits) -> None:
    for name, soft, hard in _limits(limits):
        resource.prlimit(pid, getattr(resource, f"RLIMIT_{name.upper()}"), (soft, hard))


async def _read_until_done(stream: asyncio.StreamReader, buffer: bytearray, cap: int) -> bool:
    """Read results until EOF or the harness's final line; True if the output hit the cap."""
    while chunk := await stream.read(65536):
        if ending := append_results(buffer, chunk, cap):
            return ending == "overflow"
    return False


async def _wait_exit(proc) -> None:
    # proc.wait() would also wait for the pipes to close, which forked children can delay;
    # returncode is set as soon as the harness itself exits.
    while proc.returncode is None:
        await asyncio.sleep(EXIT_POLL_S)


async def _reap(proc) -> None:
    try:
        await asyncio.wait_for(proc.wait(), DRAIN_S)
    except asyncio.TimeoutError:
        pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # the group is already gone


def _read_tail(path: Path) -> str:
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - LOG_TAIL_BYTES))
            return log.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
