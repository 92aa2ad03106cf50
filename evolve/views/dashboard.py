"""The live terminal dashboard: the panels of evolve/views/panels.py, run two ways.

- `LiveDashboard` is what `evolve run` shows on a terminal: the run's events feed its
  recent-events panel (instead of being printed) and a thread redraws the screen from its
  own read-only connection.
- `attach()` is `evolve dashboard RUN_DIR`: the same screen for a running or finished run,
  from another terminal; events come from RUN_DIR/events.jsonl.
"""
from __future__ import annotations

import io
import os
import select
import sys
import threading
import time
from collections import deque
from pathlib import Path

from rich.console import Console

from evolve.events import Event
from evolve.views.panels import View, screen, stacked, summary_line, waiting
from evolve.views.snapshot import RunReader, Snapshot

REFRESH_S = 1.0  # one frame a second: the clock ticks, and the CPU cost stays ~1 % (see benchmarks)
EVENT_LINES = 200  # events kept for the recent-events panel
# ---- events: from the running engine, or from events.jsonl --------------------------------------
class EventTail:
    """Follows RUN_DIR/events.jsonl (older runs: the plain evolve.log) without re-reading it."""

    def __init__(self, run_dir: Path, keep: int = EVENT_LINES):
        self.path = Path(run_dir) / "events.jsonl"
        self.log = Path(run_dir) / "evolve.log"
        self.events: deque[Event] = deque(maxlen=keep)
        self.offset = 0
        self.partial = b""
        self.from_log = False

    def poll(self) -> deque:
        if self.path.exists():
            self._read_new()
        elif not self.from_log and self.log.exists():  # a run from before events.jsonl existed
            self.from_log = True
            for line in _tail_lines(self.log, 64 * 1024):
                self.events.append(Event("log", line, time=self.log.stat().st_mtime))
        return self.events

    def _read_new(self) -> None:
        size = self.path.stat().st_size
        if size < self.offset:  # truncated or replaced: start over
            self.offset, self.partial = 0, b""
        if self.offset == 0:
            self.offset = max(size - 256 * 1024, 0)  # the recent past is enough
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = self.partial + f.read()
            self.offset = f.tell()
        *lines, self.partial = data.split(b"\n")
        for line in lines:
            try:
                self.events.append(Event.from_json(line.decode()))
            except (ValueError, KeyError):
                continue  # the first line after seeking into the file is usually cut


def _tail_lines(path: Path, nbytes: int) -> list[str]:
    with open(path, "rb") as f:
        f.seek(max(path.stat().st_size - nbytes, 0))
        return [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()][-EVENT_LINES:]


# ---- keyboard ----------------------------------------------------------------------------------
class Keys:
    """Single key presses from a terminal (cbreak: no echo, no Enter; Ctrl-C still interrupts)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stdin
        self.saved = None

    def __enter__(self) -> "Keys":
        try:
            import termios
            import tty
            # a background job (`evolve run ... &`) must not touch the terminal: SIGTTOU would stop it
            if self.stream.isatty() and os.tcgetpgrp(self.stream.fileno()) == os.getpgrp():
                self.fd = self.stream.fileno()
                self.saved = termios.tcgetattr(self.fd)
                tty.setcbreak(self.fd)
        except (ImportError, OSError, ValueError, io.UnsupportedOperation):
            self.saved = None
        return self

    def read(self, timeout: float) -> str:
        """A pressed key, or "" after `timeout` seconds."""
        if self.saved is None:
            time.sleep(timeout)
            return ""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        return os.read(self.fd, 32).decode(errors="ignore") if ready else ""

    def __exit__(self, *exc) -> None:
        if self.saved is not None:
            import termios
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self.saved)


# ---- `evolve dashboard RUN_DIR` ---------------------------------------------------------------
ATTACH_HINT = "keys: g switch grid view · q quit (read-only: the run is not affected)"


def attach(run_dir: Path, spec: dict, once: bool = False, refresh: float = REFRESH_S,
           console: Console | None = None) -> int:
    console = console or Console()
    refresh = max(refresh, 0.1)
    reader = RunReader(run_dir, spec)
    tail = EventTail(run_dir)
    view = View()
    try:
        if once or not console.is_terminal:
            snap = reader.snapshot()
            events = tail.poll()
            console.print(stacked(snap, events, view) if snap else waiting(str(run_dir), events))
            return 0
        return _attach_live(reader, tail, view, console, refresh)
    finally:
        reader.close()


def _attach_live(reader: RunReader, tail: EventTail, view: View, console: Console, refresh: float) -> int:
    from rich.live import Live

    def frame():
        snap = reader.snapshot()
        events = tail.poll()
        return screen(snap, events, view, ATTACH_HINT) if snap else waiting(str(reader.run_dir), events)

    with Keys() as keys, Live(frame(), console=console, screen=True, auto_refresh=False,
                              redirect_stdout=False, redirect_stderr=False) as live:
        try:
            while True:
                key = keys.read(refresh)
                if "q" in key.lower():
                    break
                if "g" in key.lower():
                    view.cycle(len(reader.acc.islands) or 1)
                live.update(frame(), refresh=True)
        except KeyboardInterrupt:
            pass
    return 0


# ---- `evolve run` on a terminal ----------------------------------------------------------------
RUN_HINT = "keys: g switch grid view · Ctrl-C stops the run (`evolve resume` continues it)"


class _Capture(io.TextIOBase):
    """Stands in for stdout/stderr while the screen is live: lines become events, kept for later."""

    def __init__(self, feed):
        self.feed, self.buffer, self.lines = feed, "", []

    def write(self, data: str) -> int:
        self.buffer += data
        *done, self.buffer = self.buffer.split("\n")
        for line in done:
            if line.strip():
                self.lines.append(line)
                self.feed(Event("output", line))
        return len(data)

    def flush(self) -> None:
        pass


class LiveDashboard:
    """`with LiveDashboard(run_dir, spec) as sink:` - the EventLog's sink while the screen is live."""

    def __init__(self, run_dir: Path, spec: dict, refresh: float = REFRESH_S, console: Console | None = None):
        self.reader = RunReader(run_dir, spec)
        self.events: deque[Event] = deque(maxlen=EVENT_LINES)
        self.view = View()
        self.refresh = refresh
        self.stopping = threading.Event()
        self.real_out, self.real_err = sys.stdout, sys.stderr
        self.console = console or Console(file=self.real_out)
        self.capture = _Capture(self.events.append)
        self.last_error = ""
        self.last: Snapshot | None = None  # for the summary line at the end

    def sink(self, event: Event) -> None:
        self.events.append(event)  # deque.append is atomic: safe from the engine's thread

    def __enter__(self):
        from rich.live import Live

        self.live = Live(self._frame(), console=self.console, screen=True, auto_refresh=False,
                         redirect_stdout=False, redirect_stderr=False)
        self.thread = threading.Thread(target=self._loop, name="dashboard", daemon=True)
        try:
            self.live.start(refresh=True)
        except BaseException:  # Ctrl-C while the first frame is drawn: give the terminal back first
            self.live.stop()
            raise
        sys.stdout = sys.stderr = self.capture  # a stray print must not tear the screen
        self.thread.start()
        return self.sink

    def _frame(self):
        events = list(self.events)  # a copy: the engine's thread appends while we draw
        try:
            snap = self.reader.snapshot()
        except Exception as exc:  # the view must never take the run down
            message = f"dashboard: {type(exc).__name__}: {exc}"
            if message != self.last_error:  # once, not once a second
                self.events.append(Event("error", message))
                self.last_error = message
            snap = None
        if snap is not None:
            self.last = snap
            return screen(snap, events, self.view, RUN_HINT)
        return waiting(str(self.reader.run_dir), events, RUN_HINT)

    def _loop(self) -> None:
        with Keys() as keys:
            while not self.stopping.is_set():
                key = keys.read(self.refresh)
                if "g" in key.lower():
                    self.view.cycle(len(self.reader.acc.islands) or 1)
                if not self.stopping.is_set():
                    self.live.update(self._frame(), refresh=True)

    def __exit__(self, *exc) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)
        sys.stdout, sys.stderr = self.real_out, self.real_err
        try:
            if not self.thread.is_alive():  # (else it is still reading: the reader is not ours to use)
                self.live.update(self._frame(), refresh=True)  # the final state, however short the last second
        finally:  # even on a second Ctrl-C
            self.live.stop()  # leaves the alternate screen: the terminal is as it was
        for line in self.capture.lines:
            print(line, file=self.real_err)
        if self.last is not None:
            print(summary_line(self.last), file=self.real_out)
        self.reader.close()


def wants_dashboard(no_dashboard: bool) -> bool:
    """The live screen needs a terminal; pipes and logs get one line per event instead."""
    return not no_dashboard and sys.stdout.isatty() and os.environ.get("TERM") != "dumb"

