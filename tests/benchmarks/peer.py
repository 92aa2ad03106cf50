"""Benchmark: this engine against OpenEvolve at equal wall time, model, server and seed program.

    python tests/benchmarks/peer.py problems/circle_packing.yaml --minutes 30 --seeds 0 1 2
    python tests/benchmarks/peer.py problems/circle_packing_ring.yaml --minutes 30 --seeds 0 1 2
    python tests/benchmarks/peer.py --report docs/benchmarks/peer/circle_packing

Each finished run leaves one small JSON (its best against time, evaluations, command, commit)
under --results (default docs/benchmarks/peer/PROBLEM), and the table is made from those files
alone: a session can run one engine and seed, commit its file, and the next adds another, since
run directories do not outlive their machine.

OpenEvolve (`openevolve` 0.4.0 from PyPI) is installed in a virtual environment of its own
(--venv, made on first use). Both engines get the problem's policy model on the same vLLM server
command (`evolve`'s own start-up of the embedded server), the problem's seed program and its
description, and the same wall time counted from launch, server start-up included. OpenEvolve
keeps its defaults except where this machine needs otherwise: the endpoint and model, LLM
timeouts long enough for a CPU (a 1.5B model's full answer takes minutes), no cascade (the judge
is one stage), four workers (`parallel_evaluations`, as its own example configurations set it:
each worker is one iteration, its LLM request included, and with the dataclass default of one
the server decodes a single sequence at about 5 tok/s where a batch makes 30-45), and the run
seed for its database only (see openevolve_config). Its children are scored by this
project's strict judge (peer_judge.py: the same sandbox and trusted scorer), whose verdicts give
its best against time. This engine's arm is `search.py`'s `evolve` arm.
"""
from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import yaml
from search import measure, run_arm  # a sibling script: run this one as tests/benchmarks/peer.py

from evolve.config import load_policy, load_problem
from evolve.serving.server import start_policy_server

HERE = Path(__file__).resolve().parent
OPENEVOLVE = "openevolve==0.4.0"
# The code a run ran: read at launch, since a commit made while it runs must not be credited to it.
COMMIT = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                        cwd=HERE).stdout.strip()

EVALUATOR = '''"""OpenEvolve's evaluator: the program scored by evolve's strict judge (peer_judge.py)."""
import json
import subprocess


def evaluate(program_path):
    out = subprocess.run([{python!r}, {judge!r}, {problem!r}, program_path, {log!r}],
                         capture_output=True, text=True, timeout=600)
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        return {{"combined_score": 0.0, "error": out.stderr[-500:]}}
    verdict = json.loads(lines[-1])
    return {{"combined_score": verdict["objective"], "headline": verdict["headline"] or 0.0}}
'''


def ensure_venv(venv: Path) -> Path:
    """OpenEvolve's own environment (its dependencies never touch this project's)."""
    runner = venv / "bin" / "openevolve-run"
    if not runner.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", OPENEVOLVE], check=True)
    return runner


def openevolve_config(problem, policy, base_url: str, seed: int) -> dict:
    """The run seed seeds OpenEvolve's database (its sampling of parents and islands), never its
    LLM requests: a seeded OpenEvolve sends one fixed seed with every request, so on a vLLM server
    the same prompt gets the same answer, and while its database holds only the seed program every
    prompt is the same. Measured: run seed 1, seeded so, failed its first diff and then wrote one
    answer of 2,134 tokens, never a valid diff, in each of its four later iterations
    (docs/benchmarks/generalization.md, Bar 3)."""
    s = policy.sampling
    model = {"name": policy.model, "api_base": base_url, "api_key": "EMPTY", "weight": 1.0}
    return {
        "max_iterations": 100000, "checkpoint_interval": 10, "random_seed": None, "language": "python",
        "llm": {"models": [model], "api_base": base_url, "api_key": "EMPTY", "temperature": s.temperature,
                "top_p": s.top_p, "max_tokens": 4096, "timeout": 1800, "retries": 1},
        "prompt": {"system_message": problem.description.strip()},
        "database": {"random_seed": seed},
        "evaluator": {"timeout": 900, "parallel_evaluations": 4, "cascade_evaluation": False},
    }


def run_openevolve(problem_path: Path, seed: int, minutes: float, out: Path, venv: Path) -> Path:
    run_dir = out / f"openevolve-s{seed}"
    if (run_dir / "done.json").exists():
        return run_dir
    runner = ensure_venv(venv)
    problem = load_problem(problem_path)
    policy = load_policy(problem.resolve(problem.policy)) if problem.policy else None
    assert policy is not None, f"{problem_path}: the peer runs the problem's own policy; it names none"
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "judge.jsonl"
    log.unlink(missing_ok=True)
    launch = time.time()  # the wall time counts from here: server start-up included, as for evolve
    with ExitStack() as stack:
        base_url, _, _ = start_policy_server(policy, run_dir, seed, stack)
        (run_dir / "initial.py").write_text(problem.seed_code())
        (run_dir / "evaluator.py").write_text(EVALUATOR.format(
            python=sys.executable, judge=str(HERE / "peer_judge.py"), problem=str(problem_path.resolve()),
            log=str(log.resolve())))
        (run_dir / "config.yaml").write_text(yaml.safe_dump(openevolve_config(problem, policy, base_url, seed)))
        cmd = [str(runner), str(run_dir / "initial.py"), str(run_dir / "evaluator.py"),
               "--config", str(run_dir / "config.yaml"), "--output", str(run_dir / "output")]
        print(f"[peer] openevolve seed {seed}: {' '.join(cmd)}", flush=True)
        with open(run_dir / "openevolve.log", "w") as out_log:
            proc = subprocess.Popen(cmd, stdout=out_log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                proc.wait(timeout=max(1.0, launch + minutes * 60 - time.time()))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGINT)  # its own checkpoint on the way out
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
    (run_dir / "done.json").write_text(json.dumps({"launch": launch, "minutes": minutes, "command": cmd}))
    return run_dir


def openevolve_curve(run_dir: Path, minutes: float) -> dict:
    """Best headline against minutes from launch, from the judge's verdicts (the seed first)."""
    launch = json.loads((run_dir / "done.json").read_text())["launch"]
    lines = (run_dir / "judge.jsonl").read_text().splitlines()
    verdicts = sorted((json.loads(line) for line in lines if line), key=lambda v: v["t"])  # 4 workers append
    best, curve = None, []
    for v in verdicts:
        t = (v["t"] - launch) / 60
        if t > minutes:
            break
        if v["status"] == "ok" and (best is None or v["objective"] > best[0]):
            best = (v["objective"], v["headline"])
            curve.append((t, v["headline"], v["objective"]))
    return {"best_headline": best[1] if best else None, "best_objective": best[0] if best else None,
            "curve": curve, "evaluations": sum((v["t"] - launch) / 60 <= minutes for v in verdicts)}


def summary(problem_path: Path, engine: str, seed: int, minutes: float, run_dir: Path) -> dict:
    """One finished run as the table needs it, small enough to commit."""
    r = measure(run_dir, minutes) if engine == "evolve" else openevolve_curve(run_dir, minutes)
    meta = json.loads((run_dir / ("bench.json" if engine == "evolve" else "done.json")).read_text())
    return {"problem": problem_path.stem, "engine": engine, "seed": seed, "minutes": minutes,
            "headline": load_problem(problem_path).headline, "commit": COMMIT,
            "command": " ".join(map(str, meta["command"])), "date": time.strftime("%Y-%m-%d"),
            "benchmark": f"python tests/benchmarks/peer.py {problem_path} --minutes {minutes:g} --seeds {seed} "
                         f"--engines {engine}",
            **{k: r[k] for k in ("best_headline", "best_objective", "evaluations", "curve")}}


def report(results: Path) -> str:
    """The table of every run summarised under `results` (one JSON per engine and seed)."""
    runs = [json.loads(p.read_text()) for p in sorted(results.glob("*-s*.json"))]
    if not runs:
        sys.exit(f"[peer] {results}: no run summaries (ENGINE-sSEED.json) to report")
    headline, minutes = runs[0]["headline"], runs[0]["minutes"]
    by = {(r["engine"], r["seed"]): r for r in runs}
    cell = lambda r: "-" if r is None or r["best_headline"] is None else f"{r['best_headline']:.4f}"  # noqa: E731
    count = lambda r: "-" if r is None else str(r["evaluations"])  # noqa: E731
    rows = []
    for seed in sorted({seed for _, seed in by}):
        ours, peer = by.get(("evolve", seed)), by.get(("openevolve", seed))
        rows.append(f"| {seed} | {cell(ours)} | {count(ours)} | {cell(peer)} | {count(peer)} |")
    lines = [f"| seed | evolve: best {headline} at {minutes:g} min | evolve evaluations | "
             f"OpenEvolve: best {headline} | OpenEvolve evaluations |", "|---|---|---|---|---|", *rows, ""]
    for engine in ("evolve", "openevolve"):
        v = [r["best_headline"] for (e, _), r in by.items() if e == engine and r["best_headline"] is not None]
        if v:
            lines.append(f"- median best {headline} of {engine} over {len(v)} seed(s): {statistics.median(v):.4f}")
    lines.append("- commands: " + "; ".join(f"`{r['benchmark']}` ({r['commit']}, {r['date']})" for r in runs))
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("problem", nargs="?", type=Path)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--engines", nargs="+", default=["evolve", "openevolve"], choices=["evolve", "openevolve"])
    ap.add_argument("--venv", type=Path, default=Path("runs/peer-venv"))
    ap.add_argument("--out", type=Path, help="run directories; default: runs/peer-PROBLEM")
    ap.add_argument("--results", type=Path, help="run summaries; default: docs/benchmarks/peer/PROBLEM")
    ap.add_argument("--report", type=Path, help="only print the table of the summaries in REPORT")
    args = ap.parse_args()
    if args.report:
        print(report(args.report))
        return
    out = args.out or Path("runs") / f"peer-{args.problem.stem}"
    results = args.results or HERE.parents[1] / "docs" / "benchmarks" / "peer" / args.problem.stem
    results.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        for engine in args.engines:
            if engine == "evolve":
                run_dir = run_arm(args.problem, "evolve", seed, args.minutes, out, None, [])
            else:
                run_dir = run_openevolve(args.problem, seed, args.minutes, out, args.venv)
            found = summary(args.problem, engine, seed, args.minutes, run_dir)
            (results / f"{engine}-s{seed}.json").write_text(json.dumps(found, indent=1) + "\n")
    print(report(results))


if __name__ == "__main__":
    main()
