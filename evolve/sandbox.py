"""Run untrusted candidate code in a separate, limited process and collect plain data.

The process backend (`ProcessSandbox`, `sandbox.backend: process`) is an explicit opt-in for
hosts without Docker; Docker (evolve/docker_sandbox.py) is the default and the real jail.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evolve.config import SandboxLimits

# Read once: a candidate that rewrites harness.py on disk cannot change later runs.
HARNESS_SOURCE = (Path(__file__).parent / "harness.py").read_text()
LOG_NAME = "candidate.log"  # written by the harness in the work dir
LOG_TAIL_BYTES = 2048
FILE_SIZE_LIMIT = 16 * 1024 * 1024  # per file the candidate writes (its log included)
MAX_CASE_ERROR_CHARS = 4000
EXIT_POLL_S = 0.05
DRAIN_S = 2.0  # after the group is killed the pipe must hit EOF quickly
DONE_LINE = b'{"done": true}\n'  # the harness's last line, exactly as json.dumps writes it


@dataclass
class SandboxResult:
    status: str  # "ok" (harness finished), "error" (crashed / killed / garbled), "timeout"
    outputs: dict[str, Any]  # case name -> plain output data
    case_errors: dict[str, str]  # case name -> error text (exception in candidate, or missing)
    log_tail: str  # last ~2 KB of candidate.log (its prints / stderr)
    elapsed_s: float
    detail: str = ""  # why status is error / timeout
    program_s: float | None = None  # the harness process alone, where the backend measures it
    # The sandbox itself failed (engine gone, no container): nothing is known about the
    # candidate, so the evaluator must not score it (evolve.faults.SandboxFault).
    fault: str = ""
    fault_permanent: bool = False  # waiting will not help (e.g. the image is missing)


@dataclass
class Collected:
    """What one harness run sent back, before parsing (filled in by either backend)."""
    stdout: bytes = b""
    timed_out: bool = False
    overflow: bool = False
    returncode: int | None = None
    program_s: float | None = None
    started: bool = True  # False: the sandbox could not start the harness (see extra)
    extra: list[str] = field(default_factory=list)  # sandbox-side problems worth reporting
    fault: str = ""  # see SandboxResult.fault
    fault_permanent: bool = False
    oom_killed: bool | None = None  # the memory limit killed a process (None: cannot tell)


class SandboxUnavailable(Exception):
    """Candidates cannot run here (no Docker engine or image; a process backend that would run
    them as root). One line says why and what to do."""

    def __init__(self, reason: str, permanent: bool = False):
        super().__init__(reason)
        self.permanent = permanent  # waiting will not help (e.g. the image is not built)


def make_sandbox(limits: SandboxLimits, report=None):
    """The backend the limits ask for. Docker never falls back in silence: where it cannot
    run, the run fails and says how to opt in to the process backend. `report` hears what a
    Ray cluster's nodes do (lost, replaced)."""
    if limits.backend == "process":
        return ProcessSandbox(limits)
    if limits.backend == "ray":
        from evolve.ray_sandbox import RaySandbox  # ray is imported only by runs that use it

        return RaySandbox(limits, report)
    from evolve.docker_sandbox import DockerSandbox, DockerUnavailable

    try:
        return DockerSandbox(limits)
    except DockerUnavailable as exc:
        raise DockerUnavailable(f"{exc}. To run candidates without Docker, on this host and "
                                "without a jail, set sandbox.backend: process", exc.permanent) from None


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
        uid, lock = await _lease_uid() if self.drops else (None, None)
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
        user = {}
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
    for task in Path("/proc").glob("[0-9]*/task/[0-9]*"):
        try:
            status = (task / "status").read_text()
        except OSError:
            continue  # gone while we looked
        uids = next((line.split()[1:4] for line in status.splitlines() if line.startswith("Uid:")), [])
        if str(uid) in uids and "\nState:\tZ" not in status:
            found.add(int(task.parent.parent.name))
    return sorted(found)


def candidate_environment(workdir: str, path: str, limits: SandboxLimits) -> dict[str, str]:
    """Only what Python needs; never the engine's environment (API keys live there)."""
    threads = str(max(1, int(limits.cpus)))
    return {
        "PATH": path,
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": threads,
        "OPENBLAS_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "PYTHONDONTWRITEBYTECODE": "1",
    }


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


def append_results(buffer: bytearray, chunk: bytes, cap: int) -> str | None:
    """Add a chunk of the results stream: "overflow" past the cap, "done" at the final line.

    Stopping at the done line matters: forked workers of the candidate (e.g. a
    multiprocessing pool it never closed) still hold the pipe, so EOF would only come at
    the timeout. A forged early done line just ends the candidate's own run early.
    """
    scan_from = max(0, len(buffer) - len(DONE_LINE))  # the line may span two chunks
    buffer += chunk
    if len(buffer) > cap:
        del buffer[cap:]
        return "overflow"
    if DONE_LINE in buffer[scan_from:]:
        return "done"
    return None


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


def build_result(collected: Collected, cases: list[dict], log_tail: str,
                 limits: SandboxLimits, start: float) -> SandboxResult:
    """The strict reading of one harness run, the same for every backend."""
    names = [case["name"] for case in cases]
    outputs, case_errors, done = _parse_lines(collected.stdout, names)
    status, detail = _verdict(collected, done, limits)
    for name in names:
        if name not in outputs and name not in case_errors:
            case_errors[name] = f"no result ({detail or 'harness reported nothing'})"
    return SandboxResult(status, outputs, case_errors, log_tail, time.monotonic() - start, detail,
                         collected.program_s, collected.fault, collected.fault_permanent)


def _parse_lines(stdout: bytes, names: list[str]) -> tuple[dict, dict, bool]:
    """Untrusted lines -> (outputs, case_errors, done). Anything malformed is ignored."""
    wanted = set(names)
    outputs: dict[str, Any] = {}
    errors: dict[str, str] = {}
    for line in stdout.split(b"\n"):
        try:
            record = json.loads(line)
        except Exception:  # not JSON, or nested so deeply that the parser gives up
            continue
        if record == {"done": True}:
            return outputs, errors, True  # lines after the harness's last word do not count
        if not isinstance(record, dict) or len(record) != 2:
            continue
        name = record.get("case")
        if name not in wanted or name in outputs or name in errors:
            continue  # unknown case, or not the first line for it
        if "output" in record:
            outputs[name] = record["output"]
        elif isinstance(record.get("error"), str):
            errors[name] = record["error"][:MAX_CASE_ERROR_CHARS]
    return outputs, errors, False


def _verdict(collected: Collected, done: bool, limits: SandboxLimits) -> tuple[str, str]:
    extra = "; ".join(collected.extra)
    if not collected.started:
        return "error", extra
    if collected.overflow:
        return "error", f"output over {limits.output_kb} KB"
    if done:
        return "ok", extra
    if collected.timed_out:
        return "timeout", f"timed out after {limits.timeout_s:g} s"
    why = _describe_exit(collected.returncode, collected.oom_killed, limits)
    return "error", "; ".join(filter(None, [why, extra]))


def _describe_exit(returncode: int | None, oom_killed: bool | None = None,
                   limits: SandboxLimits | None = None) -> str:
    if returncode is None:
        return "harness did not finish"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = {"SIGXCPU": " (CPU time limit)", "SIGSEGV": " (crash in native code?)"}.get(name, "")
        if name == "SIGKILL":  # say what is known: only the Docker backend can tell
            memory = f" of {limits.memory_mb} MB" if limits else ""
            hint = {True: f" (out of memory: the memory limit{memory})",
                    False: " (not by the memory limit: by the candidate itself)",
                    None: " (the memory limit, or the candidate itself: this backend cannot tell)",
                    }[oom_killed]
        return f"killed by {name}{hint}"
    return f"harness exited with code {returncode} before finishing"


def _read_tail(path: Path) -> str:
    try:
        with open(path, "rb") as log:
            log.seek(0, os.SEEK_END)
            log.seek(max(0, log.tell() - LOG_TAIL_BYTES))
            return log.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
