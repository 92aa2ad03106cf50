"""What the engine tells its user while it runs: one structured event per thing that happened.

The controller and the RL hook only emit events; a sink decides how they are shown (a plain
log line on a non-terminal, the live dashboard on a terminal) and `evolve.log` keeps them all,
so `evolve dashboard RUN_DIR` can show a run's recent events from another terminal.
"""
from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

# kinds: run, sandbox, seed, resume, progress, best, migration, llm_error, training, adapter, stop,
# outages (evolve.faults): llm_down/_retry/_up, llm_restart, sandbox_down/_retry/_up,
# database_down/_retry/_up; fault; llm_endpoint: one of several policy endpoints out or back
PARTS = {"llm": "policy server", "sandbox": "sandbox", "database": "database server"}  # outage kinds' parts
KINDS = ("run", "sandbox", "seed", "resume", "progress", "best", "migration", "llm_error",
         "training", "adapter", "stop", "llm_down", "llm_retry", "llm_up", "llm_restart",
         "sandbox_down", "sandbox_retry", "sandbox_up", "database_down", "database_retry", "database_up",
         "fault", "llm_endpoint")


# C0 and C1 control characters but newline and tab (ESC starts screen clears and OSC 52
# clipboard writes), and the bidirectional overrides that reorder what a reader sees.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """Text that came from a candidate or the LLM, safe to put on a terminal."""
    return _CONTROL.sub("\ufffd", text)


@dataclass
class Event:
    kind: str
    message: str  # one human-readable line
    fields: dict[str, Any] = field(default_factory=dict)  # the same facts, machine-readable
    time: float = field(default_factory=time.time)

    def line(self) -> str:
        """logfmt: `HH:MM:SS kind message | key=value ...`, greppable and still readable."""
        stamp = time.strftime("%H:%M:%S", time.localtime(self.time))
        pairs = " ".join(f"{k}={_fmt(v)}" for k, v in self.fields.items())
        return printable(f"{stamp} {self.kind:<9} {self.message}" + (f" | {pairs}" if pairs else ""))

    def to_json(self) -> str:
        return json.dumps({"time": self.time, "kind": self.kind, "message": self.message,
                           "fields": self.fields}, default=str)

    @classmethod
    def from_json(cls, text: str) -> "Event":
        d = json.loads(text)
        return cls(kind=d["kind"], message=d["message"], fields=d.get("fields", {}), time=d["time"])


Sink = Callable[[Event], None]


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    text = str(value)
    return json.dumps(text) if (" " in text or not text) else text


def print_sink(event: Event) -> None:
    print(event.line(), flush=True)


class EventLog:
    """Keeps every event of a run in the run directory and passes it on to a sink.

    `evolve.log` holds the human lines, `events.jsonl` the same events for programs (the
    dashboard attaching from another terminal reads it).
    """

    def __init__(self, run_dir, sink: Sink = print_sink):
        self.sink = sink
        self.human = open(f"{run_dir}/evolve.log", "a")
        self.machine = open(f"{run_dir}/events.jsonl", "a")
        self.failed = False

    def __call__(self, event: Event) -> None:
        if not self.failed:
            for f, text in ((self.human, event.line()), (self.machine, event.to_json())):
                try:
                    f.write(text + "\n")
                    f.flush()
                except OSError as exc:
                    # e.g. the disk is full: raised once, so the run stops (evolve.faults); the
                    # events of the stop itself still reach the screen.
                    self.failed = True
                    self._close()
                    raise OSError(exc.errno, exc.strerror, f.name) from exc
        self.sink(event)

    def __enter__(self) -> "EventLog":
        return self

    def __exit__(self, *exc) -> None:
        self._close()

    def _close(self) -> None:
        for f in (self.human, self.machine):
            try:
                f.close()
            except OSError:  # its last buffered line could not be written: the disk is full
                pass
