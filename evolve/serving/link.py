"""The policy client made patient: retries with backoff, and restarts of the embedded server."""
from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

import openai

from evolve.events import Event
from evolve.faults import Fault, Outage, one_line
from evolve.serving.client import Sample, Sampler

RESTART_AFTER = 2  # failed attempts in a row before an embedded server that still runs is restarted
MAX_RESTARTS = 3  # restarts in one outage before the run gives up on the policy server
# Failures worth waiting out: the server is away, overloaded or restarting. Anything else
# (e.g. 400, a prompt the server rejects) is recorded as a failed call and the search goes on.
# TimeoutError: a request timed out on the server's active clock (client.py), as the SDK's own.
TRANSIENT = (openai.APIConnectionError, openai.InternalServerError, openai.RateLimitError, TimeoutError)


class PolicyLink:
    """The policy client, made patient: a request is repeated until the server answers it.

    Transient failures (refused, reset, timed out, 5xx) are retried with backoff, with the
    same messages and seed, so no half-answered group is ever stored. The embedded server
    (`server`) is restarted when its process died or it keeps failing (a hung server times
    out); an external one is waited for. After a restart the run's adapter is loaded again.
    """

    def __init__(self, client: Sampler, report: Callable[[Event], None], server=None,
                 on_restart: Callable[[Sampler], Awaitable[None]] | None = None):
        self.client, self.server, self.report = client, server, report
        self.on_restart = on_restart  # a learning mutator serves its current version again
        self.outage = Outage("llm", report)
        self.restarts = 0  # in the current outage
        self.epoch = 0  # counts restarts, so concurrent callers restart once per failure
        self.lock = asyncio.Lock()

    @property
    def model(self) -> str:
        return self.client.model

    async def sample(self, messages: list[dict], n: int, seed: int | None = None,
                     max_tokens: int | None = None, model: str | None = None,
                     on_answer: Callable[[], None] | None = None) -> Sample:
        while True:
            epoch = self.epoch
            try:
                sample = await self.client.sample(messages, n, seed=seed, max_tokens=max_tokens, model=model,
                                                  on_answer=on_answer)
            except TRANSIENT as exc:
                delay = self.outage.failed(one_line(exc))
                if await self._repair(epoch, exc):
                    continue  # a fresh server: no reason to wait
                await asyncio.sleep(delay)
                continue
            self.outage.recovered()
            self.restarts = 0
            return sample

    async def _repair(self, epoch: int, exc: Exception) -> bool:
        """Restart the embedded server if it is dead or stuck; True if it was restarted."""
        if self.server is None or self.server.reused:  # not ours (external, or another run's): wait
            return False
        async with self.lock:
            if self.epoch != epoch:  # another caller restarted it meanwhile
                return True
            dead = not self.server.running()
            if not dead and self.outage.attempts < RESTART_AFTER:
                return False
            if self.restarts >= MAX_RESTARTS:
                raise Fault(f"the policy server failed {self.restarts} restarts ({one_line(exc)}); "
                            f"see {self.server.log_path}")
            self.restarts += 1
            why = "its process exited" if dead else f"{self.outage.attempts} failed attempts"
            self.report(Event("llm_restart", f"restarting the policy server ({why})",
                              {"restart": self.restarts}))
            started = time.time()
            try:
                await asyncio.to_thread(self.server.restart)
            except Exception as failure:  # noqa: BLE001 - ServerError or a port still held
                self.report(Event("llm_restart", f"policy server restart failed: {one_line(failure)}",
                                  {"restart": self.restarts}))
                return False
            self.epoch += 1
            self.report(Event("llm_restart", f"policy server restarted in {time.time() - started:.0f} s",
                              {"restart": self.restarts, "took_s": round(time.time() - started, 1)}))
            if self.on_restart is not None:
                await self.on_restart(self)
            return True

    def pause(self) -> bool:
        """Freeze our embedded server with its batch (a search's tuning turn); False for a server
        that is not ours to freeze (external, or another run's), whose turns drain instead."""
        return self.server is not None and not self.server.reused and self.server.pause()

    def resume(self) -> None:
        if self.server is not None:
            self.server.resume()

    async def close(self) -> None:
        await self.client.close()
