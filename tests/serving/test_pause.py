"""Pausing the embedded server between a search's turns (`tuning.pause_llm`), without a model:
the engine's processes are frozen and thawed, the API server never, and a request's timeout
runs on the server's active clock. The real server: tests/serving/test_server.py."""
from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

import pytest
from fakes import toy_policy

from evolve import config
from evolve.serving.client import PolicyClient
from evolve.serving.link import TRANSIENT
from evolve.serving.server import VLLMServer, _group_alive, _group_members, spawn


def state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def until(condition, seconds: float = 10.0) -> bool:
    """Signals land asynchronously: whether `condition` holds within `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


@pytest.fixture
def group(tmp_path):
    """A VLLMServer whose process is a stand-in group: a leader (the API server) and a child
    (its engine)."""
    server = VLLMServer(tmp_path, "m", config.Server(), tmp_path / "vllm.log")
    server.process = spawn(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
    deadline = time.monotonic() + 10
    while len(_group_members(server.process.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    yield server
    server.stop(grace_s=1)


def test_pause_freezes_the_engine_not_the_api_server_and_its_clock_stands_still(group):
    leader = group.process.pid
    engine = [pid for pid in _group_members(leader) if pid != leader]
    assert engine and group.pause() and group.pause()  # twice: still one pause
    assert until(lambda: all(state(pid) == "T" for pid in engine)) and state(leader) != "T"
    frozen = group.active_time()
    time.sleep(0.2)
    assert group.active_time() == frozen
    group.resume()
    assert until(lambda: all(state(pid) != "T" for pid in engine))
    assert group.active_time() >= frozen and group.paused_s >= 0.2


def test_a_paused_server_stops_whole(group):
    pgid = group.process.pid
    assert group.pause()
    group.stop(grace_s=1)
    assert not _group_alive(pgid)


def test_nothing_to_pause_without_a_running_server_of_ours(tmp_path):
    server = VLLMServer(tmp_path, "m", config.Server(), tmp_path / "vllm.log")
    assert not server.pause()
    server.process = subprocess.Popen(["true"])
    server.process.wait()
    assert not server.pause()


def test_a_requests_timeout_runs_on_the_servers_active_clock(tmp_path):
    """A request that waits out a pause longer than its timeout is no timeout; one that the
    server leaves unanswered while it runs times out as the SDK's timeout would: transient."""
    policy, _ = toy_policy(tmp_path)
    policy = policy.model_copy(update={"server": policy.server.model_copy(update={"request_timeout_s": 0.1})})

    async def answered(clock, after_s: float) -> str:
        client = PolicyClient(policy, "http://127.0.0.1:9/v1", "m", clock=clock)
        try:
            return await client._timed(asyncio.sleep(after_s, result="answer"))
        finally:
            await client.close()

    assert asyncio.run(answered(lambda: 0.0, 0.3)) == "answer"  # paused all along
    with pytest.raises(TimeoutError) as timeout:
        asyncio.run(answered(time.monotonic, 30))
    assert isinstance(timeout.value, TRANSIENT)
