"""The live view of `evolve compare`: the run dashboard of the arm being run, under a header line
that says which arm it is and how far the whole comparison has got.

It reuses evolve/views/dashboard.py's screen and snapshot reader as they are: the arms run with
`--no-dashboard` in child processes, and this view reads each arm's database and events.jsonl
read-only, like `evolve dashboard RUN_DIR` does from another terminal. Key `a` shows the next
running arm (with --parallel), `g` switches the grid view; Ctrl-C stops the comparison.
"""
from __future__ import annotations

import threading
import time
from collections import deque

from rich.console import Console

from evolve.events import Event
from evolve.rundir import RunDir
from evolve.views.dashboard import REFRESH_S, EventTail, Keys
from evolve.views.panels import View, screen, waiting
from evolve.views.snapshot import RunReader

PROGRESS_EVERY_S = 5.0  # the overall count opens every arm's database: not on every frame


class ComparisonView:
    """`with ComparisonView(plan, arms) as view:` while arms run; `view.show(arm)`, `view.say(text)`."""

    def __init__(self, plan, arms, console: Console | None = None, refresh: float = REFRESH_S):
        self.plan, self.arms = plan, arms
        self.console = console or Console()
        self.refresh = refresh
        self.running: list = []  # arms in flight, in start order; the last one is shown first
        self.current = None
        self.notes: deque[Event] = deque(maxlen=100)  # the comparison's own messages
        self.view = View()
        self.readers: dict = {}
        self.stopping = threading.Event()
        self._progress, self._progress_at = "", 0.0

    # ---- fed by the harness ------------------------------------------------------------------
    def say(self, message: str) -> None:
        self.notes.append(Event("compare", message))  # deque.append is atomic: safe across threads

    def started(self, arm) -> None:
        self.running.append(arm)
        self.current = arm
        self._progress_at = 0.0

    def finished(self, arm) -> None:
        if arm in self.running:
            self.running.remove(arm)
        if self.current == arm and self.running:
            self.current = self.running[-1]
        self._progress_at = 0.0

    # ---- drawing -------------------------------------------------------------------------------
    def hint(self) -> str:
        from evolve.compare.plan import progress

        if time.time() - self._progress_at > PROGRESS_EVERY_S:
            done, total = progress(self.plan, self.arms)
            self._progress = f"overall {done}/{total} evaluations"
            self._progress_at = time.time()
        arm = self.current
        which = f"arm {arm.index + 1}/{len(self.arms)}: {arm.name}" if arm else "no arm running"
        more = f" · {len(self.running)} running (a: next)" if len(self.running) > 1 else ""
        return (f"compare {self.plan.dir.name} · {which}{more} · {self._progress} · "
                "Ctrl-C stops (`evolve compare --resume` continues)")

    def frame(self):
        hint = self.hint()
        arm = self.current
        if arm is None or not RunDir(arm.dir).exists():
            return waiting(str(self.plan.dir), list(self.notes), hint)
        reader, tail = self._reader(arm)
        snap = reader.snapshot() if reader.ready() else None
        events = sorted([*tail.poll(), *self.notes], key=lambda e: e.time)
        return screen(snap, events, self.view, hint) if snap else waiting(str(arm.dir), events, hint)

    def _reader(self, arm) -> tuple[RunReader, EventTail]:
        if arm.name not in self.readers:
            spec = RunDir(arm.dir).stored()
            self.readers[arm.name] = (RunReader(arm.dir, spec), EventTail(arm.dir))
        return self.readers[arm.name]

    def _safe_frame(self):
        try:
            return self.frame()
        except Exception as exc:  # the view must never take the comparison down
            self.say(f"view: {type(exc).__name__}: {exc}")
            return waiting(str(self.plan.dir), list(self.notes), "")

    # ---- the screen ----------------------------------------------------------------------------
    def __enter__(self) -> "ComparisonView":
        from rich.live import Live

        self.live = Live(self._safe_frame(), console=self.console, screen=True, auto_refresh=False,
                         redirect_stdout=False, redirect_stderr=False)
        self.live.start(refresh=True)
        self.thread = threading.Thread(target=self._loop, name="compare-view", daemon=True)
        self.thread.start()
        return self

    def _loop(self) -> None:
        with Keys() as keys:
            while not self.stopping.is_set():
                key = keys.read(self.refresh).lower()
                if "g" in key:
                    entry = self.readers.get(self.current.name) if self.current else None
                    self.view.cycle((len(entry[0].acc.islands) if entry else 0) or 1)
                if "a" in key and self.running:
                    i = self.running.index(self.current) if self.current in self.running else -1
                    self.current = self.running[(i + 1) % len(self.running)]
                if not self.stopping.is_set():
                    self.live.update(self._safe_frame(), refresh=True)

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)
        self.live.stop()  # leaves the alternate screen: the terminal is as it was
        for note in self.notes:  # what the comparison said stays readable afterwards
            print(note.line(), flush=True)
        for reader, _ in self.readers.values():
            reader.close()
