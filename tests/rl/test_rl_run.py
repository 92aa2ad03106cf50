"""The RL hook through the real parts: `evolve run` with a GRPO policy on the real vLLM server
(LoRA enabled), the real trainer on Qwen 0.5B and SQLite. It must train, hot-load the adapter,
route later calls to it, record which version made each call, and pick the adapter up on resume.
"""
from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys

import httpx
import pytest
from sqlalchemy import select

from evolve.config import Server
from evolve.rl.hook import SERVED_TOLERANCE
from evolve.serving.adapters import load_adapter
from evolve.serving.models import ensure_model
from evolve.serving.server import VLLMServer
from evolve.store.schema import Completion, LLMCall, PolicyVersion, TrainingStep
from tests.test_run import MODEL, ROOT, db_session, evolve

pytestmark = pytest.mark.real
PORT = 8126
HUMANEVAL = ROOT / "problems" / "humaneval.yaml"
PROMPT = [{"role": "user", "content": "Write a Python function that packs circles in a unit square."}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A LoRA-enabled server that `evolve run` reuses, so the test can query it afterwards."""
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    settings = Server(port=PORT, max_model_len=8192, extra_args=["--enforce-eager"])
    with VLLMServer(ensure_model(MODEL), MODEL, settings, log, seed=0, lora_rank=16) as srv:
        yield srv


def grpo_policy(path, name: str, guard: str):
    """A GRPO policy on the shared LoRA server that trains after every call."""
    path.write_text(f"""
name: {name}
model: {MODEL}
server: {{embedded: true, port: {PORT}, max_model_len: 8192}}
sampling: {{temperature: 1.0, max_tokens: 320, group_size: 8, max_prompt_tokens: 4000}}
answer_format: rewrite
train: {{algorithm: grpo, train_every_answers: 1, lr: 1.0e-4, minibatches: 1, micro_batch: 4, guard: {guard}}}
""")
    return path


HUMANEVAL_ARGS = ["--set", "task=HumanEval/0", "--set", "budget.target_objective=null"]


def run_humaneval(policy, run_dir, calls: int, script=None) -> subprocess.CompletedProcess:
    """`evolve run` on HumanEval/0 (the 0.5B model solves it in some answers and not in others:
    a reward signal), or the same through a script that patches the trainer first."""
    if script is None:
        # 1,500 s as below: a whole training run (the merge run took 780 s of its test on an
        # AVX2-only machine, and 900 s on a loaded one, where it was killed at 900)
        return evolve("run", HUMANEVAL, "--policy", policy, "--run-dir", run_dir, "--max-llm-calls", calls,
                      *HUMANEVAL_ARGS, timeout=1500)
    return subprocess.run([sys.executable, str(script), "run", str(HUMANEVAL), "--policy", str(policy),
                           "--run-dir", str(run_dir), "--max-llm-calls", str(calls), "--no-dashboard",
                           *HUMANEVAL_ARGS], cwd=ROOT, capture_output=True, text=True, timeout=1500)


@pytest.fixture
def policy(tmp_path):
    # no guard here: this test is about the plumbing of every step (the guard has its own test)
    return grpo_policy(tmp_path / "grpo.yaml", "test-grpo", "null")


def served_vs_trained(server: VLLMServer, version) -> dict:
    from transformers import AutoTokenizer

    from evolve.config import Train
    from evolve.rl.trainer import Trainer

    body = {"model": version.model, "messages": PROMPT, "max_tokens": 24, "temperature": 0, "seed": 7,
            "logprobs": True, "return_token_ids": True}
    choice = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=300).json()["choices"][0]
    served = [t["logprob"] for t in choice["logprobs"]["content"]]
    model_dir = ensure_model(MODEL)
    prompt = AutoTokenizer.from_pretrained(model_dir).apply_chat_template(
        PROMPT, add_generation_prompt=True, tokenize=True, return_dict=False)
    trainer = Trainer(model_dir, Train(algorithm="grpo"), temperature=1.0, adapter=version.adapter_path)
    trained = trainer.logprobs(prompt, choice["token_ids"])[:len(served)]
    gaps = [abs(a - b) for a, b in zip(served, trained)]
    return {"mean": sum(gaps) / len(gaps), "max": max(gaps), "tokens": len(gaps)}


def first_tokens(server: VLLMServer, model: str) -> tuple[str, list[float]]:
    """Greedy completion of a fixed prompt with its token log-probs."""
    body = {"model": model, "messages": PROMPT, "max_tokens": 24, "temperature": 0, "seed": 7,
            "logprobs": True}
    resp = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=300).json()
    choice = resp["choices"][0]
    return choice["message"]["content"], [t["logprob"] for t in choice["logprobs"]["content"]]


# Slow: on an AVX2-only CPU (AMD Zen 3) the run was killed (-9, out of memory) in its training
# step: the fp32 trainer (about 9.6 GB) beside this module's LoRA-enabled fp32 server.
@pytest.mark.slow
def test_the_hook_trains_hot_loads_and_resumes(server, policy, tmp_path):
    run_dir = tmp_path / "run"
    # A HumanEval task the 0.5B model solves in some answers and not in others: a reward signal
    # (on circle packing its answers now mostly fail or repeat the parent, and those earn nothing).
    first = run_humaneval(policy, run_dir, 4)
    assert first.returncode == 0, first.stdout + first.stderr
    with db_session(run_dir) as s:
        steps = s.scalars(select(TrainingStep).order_by(TrainingStep.version)).all()
        versions = s.scalars(select(PolicyVersion).order_by(PolicyVersion.version)).all()
        calls = s.scalars(select(LLMCall).order_by(LLMCall.id)).all()
        assert steps, first.stdout
        served = [st for st in steps if st.published]
        assert [v.version for v in versions] == list(range(len(versions))) and len(versions) == len(served) + 1
        for step in served:
            assert math.isfinite(step.loss) and step.kl >= 0 and step.train_s > 0 and step.load_s > 0
            # q (top_p 0.95 at T 1) against pi_old: log q - log pi lies in [0, -log 0.95] per token
            # in exact arithmetic; bf16 kernels add noise of the order of SERVED_TOLERANCE.
            assert step.sampler_kl is not None and abs(step.sampler_kl) < 0.5, step.sampler_kl
            # the first call after the load reproduced the trainer's log-probs (run-time check)
            assert step.served_check["ok"] and step.served_check["tokens"] > 0, step.served_check
            assert (run_dir / "adapters" / f"v{step.version}" / "adapter_config.json").exists()
        # Each call records the version that produced it, and was routed to that version's model.
        model_of = {v.version: v.model for v in versions}
        model_of[0] = MODEL
        assert calls[0].policy_version == 0 and calls[-1].policy_version >= 1
        assert all(c.model == model_of[c.policy_version] for c in calls)
        assert all(c.prompt_token_ids for c in calls)
        completions = s.scalars(select(Completion)).all()
        assert all(c.token_ids for c in completions)
        # the sampler's log-prob of every served token, for the trainer's importance weights
        assert all(c.logprobs and len(c.logprobs) == len(c.token_ids) for c in completions)
        latest = versions[-1]
        trained = [st for st in steps if st.mean_abs_advantage > 0]
    assert trained, "no group had a reward signal: every answer of every group scored the same"

    # The server now serves the adapter: same prompt, same seed, different log-probs.
    base_text, base_lp = first_tokens(server, MODEL)
    asyncio.run(load_adapter(server.root_url, latest.model, latest.adapter_path))
    tuned_text, tuned_lp = first_tokens(server, latest.model)
    diff = max(abs(a - b) for a, b in zip(base_lp, tuned_lp))
    assert tuned_text != base_text or diff > 1e-3, (base_text, tuned_text, diff)

    # Served equals trained: the trainer, loading the same adapter from disk, gives the tokens
    # vLLM chose the log-probs vLLM reported (both bf16 bodies; the trainer's head in fp32).
    gap = served_vs_trained(server, latest)
    assert gap["mean"] < SERVED_TOLERANCE["mean"] and gap["max"] < SERVED_TOLERANCE["max"], gap

    # A resume serves the latest adapter again before its first call.
    second = evolve("resume", run_dir, "--max-llm-calls", 5)
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"resumed policy v{latest.version}" in second.stdout
    with db_session(run_dir) as s:
        call = s.scalars(select(LLMCall).order_by(LLMCall.id.desc())).first()
        assert call.policy_version >= latest.version and call.error is None
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert {"training", "adapter"} <= {e["kind"] for e in events}


# `evolve run` with a trainer that breaks every adapter it saves (random LoRA B weights): the
# guard must measure the new version worse on held-out parents and never serve it.
BROKEN_TRAINER = f"""
import sys, torch
sys.path.insert(0, {str(ROOT)!r})
import evolve.rl.trainer as trainer
real_save = trainer.Trainer.save
def save(self, path):
    with torch.no_grad():
        for name, p in self.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 1.0)
    return real_save(self, path)
trainer.Trainer.save = save
from evolve.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_the_guard_never_serves_a_broken_adapter(server, tmp_path):
    policy = grpo_policy(tmp_path / "guarded.yaml", "test-guarded", "{parents: 2, answers: 8, margin: 0.05}")
    script = tmp_path / "broken_evolve.py"
    script.write_text(BROKEN_TRAINER)
    run_dir = tmp_path / "run"
    done = run_humaneval(policy, run_dir, 3, script)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with db_session(run_dir) as s:
        steps = s.scalars(select(TrainingStep)).all()
        measured = [st for st in steps if st.guard and st.guard.get("after")]
        assert measured, (done.stdout[-3000:], [st.guard for st in steps])
        for st in measured:
            assert st.published is False and "worse than v0" in st.guard["why"]
            assert st.guard["after"]["valid"] < st.guard["before"]["valid"]
        assert [v.version for v in s.scalars(select(PolicyVersion))] == [0]  # nothing else served
        assert {c.policy_version for c in s.scalars(select(LLMCall))} == {0}
    assert "not published, v0 keeps serving" in done.stdout
    assert not list((run_dir / "adapters").glob("v*")) if (run_dir / "adapters").exists() else True


# `evolve run` with a trainer whose saved adapter is not what it trained (LoRA B randomised in
# the file only): the server then serves other weights than the trainer's, and the run-time
# check on the first call after the load must refuse the version.
SKEWED_TRAINER = f"""
import sys, torch
from pathlib import Path
from safetensors.torch import load_file, save_file
sys.path.insert(0, {str(ROOT)!r})
import evolve.rl.trainer as trainer
real_save = trainer.Trainer.save
def save(self, path):
    out = real_save(self, path)
    weights = Path(path) / "adapter_model.safetensors"
    skewed = {{k: torch.randn_like(v) if "lora_B" in k else v for k, v in load_file(weights).items()}}
    save_file(skewed, weights)
    return out
trainer.Trainer.save = save
from evolve.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_server_that_does_not_serve_the_trained_adapter_is_caught_on_its_first_call(server, tmp_path):
    policy = grpo_policy(tmp_path / "unguarded.yaml", "test-skewed", "null")  # the check, not the guard
    script = tmp_path / "skewed_evolve.py"
    script.write_text(SKEWED_TRAINER)
    run_dir = tmp_path / "run"
    done = run_humaneval(policy, run_dir, 3, script)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with db_session(run_dir) as s:
        checked = [st for st in s.scalars(select(TrainingStep)) if st.served_check]
        assert checked, done.stdout[-3000:]
        for st in checked:
            assert st.published is False and not st.served_check["ok"], st.served_check
            assert st.served_check["max"] > st.served_check["tolerance"]["max"]
        assert [v.version for v in s.scalars(select(PolicyVersion))] == [0]  # nothing else served
        assert {c.policy_version for c in s.scalars(select(LLMCall))} == {0}
    assert "does not reproduce the trained adapter" in done.stdout
