"""The LoRA trainer on the real (small) shipped model: gradients, a real step, the saved adapter."""
from __future__ import annotations

import contextlib
import json
import math

import numpy as np
import pytest
import torch

from evolve.config import Train
from evolve.rl import trainer as trainer_module
from evolve.rl.loss import token_logprobs
from evolve.rl.rollouts import Group, Rollout
from evolve.rl.trainer import Interrupted, Sequence, Trainer
from evolve.serving.models import ensure_model


@pytest.fixture(scope="module")
def model_dir():
    return ensure_model("smollm2-135m-instruct")


def _random_sequence(lengths=(5, 9, 1, 7), advantages=(1.0, -0.5, 0.3, -0.8)) -> Sequence:
    g = torch.Generator().manual_seed(0)
    return Sequence(torch.randint(0, 1000, (30,), generator=g),
                    [torch.randint(0, 1000, (n,), generator=g) for n in lengths],
                    torch.tensor(advantages))


def test_shared_prompt_gives_the_gradient_of_separate_sequences(model_dir, monkeypatch):
    """The prompt's cache shared by micro-batches must not change the policy gradient."""
    monkeypatch.setattr(trainer_module.torch, "autocast", lambda *a, **k: contextlib.nullcontext())
    t = Trainer(model_dir, Train(algorithm="grpo", kl_coef=0.0, micro_batch=2), temperature=0.8)
    t.model.float()  # exact comparison: no bf16 rounding on either side
    for name, p in t.model.named_parameters():
        if "lora_B" in name:  # B = 0 at init would hide errors in the A path
            torch.nn.init.normal_(p, std=0.02, generator=torch.Generator().manual_seed(1))
    seq = _random_sequence()
    n_tokens = float(sum(len(c) for c in seq.completions))
    for _ in t._group_losses(seq, None, None, n_tokens, None):
        pass
    shared = {n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None}
    t.model.zero_grad()
    for c, a in zip(seq.completions, seq.advantages):  # ratio = 1: grad of -A * logp, token mean
        logits = t.model(input_ids=torch.cat([seq.prompt, c])[None]).logits[:, len(seq.prompt) - 1:-1]
        (-(a * token_logprobs(logits, c[None], 0.8)).sum() / n_tokens).backward()
    worst = max(float((p.grad - shared[n]).abs().max()) for n, p in t.model.named_parameters()
                if p.grad is not None)
    scale = max(float(g.abs().max()) for g in shared.values())
    assert scale > 1e-3 and worst < 1e-3 * scale


def test_a_step_moves_the_policy_towards_positive_advantages(model_dir, tmp_path):
    train = Train(algorithm="grpo", lr=1e-3, minibatches=1, micro_batch=2, kl_coef=1e-3)
    t = Trainer(model_dir, train, temperature=1.0)
    seq = _random_sequence(lengths=(6, 6), advantages=(1.0, -1.0))

    def logp() -> np.ndarray:
        return t._logprobs(seq, adapter=True, stop=None).sum(dim=1).numpy()

    before = logp()
    stats = t.step([seq, _random_sequence(advantages=(0, 0, 0, 0))])  # the zero group is skipped
    after = logp()
    assert stats.rollouts == 2 and stats.tokens == 12 and stats.train_s > 0
    assert after[0] > before[0] and after[1] < before[1]
    path = t.save(tmp_path / "v1")
    config = json.loads((path / "adapter_config.json").read_text())
    assert config["r"] == 16 and (path / "adapter_model.safetensors").exists()
    again = Trainer(model_dir, train, temperature=1.0, adapter=path)  # resume: same policy
    assert np.allclose(again._logprobs(seq, adapter=True, stop=None).sum(dim=1).numpy(), after, atol=1e-2)
    # a run that stopped after saving v1 but before serving it trains v1 again on resume
    (path / "stale").write_text("from the step that was never published")
    assert again.save(path) == path and not (path / "stale").exists()
    assert not path.with_name("v1.tmp").exists()


def test_encode_uses_served_ids_and_falls_back_to_the_chat_template(model_dir):
    t = Trainer(model_dir, Train(algorithm="vpo"), temperature=1.0)
    messages = [{"role": "user", "content": "hello"}]
    served = Group(1, 0, messages, [1, 2, 3], [Rollout(1, "x", [7, 8], "stop", np.zeros((1, 2)))])
    seq = t.encode(served, np.array([0.5]))
    assert seq.prompt.tolist() == [1, 2, 3] and seq.completions[0].tolist() == [7, 8]
    stored = Group(1, 0, messages, None, [Rollout(1, "hi there", None, "stop", np.zeros((1, 2)))])
    seq = t.encode(stored, np.array([0.5]))
    expected = t.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                               return_dict=False)
    assert seq.prompt.tolist() == list(expected)
    assert seq.completions[0].tolist()[-1] == t.tokenizer.eos_token_id
    assert seq.sampler is None  # no sampler log-probs: no importance weights


def test_encode_keeps_the_sampler_log_probs_of_served_tokens_only(model_dir):
    t = Trainer(model_dir, Train(algorithm="grpo"), temperature=1.0)
    rollouts = [Rollout(1, "x", [7, 8], "stop", np.zeros((1, 2)), logprobs=[-0.5, -1.5]),
                Rollout(2, "y", [7, 8, 9], "stop", np.zeros((1, 2)), logprobs=[-0.5]),  # length mismatch
                Rollout(3, "z", [7], "stop", np.zeros((1, 2)))]
    seq = t.encode(Group(1, 0, [{"role": "user", "content": "hi"}], [1, 2], rollouts), np.zeros(3))
    assert seq.sampler.shape == (3, 3)
    assert seq.sampler[0, :2].tolist() == [-0.5, -1.5] and bool(torch.isnan(seq.sampler[0, 2]))
    assert bool(torch.isnan(seq.sampler[1:]).all())


def test_the_sampler_log_probs_weight_the_loss_and_give_the_sampler_kl(model_dir):
    """q = 2 pi_old on every token: weights 1/2 halve the first minibatch's loss (ratio 1, so the
    loss is -mean(w A)), and the sampler-to-trainer KL is log 2."""
    train = Train(algorithm="grpo", minibatches=1, micro_batch=2, kl_coef=0.0, is_cap=2.0)
    losses = {}
    for name in ("plain", "weighted"):
        t = Trainer(model_dir, train, temperature=1.0)
        seq = _random_sequence(lengths=(6, 6), advantages=(1.0, 0.5))
        if name == "weighted":
            seq.sampler = t._logprobs(seq, adapter=True, stop=None) + math.log(2.0)
        stats = t.step([seq])
        losses[name] = stats.loss
    assert losses["plain"] == pytest.approx(-0.75, abs=1e-4)
    assert losses["weighted"] == pytest.approx(-0.375, abs=1e-3)
    assert stats.sampler_kl == pytest.approx(math.log(2.0), abs=1e-3)


def test_a_stop_request_abandons_the_step(model_dir):
    import threading

    t = Trainer(model_dir, Train(algorithm="grpo"), temperature=1.0)
    stop = threading.Event()
    stop.set()
    with pytest.raises(Interrupted):
        t.step([_random_sequence()], stop)


def test_log_probs_come_from_fp32_logits_of_the_body_in_its_compute_dtype(model_dir):
    """bf16 logits would be quantised (spacing 0.06-0.12 at typical magnitudes): as much as a
    PPO ratio's clip range. The body runs in the hardware's compute dtype (bf16 where the CPU
    does it natively, fp32 elsewhere); the head's matmul always runs in fp32."""
    t = Trainer(model_dir, Train(algorithm="grpo"), temperature=0.8)
    native = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert t.dtype == (torch.bfloat16 if native else torch.float32)
    seq = _random_sequence(lengths=(12, 7), advantages=(1.0, -1.0))
    with torch.no_grad(), t._autocast():
        prompt_kv, last = t._prompt(seq.prompt)
        hidden = t._body(input_ids=seq.prompt[None]).last_hidden_state
    first = t._head(last)
    assert hidden.dtype == t.dtype and last.dtype == t.dtype and first.dtype == torch.float32
    assert float((first - first.to(torch.bfloat16).float()).abs().max()) > 0.01  # what bf16 would lose
    # the same fp32 head on the same hidden state, outside any autocast
    expected = hidden[:, -1].float() @ t.model.get_output_embeddings().weight.float().T
    assert torch.allclose(first, expected, atol=1e-4)
    ours = t._logprobs(seq, adapter=True, stop=None)
    assert ours.dtype == torch.float32 and bool(torch.isfinite(ours).all())


def test_the_head_in_chunks_gives_the_same_log_probs_and_gradients(model_dir, monkeypatch):
    """The fp32 head runs HEAD_CHUNK positions at a time and is recomputed in backward (the
    whole (b, W, vocab) logits cost gigabytes): values and gradients must not change."""
    monkeypatch.setattr(trainer_module.torch, "autocast", lambda *a, **k: contextlib.nullcontext())

    def run(chunk: int):
        monkeypatch.setattr(trainer_module, "HEAD_CHUNK", chunk)
        t = Trainer(model_dir, Train(algorithm="grpo", kl_coef=0.0, micro_batch=2), temperature=0.8)
        t.model.float()
        for name, p in t.model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02, generator=torch.Generator().manual_seed(1))
        seq = _random_sequence(lengths=(11, 4, 9, 1))
        logp = t._logprobs(seq, adapter=True, stop=None)
        for _ in t._group_losses(seq, None, None, 25.0, None):
            pass
        return logp, {n: p.grad.clone() for n, p in t.model.named_parameters() if p.grad is not None}

    whole_lp, whole = run(10_000)
    chunked_lp, chunked = run(3)
    assert torch.allclose(whole_lp, chunked_lp, atol=1e-5)
    assert whole.keys() == chunked.keys() and whole
    worst = max(float((g - chunked[n]).abs().max()) for n, g in whole.items())
    scale = max(float(g.abs().max()) for g in whole.values())
    assert scale > 1e-3 and worst < 1e-3 * scale  # fp32 rounding: the sums run in another order
