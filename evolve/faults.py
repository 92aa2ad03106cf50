"""What a run does when a part it depends on fails: the policy server, the sandbox, the disk,
the database. (The policy server's own retries and restarts: evolve/serving/link.py.)

- A failure of our own machinery is never blamed on a candidate nor stored as a rollout: the
  request or the evaluation is made again once the part is back.
- The user is told once when a part goes down, at each retry, and once when it is back
  (events `<part>_down`, `<part>_retry`, `<part>_up`); the dashboard shows an outage while it lasts.
- What waiting does not fix (a full disk, a database locked for too long, a missing sandbox
  image, a part that stays down too long) stops the run with one line (`Fault`): every
  committed row is kept and `evolve resume` goes on from there.
"""
from __future__ import annotations

import errno
import time
from typing import Callable

from evolve.events import PARTS, Event

BACKOFF_FIRST_S = 1.0
BACKOFF_CAP_S = 60.0
FAULT_EXIT = 75  # EX_TEMPFAIL: stopped by a fault; `evolve resume` once it is fixed
# A server database that went away (restarted, network) is waited for, up to this long; the
# run then resumes in the same process (evolve/run.py).
DATABASE_AWAY = "the database server went away"
DATABASE_WAIT_S = 600.0


class Fault(Exception):
    """A part of the run failed in a way waiting does not fix: stop cleanly, resumable."""


class SandboxFault(Exception):
    """The sandbox could not run a candidate (not the candidate's doing): evaluate it later."""

    def __init__(self, reason: str, permanent: bool = False):
        super().__init__(reason)
        self.permanent = permanent  # e.g. the image is missing: waiting will not bring it back


def fault_of(exc: BaseException) -> str | None:
    """One line for an environment failure that must stop the run, or None (a bug: re-raise)."""
    from sqlalchemy.exc import OperationalError

    if isinstance(exc, Fault):
        return str(exc)
    if database_away(exc):
        return f"{DATABASE_AWAY} ({one_line(getattr(exc, 'orig', None) or exc)}); nothing was lost"
    if isinstance(exc, OperationalError):
        text = str(exc.orig)
        if "locked" in text or "busy" in text:
            return f"the database is locked by another process ({text}); nothing was lost"
        if "full" in text:
            return f"disk full: the database could not be written ({text}); free some space"
        return f"the database failed ({text})"
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"disk full: {exc.filename or 'a run file'} could not be written; free some space"
    return None


def database_away(exc: BaseException) -> bool:
    """The database server closed our connection or refuses new ones: waiting can fix that
    (SQLite, a file, never goes away like this)."""
    from sqlalchemy.exc import DBAPIError

    if not isinstance(exc, DBAPIError):
        return False
    driver = type(exc.orig).__module__.split(".")[0]
    return exc.connection_invalidated or (driver == "psycopg" and "connect" in str(exc.orig).lower())


def wait_for_database(url: str, report: Callable[[Event], None], limit_s: float = DATABASE_WAIT_S) -> bool:
    """Until the database answers again (True), telling the user as an outage; False after
    `limit_s` (the run then stays stopped, resumable)."""
    from sqlalchemy import create_engine
    from sqlalchemy.exc import OperationalError
    from sqlalchemy.pool import NullPool

    engine, outage, started = create_engine(url, poolclass=NullPool), Outage("database", report), time.time()
    try:
        while True:
            try:
                with engine.connect():
                    outage.recovered()
                    return True
            except OperationalError as exc:
                delay = outage.failed(one_line(exc.orig or exc))
                if time.time() - started + delay > limit_s:
                    return False
                time.sleep(delay)
    finally:
        engine.dispose()


def backoff(attempt: int) -> float:
    """1, 2, 4, ... seconds, at most a minute: quick when a blip, quiet when a long outage."""
    return min(BACKOFF_CAP_S, BACKOFF_FIRST_S * 2 ** max(attempt - 1, 0))


class Outage:
    """One part's current outage, told to the user as events."""

    def __init__(self, part: str, report: Callable[[Event], None]):
        self.part, self.report = part, report
        self.since: float | None = None
        self.attempts = 0

    @property
    def down_s(self) -> float:
        return 0.0 if self.since is None else time.time() - self.since

    def failed(self, reason: str) -> float:
        """Count a failed attempt; the delay before the next one."""
        label = PARTS[self.part]
        self.attempts += 1
        delay = backoff(self.attempts)
        if self.since is None:
            self.since = time.time()
            self._emit("down", f"{label} unavailable: {reason}; retrying with backoff, nothing is lost",
                       reason=reason)
        else:
            self._emit("retry", f"{label} still unavailable after {self.down_s:.0f} s "
                       f"(attempt {self.attempts}): {reason}", reason=reason)
        return delay

    def recovered(self) -> None:
        if self.since is not None:
            self._emit("up", f"{PARTS[self.part]} back after {self.down_s:.0f} s and "
                       f"{self.attempts} failed attempt(s)", down_s=round(self.down_s, 1))
            self.since, self.attempts = None, 0

    def _emit(self, what: str, message: str, **fields) -> None:
        self.report(Event(f"{self.part}_{what}", message,
                          {"attempt": self.attempts, "retry_in_s": backoff(self.attempts), **fields}))


def one_line(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"[:300] if text else type(exc).__name__
