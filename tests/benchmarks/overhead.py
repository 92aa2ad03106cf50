"""Benchmark: share of a run's wall time spent outside LLM calls and candidate execution.

Reads the run's own timing records (sessions, llm_calls, evaluations):
    python tests/benchmarks/overhead.py RUN_DIR
Also prints the run's figures: valid-mutation rate, evaluations per minute, tokens/s, best
headline versus the seed's. Target: overhead < 2 % of the wall time.
"""
import sys
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from evolve.rundir import RunDir
from evolve.store.database import connect
from evolve.store.schema import Evaluation, LLMCall
from evolve.store.schema import Session as RunSession
from evolve.views.report import summary


def union_length(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def main(run_dir: Path) -> None:
    spec = RunDir(run_dir).spec()
    with Session(connect(spec["db_url"])) as s:
        sessions = [(r.started_at, r.ended_at) for r in s.scalars(select(RunSession)) if r.ended_at]
        busy = [(c.started_at, c.started_at + c.latency_s) for c in s.scalars(select(LLMCall))
                if c.latency_s is not None]
        busy += [(e.started_at, e.started_at + e.elapsed_s) for e in s.scalars(select(Evaluation))]
        wall = sum(b - a for a, b in sessions)
        inside = sum(union_length([(max(x, a), min(y, b)) for x, y in busy if y > a and x < b])
                     for a, b in sessions)
        info = summary(s)
        evals = s.query(Evaluation).count()
    print(f"wall time {wall:.1f} s over {len(sessions)} session(s); LLM or candidate busy {inside:.1f} s")
    print(f"engine overhead: {wall - inside:.2f} s = {(wall - inside) / wall:.2%} of wall time")
    best, seed = info["best"], info["seed"]
    rate = info["valid_mutation_rate"]
    print(f"valid-mutation rate {rate:.1%} of {info['answers']} answers; "
          f"{evals / (wall / 60):.1f} evaluations/min; "
          f"{info['tokens'] / wall:.1f} LLM tokens/s of wall time "
          f"({info['tokens'] / info['llm_s']:.1f} per call in flight) over {info['llm_calls']} calls")
    print(f"best headline {best.headline:.6f} (#{best.id}) vs seed {seed.headline:.6f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
