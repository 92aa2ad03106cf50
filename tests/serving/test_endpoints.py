"""Several policy endpoints behind one client (evolve/serving/endpoints.py), the choice isolated with
stand-in endpoints; the real parts (a live vLLM and a dead port): tests/serving/test_link.py."""
from __future__ import annotations

import asyncio

import httpx
import openai
import pytest

from evolve.serving.endpoints import EndpointPool


class Stub:
    """An endpoint that answers after `delay` s, or fails like a server that is gone."""

    def __init__(self, delay: float = 0.0, down: bool = False):
        self.model, self.delay, self.down, self.asked, self.names = "m", delay, down, 0, []

    async def sample(self, messages, n, seed=None, **kw):
        self.asked += 1
        self.names.append(kw.get("model"))
        await asyncio.sleep(self.delay)
        if self.down:
            raise openai.APIConnectionError(request=httpx.Request("POST", "http://x"))
        return f"answer from {id(self)}"

    async def close(self):
        pass


async def test_calls_go_to_the_least_loaded_endpoint():
    a, b = Stub(delay=0.2), Stub(delay=0.2)
    pool = EndpointPool({"http://a/v1": a, "http://b/v1": b}, lambda e: None)
    await asyncio.gather(*(pool.sample([], 1) for _ in range(6)))
    assert (a.asked, b.asked) == (3, 3)
    await asyncio.gather(*(pool.sample([], 1, model="v1") for _ in range(2)))
    assert a.names[-1] == b.names[-1] == "v1"  # a call that names a version asks it of any endpoint
    assert a.model == b.model == "m" == pool.model  # and switches none of them


async def test_a_failing_endpoint_is_taken_out_and_the_call_goes_elsewhere():
    said, rejoined = [], []

    async def rejoin(url):  # the RL hook's part: serve the current version on the endpoint
        rejoined.append(url)

    gone, live = Stub(down=True), Stub()
    pool = EndpointPool({"http://gone/v1": gone, "http://live/v1": live}, said.append, rejoin)
    for _ in range(3):
        assert await pool.sample([], 1) == f"answer from {id(live)}"
    assert gone.asked == 1  # out for its backoff: not asked again at once
    assert said[0].kind == "llm_endpoint" and "taken out" in said[0].message and "1 of 2 in" in said[0].message
    assert not rejoined  # not back yet
    pool.endpoints[0].out_until = 0  # its backoff is over: tried again, first given the adapter
    gone.down = False
    await asyncio.gather(pool.sample([], 1), pool.sample([], 1))
    assert rejoined == ["http://gone/v1"] and "is back in" in said[-1].message


async def test_with_every_endpoint_out_the_caller_sees_the_failure():
    pool = EndpointPool({"http://a/v1": Stub(down=True), "http://b/v1": Stub(down=True)}, lambda e: None)
    with pytest.raises(openai.APIConnectionError):
        await pool.sample([], 1)
    with pytest.raises(openai.APIConnectionError, match="every policy endpoint is taken out"):
        await pool.sample([], 1)


def test_a_policy_lists_its_endpoints():
    from pydantic import ValidationError

    from evolve.config import Server

    s = Server(embedded=False, base_url="http://a/v1", base_urls=["http://b/v1", "http://a/v1"])
    assert s.endpoints() == ["http://a/v1", "http://b/v1"]
    with pytest.raises(ValidationError, match="base_urls lists remote endpoints: set embedded: false"):
        Server(base_urls=["http://b/v1"])
    with pytest.raises(ValidationError, match=r"base_url \(or base_urls\) is required"):
        Server(embedded=False)
