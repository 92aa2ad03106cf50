"""Evaluations on a Ray cluster: an actor per node, each with that node's own warm sandbox.

The trust boundary is the one a single host has: a node's actor runs candidates in its own
Docker pool (or process sandbox) with the run's limits and returns the sandbox's plain result;
the scorer runs in the engine, on that data. What Ray adds is where candidates run and what
happens when a node goes: a candidate whose worker died is a sandbox fault (evaluated again,
never charged to it), the lost worker is replaced where its node is still alive, and the run
goes on with the slots that are left, saying so in one line.
"""
from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Callable

import ray
from ray.exceptions import RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from evolve.config import SandboxLimits
from evolve.events import Event
from evolve.sandbox.host import host_sandbox
from evolve.sandbox.result import (
    Collected,
    SandboxResult,
    SandboxUnavailable,
    build_result,
)

REDISCOVER_S = 5.0  # how often nodes are looked for while a worker is missing
NAMESPACE = "evolve"


@ray.remote(num_cpus=0, max_restarts=0)
class NodeSandbox:
    """One node's evaluator: the node's own sandbox, shared by `slots` candidates at once."""

    def __init__(self, limits_json: str):
        limits = SandboxLimits.model_validate_json(limits_json)
        self.sandbox = host_sandbox(limits.model_copy(update={"backend": limits.ray.node_backend}))

    async def run(self, code: str, entry_point: str, cases: list[dict]) -> SandboxResult:
        return await self.sandbox.run(code, entry_point, cases)

    def pid(self) -> int:
        return os.getpid()

    def close(self) -> None:
        self.sandbox.close()


@dataclass
class Worker:
    node: str
    actor: ray.actor.ActorHandle
    slots: int
    busy: int = 0  # candidates on it now
    done: int = 0  # candidates it returned


class RaySandbox:
    """Same interface as the other sandboxes: `await run(code, entry_point, cases)`."""

    backend = "ray"

    def __init__(self, limits: SandboxLimits, report: Callable[[Event], None] | None = None):
        self.limits, self.report = limits, report or (lambda event: None)
        # address None: a Ray of this run's own on this machine, stopped with the run
        self.owned = limits.ray.address is None and not ray.is_initialized()
        if not ray.is_initialized():
            ray.init(address=limits.ray.address, namespace=NAMESPACE, include_dashboard=False,
                     log_to_driver=False, configure_logging=False)
        self.workers: dict[str, Worker] = {}
        self.refused: dict[str, str] = {}  # nodes whose evaluator could not start, and why
        self.looked_at, self.capacity = 0.0, 0
        self._discover()
        if not self.workers:
            raise SandboxUnavailable(f"no Ray node ({limits.ray.address or 'local'}) could start an evaluator: "
                                     + "; ".join(self.refused.values()))
        self.capacity = self.slots  # at start: the engine's evaluations in flight

    @property
    def slots(self) -> int:
        """Candidates the live evaluators take at once now."""
        return sum(w.slots for w in self.workers.values())

    @property
    def warning(self) -> str:
        nodes = len(self.workers)
        return (f"{self.capacity} slots on {nodes} node{'s' * (nodes != 1)}, "
                f"{self.limits.ray.node_backend} on each")

    # ---- nodes -----------------------------------------------------------------------------
    def _discover(self) -> None:
        """An evaluator on every live node that has none (at start, and after a loss)."""
        self.looked_at = time.monotonic()
        for node in ray.nodes():
            if not node["Alive"] or node["NodeID"] in self.workers or node["NodeID"] in self.refused:
                continue
            slots = self.limits.ray.slots_per_node or max(1, int(node["Resources"].get("CPU", 1) // self.limits.cpus))
            actor = NodeSandbox.options(  # type: ignore[attr-defined]  # added by @ray.remote
                scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False),
                max_concurrency=slots).remote(self.limits.model_dump_json())
            try:
                ray.get(actor.pid.remote(), timeout=120)  # its sandbox is up (or why not)
            except RayError as exc:
                self.refused[node["NodeID"]] = why = f"node {node['NodeManagerAddress']}: {_short(exc)}"
                self._say(f"ray: cannot evaluate on {why}")  # told once, not every few seconds
                ray.kill(actor)
                continue
            self.workers[node["NodeID"]] = Worker(node["NodeID"], actor, slots)
            if self.capacity:  # not at start: a replacement, or a node that joined
                self._say(f"ray: evaluator on node {node['NodeID'][:8]} ({node['NodeManagerAddress']}) "
                          f"started, {slots} slots")

    def _lost(self, worker: Worker, exc: BaseException) -> None:
        if self.workers.get(worker.node) is not worker:
            return  # already counted by another of its candidates
        del self.workers[worker.node]
        left = self.slots
        self._say(f"ray: the evaluator on node {worker.node[:8]} was lost ({_short(exc)}); its candidates "
                  f"are evaluated again; {left} slots on {len(self.workers)} nodes go on")

    def _say(self, message: str) -> None:
        self.report(Event("sandbox", message, {"backend": "ray", "slots": self.slots}))

    async def _take(self) -> Worker | None:
        """The least busy worker with a free slot, waiting for one; None when no node is left."""
        while True:
            if time.monotonic() - self.looked_at > REDISCOVER_S and (
                    not self.workers or self.slots < self.capacity):
                await asyncio.to_thread(self._discover)
            free = [w for w in self.workers.values() if w.busy < w.slots]
            if free:
                worker = min(free, key=lambda w: w.busy / w.slots)
                worker.busy += 1
                return worker
            if not self.workers:
                return None
            await asyncio.sleep(0.05)

    # ---- evaluation ------------------------------------------------------------------------
    async def run(self, code: str, entry_point: str, cases: list[dict]) -> SandboxResult:
        start = time.monotonic()
        worker = await self._take()
        if worker is None:
            return self._fault("no Ray node is left to evaluate on", cases, start)
        try:
            result = await worker.actor.run.remote(code, entry_point, cases)
            worker.done += 1
            return result
        except RayTaskError as exc:  # our sandbox code failed on the node: not the candidate's doing
            return self._fault(f"ray worker error: {_short(exc)}", cases, start)
        except RayError as exc:  # the worker or its node died under the candidate
            self._lost(worker, exc)
            return self._fault(f"ray worker lost: {_short(exc)}", cases, start)
        finally:
            worker.busy -= 1

    def _fault(self, why: str, cases: list[dict], start: float) -> SandboxResult:
        return build_result(Collected(started=False, extra=[why], fault=why), cases, "", self.limits, start)

    def close(self) -> None:
        """Each node removes its containers; a Ray of this run's own stops."""
        if not ray.is_initialized():
            return
        actors = [w.actor for w in self.workers.values()]
        try:
            ray.get([a.close.remote() for a in actors], timeout=60)
        except RayError:
            pass
        for actor in actors:
            ray.kill(actor)
        self.workers.clear()
        if self.owned:
            ray.shutdown()


def _short(exc: BaseException) -> str:
    """Ray's errors end with the cause (faults.one_line keeps a first line, here a traceback header)."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"[:300]
