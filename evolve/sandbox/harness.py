"""Run one candidate program inside the sandbox and report its outputs as JSON lines.

Standalone on purpose (standard library only, no `evolve` imports): the sandbox copies this
file next to the candidate, in the process backend's temp dir or in a Docker container.

    python -I harness.py  < {"program": "candidate.py", "entry_point": "construct_packing",
                             "cases": [{"name": "n26", "args": {"n": 26}}, ...]}

A case may also carry "driver": the source of the problem's trusted driver, which defines
drive(entry, **args); the harness then calls that instead of entry(**args) (code problems use
it to run their test cases against the candidate and send back what it returned).

For every case it writes one line to its ORIGINAL stdout, flushed at once so the lines that
arrived survive a timeout:
    {"case": "n26", "output": <plain data>}   or   {"case": "n26", "error": "<reason>"}
and finally {"done": true}. The candidate's own prints (fd 1 and fd 2) go to candidate.log.

Why forged lines are harmless: the candidate runs in this very process, so it could find the
private results fd and write lines of its own. That gives it no power it does not already
have: a line only carries plain data, exactly what returning that data would carry, and the
trusted side re-scores every output from the data alone (and counts only the first line per
case). The candidate never reports a score that anybody believes.
"""
import importlib.util
import json
import os
import random
import signal
import sys
import traceback

LOG_NAME = "candidate.log"
MAX_ERROR_CHARS = 2000
MAX_DEPTH = 64  # deeper nesting is not a packing; also stops tolist() cycles


class NotPlainData(Exception):
    pass


def to_plain(value, depth=0):
    """Lists, dicts with str keys, numbers, str, None; numpy values through .tolist()."""
    if depth > MAX_DEPTH:
        raise NotPlainData("output is nested too deeply")
    # Exact base types: a subclass could carry behaviour (e.g. a custom __repr__).
    for base in (bool, int, float, str):
        if isinstance(value, base):
            return base(value)
    if value is None:
        return None
    if isinstance(value, (list, tuple)):
        return [to_plain(item, depth + 1) for item in value]
    if isinstance(value, dict) and all(isinstance(key, str) for key in value):
        return {str(key): to_plain(item, depth + 1) for key, item in value.items()}
    if callable(getattr(value, "tolist", None)):  # numpy arrays and scalars
        return to_plain(value.tolist(), depth + 1)
    raise NotPlainData(f"output is not plain data: {type(value).__name__}")


def describe(exc):
    """'Type: message' plus the last lines of the traceback, bounded."""
    if isinstance(exc, NotPlainData):
        return str(exc)  # our own message; a traceback into the harness would only confuse
    try:
        head = f"{type(exc).__name__}: {exc}"
        tb = exc.__traceback__
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next  # drop the harness's own frame
        trace = "".join(traceback.format_exception(type(exc), exc, tb))
    except BaseException:  # a hostile __str__ must not take the harness down
        head, trace = type(exc).__name__, ""
    return f"{head}\n{trace[-(MAX_ERROR_CHARS // 2):]}"[:MAX_ERROR_CHARS]


def redirect_output():
    """Keep the real stdout for results only; send fd 1 and fd 2 to the log.

    os.dup() makes a non-inheritable fd, so programs the candidate exec()s never hold the
    results pipe; they inherit fd 1 and 2, which now point at the log.
    """
    results = os.fdopen(os.dup(1), "w", encoding="utf-8")
    log_fd = os.open(LOG_NAME, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    sys.stdout.reconfigure(line_buffering=True)  # the log tail stays useful after a kill
    return results


def load_candidate(path):
    spec = importlib.util.spec_from_file_location("candidate", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["candidate"] = module
    spec.loader.exec_module(module)
    return module


def seed_randomness():
    """Every case starts from the same random state, so that a candidate drawing from `random`
    or numpy's global generator without a seed of its own scores the same each time it is run:
    its score reproduces, and one lucky draw cannot carry a program into the archive.
    (Measured: the best child of a 1.5B sampling run jittered its start with `np.random`.)
    A generator the candidate makes itself, e.g. `np.random.default_rng()`, stays its own."""
    random.seed(0)
    numpy = sys.modules.get("numpy")  # only where the candidate uses it: no import of our own
    if numpy is not None:
        numpy.random.seed(0)


def run_case(function, case):
    """entry(**args), or drive(entry, **args) when the problem has a trusted driver."""
    try:
        seed_randomness()  # inside: a candidate may have replaced numpy's seed() with a trap
        if "driver" in case:
            namespace = {"__name__": "driver"}
            exec(compile(case["driver"], "driver.py", "exec"), namespace)
            return {"output": to_plain(namespace["drive"](function, **case["args"]))}
        return {"output": to_plain(function(**case["args"]))}
    except BaseException as exc:  # SystemExit and friends are the candidate's failure too
        if isinstance(exc, KeyboardInterrupt):
            raise
        return {"error": describe(exc)}


def emit(results, record):
    try:
        line = json.dumps(record, allow_nan=True)  # NaN/inf pass; the trusted scorer rejects them
    except BaseException as exc:  # e.g. an int too long to print
        line = json.dumps({"case": record.get("case"), "error": describe(exc)})
    results.write(line + "\n")
    results.flush()


def main():
    # -I ignores PYTHONDONTWRITEBYTECODE, so say it here: no __pycache__ in the work dir.
    sys.dont_write_bytecode = True
    # Past RLIMIT_FSIZE a write should fail with EFBIG (an error in the candidate's print),
    # not kill the whole harness with SIGXFSZ.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    spec = json.loads(sys.stdin.buffer.read())  # blocks until the sandbox has set the limits
    results = redirect_output()
    cases = spec["cases"]
    try:
        seed_randomness()  # draws at import time reproduce too
        function = getattr(load_candidate(spec["program"]), spec["entry_point"])
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            raise
        failure = describe(exc)
        for case in cases:
            emit(results, {"case": case["name"], "error": failure})
    else:
        for case in cases:
            emit(results, {"case": case["name"], **run_case(function, case)})
    emit(results, {"done": True})
    # Skip interpreter shutdown: atexit hooks and non-daemon threads of the candidate
    # must not keep the process alive after the results are out.
    os._exit(0)


if __name__ == "__main__":
    main()
