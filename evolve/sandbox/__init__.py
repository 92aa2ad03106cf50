"""Untrusted candidates run here, never in the engine: choose a backend (process, Docker, a Ray
cluster of either) for the problem's limits. Each backend runs the same harness and returns the
same `SandboxResult` (evolve/sandbox/result.py)."""
from __future__ import annotations

from typing import Callable, Protocol

from evolve.config import SandboxLimits
from evolve.events import Event
from evolve.sandbox.host import host_sandbox
from evolve.sandbox.result import SandboxResult


class Sandbox(Protocol):
    """What the evaluator and the run need of a backend. A backend may also say `warning` (what
    it does not guarantee) and `capacity` (evaluations it runs at once, where it knows)."""
    backend: str  # recorded with every evaluation

    async def run(self, code: str, entry_point: str, cases: list[dict]) -> SandboxResult: ...

    def close(self) -> None: ...


def make_sandbox(limits: SandboxLimits, report: Callable[[Event], None] | None = None) -> Sandbox:
    """The backend the limits ask for; `report` hears what a Ray cluster's nodes do (lost,
    replaced)."""
    if limits.backend == "ray":
        # ray is imported only by runs that use it
        from evolve.sandbox.ray import RaySandbox

        return RaySandbox(limits, report)
    return host_sandbox(limits)
