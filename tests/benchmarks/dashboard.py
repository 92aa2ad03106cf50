"""Benchmark: the live dashboard's CPU cost on a large archive (target: < 5 % of one core).

    python tests/benchmarks/dashboard.py [--programs 200000] [--seconds 60] [--refresh 1.0]

Builds a run database with --programs programs (plus their evaluations, LLM calls, cells),
then runs the real `LiveDashboard` of `evolve run` (its refresh thread, the read-only
reader and the rich screen, drawn to /dev/null at 160x50) for --seconds while a separate
writer process keeps adding programs at a live run's pace (--rate per second, stored
pending then scored, as the engine does). Reports the first snapshot's time (reading the
whole archive once) and the share of a core the dashboard used in the steady state.
"""
import argparse
import multiprocessing
import os
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from sqlalchemy import insert, update

from evolve.archive import cell_of
from evolve.config import load_problem
from evolve.store.database import ProgramDatabase, connect
from evolve.store.schema import Cell, Evaluation, LLMCall, Program
from evolve.store.schema import Session as RunSession
from evolve.views.dashboard import LiveDashboard
from evolve.views.panels import screen
from evolve.views.snapshot import RunReader

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = ROOT / "problems" / "circle_packing.yaml"
STATUSES = ["ok", "invalid", "error", "timeout", "mutation_failed"]
WEIGHTS = [0.3, 0.15, 0.15, 0.02, 0.38]


def program_row(rng, i: int, now: float, axes, status=None) -> dict:
    status = status or str(rng.choice(STATUSES, p=WEIGHTS))
    row = {"id": i, "run_id": 1, "island": i % 4, "parent_id": None, "generation": 1 + i // 1000,
           "origin": "mutation", "status": status, "created_at": now, "completion_id": None,
           "code": None if status == "mutation_failed" else f"x = {i}\n", "objective": None, "headline": None,
           "fitness": None, "raw": None, "descriptors": None, "cell": None}  # same keys in every row: one executemany
    if status == "ok":
        obj = float(rng.beta(5, 2))
        desc = {"radius_cv": float(rng.random() * 0.6), "border_share": float(rng.random())}
        row.update(objective=obj, headline=2.6 * obj, fitness={f"n{n}": obj for n in range(26, 33)},
                   raw={f"n{n}": 2.6 * obj for n in range(26, 33)}, descriptors=desc, cell=cell_of(desc, axes))
    return row


def build(url: str, programs: int) -> None:
    problem = load_problem(PROBLEM)
    db = ProgramDatabase.open(url, "bench", PROBLEM.read_text(), (ROOT / "policies" / "frozen.yaml").read_text(),
                              0, problem.descriptors, problem.search, problem.name)
    db.close()
    engine = connect(url)
    rng = np.random.default_rng(0)
    start = time.time() - programs * 0.5  # half a second per program, ending now
    elites: dict = {}
    with engine.begin() as conn:
        conn.execute(insert(RunSession), [{"run_id": 1, "started_at": start}])  # open: a live run
        for lo in range(1, programs + 1, 20_000):
            rows = [program_row(rng, i, start + i * 0.5, problem.descriptors) for i in range(lo, min(lo + 20_000, programs + 1))]
            conn.execute(insert(Program), rows)
            evals = [{"program_id": r["id"], "backend": "docker", "status": r["status"],
                      "started_at": r["created_at"], "elapsed_s": 0.4} for r in rows if r["status"] != "mutation_failed"]
            conn.execute(insert(Evaluation), evals)
            calls = [{"id": r["id"] // 8 + 1, "run_id": 1, "island": r["island"], "parent_id": 1, "policy_version": 0,
                      "model": "m", "prompt": "", "n": 8, "completion_tokens": 2000, "prompt_tokens": 3000,
                      "started_at": r["created_at"] - 30, "latency_s": 30.0} for r in rows if r["id"] % 8 == 0]
            conn.execute(insert(LLMCall), calls)
            for r in rows:
                if r["status"] == "ok" and r["objective"] > elites.get((r["island"], r["cell"]), (0, -1))[1]:
                    elites[(r["island"], r["cell"])] = (r["id"], r["objective"])
        conn.execute(insert(Cell), [{"run_id": 1, "island": isl, "cell": cell, "program_id": pid, "objective": obj}
                                    for (isl, cell), (pid, obj) in elites.items()])
    engine.dispose()


def writer(url: str, first_id: int, rate: float, stop) -> None:
    """A live run's writes: a child stored pending, then scored (and an evaluation row)."""
    problem = load_problem(PROBLEM)
    engine = connect(url)
    rng = np.random.default_rng(1)
    i = first_id
    while not stop.is_set():
        now = time.time()
        row = program_row(rng, i, now, problem.descriptors)
        final = {k: row.pop(k) for k in ("status", "objective", "headline", "fitness", "raw", "descriptors", "cell")
                 if k in row}
        with engine.begin() as conn:
            conn.execute(insert(Program), [{**row, "status": "pending"}])
        time.sleep(0.5 / rate)
        with engine.begin() as conn:
            conn.execute(update(Program).where(Program.id == i).values(**final))
            if final["status"] != "mutation_failed":
                conn.execute(insert(Evaluation), [{"program_id": i, "backend": "docker", "status": final["status"],
                                                   "started_at": now, "elapsed_s": 0.4}])
        i += 1
        time.sleep(0.5 / rate)
    engine.dispose()


def cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", type=int, default=200_000)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--refresh", type=float, default=1.0)
    ap.add_argument("--rate", type=float, default=2.0, help="programs per second the writer adds")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "bench"
        run_dir.mkdir()
        url = f"sqlite:///{run_dir / 'evolve.db'}"
        t0 = time.perf_counter()
        build(url, args.programs)
        print(f"built {args.programs} programs in {time.perf_counter() - t0:.1f} s "
              f"({(run_dir / 'evolve.db').stat().st_size / 2**20:.0f} MiB)")
        spec = {"db_url": url, "run_name": "bench", "budget": {"max_evaluations": args.programs * 2}}

        reader = RunReader(run_dir, spec)
        t0, c0 = time.perf_counter(), cpu_s()
        snap = reader.snapshot()
        print(f"first snapshot (reads the whole archive once): {time.perf_counter() - t0:.2f} s wall, "
              f"{cpu_s() - c0:.2f} s CPU")
        t0 = time.perf_counter()
        for _ in range(20):
            snap = reader.snapshot()
        print(f"later snapshot, nothing new: {(time.perf_counter() - t0) / 20 * 1e3:.1f} ms")
        console = Console(file=open(os.devnull, "w"), force_terminal=True, width=160, height=50)
        t0 = time.perf_counter()
        for _ in range(20):
            console.print(screen(snap, [], None, "keys"))
        print(f"one frame drawn (160x50): {(time.perf_counter() - t0) / 20 * 1e3:.1f} ms")
        reader.close()

        stop = multiprocessing.Event()
        proc = multiprocessing.Process(target=writer, args=(url, args.programs + 1, args.rate, stop))
        proc.start()
        dash = LiveDashboard(run_dir, spec, refresh=args.refresh, console=console)
        with dash:
            time.sleep(args.refresh * 3)  # past the first, whole-archive read
            t0, c0 = time.perf_counter(), cpu_s()
            time.sleep(args.seconds)
            wall, cpu = time.perf_counter() - t0, cpu_s() - c0
            seen = dash.reader.acc.last_program
        stop.set()
        proc.join()
        print(f"steady state: {cpu:.2f} s CPU in {wall:.1f} s at one frame per {args.refresh:g} s "
              f"= {cpu / wall:.2%} of a core (writer added {seen - args.programs} programs meanwhile)")


if __name__ == "__main__":
    main()
