"""The policy's client: one OpenAI-compatible call samples a group of answers (the embedded
vLLM, a GPU vLLM, or a hosted API)."""
from __future__ import annotations

import asyncio
import os
import time
from dataclasses import dataclass
from typing import Awaitable, Callable, Protocol, TypeVar, runtime_checkable

from openai import AsyncOpenAI

from evolve.config import Policy
from evolve.mutation.versions import STOP

T = TypeVar("T")


@dataclass
class Sample:
    texts: list[str]
    finish_reasons: list[str | None]
    prompt_tokens: int | None
    completion_tokens: int | None
    started_at: float
    latency_s: float
    token_ids: list[list[int] | None] | None = None  # per choice, as served (vLLM only)
    prompt_token_ids: list[int] | None = None
    logprobs: list[list[float] | None] | None = None  # per choice, the sampler's (training only)
    model: str | None = None  # the served name that answered (an ensemble has several)


class Sampler(Protocol):
    """What the search and the RL hook ask of the policy: one client, several endpoints
    (EndpointPool), or either made patient (PolicyLink). A call goes to the base model unless it
    names another served name (`model=`: an adapter, or a merged version); nothing switches the
    client itself, so a guard measuring a candidate cannot redirect a search call beside it."""

    @property
    def model(self) -> str:
        """The base model's served name."""

    async def sample(self, messages: list[dict], n: int, seed: int | None = None,
                     max_tokens: int | None = None, model: str | None = None,
                     on_answer: Callable[[], None] | None = None) -> Sample:
        """`n` answers to `messages`; `on_answer` is called as each answer ends (the scheduler
        keeps the server's batch full with it), at the latest when the group returns."""

    async def close(self) -> None: ...


@runtime_checkable
class Pausable(Protocol):
    """A policy whose server can be frozen with its batch between a search's turns (the
    embedded vLLM: evolve/serving/server.py)."""

    def pause(self) -> bool:
        """Freeze the server; False where it cannot be (then the turn waits for its calls)."""

    def resume(self) -> None: ...


class PolicyClient:
    """Async OpenAI-compatible client; one call samples a whole group with `n`.

    `clock`: what a request's timeout is measured on, where the server may be paused (the
    embedded server's `active_time`); the SDK's own timeout counts wall time."""

    def __init__(self, policy: Policy, base_url: str, model: str, clock: Callable[[], float] | None = None):
        self.policy = policy
        self.base = model  # the base model's served name
        self.is_vllm = policy.server.embedded or policy.train is not None
        self.clock, self.timeout = clock, policy.server.request_timeout_s
        key = os.environ.get(policy.server.api_key_env, "") if policy.server.api_key_env else ""
        # No silent retries in the SDK: evolve.serving.link.PolicyLink retries, says so, and restarts
        # the embedded server when it is gone.
        self.client = AsyncOpenAI(base_url=base_url, api_key=key or "EMPTY", max_retries=0,
                                  timeout=self.timeout if clock is None else None)

    @property
    def model(self) -> str:
        return self.base

    async def sample(self, messages: list[dict], n: int, seed: int | None = None,
                     max_tokens: int | None = None, model: str | None = None,
                     on_answer: Callable[[], None] | None = None) -> Sample:
        if not self.is_vllm or n == 1:  # a hosted API bills the prompt per request: one request
            sample = await self._request(messages, n, seed, max_tokens, model)
            for _ in range(n if on_answer else 0):
                on_answer()  # type: ignore[misc]
            return sample
        # vLLM: one request per answer, seeded as vLLM seeds a group's answers (seed + index,
        # vllm/v1/engine/parallel_sampling.py), so the answers are the group's; each ends on its
        # own, so the caller can start new answers while this group's longest is still running.
        tasks = [asyncio.create_task(self._answer(messages, None if seed is None else seed + i, max_tokens,
                                                  model, on_answer)) for i in range(n)]
        try:
            return _merge(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:  # one answer failed: the group is asked again whole, free the server
                task.cancel()
            raise

    async def _answer(self, messages: list[dict], seed: int | None, max_tokens: int | None, model: str | None,
                      on_answer: Callable[[], None] | None) -> Sample:
        sample = await self._request(messages, 1, seed, max_tokens, model)
        if on_answer is not None:
            on_answer()
        return sample

    async def _request(self, messages: list[dict], n: int, seed: int | None, max_tokens: int | None,
                       model: str | None) -> Sample:
        s, model = self.policy.sampling, model or self.base
        extra: dict = {"seed": seed} if (s.seed_requests and seed is not None) else {}
        # vLLM returns the exact token ids it sampled, so training needs no re-tokenising;
        # other OpenAI-compatible servers may reject the unknown field, so only ask vLLM.
        body: dict = {"return_token_ids": True} if self.is_vllm else {}
        if self.is_vllm and self.policy.train is not None:
            body["logprobs"] = True  # q(token) of every sampled token: the trainer's IS weights
        if messages[-1]["role"] == "assistant":
            # A prefix to continue (the `complete` format): vLLM's continue_final_message, and
            # the answer ends with the function it completes.
            body |= {"continue_final_message": True, "add_generation_prompt": False}
            extra["stop"] = STOP
        started = time.time()
        resp = await self._timed(self.client.chat.completions.create(
            model=model, messages=messages,  # type: ignore[arg-type]  # plain dicts, not the SDK's TypedDicts
            n=n, temperature=s.temperature, top_p=s.top_p,
            max_tokens=max_tokens or s.max_tokens, extra_body=body or None, **extra))
        choices = sorted(resp.choices, key=lambda c: c.index)
        usage = resp.usage
        return Sample(texts=[c.message.content or "" for c in choices],
                      finish_reasons=[c.finish_reason for c in choices],
                      prompt_tokens=usage.prompt_tokens if usage else None,
                      completion_tokens=usage.completion_tokens if usage else None,
                      started_at=started, latency_s=time.time() - started,
                      token_ids=[getattr(c, "token_ids", None) for c in choices],
                      prompt_token_ids=getattr(resp, "prompt_token_ids", None),
                      logprobs=[_logprobs(c) for c in choices], model=model)

    async def _timed(self, request: Awaitable[T]) -> T:
        """The request, timed out on `clock` (the SDK times it where there is none): time the
        server spent paused is not a server that hangs. A timeout is TimeoutError, which the
        patient client (link.py) takes as the SDK's own: transient."""
        if self.clock is None:
            return await request
        task, start = asyncio.ensure_future(request), self.clock()
        try:
            while (left := self.timeout - (self.clock() - start)) > 0:
                done, _ = await asyncio.wait({task}, timeout=left)
                if done:
                    return task.result()
            raise TimeoutError(f"no answer in {self.timeout:g} s of the server's active time")
        finally:
            task.cancel()  # a no-op once it is done

    async def close(self) -> None:
        await self.client.close()


def _merge(parts: list[Sample]) -> Sample:
    """One group's Sample from its answers' requests, in seed order."""
    tokens = [p.completion_tokens for p in parts]
    return Sample(texts=[t for p in parts for t in p.texts],
                  finish_reasons=[f for p in parts for f in p.finish_reasons],
                  prompt_tokens=parts[0].prompt_tokens,
                  completion_tokens=None if None in tokens else sum(tokens),  # type: ignore[arg-type]
                  started_at=min(p.started_at for p in parts),
                  latency_s=max(p.started_at + p.latency_s for p in parts) - min(p.started_at for p in parts),
                  token_ids=[i for p in parts for i in (p.token_ids or [None])],
                  prompt_token_ids=parts[0].prompt_token_ids,
                  logprobs=[lp for p in parts for lp in (p.logprobs or [None])], model=parts[0].model)


def _logprobs(choice) -> list[float] | None:
    content = getattr(getattr(choice, "logprobs", None), "content", None)
    return None if content is None else [float(t.logprob) for t in content]
