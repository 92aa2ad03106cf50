"""Several policy servers behind one client: each call goes to the least loaded endpoint.

A policy may list several OpenAI-compatible endpoints serving the same model (vLLM replicas
on GPU nodes). An endpoint that fails a request is taken out for a backoff and the request
goes to another one; it is tried again once its backoff is over (and, for a training policy,
given the current adapter first). Only when every endpoint is out does the caller see the
failure: PolicyLink (evolve/serving/link.py) then waits, as it does for a single server.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import httpx
import openai

from evolve.events import Event
from evolve.faults import backoff, one_line
from evolve.serving.client import Sample, Sampler
from evolve.serving.link import TRANSIENT


@dataclass
class Endpoint:
    url: str
    client: Sampler
    in_flight: int = 0
    failures: int = 0  # in a row
    out_until: float = 0.0  # taken out until then (time.time())
    calls: int = field(default=0)


class EndpointPool:
    """The PolicyClient interface (`model`, `sample`, `close`) over several endpoints."""

    def __init__(self, clients: dict[str, Sampler], report: Callable[[Event], None],
                 rejoin: Callable[[str], Awaitable[None]] | None = None):
        self.endpoints = [Endpoint(url, client) for url, client in clients.items()]
        self.report = report
        self.rejoin = rejoin  # a learning mutator: serve the current version on an endpoint that comes back

    @property
    def model(self) -> str:
        return self.endpoints[0].client.model

    @property
    def urls(self) -> list[str]:
        return [e.url for e in self.endpoints]

    async def sample(self, messages: list[dict], n: int, seed: int | None = None,
                     max_tokens: int | None = None, model: str | None = None,
                     on_answer: Callable[[], None] | None = None) -> Sample:
        last: Exception | None = None
        tried: set[str] = set()
        while True:
            now = time.time()
            ready = [e for e in self.endpoints if e.out_until <= now and e.url not in tried]
            if not ready:  # every endpoint is out: the caller waits (PolicyLink) and asks again
                raise last or openai.APIConnectionError(message="every policy endpoint is taken out",
                                                        request=httpx.Request("POST", self.endpoints[0].url))  # type: ignore[arg-type]
            endpoint = min(ready, key=lambda e: (e.in_flight, e.calls))
            tried.add(endpoint.url)
            try:
                if endpoint.failures and self.rejoin is not None:
                    await self.rejoin(endpoint.url)  # back from an outage: it may know no adapter
                endpoint.in_flight += 1
                try:
                    sample = await endpoint.client.sample(messages, n, seed=seed, max_tokens=max_tokens, model=model,
                                                          on_answer=on_answer)
                finally:
                    endpoint.in_flight -= 1
            except TRANSIENT as exc:
                last = exc
                self._out(endpoint, exc)
                continue
            endpoint.calls += 1
            if endpoint.failures:
                self.report(Event("llm_endpoint", f"policy endpoint {endpoint.url} is back in "
                                  f"after {endpoint.failures} failed attempt(s)", {"endpoint": endpoint.url}))
                endpoint.failures = 0
            return sample

    def take_out(self, server_url: str, why: str) -> None:
        """Another part (the RL hook loading an adapter) could not reach this endpoint."""
        for e in self.endpoints:
            if e.url.rstrip("/").removesuffix("/v1") == server_url:
                self._out(e, why)

    def _out(self, endpoint: Endpoint, exc: Exception | str) -> None:
        endpoint.failures += 1
        delay = backoff(endpoint.failures)
        endpoint.out_until = time.time() + delay
        live = sum(e.out_until <= time.time() for e in self.endpoints)
        self.report(Event("llm_endpoint", f"policy endpoint {endpoint.url} taken out for {delay:.0f} s: "
                          f"{exc if isinstance(exc, str) else one_line(exc)}; {live} of {len(self.endpoints)} in", {"endpoint": endpoint.url}))

    async def close(self) -> None:
        for e in self.endpoints:
            await e.client.close()
