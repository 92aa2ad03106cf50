"""Benchmark: parent sampling and insertion with 100k programs stored (target <= 1 ms each),
on a SQLite file and on a throwaway PostgreSQL server on this machine (tests/postgres.py).

    python tests/benchmarks/archive.py [--programs 100000] [--ops 2000] [--backends sqlite postgresql]
"""
import argparse
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from evolve.config import Descriptor, Search
from evolve.store.database import ProgramDatabase, code_hash
from evolve.store.schema import Program

AXES = [Descriptor(name="radius_cv", low=0, high=0.6, bins=8),
        Descriptor(name="border_share", low=0, high=1, bins=8)]
CODE = "import numpy as np\n# EVOLVE-BLOCK-START\n" + "x = 1\n" * 40 + "# EVOLVE-BLOCK-END\n"


def program(rng, island, i) -> Program:
    obj = float(rng.random())
    code = CODE + f"# {i}\n"
    return Program(island=island, origin="mutation", status="ok", objective=obj, headline=obj,
                   fitness={f"n{n}": obj for n in range(26, 33)}, code=code, code_hash=code_hash(code),
                   descriptors={"radius_cv": float(rng.random() * 0.6), "border_share": float(rng.random())})


def measure(url: str, programs: int, ops: int) -> None:
    rng = np.random.default_rng(0)
    search = Search(islands=4)
    db = ProgramDatabase.open(url, "bench", "", "", 0, AXES, search, "bench")
    t0 = time.perf_counter()
    for start in range(0, programs, 5000):  # bulk fill through the normal tell path's rows
        for i in range(start, min(start + 5000, programs)):
            p = program(rng, i % 4, i)
            p.run_id = db.run_id
            db.session.add(p)
            db.session.flush()
            db._place(p)
        db.session.commit()
    fill = time.perf_counter() - t0
    db.close()
    t0 = time.perf_counter()
    db = ProgramDatabase.open(url, "bench", "", "", 0, AXES, search, "bench")
    reopen = time.perf_counter() - t0

    t0 = time.perf_counter()
    for k in range(ops):
        db.ask(k % 4, rng)
    ask_ms = (time.perf_counter() - t0) / ops * 1e3
    t0 = time.perf_counter()
    for k in range(ops):
        db.tell(program(rng, k % 4, programs + k))
    tell_ms = (time.perf_counter() - t0) / ops * 1e3
    print(f"programs stored: {db.count()}  (fill {fill:.1f} s, reopen/rebuild index {reopen:.2f} s)")
    print(f"ask  (parent + inspirations): {ask_ms:.3f} ms/op")
    print(f"tell (insert + commit + cell): {tell_ms:.3f} ms/op")
    db.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", type=int, default=100_000)
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"], choices=["sqlite", "postgresql"])
    args = ap.parse_args()
    for backend in args.backends:
        with ExitStack() as stack:
            if backend == "sqlite":
                url = f"sqlite:///{Path(stack.enter_context(tempfile.TemporaryDirectory())) / 'bench.db'}"
            else:  # a server on loopback with PostgreSQL's durable defaults (fsync on)
                sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
                from postgres import PostgresServer
                url = stack.enter_context(PostgresServer(fsync=True)).new_database()
            print(f"== {backend}")
            measure(url, args.programs, args.ops)


if __name__ == "__main__":
    main()
