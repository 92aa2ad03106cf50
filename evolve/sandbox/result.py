"""What every sandbox backend shares: the harness it runs, the plain data one harness run sends
back (`Collected`), and the strict parse of that into a `SandboxResult`. Nothing the candidate
made is ever unpickled or executed here."""
from __future__ import annotations

import json
import signal
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


