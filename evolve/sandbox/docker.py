"""Run untrusted candidate code in locked-down Docker containers from a warm pool.

Pool containers are started ahead of need. Each runs, under tini, a small launcher
(evolve/sandbox/launcher.py) that the engine talks to over the container's attached
stdin/stdout: per evaluation one request line in; the harness's results and a final report
out. The launcher forks and execs a fresh harness (evolve/sandbox/harness.py) per candidate, as
uid/gid 65534, so an evaluation costs a process start, not a `docker exec` (whose runc
start-up alone is 45-90 ms on a 2-core machine).

Every pool container has:
  - no network (network mode "none": a loopback interface with nothing listening on it);
  - a read-only root filesystem; a small tmpfs work dir, /work (noexec);
  - memory (no swap), CPU and pids limits from SandboxLimits;
  - every capability dropped except CAP_SETUID/CAP_SETGID, which only the launcher (root)
    holds and uses to become 65534; no-new-privileges; Docker's default seccomp profile;
  - a 16 MB cap on each file the candidate writes (its log included), results capped at
    output_kb, and the wall-clock timeout enforced here, by killing the container.
The engine's environment never enters the container; the harness gets a minimal one.

Nothing persists between candidates. After each harness exits, the launcher (which the
candidate can neither signal nor ptrace) kills every process of uid 65534 in any state and
checks every thread in /proc; a helper running as 65534 resets the mode of /work, empties
/work, /dev/shm and /dev/mqueue and checks SysV IPC; and every writable mount must have the
owner and mode it started with. Only then is the container lent again; anything it cannot
prove clean, a timeout, output over the cap or a lost connection gets it killed and
replaced. A failure of the launcher itself (it could not start the harness) is retried in a
fresh container and, if it persists, is a sandbox fault: never the candidate's result.

Docker going away: a failing engine call makes the evaluation an `error` whose detail says
so; dead containers are replaced as they are met, so the pool rebuilds itself once the
engine is back. Pool containers carry a label naming their owner process; close() (also run
at exit) removes them. If the engine process dies, the containers' stdin closes, their
launchers exit and Docker removes them (auto-remove); the next DockerSandbox removes any
labelled leftovers of dead owners.
"""
from __future__ import annotations

import asyncio
import json
import os
import select
import socket
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import docker
import requests
from docker.types import LogConfig, Ulimit

from evolve.config import SandboxLimits
from evolve.sandbox.image import image_tag
from evolve.sandbox.result import (
    DRAIN_S,
    FILE_SIZE_LIMIT,
    HARNESS_SOURCE,
    LOG_TAIL_BYTES,
    Collected,
    SandboxResult,
    SandboxUnavailable,
    append_results,
    build_result,
    candidate_environment,
)

LAUNCHER_SOURCE = (Path(__file__).parent / "launcher.py").read_text()
CONTAINER_COMMAND = ["/usr/bin/tini", "-s", "--",
                     "python3", "-I", "-c", LAUNCHER_SOURCE, HARNESS_SOURCE]
LABEL = "evolve.sandbox.process"  # its value names the owner: host:pid:process start time
WORKDIR = "/work"
CONTAINER_PATH = "/usr/local/bin:/usr/bin:/bin"
WORK_TMPFS_MB = 64
WORK_TMPFS = f"rw,nosuid,nodev,noexec,size={WORK_TMPFS_MB}m,uid=65534,gid=65534,mode=0700"
SHM_MB = 64
WARM_CONTAINERS = 2  # started ahead; the pool grows to the number of evaluations in flight
MAX_CONTAINERS = 16
API_TIMEOUT_S = 30  # a hung engine fails the evaluation after this long
START_TIMEOUT_S = 60  # from create to the launcher's hello
ACQUIRE_TIMEOUT_S = 120  # waiting for a free container (starts are slow on a busy host)
ACQUIRE_POLL_S = 0.002
STDOUT = 1  # stream id in Docker's multiplexed attach stream (2 is stderr)
ENGINE_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException, OSError)


CONTAINER_RETRIES = 2  # a container that dies mid-run (not by our hand) is tried again this often


class DockerUnavailable(SandboxUnavailable):
    """The Docker engine cannot be used (not reachable, image missing, no container)."""


def connect(base_url: str | None = None, timeout: float = API_TIMEOUT_S) -> docker.DockerClient:
    """A client for base_url, or for the environment's engine (DOCKER_HOST, the default socket)."""
    if base_url:
        return docker.DockerClient(base_url=base_url, timeout=timeout)
    return docker.from_env(timeout=timeout)


def docker_unavailable_reason(base_url: str | None = None, image: str | None = None) -> str | None:
    """None if candidates can run in Docker here; otherwise a one-line reason."""
    try:
        client = connect(base_url)
    except ENGINE_ERRORS as exc:
        return f"no Docker engine reachable ({short_error(exc)})"
    try:
        missing = image_missing(client, image or image_tag())
        return str(missing) if missing else None
    finally:
        client.close()


def image_missing(client: docker.DockerClient, image: str) -> DockerUnavailable | None:
    """None if the image is there; otherwise why not (permanent: it is not built)."""
    try:
        client.images.get(image)
        return None
    except docker.errors.ImageNotFound:
        return DockerUnavailable(f"the sandbox image {image} is not built (run `evolve sandbox build`)",
                                 permanent=True)
    except ENGINE_ERRORS as exc:
        return DockerUnavailable(f"no Docker engine reachable ({short_error(exc)})")


class DockerSandbox:
    """Same interface as ProcessSandbox: `await run(code, entry_point, cases)`."""

    backend = "docker"

    def __init__(self, limits: SandboxLimits, *, base_url: str | None = None,
                 image: str | None = None, warm: int = WARM_CONTAINERS):
        self.limits = limits
        self.image = image or image_tag()
        try:
            self._client = connect(base_url)
        except ENGINE_ERRORS as exc:
            raise DockerUnavailable(f"no Docker engine reachable ({short_error(exc)})") from None
        if missing := image_missing(self._client, self.image):
            raise missing
        try:
            remove_leftovers(self._client)
        except ENGINE_ERRORS:
            pass  # best effort: a leftover costs memory, not correctness
        self._pool = _Pool(self._client, self._container_config(), warm)
        # Each evaluation holds a thread for its socket I/O; a pool of our own keeps long
        # evaluations from starving asyncio.to_thread users of the default executor.
        self._io = ThreadPoolExecutor(MAX_CONTAINERS, thread_name_prefix="evolve-docker-io")
        self._environment = candidate_environment(WORKDIR, CONTAINER_PATH, limits)
        self._closer = weakref.finalize(self, _shut_down, self._pool, self._io)  # also at exit
        self._pool.fill()

    def close(self) -> None:
        """Remove every container of the pool (safe to call twice)."""
        self._closer()

    async def run(self, code: str, entry_point: str, cases: list[dict]) -> SandboxResult:
        start = time.monotonic()
        request = json.dumps({"program": "candidate.py", "entry_point": entry_point,
                              "cases": cases, "code": code, "env": self._environment,
                              "log_limit": FILE_SIZE_LIMIT, "log_tail": LOG_TAIL_BYTES})
        for attempt in range(CONTAINER_RETRIES + 1):
            try:
                box = await self._pool.acquire()
            except DockerUnavailable as exc:
                failed = Collected(started=False, extra=[str(exc)], fault=str(exc), fault_permanent=exc.permanent)
                return build_result(failed, cases, "", self.limits, start)
            talk = await self._converse(box, request.encode() + b"\n")
            # A container killed under the candidate (a dockerd restart, `docker kill`) tells
            # nothing about it: try again in a fresh one. Only dying every time is its doing.
            # The launcher failing to start the harness is never the candidate's doing.
            if not (talk.died or talk.fault) or attempt == CONTAINER_RETRIES:
                break
        if talk.fault:
            talk.collected.fault = f"sandbox launcher: {talk.fault}"
        return build_result(talk.collected, cases, talk.log_tail, self.limits, start)

    async def _converse(self, box: _Box, request: bytes) -> _Talk:
        """One evaluation's traffic, then the container goes back to the pool or is replaced."""
        loop = asyncio.get_running_loop()
        try:
            talk = await loop.run_in_executor(self._io, self._talk, box, request)
        except BaseException:  # cancelled: the engine is shutting down
            box.close()  # ends the I/O thread at once
            await asyncio.to_thread(self._pool.kill, box)
            raise
        if talk.reusable:
            self._pool.release(box)
            return talk
        if talk.lost:
            why, cause = await asyncio.to_thread(self._why_lost, box, talk.lost)
            talk.collected.extra.append(why)
            if cause == "engine":
                talk.collected.fault = why
            else:  # unless the harness had finished, or the candidate ran the container out of memory
                talk.died = not talk.done and cause != "oom"
        # Killed now, so a runaway candidate stops using CPU before the next evaluation.
        await asyncio.to_thread(self._pool.kill, box)
        return talk

    def _talk(self, box: _Box, request: bytes) -> _Talk:
        """Blocking I/O for one evaluation; the wall-clock timeout starts here."""
        talk = _Talk()
        deadline = time.monotonic() + self.limits.timeout_s
        cap = self.limits.output_kb * 1024
        results = bytearray()
        done = False
        try:
            box.send(request, deadline)
            while True:
                kind, payload = box.frame(deadline)
                if kind == b"R" and not done:
                    ending = append_results(results, payload, cap)
                    if ending == "overflow":
                        talk.collected.overflow = True
                        break
                    if ending == "done":  # the report follows at once, unless the candidate
                        done = True       # forged this line and keeps its harness running
                        deadline = min(deadline, time.monotonic() + DRAIN_S)
                elif kind == b"E":
                    talk.finish(json.loads(payload))
                    break
        except socket.timeout:
            talk.collected.timed_out = not done
        except (OSError, EOFError, ValueError) as exc:  # ValueError: a garbled report
            talk.lost = short_error(exc)
        talk.collected.stdout, talk.done = bytes(results), done
        return talk

    def _why_lost(self, box: _Box, error: str) -> tuple[str, str]:
        """The stream broke: why, and the cause: "engine" (gone), "oom" (the candidate's
        memory) or "died" (the container was killed under it)."""
        try:
            state = self._client.api.inspect_container(box.id)["State"]
        except docker.errors.NotFound:
            return "the sandbox container vanished mid-run", "died"
        except ENGINE_ERRORS:
            return f"lost the Docker engine mid-run ({error})", "engine"
        launcher = box.errors.decode(errors="replace").strip()[-500:]
        return (f"the sandbox container stopped mid-run (status {state.get('Status')}, "
                f"exit code {state.get('ExitCode')}, OOM killed {state.get('OOMKilled')})"
                + (f": {launcher}" if launcher else "")), "oom" if state.get("OOMKilled") else "died"

    def _container_config(self) -> dict:
        """Arguments of the low-level create_container (the high-level API hides StdinOnce)."""
        limits = self.limits
        memory = f"{limits.memory_mb}m"
        host_config = self._client.api.create_host_config(
            auto_remove=True,
            network_mode="none", read_only=True,
            tmpfs={WORKDIR: WORK_TMPFS},
            ipc_mode="private", shm_size=f"{SHM_MB}m",
            mem_limit=memory, memswap_limit=memory,  # equal: no swap
            nano_cpus=int(limits.cpus * 1e9), pids_limit=limits.pids,
            cap_drop=["ALL"], cap_add=["SETUID", "SETGID"], security_opt=["no-new-privileges"],
            ulimits=[Ulimit(name="core", soft=0, hard=0),
                     Ulimit(name="nofile", soft=256, hard=256)],
            log_config=LogConfig(type="none"),  # everything it says comes over the attach stream
        )
        return dict(
            image=self.image, command=CONTAINER_COMMAND, labels={LABEL: owner_id()},
            hostname="sandbox", environment={}, user="0:0",  # the launcher; candidates: 65534
            # Attached stdin that closes when our attachment does (StdinOnce, which the SDK
            # sets for non-detached containers): if the engine dies, the launcher exits.
            stdin_open=True, detach=False, host_config=host_config)


@dataclass
class _Talk:
    """One evaluation's outcome, as far as the engine saw it."""
    collected: Collected = field(default_factory=Collected)
    log_tail: str = ""
    reusable: bool = False  # the launcher reported and found the container clean
    lost: str = ""  # why the stream broke, if it did
    done: bool = False  # the harness sent its last line
    died: bool = False  # the container died under a candidate that had not finished
    fault: str = ""  # the launcher's own machinery failed (e.g. it could not start the harness)

    def finish(self, report: dict) -> None:
        self.collected.returncode = report.get("exit")
        self.collected.program_s = report.get("run_s")
        self.collected.oom_killed = _oom(report.get("oom_kills"))
        self.fault = str(report.get("fault") or "")
        self.log_tail = str(report.get("log_tail", ""))[-LOG_TAIL_BYTES:]
        self.reusable = report.get("clean") is True
        if report.get("why"):
            self.collected.extra.append(f"sandbox container replaced: {report['why']}")


class _Box:
    """One pool container and the attached stream to its launcher."""

    def __init__(self, container_id: str, sock):
        self.id = container_id
        self._sock = sock  # keeps the SDK's response (and so the connection) alive
        self._raw: socket.socket = getattr(sock, "_sock", sock)
        self._pending = bytearray()  # launcher output not yet parsed into frames
        self.errors = bytearray()  # the tail of the launcher's stderr (its own crashes)

    def is_dead(self) -> bool:
        """An idle launcher says nothing: anything to read means its container went away."""
        try:
            readable, _, _ = select.select([self._raw], [], [], 0)
        except (OSError, ValueError):  # closed
            return True
        return bool(readable)

    def send(self, data: bytes, deadline: float) -> None:
        self._raw.settimeout(max(0.001, deadline - time.monotonic()))
        self._raw.sendall(data)

    def frame(self, deadline: float) -> tuple[bytes, bytes]:
        """The launcher's next frame: kind (1 byte), size (4 bytes, big-endian), payload."""
        while True:
            if len(self._pending) >= 5:
                end = 5 + int.from_bytes(self._pending[1:5], "big")
                if len(self._pending) >= end:
                    kind, payload = bytes(self._pending[:1]), bytes(self._pending[5:end])
                    del self._pending[:end]
                    return kind, payload
            stream, payload = self._docker_frame(deadline)
            if stream == STDOUT:
                self._pending += payload
            else:
                self.errors += payload
                del self.errors[:-2048]

    def _docker_frame(self, deadline: float) -> tuple[int, bytes]:
        """Docker's multiplexing: stream id, three zero bytes, size (4 bytes), payload."""
        header = self._read_exactly(8, deadline)
        return header[0], self._read_exactly(int.from_bytes(header[4:], "big"), deadline)

    def _read_exactly(self, size: int, deadline: float) -> bytes:
        data = bytearray()
        while len(data) < size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise socket.timeout("deadline")
            self._raw.settimeout(remaining)
            chunk = self._raw.recv(min(size - len(data), 1 << 16))
            if not chunk:
                raise EOFError("the sandbox container closed its stream")
            data += chunk
        return bytes(data)

    def close(self) -> None:
        # shutdown, not just close: the SDK's response still references the socket, and a
        # plain close() would leave the connection open (and the engine writing into it).
        steps = (lambda: self._raw.shutdown(socket.SHUT_RDWR), self._raw.close, self._sock.close)
        for step in steps:
            try:
                step()
            except OSError:
                pass


class _Pool:
    """Containers started ahead and lent out for one evaluation at a time.

    Thread-based (a lock and a few worker threads), so one pool serves any event loop.
    """

    def __init__(self, client: docker.DockerClient, config: dict, warm: int):
        self._client = client
        self._config = config
        self._warm = warm
        self._lock = threading.Lock()
        self._idle: list[_Box] = []
        self._starting = 0
        self._busy = 0  # lent out
        self._waiting = 0  # evaluations waiting for a container
        self._owned: set[str] = set()  # every container not yet removed
        self._doomed: set[str] = set()  # given up, removal not yet confirmed
        self._failure = ""  # why the last start failed
        self._failure_permanent = False  # the image is missing: no start will work until rebuilt
        self._failed_at = float("-inf")
        self._closed = False
        self._workers = ThreadPoolExecutor(4, thread_name_prefix="evolve-docker-pool")

    # ---- lending -------------------------------------------------------------------------
    async def acquire(self) -> _Box:
        began = time.monotonic()
        with self._lock:
            self._waiting += 1
        try:
            while True:
                with self._lock:
                    box = self._idle.pop() if self._idle else None
                if box is not None and box.is_dead():  # e.g. killed by a dockerd restart
                    self._forget(box)
                    continue
                if box is not None:
                    with self._lock:
                        self._busy += 1
                    return box
                with self._lock:
                    if self._failed_at > began:  # a start tried since we began has failed
                        raise DockerUnavailable(self._failure, permanent=self._failure_permanent)
                if time.monotonic() - began > ACQUIRE_TIMEOUT_S:
                    raise DockerUnavailable(
                        f"no sandbox container ready after {ACQUIRE_TIMEOUT_S} s")
                self.fill()
                await asyncio.sleep(ACQUIRE_POLL_S)
        finally:
            with self._lock:
                self._waiting -= 1

    def release(self, box: _Box) -> None:
        """After a run the launcher found clean: ready for the next candidate."""
        with self._lock:
            self._busy -= 1
            self._idle.append(box)

    def kill(self, box: _Box) -> None:
        """Replace a lent container: stop everything in it now (blocking), remove it later."""
        # Close our end first: the engine finishes a container's exit only once it has
        # delivered the container's output, and an end nobody reads would hold it (and
        # every API call about the container) until our client times out.
        box.close()
        try:
            self._client.api.kill(box.id)
        except ENGINE_ERRORS:
            pass  # already gone, or the engine is away: removal retries later
        with self._lock:
            self._busy -= 1
        self._forget(box)

    def _forget(self, box: _Box) -> None:
        box.close()
        with self._lock:
            self._doomed.add(box.id)
        self._submit(self._remove, box.id)
        self.fill()

    # ---- upkeep (worker threads) ---------------------------------------------------------
    def fill(self) -> None:
        """Start containers until the warm ones, the lent ones and the waiters are covered."""
        with self._lock:
            wanted = min(MAX_CONTAINERS, max(self._warm, self._busy + self._waiting))
            have = len(self._idle) + self._starting + self._busy
            missing = 0 if self._closed else max(0, wanted - have)
            self._starting += missing
        for _ in range(missing):
            self._submit(self._start_one)

    def _start_one(self) -> None:
        """Create, attach (before the start, so no output is missed), start, await hello."""
        container_id = box = None
        try:
            container_id = self._client.api.create_container(**self._config)["Id"]
            with self._lock:
                self._owned.add(container_id)
            box = _Box(container_id, self._client.api.attach_socket(
                container_id, params={"stdin": 1, "stdout": 1, "stderr": 1, "stream": 1}))
            self._client.api.start(container_id)
            kind, _ = box.frame(time.monotonic() + START_TIMEOUT_S)
            if kind != b"H":
                raise OSError(f"the launcher said {kind!r} instead of hello")
        except Exception as exc:  # noqa: BLE001 - a start that fails for any reason is reported
            with self._lock:
                self._starting -= 1
                self._failure = _start_failure(exc)
                self._failure_permanent = isinstance(exc, docker.errors.ImageNotFound)
                self._failed_at = time.monotonic()
            if box is not None:
                box.close()
            if container_id is not None:
                with self._lock:
                    self._doomed.add(container_id)
                self._remove(container_id)
            return
        with self._lock:
            self._starting -= 1
            self._idle.append(box)
            doomed = set(self._doomed)
        for leftover in doomed:  # the engine works again: clear what an outage left behind
            self._remove(leftover)

    def _remove(self, container_id: str) -> None:
        try:
            self._client.api.remove_container(container_id, force=True)
        except docker.errors.APIError as exc:
            if exc.status_code not in (404, 409):  # 404: gone; 409: auto-removal under way
                return
        except ENGINE_ERRORS:
            return  # stays doomed: retried when the engine is back, and at close()
        with self._lock:
            self._owned.discard(container_id)
            self._doomed.discard(container_id)

    def _submit(self, task, *args) -> None:
        try:
            self._workers.submit(task, *args)
        except RuntimeError:  # closed: close() removes what is left
            pass

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for box in idle:
            box.close()
        self._workers.shutdown(wait=True, cancel_futures=True)
        with self._lock:
            owned = set(self._owned)  # including any started while we waited
        for container_id in owned:
            self._remove(container_id)


def _shut_down(pool: _Pool, io: ThreadPoolExecutor) -> None:
    pool.close()
    io.shutdown(wait=False, cancel_futures=True)


# ---- owners and leftovers ----------------------------------------------------------------
def owner_id(pid: int | None = None) -> str:
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{_start_time(pid)}"


def _start_time(pid: int) -> str:
    """Field 22 of /proc/PID/stat: with the pid, it names one process even after pid reuse."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return "gone"


def remove_leftovers(client: docker.DockerClient) -> int:
    """Remove pool containers whose owner (an engine on this host) no longer runs."""
    removed = 0
    # The low-level list: the high-level one inspects each container and fails on any that
    # Docker auto-removes meanwhile.
    for container in client.api.containers(all=True, filters={"label": LABEL}):
        host, _, pid_start = (container.get("Labels") or {}).get(LABEL, "").partition(":")
        pid, _, start = pid_start.partition(":")
        if host != socket.gethostname() or not pid.isdigit():
            continue  # another machine's engine shares this Docker engine: not ours to judge
        if _start_time(int(pid)) != start:
            try:
                client.api.remove_container(container["Id"], force=True)
                removed += 1
            except docker.errors.APIError as exc:
                if exc.status_code not in (404, 409):  # gone, or being removed
                    raise
    return removed


# ---- messages ----------------------------------------------------------------------------
def _oom(kills) -> bool | None:
    """Whether the memory limit killed something during the run; None: the cgroup was unreadable."""
    return kills > 0 if isinstance(kills, int) and kills >= 0 else None


def _engine_gone(exc: BaseException) -> str:
    return (f"Docker engine unreachable ({short_error(exc)}); the sandbox pool is rebuilt "
            "when it is back")


def _start_failure(exc: BaseException) -> str:
    if isinstance(exc, (requests.exceptions.ConnectionError, ConnectionError, FileNotFoundError)):
        return _engine_gone(exc)
    if isinstance(exc, docker.errors.ImageNotFound):
        return f"the sandbox image is missing ({short_error(exc)}); run `evolve sandbox build`"
    return f"could not start a sandbox container: {short_error(exc)}"


def short_error(exc: BaseException | None) -> str:
    text = str(exc).splitlines()[0] if exc is not None and str(exc) else type(exc).__name__
    return text[:300]
