"""The run directory: the one place that reads, writes and locks its files.

    run.json     what `evolve resume` needs to go on: problem, --set overrides, policy, seed,
                 database URL (None: evolve.db in this directory), run name, budget overrides
    run.lock     held by the one process that runs it
    evolve.db    the archive, unless run.json names another database
    events.jsonl, vllm.log, adapters/ ... written by the parts that own them

Also how a session can end (`Stop`): the controller writes these, the CLI, `evolve suite` and
`evolve compare` read them.
"""
from __future__ import annotations

import fcntl
import json
import os
import uuid
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

RUN_FILE = "run.json"
LOCK_FILE = "run.lock"
DB_FILE = "evolve.db"


class RunDirError(Exception):
    """Not a run directory, or one another process runs (one line for the user)."""


class InspectError(Exception):
    """A run cannot be read, or the thing asked for is not in it (one line for the user)."""


class Stop(StrEnum):
    """Why a session ended; anything else a session records is a fault's one line."""
    BUDGET = "budget reached"
    LLM_CALLS = "llm call budget reached"
    WALL_TIME = "wall time reached"
    TARGET = "target reached"
    INTERRUPTED = "interrupted"
    NOTHING_TO_TUNE = "nothing left to tune"


FINISHED = frozenset(Stop)  # ended by itself or by the user, not by a fault
DONE = frozenset({Stop.BUDGET, Stop.LLM_CALLS, Stop.TARGET})  # the budget is spent: nothing to resume


@dataclass(frozen=True)
class RunDir:
    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    @property
    def spec_file(self) -> Path:
        return self.path / RUN_FILE

    def exists(self) -> bool:
        return self.spec_file.exists()

    @classmethod
    def create(cls, path: Path, problem: Path, sets: list[str], policy: Path, seed: int,
               db_url: str | None = None, budget: dict | None = None) -> "RunDir":
        """A new run directory with its run.json."""
        run = cls(path)
        run.path.mkdir(parents=True, exist_ok=True)
        run._write({"problem": str(Path(problem).resolve()), "set": list(sets),
                    "policy": str(Path(policy).resolve()), "seed": seed,
                    # None: evolve.db inside the run directory, wherever it is moved or copied to
                    "db_url": db_url, "run_name": run_name(run.path, db_url), "budget": dict(budget or {})})
        return run

    def stored(self) -> dict:
        """run.json as written (`db_url` None for the directory's own database)."""
        if not self.exists():
            raise RunDirError(f"{self.path}: not a run directory (no {RUN_FILE})")
        return json.loads(self.spec_file.read_text())

    def spec(self) -> dict:
        """run.json with the database URL and run name resolved: what a session opens."""
        spec = self.stored()
        spec["db_url"] = self.database_url(spec)
        spec.setdefault("run_name", self.path.resolve().name)
        return spec

    def database_url(self, spec: dict | None = None) -> str:
        """The run's database URL; a SQLite file moved along with its run directory is still found."""
        from sqlalchemy.engine import make_url

        url = (self.stored() if spec is None else spec).get("db_url")
        if not url:
            return f"sqlite:///{(self.path / DB_FILE).resolve()}"
        u = make_url(url)
        if u.get_backend_name() == "sqlite" and u.database:
            moved = self.path / Path(u.database).name
            if not Path(u.database).exists() and moved.exists():
                return f"sqlite:///{moved.resolve()}"
        return url

    def update_budget(self, budget: dict) -> dict:
        """Budget overrides (None: unchanged) are remembered: a later resume keeps a raised budget."""
        stored = self.stored()
        changes = {k: v for k, v in budget.items() if v is not None and stored["budget"].get(k) != v}
        if changes:
            stored["budget"].update(changes)
            self._write(stored)
        return self.spec()

    def _write(self, spec: dict) -> None:
        """Atomically: `evolve compare` and the dashboard read it while a run is going."""
        tmp = self.path / (RUN_FILE + ".tmp")
        tmp.write_text(json.dumps(spec, indent=2) + "\n")
        tmp.replace(self.spec_file)

    def lock(self):
        """One process at a time per run directory: two writers would interleave their searches.
        The kernel drops the lock (the open file, closed by `with`) when the process dies, however."""
        lock = open(self.path / LOCK_FILE, "a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            owner = lock.read().strip() or "another process"
            lock.close()
            raise RunDirError(f"{self.path} is already being run by {owner}; "
                              f"watch it with `evolve dashboard {self.path}`") from None
        try:  # who holds it, for the message above; on a full disk it stays unsaid
            os.ftruncate(lock.fileno(), 0)
            os.pwrite(lock.fileno(), f"pid {os.getpid()}\n".encode(), 0)
        except OSError:
            pass
        return lock


def run_name(run_dir: Path, db_url: str | None) -> str:
    """The run's name in its database: the directory's own database holds one run; a shared
    one (--db-url) holds many, so the name gets a random suffix (two `runs/x/run` must differ)."""
    name = Path(run_dir).resolve().name
    return name if db_url is None else f"{name}-{uuid.uuid4().hex[:8]}"
