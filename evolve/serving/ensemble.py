"""Several models behind one client: each call is answered by one of them, drawn by share.

An ensemble policy (`ensemble:` in the policy YAML) mixes, say, a fast small model with a
slower one that writes valid code more often. The draw depends only on the call's seed, so a
run repeats which model answered which call; each call records its model (`llm_calls.model`),
and `evolve status` gives each model's rates.
"""
from __future__ import annotations

import random
from typing import Callable

from evolve.serving.client import Sample, Sampler


class Ensemble:
    """The Sampler interface over (client, share) members; the first is the policy's own model."""

    def __init__(self, members: list[tuple[Sampler, float]], seed: int):
        self.members = members
        self.calls = random.Random(seed)  # draws for calls without a seed of their own

    @property
    def model(self) -> str:
        return self.members[0][0].model

    def pick(self, seed: int | None) -> Sampler:
        u = (random.Random(seed) if seed is not None else self.calls).random()
        for client, share in self.members:
            u -= share
            if u < 0:
                return client
        return self.members[-1][0]  # shares sum to 1 up to rounding

    async def sample(self, messages: list[dict], n: int, seed: int | None = None,
                     max_tokens: int | None = None, model: str | None = None,
                     on_answer: Callable[[], None] | None = None) -> Sample:
        if model is not None:  # an adapter of the policy's model: an ensemble never trains
            raise TypeError(f"an ensemble serves its members' own models; it cannot serve {model!r}")
        return await self.pick(seed).sample(messages, n, seed=seed, max_tokens=max_tokens, on_answer=on_answer)

    async def close(self) -> None:
        for client, _ in self.members:
            await client.close()
