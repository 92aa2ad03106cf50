"""evolve.faults in isolation: which failures stop a run, the backoff, the outage events and
the dashboard line. The same behaviour through the real parts: test_reliability.py (disk,
database, kill -9, Docker) and test_llm_faults.py (the real vLLM server)."""
import asyncio
import errno
import sqlite3

import httpx
import openai
import pytest
from sqlalchemy.exc import OperationalError

from evolve.events import Event
from evolve.faults import Fault, backoff, fault_of
from evolve.serving.link import PolicyLink
from evolve.views.panels import outages


def operational(message: str) -> OperationalError:
    return OperationalError("INSERT ...", {}, sqlite3.OperationalError(message))


def test_environment_failures_are_faults_and_bugs_are_not():
    assert fault_of(operational("database is locked")).startswith("the database is locked by another process")
    assert fault_of(operational("database or disk is full")).startswith("disk full")
    assert fault_of(OSError(errno.ENOSPC, "No space left on device", "events.jsonl")).startswith(
        "disk full: events.jsonl")
    assert fault_of(Fault("sandbox: image missing")) == "sandbox: image missing"
    assert fault_of(ValueError("a bug")) is None
    assert fault_of(OSError(errno.EACCES, "denied")) is None


def test_backoff_doubles_up_to_a_minute():
    assert [backoff(i) for i in (1, 2, 3, 4, 7, 8, 20)] == [1, 2, 4, 8, 60, 60, 60]


class Flaky:
    """A client whose server is down for the first `failures` requests."""
    model = "m"

    def __init__(self, failures: int, error):
        self.failures, self.error, self.requests = failures, error, []

    async def sample(self, messages, n, seed=None, max_tokens=None, model=None, on_answer=None):
        self.requests.append(seed)
        if len(self.requests) <= self.failures:
            raise self.error
        return "answer"

    async def close(self):
        pass


def connection_error():
    return openai.APIConnectionError(request=httpx.Request("POST", "http://127.0.0.1:9/v1/chat/completions"))


def test_a_transient_failure_is_retried_with_the_same_seed_and_reported(monkeypatch):
    seen: list[Event] = []
    slept: list[float] = []

    async def fake_sleep(seconds):
        slept.append(seconds)
    monkeypatch.setattr("evolve.serving.link.asyncio.sleep", fake_sleep)
    client = Flaky(3, connection_error())
    link = PolicyLink(client, seen.append)
    assert asyncio.run(link.sample([], 4, seed=77)) == "answer"
    assert client.requests == [77, 77, 77, 77] and slept == [1, 2, 4]
    assert [e.kind for e in seen] == ["llm_down", "llm_retry", "llm_retry", "llm_up"]
    assert "nothing is lost" in seen[0].message and "3 failed attempt(s)" in seen[-1].message


def test_a_rejected_request_is_not_retried():
    bad = openai.BadRequestError("prompt too long", response=httpx.Response(
        400, request=httpx.Request("POST", "http://x/v1/chat/completions")), body=None)
    link = PolicyLink(Flaky(1, bad), lambda e: None)
    with pytest.raises(openai.BadRequestError):
        asyncio.run(link.sample([], 1))


def test_the_dashboard_shows_an_outage_while_it_lasts():
    down = Event("llm_down", "policy server unavailable: APIConnectionError", {"attempt": 1})
    assert outages([down]) and "policy server DOWN" in outages([down])[0]
    assert outages([down, Event("llm_restart", "restarting the policy server")])
    assert outages([down, Event("llm_up", "policy server back after 3 s")]) == []
    sandbox = Event("sandbox_retry", "sandbox still unavailable", {"attempt": 4})
    assert "sandbox DOWN" in outages([down, Event("llm_up", "back"), sandbox])[0]


class Server:
    """Stands in for VLLMServer's lifecycle only: whether it runs, and restarts asked of it."""

    def __init__(self, reused=False):
        self.reused, self.restarts, self.log_path = reused, 0, "vllm.log"

    def running(self):
        return self.restarts > 0  # dead until restarted

    def restart(self):
        self.restarts += 1


def test_a_dead_embedded_server_is_restarted_once_and_another_runs_server_is_waited_for(monkeypatch):
    async def no_sleep(seconds):
        pass
    monkeypatch.setattr("evolve.serving.link.asyncio.sleep", no_sleep)
    seen = []
    ours = Server()
    link = PolicyLink(Flaky(1, connection_error()), seen.append, ours)
    assert asyncio.run(link.sample([], 1, seed=5)) == "answer"
    assert ours.restarts == 1 and [e.kind for e in seen] == ["llm_down", "llm_restart", "llm_restart", "llm_up"]
    theirs = Server(reused=True)
    link = PolicyLink(Flaky(3, connection_error()), lambda e: None, theirs)
    assert asyncio.run(link.sample([], 1)) == "answer" and theirs.restarts == 0
