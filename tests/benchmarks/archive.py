"""Benchmark: parent sampling and insertion with 100k programs stored (target <= 1 ms each).

    python tests/benchmarks/archive.py [--programs 100000] [--ops 2000]
"""
import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from evolve.config import Descriptor, Search
from evolve.database import ProgramDatabase, code_hash
from evolve.schema import Program

AXES = [Descriptor(name="radius_cv", low=0, high=0.6, bins=8),
        Descriptor(name="border_share", low=0, high=1, bins=8)]
CODE = "import numpy as np\n# EVOLVE-BLOCK-START\n" + "x = 1\n" * 40 + "# EVOLVE-BLOCK-END\n"


def program(rng, island, i) -> Program:
    obj = float(rng.random())
    code = CODE + f"# {i}\n"
    return Program(island=island, origin="mutation", status="ok", objective=obj, headline=obj,
                   fitness={f"n{n}": obj for n in range(26, 33)}, code=code, code_hash=code_hash(code),
                   descriptors={"radius_cv": float(rng.random() * 0.6), "border_share": float(rng.random())})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--programs", type=int, default=100_000)
    ap.add_argument("--ops", type=int, default=2000)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    search = Search(islands=4)
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        db = ProgramDatabase.open(url, "bench", "", "", 0, AXES, search, "bench")
        t0 = time.perf_counter()
        for start in range(0, args.programs, 5000):  # bulk fill through the normal tell path's rows
            for i in range(start, min(start + 5000, args.programs)):
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
        for k in range(args.ops):
            db.ask(k % 4, rng)
        ask_ms = (time.perf_counter() - t0) / args.ops * 1e3
        t0 = time.perf_counter()
        for k in range(args.ops):
            db.tell(program(rng, k % 4, args.programs + k))
        tell_ms = (time.perf_counter() - t0) / args.ops * 1e3
        print(f"programs stored: {db.count()}  (fill {fill:.1f} s, reopen/rebuild index {reopen:.2f} s)")
        print(f"ask  (parent + inspirations): {ask_ms:.3f} ms/op")
        print(f"tell (insert + commit + cell): {tell_ms:.3f} ms/op")


if __name__ == "__main__":
    main()
