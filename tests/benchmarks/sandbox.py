"""Benchmark: what a sandbox adds to one evaluation, backend by backend.

    python tests/benchmarks/sandbox.py [--runs 20] [--cold-runs 5]

Two candidates: a trivial one (one case, returns 1) and the circle-packing seed (numpy,
seven cases). For each, the wall time of one evaluation (median and 90th percentile, ms):
  bare (image)     the harness run directly by a python loop inside one container: the
                   program alone, same interpreter, libraries and limits as the pool
  warm pool        DockerSandbox.run on a warm pool (what the engine pays)
  cold docker run  `docker run --rm -i` of a fresh container per evaluation, with the same
                   isolation flags and the same launcher (includes the docker CLI's start)
  bare (host)      the harness run directly by the engine's python in a temp dir
  process backend  ProcessSandbox.run
Target: the warm pool adds <= 20 ms over the bare run in the image. On a busy machine the
rows above drift with the load, so the added time is also measured pairwise: per warm-pool
evaluation, its wall time minus the harness process's own run time as the launcher measured
it (fork to exit) inside the container.
"""
import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evolve.config import SandboxLimits, load_problem
from evolve.sandbox.docker import (
    CONTAINER_COMMAND,
    WORK_TMPFS,
    DockerSandbox,
    docker_unavailable_reason,
)
from evolve.sandbox.image import image_tag
from evolve.sandbox.process import ProcessSandbox
from evolve.sandbox.result import (
    FILE_SIZE_LIMIT,
    HARNESS_SOURCE,
    LOG_TAIL_BYTES,
    Collected,
    SandboxUnavailable,
    append_results,
    build_result,
    candidate_environment,
)

ROOT = Path(__file__).resolve().parents[2]
LIMITS = SandboxLimits(timeout_s=60, memory_mb=1024, cpus=1)

# Runs inside a container: times `python3 -I -c HARNESS < spec` n times, prints the times.
BARE_DRIVER = """
import json, os, subprocess, sys, tempfile, time
job = json.loads(sys.stdin.read())
times = []
for _ in range(job["runs"]):
    work = tempfile.mkdtemp(dir="/work")
    with open(os.path.join(work, "candidate.py"), "w") as program:
        program.write(job["code"])
    start = time.monotonic()
    subprocess.run(["python3", "-I", "-c", job["harness"]], input=job["spec"].encode(),
                   cwd=work, env=job["env"], stdout=subprocess.DEVNULL, check=True)
    times.append(time.monotonic() - start)
print(json.dumps(times))
"""


def candidates() -> dict[str, tuple[str, str, list[dict]]]:
    problem = load_problem(ROOT / "problems" / "circle_packing.yaml")
    seed = problem.resolve(problem.program).read_text()
    cases = [{"name": c.name, "args": c.args} for c in problem.components]
    return {"trivial": ("def f():\n    return 1\n", "f", [{"name": "a", "args": {}}]),
            "numpy seed": (seed, problem.entry_point, cases)}


def isolation_flags() -> list[str]:
    """The pool's container settings, as docker run flags."""
    return ["--network", "none", "--read-only", "--cap-drop", "ALL", "--cap-add", "SETUID",
            "--cap-add", "SETGID", "--security-opt", "no-new-privileges",
            "--tmpfs", f"/work:{WORK_TMPFS}",
            "--memory", f"{LIMITS.memory_mb}m", "--memory-swap", f"{LIMITS.memory_mb}m",
            "--cpus", str(LIMITS.cpus), "--pids-limit", str(LIMITS.pids),
            "--ulimit", "core=0", "--ulimit", "nofile=256:256", "--log-driver", "none"]


def bare_in_image(code: str, entry: str, cases: list[dict], runs: int) -> list[float]:
    job = {"runs": runs, "code": code, "harness": HARNESS_SOURCE,
           "env": candidate_environment("/work", "/usr/local/bin:/usr/bin:/bin", LIMITS),
           "spec": json.dumps({"program": "candidate.py", "entry_point": entry, "cases": cases})}
    command = ["docker", "run", "--rm", "-i", "--user", "65534:65534", *isolation_flags(),
               image_tag(), "python3", "-c", BARE_DRIVER]
    done = subprocess.run(command,
                          input=json.dumps(job).encode(), capture_output=True, check=True)
    return json.loads(done.stdout)


def cold_docker_run(code: str, entry: str, cases: list[dict]) -> float:
    """One evaluation in a brand-new container: start, one request to the launcher, exit."""
    start = time.monotonic()
    request = {"program": "candidate.py", "entry_point": entry, "cases": cases, "code": code,
               "env": candidate_environment("/work", "/usr/local/bin:/usr/bin:/bin", LIMITS),
               "log_limit": FILE_SIZE_LIMIT, "log_tail": LOG_TAIL_BYTES}
    done = subprocess.run(["docker", "run", "--rm", "-i", *isolation_flags(), image_tag(),
                           *CONTAINER_COMMAND], input=json.dumps(request).encode() + b"\n",
                          capture_output=True, check=True)
    results, report = bytearray(), {}
    stream = done.stdout
    while stream:  # the launcher's frames: kind, 4-byte size, payload
        kind, size = stream[:1], int.from_bytes(stream[1:5], "big")
        payload, stream = stream[5:5 + size], stream[5 + size:]
        if kind == b"R":
            append_results(results, payload, LIMITS.output_kb * 1024)
        elif kind == b"E":
            report = json.loads(payload)
    result = build_result(Collected(stdout=bytes(results), returncode=report.get("exit")),
                          cases, "", LIMITS, start)
    assert result.status == "ok" and not result.case_errors, result
    return time.monotonic() - start


def bare_on_host(code: str, entry: str, cases: list[dict], runs: int) -> list[float]:
    spec = json.dumps({"program": "candidate.py", "entry_point": entry, "cases": cases}).encode()
    times = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory() as work:
            Path(work, "candidate.py").write_text(code)
            Path(work, "harness.py").write_text(HARNESS_SOURCE)
            start = time.monotonic()
            subprocess.run([sys.executable, "-I", "harness.py"], input=spec, cwd=work,
                           stdout=subprocess.DEVNULL, check=True)
            times.append(time.monotonic() - start)
    return times


async def through(sandbox, code: str, entry: str, cases: list[dict], runs: int,
                  added: list[float] | None = None) -> list[float]:
    times = []
    for _ in range(runs):
        result = await sandbox.run(code, entry, cases)
        assert result.status == "ok" and not result.case_errors, result
        times.append(result.elapsed_s)
        if added is not None:
            added.append(result.elapsed_s - result.program_s)
    return times


def summary(times: list[float]) -> str:
    ordered = sorted(times)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"{statistics.median(ordered) * 1000:7.1f} ms (p90 {p90 * 1000:6.1f})"


async def main(runs: int, cold_runs: int) -> None:
    if reason := docker_unavailable_reason():
        sys.exit(f"cannot benchmark the Docker sandbox: {reason}")
    pool = DockerSandbox(LIMITS, warm=2)
    try:
        process = ProcessSandbox(LIMITS)
    except SandboxUnavailable as exc:  # as root, with a Python the candidate uid cannot run
        print(f"process backend: not measured ({exc})")
        process = None
    try:
        for name, (code, entry, cases) in candidates().items():
            await through(pool, code, entry, cases, 2)  # warm-up: the pool, the page cache
            added = []
            rows = {
                "bare (image)": bare_in_image(code, entry, cases, runs),
                "warm pool": await through(pool, code, entry, cases, runs, added),
                "cold docker run": [cold_docker_run(code, entry, cases) for _ in range(cold_runs)],
                "bare (host)": bare_on_host(code, entry, cases, runs),
            }
            if process is not None:
                rows["process backend"] = await through(process, code, entry, cases, runs)
            print(f"\n{name} ({len(cases)} case(s)), median of {runs} runs ({cold_runs} cold):")
            for label, times in rows.items():
                print(f"  {label:16s} {summary(times)}")
            print(f"  warm pool adds {summary(added)} to the harness's own run (paired; "
                  "target <= 20 ms)")
    finally:
        pool.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--cold-runs", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.cold_runs))
