"""Trusted glue: candidate code -> sandbox -> scorer -> vector fitness.

The sandbox returns plain data per case; the problem's trusted scorer (loaded here, in the
engine process, never in the candidate's) turns each output into a raw value or a reason
why it is invalid. Nothing the candidate says about its own score is ever used.
"""
from __future__ import annotations

import asyncio
import importlib.util
import math
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Callable

from evolve.config import Problem
from evolve.events import Event
from evolve.faults import Fault, Outage, SandboxFault
from evolve.sandbox import Sandbox, make_sandbox
from evolve.sandbox.result import SandboxResult
from evolve.store.schema import Program

MAX_ERROR_CHARS = 4096
MAX_REASON_CHARS = 600  # per component, so one long traceback cannot hide the others
SANDBOX_OUTAGE_S = 1800  # an engine that stays away longer stops the run (resumable)


@dataclass
class Judgement:
    """What the judge makes of one candidate (stored as an `evaluations` row)."""
    status: str  # "ok" | "invalid" | "error" | "timeout"
    components: dict[str, float]  # normalised (1.0 = the reference); 0.0 for every failed component
    raw: dict[str, float]  # raw scorer values of the valid components
    objective: float  # weighted mean of the components (problem.objective)
    headline: float | None  # raw value of problem.headline if valid
    descriptors: dict[str, float]
    error: str | None  # reasons for failed components / sandbox detail / log tail (bounded)
    elapsed_s: float

    def fill(self, program: Program) -> None:
        """The program's columns that hold its judgement."""
        program.status, program.error = self.status, self.error
        program.fitness, program.raw = self.components, self.raw
        program.objective, program.headline = self.objective, self.headline
        program.descriptors = self.descriptors or None


def load_scorer(problem: Problem) -> ModuleType:
    """Import the problem's scorer from its file (trusted code, engine process)."""
    path = problem.resolve(problem.scorer)
    spec = importlib.util.spec_from_file_location(f"evolve_scorer_{problem.name}", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{path}: not a Python module the scorer can be imported from")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Evaluator:
    def __init__(self, problem: Problem, sandbox: Sandbox | None = None,
                 report: Callable[[Event], None] | None = None):
        self.problem = problem
        self.scorer = load_scorer(problem)
        self.sandbox = make_sandbox(problem.sandbox, report) if sandbox is None else sandbox

    async def evaluate(self, code: str) -> Judgement:
        start = time.monotonic()
        problem = self.problem
        result = await self.sandbox.run(code, problem.entry_point, problem.cases())
        if result.fault:  # our machinery failed, not the candidate: it is evaluated again later
            raise SandboxFault(result.fault, result.fault_permanent)
        raw, reasons = self._score_outputs(result)
        status = _status(result, raw)
        components = {c.name: c.normalise(raw[c.name]) if c.name in raw else 0.0
                      for c in problem.components}
        objective = problem.objective(components)
        descriptors = self._descriptors(result, raw, reasons, code) if status == "ok" else {}
        return Judgement(
            status=status,
            components=components,
            raw=raw,
            objective=objective,
            headline=_headline(problem, raw, status, objective),
            descriptors=descriptors,
            error=_error_text(reasons, result),
            elapsed_s=time.monotonic() - start,
        )

    def _score_outputs(self, result: SandboxResult) -> tuple[dict[str, float], dict[str, str]]:
        # Runs on the event loop: the circle-packing scorer takes ~1 ms per output.
        raw: dict[str, float] = {}
        reasons: dict[str, str] = {}
        for component in self.problem.components:
            name = component.name
            if name not in result.outputs:
                reasons[name] = result.case_errors.get(name, "no result")
                continue
            try:
                value = float(self.scorer.score({**component.args, **component.judge}, result.outputs[name]))
                if not math.isfinite(value):
                    raise ValueError(f"scorer returned {value!r}")
                raw[name] = value
            except Exception as exc:  # any scorer failure on bad data means invalid, never a crash
                reasons[name] = f"invalid: {exc}"
                continue
            if component.normalise(value) < 1.0 and (why := self._explain(component, result.outputs[name])):
                reasons[name] = why
        return raw, reasons

    def _explain(self, component, output) -> str | None:
        """The scorer's own words on a component short of its reference (optional `explain`):
        what the mutator is told about its parent, e.g. a test call that raised."""
        explain = getattr(self.scorer, "explain", None)
        if explain is None:
            return None
        try:
            return explain({**component.args, **component.judge}, output)
        except Exception as exc:  # a note that cannot be written is no reason to fail the candidate
            return f"(explain failed: {type(exc).__name__})"

    def _descriptors(self, result: SandboxResult, raw: dict, reasons: dict, code: str) -> dict[str, float]:
        valid = {name: result.outputs[name] for name in raw}
        try:
            return {k: float(v) for k, v in self.scorer.descriptors(valid, code).items()}
        except Exception as exc:
            reasons["descriptors"] = f"descriptors failed: {exc}"
            return {}


def _headline(problem: Problem, raw: dict, status: str, objective: float) -> float | None:
    """The raw headline component, or the objective itself for `headline: objective`."""
    if problem.headline != "objective":
        return raw.get(problem.headline)
    return objective if status == "ok" else None


def _status(result: SandboxResult, raw: dict[str, float]) -> str:
    if raw:
        return "ok"  # at least one valid component; the failing ones are explained in error
    if result.status in ("timeout", "error"):
        return result.status
    if not result.outputs:
        return "error"  # every case raised in the candidate
    return "invalid"


def _error_text(reasons: dict[str, str], result: SandboxResult) -> str | None:
    if not reasons and result.status == "ok":
        return None
    parts = [f"{name}: {_clip(reason, MAX_REASON_CHARS)}" for name, reason in reasons.items()]
    if result.detail:
        parts.append(f"sandbox: {result.detail}")
    if result.log_tail.strip():
        parts.append("candidate log (tail):\n" + result.log_tail)
    text = "\n".join(parts)
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS - 20] + "\n[... clipped]"


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + " [...]"


async def evaluate_through_outages(evaluator: Evaluator, code: str, outage: Outage) -> Judgement:
    """Evaluate, waiting out a sandbox outage: a candidate is never scored for our failure."""
    while True:
        try:
            result = await evaluator.evaluate(code)
        except SandboxFault as exc:
            if exc.permanent:
                raise Fault(f"sandbox: {exc}") from None
            if outage.down_s > SANDBOX_OUTAGE_S:
                raise Fault(f"sandbox unavailable for {outage.down_s:.0f} s: {exc}") from None
            await asyncio.sleep(outage.failed(str(exc)))
            continue
        outage.recovered()
        return result
