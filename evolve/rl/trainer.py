"""LoRA policy-gradient training of the mutator (transformers + peft), docs/design.md §7.

One `step` trains on a batch of groups whose advantages are already computed (by GRPO or VPO:
evolve/rl/advantages.py); the loss is the shared PPO-clip loss of evolve/rl/loss.py.

Cost on CPU is dominated by the prompt (≈1.6k tokens) against completions of ≈100-500 tokens,
and all G completions of a group share their prompt. So the prompt runs forward and backward once
per group, and its key/value cache is reused by every micro-batch of completions; the result
is exactly the gradient of running every prompt+completion pair separately
(tests/rl/test_trainer.py checks it).
"""
from __future__ import annotations

import copy
import ctypes
import gc
import resource
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch.utils.checkpoint import checkpoint
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache
from transformers.utils import logging as hf_logging

from evolve.config import Train
from evolve.rl.loss import importance_weights, policy_loss, token_logprobs
from evolve.rl.rollouts import Group
from evolve.serving.server import cpu_computes_bf16

OPTIMIZER_FILE = "optimizer.pt"
# Positions whose fp32 logits exist at once. A vocabulary of 152k makes two 1,024-token answers'
# logits 1.2 GB, several times over with the softmax and its gradient (a VPO step was killed for
# memory); in chunks, recomputed in backward, the head costs ~50 MB per 64 positions instead.
HEAD_CHUNK = 64


class Interrupted(Exception):
    """The run is stopping: the step was abandoned, the adapter is unchanged."""


@dataclass
class Sequence:
    prompt: torch.Tensor  # (P,) token ids
    completions: list[torch.Tensor]  # (L_i,) token ids each
    advantages: torch.Tensor  # (G,)
    sampler: torch.Tensor | None = None  # (G, Lmax) the sampler's log-probs; NaN: not known


@dataclass
class StepStats:
    loss: float
    kl: float  # mean per-token KL to the base model
    clip_fraction: float
    tokens: int
    sampler_kl: float | None  # mean per-token KL(sampler || trainer's old policy); None: not served
    rollouts: int
    train_s: float
    peak_rss_mb: float


class Trainer:
    def __init__(self, model_dir: Path, train: Train, temperature: float, adapter: Path | None = None):
        self.train, self.temperature = train, max(temperature, 1e-3)
        # Progress bars on stderr would tear through the live dashboard.
        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        torch.manual_seed(train.seed if train.seed is not None else 0)  # the hook sets the run seed
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.device = train_device(train.device)
        self.dtype = compute_dtype(self.device)
        # Frozen base weights in bf16 where the hardware computes in it (half the memory); peft
        # keeps the LoRA weights in fp32 and puts them on the base layers' device.
        base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=self.dtype).to(self.device)  # type: ignore[arg-type]  # transformers' stubs type .to() as a decorator
        if adapter is not None:
            self.model = PeftModel.from_pretrained(base, adapter, is_trainable=True)
        else:
            self.model = get_peft_model(base, LoraConfig(
                r=train.lora_rank, lora_alpha=train.lora_alpha, lora_dropout=0.0,  # type: ignore[arg-type]  # peft types it int; it scales by alpha / r
                target_modules=train.target_modules, task_type="CAUSAL_LM"))
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=train.lr, weight_decay=0.0)
        # The LM head in fp32 (frozen: LoRA does not touch it). Under bf16 autocast its output
        # would be bf16 logits, which quantise log-probs by 0.06-0.12 nats: as much as a PPO
        # ratio's clip range. The body stays in its compute dtype; the head always runs in fp32.
        head = self.model.get_output_embeddings()
        self.head_weight = head.weight.detach().float()
        self.head_bias = head.bias.detach().float() if getattr(head, "bias", None) is not None else None
        if adapter is not None and (Path(adapter) / OPTIMIZER_FILE).exists():
            self.optimizer.load_state_dict(torch.load(Path(adapter) / OPTIMIZER_FILE, map_location=self.device))

    # ---- data ------------------------------------------------------------------------------
    def encode(self, group: Group, advantages: np.ndarray) -> Sequence:
        """Token ids as served when stored; otherwise the chat template and the text again."""
        prompt = group.prompt_token_ids or self.tokenizer.apply_chat_template(
            group.messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        completions, sampled = [], []
        for r in group.rollouts:
            ids = r.token_ids
            if ids is None:
                ids = self.tokenizer(r.text, add_special_tokens=False)["input_ids"]
                if r.finish_reason == "stop":
                    ids = ids + [self.tokenizer.eos_token_id]
            completions.append(torch.tensor(ids or [self.tokenizer.eos_token_id]))
            # The sampler's log-probs belong to the served tokens; re-tokenised text has none.
            known = r.logprobs is not None and r.token_ids is not None and len(r.logprobs) == len(ids)
            sampled.append(r.logprobs if known and r.logprobs is not None else [])
        sampler = torch.full((len(completions), max(len(c) for c in completions)), float("nan"))
        for i, lp in enumerate(sampled):
            sampler[i, :len(lp)] = torch.tensor(lp, dtype=torch.float32)
        return Sequence(torch.tensor(list(prompt)), completions,
                        torch.tensor(advantages, dtype=torch.float32),
                        sampler if any(sampled) else None)

    # ---- training --------------------------------------------------------------------------
    def step(self, sequences: list[Sequence], stop: threading.Event | None = None) -> StepStats:
        """One training step: `epochs` passes over `minibatches` optimizer steps.

        Groups whose advantages are all zero carry no policy gradient and are skipped.
        """
        started = time.time()
        sequences = [s for s in sequences if bool(s.advantages.abs().max() > 0)]
        chunks = [c for c in np.array_split(np.arange(len(sequences)), self.train.minibatches) if len(c)]
        # Old log-probs must come from the policy before any update; the first minibatch of
        # the first epoch sees exactly that policy, so only the others need a separate pass.
        need_old = {i for c in chunks[1:] for i in c} | (set(range(len(sequences))) if self.train.epochs > 1 else set())
        old = {i: self._logprobs(sequences[i], adapter=True, stop=stop) for i in sorted(need_old)}
        ref = {i: self._logprobs(s, adapter=False, stop=stop) for i, s in enumerate(sequences)} \
            if self.train.kl_coef > 0 else {}
        totals = {"loss": 0.0, "kl": 0.0, "clipped": 0.0, "tokens": 0.0, "sampler_kl": 0.0, "sampled": 0.0}
        self.model.train()
        for _ in range(self.train.epochs):
            for chunk in chunks:
                self._minibatch([(sequences[i], old.get(i), ref.get(i)) for i in chunk], totals, stop)
        tokens = max(totals["tokens"], 1)
        return StepStats(loss=totals["loss"], kl=totals["kl"] / tokens,
                         clip_fraction=totals["clipped"] / tokens, tokens=int(totals["tokens"]),
                         sampler_kl=totals["sampler_kl"] / totals["sampled"] if totals["sampled"] else None,
                         rollouts=sum(len(s.completions) for s in sequences),
                         train_s=time.time() - started, peak_rss_mb=peak_rss_mb())

    def _minibatch(self, items, totals: dict, stop: threading.Event | None) -> None:
        n_tokens = float(sum(len(c) for seq, _, _ in items for c in seq.completions))
        self.optimizer.zero_grad(set_to_none=True)
        for seq, old, ref in items:
            for parts, kl_sum, sampled in self._group_losses(seq, old, ref, n_tokens, stop):
                totals["sampler_kl"] += float(kl_sum)
                totals["sampled"] += int(sampled)
                totals["loss"] += float(parts.loss.detach())
                totals["kl"] += float(parts.kl)
                totals["clipped"] += float(parts.clipped)
        totals["tokens"] += int(n_tokens)
        params = [p for p in self.model.parameters() if p.requires_grad]
        torch.nn.utils.clip_grad_norm_(params, self.train.max_grad_norm)
        self.optimizer.step()

    def _group_losses(self, seq: Sequence, old, ref, n_tokens: float, stop):
        """Backpropagate one group through its shared prompt, which is run forward and backward once.

        The micro-batches see the prompt's outputs (key/values, last logits) as leaf tensors and
        accumulate their gradients; one final backward carries the sum through the prompt.
        """
        with self._autocast():
            prompt_kv, last_hidden = self._prompt(seq.prompt)
            outputs = [t for kv in prompt_kv for t in kv] + [last_hidden]
            leaves = [t.detach().requires_grad_() for t in outputs]
            leaf_kv = list(zip(leaves[:-1:2], leaves[1:-1:2]))
            for idx in _micro_batches(seq, self.train.micro_batch):
                _check(stop)
                logp, mask = self._completion_logprobs(seq, idx, leaf_kv, leaves[-1])
                width, dev = logp.shape[1], self.device
                old_b = old[idx, :width].to(dev) if old is not None else logp.detach()
                ref_b = ref[idx, :width].to(dev) if ref is not None else None
                weights, kl_sum, sampled = None, torch.zeros(()), torch.zeros(())
                if seq.sampler is not None:
                    weights, kl_sum, sampled = importance_weights(
                        old_b, seq.sampler[idx, :width].to(dev), mask, self.train.is_cap)
                parts = policy_loss(logp, old_b, ref_b, seq.advantages[idx].to(dev), mask, clip=self.train.clip,
                                    kl_coef=self.train.kl_coef, n_tokens=n_tokens, weights=weights)
                parts.loss.backward()
                yield parts, kl_sum, sampled
        grads = [leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for leaf in leaves]
        torch.autograd.backward(outputs, grads)

    def logprobs(self, prompt: list[int], completion: list[int], adapter: bool = True) -> list[float]:
        """The trained policy's log-probs of one completion's tokens, at the sampling
        temperature: what a server serving this adapter must report for them (adapter=False:
        the base model's, against which the update is measured)."""
        seq = Sequence(torch.tensor(list(prompt)), [torch.tensor(list(completion))], torch.zeros(1))
        return self._logprobs(seq, adapter=adapter, stop=None)[0, :len(completion)].tolist()

    @torch.no_grad()
    def _logprobs(self, seq: Sequence, adapter: bool, stop) -> torch.Tensor:
        """(G, Lmax) log-probs of every completion token, without gradients."""
        self.model.eval()
        rows = torch.zeros(len(seq.completions), max(len(c) for c in seq.completions))
        with self._autocast(), _adapter(self.model, adapter):
            prompt_kv, last_hidden = self._prompt(seq.prompt)
            for idx in _micro_batches(seq, self.train.micro_batch):
                _check(stop)
                logp, _ = self._completion_logprobs(seq, idx, prompt_kv, last_hidden)
                rows[idx, :logp.shape[1]] = logp.float().cpu()
        return rows

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.dtype == torch.bfloat16)

    def _body(self, **inputs):
        """The transformer without its head (LoRA included): last hidden states and the cache."""
        return self.model.get_base_model().model(**inputs)

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 logits from hidden states, outside any autocast."""
        with torch.autocast(self.device.type, enabled=False):
            return torch.nn.functional.linear(hidden.float(), self.head_weight, self.head_bias)

    def _token_logprobs(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """(b, W) log-probs of targets from hidden states (b, W, H), HEAD_CHUNK positions at a
        time; under autograd each chunk's logits are recomputed in backward, never stored."""
        def chunk(h, t):
            return token_logprobs(self._head(h), t, self.temperature)
        parts = []
        for start in range(0, hidden.shape[1], HEAD_CHUNK):
            h, t = hidden[:, start:start + HEAD_CHUNK], targets[:, start:start + HEAD_CHUNK]
            grad = torch.is_grad_enabled() and h.requires_grad
            parts.append(checkpoint(chunk, h, t, use_reentrant=False) if grad else chunk(h, t))
        return torch.cat(parts, dim=1)

    def _prompt(self, prompt: torch.Tensor):
        """The prompt's key/values and its last hidden state (which predicts the first token)."""
        out = self._body(input_ids=prompt[None].to(self.device), use_cache=True)
        kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
        return kv, out.last_hidden_state[:, -1]

    def _completion_logprobs(self, seq: Sequence, idx: torch.Tensor, prompt_kv, last_hidden):
        """Log-probs (b, Lmax) of completions idx given the prompt's cache, and their mask.

        Right padding needs no attention mask: a causal model never lets a real token see
        the padding after it, and padded positions are masked out of the loss.
        """
        comps = [seq.completions[i] for i in idx.tolist()]
        width = max(len(c) for c in comps)
        ids = torch.zeros(len(comps), width, dtype=torch.long)
        mask = torch.zeros(len(comps), width)
        for row, c in enumerate(comps):
            ids[row, :len(c)], mask[row, :len(c)] = c, 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        cache = DynamicCache(ddp_cache_data=[(k.expand(len(comps), -1, -1, -1), v.expand(len(comps), -1, -1, -1))
                                             for k, v in prompt_kv])
        hidden = last_hidden.expand(len(comps), -1)[:, None]
        if width > 1:
            body = self._body(input_ids=ids[:, :-1], past_key_values=cache, use_cache=True).last_hidden_state
            # Token 0 is predicted by the prompt's last position, token t by completion position t-1.
            hidden = torch.cat([hidden.to(body.dtype), body], dim=1)
        return self._token_logprobs(hidden, ids), mask

    # ---- rolling back a step the guard refused ----------------------------------------------
    def checkpoint(self) -> dict:
        """The trainable weights and the optimizer state, copied (a LoRA: a few MB)."""
        return {"weights": {n: p.detach().clone() for n, p in self.model.named_parameters() if p.requires_grad},
                "optimizer": copy.deepcopy(self.optimizer.state_dict())}

    def restore(self, saved: dict) -> None:
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                if n in saved["weights"]:
                    p.copy_(saved["weights"][n])
        self.optimizer.load_state_dict(saved["optimizer"])

    # ---- saving ----------------------------------------------------------------------------
    def save(self, path: Path) -> Path:
        """The adapter in PEFT format (what vLLM loads) plus the optimizer state, atomically."""
        path = Path(path)
        tmp = path.with_name(path.name + ".tmp")
        self.model.save_pretrained(str(tmp))
        torch.save(self.optimizer.state_dict(), tmp / OPTIMIZER_FILE)
        if path.exists():  # this version was trained before, never published: the run stopped first
            shutil.rmtree(path)
        tmp.replace(path)
        return path


class _adapter:
    """Context: the LoRA on (the current policy) or off (the base model, KL's reference)."""

    def __init__(self, model: PeftModel, on: bool):
        self.model, self.on, self.ctx = model, on, None

    def __enter__(self):
        if not self.on:
            self.ctx = self.model.disable_adapter()
            self.ctx.__enter__()

    def __exit__(self, *exc):
        if self.ctx is not None:
            self.ctx.__exit__(*exc)


def _micro_batches(seq: Sequence, size: int) -> list[torch.Tensor]:
    """Completion indices in micro-batches of similar length: padding is wasted compute."""
    order = sorted(range(len(seq.completions)), key=lambda i: len(seq.completions[i]))
    return list(torch.tensor(order).split(size))


def _check(stop: threading.Event | None) -> None:
    if stop is not None and stop.is_set():
        raise Interrupted()


def merge_adapter(model_dir: Path, adapter: Path, out: Path) -> Path:
    """The base weights with `adapter` merged in, saved as a model directory vLLM can serve
    (written next to `out` and renamed, so a cut merge never looks finished)."""
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
    PeftModel.from_pretrained(base, adapter).merge_and_unload().save_pretrained(tmp)
    for f in Path(model_dir).iterdir():  # tokenizer, chat template, generation config
        if f.is_file() and not f.name.endswith(".safetensors") and not (tmp / f.name).exists():
            shutil.copy(f, tmp / f.name)
    shutil.rmtree(out, ignore_errors=True)
    tmp.replace(out)
    return out


def serve_merged(server, base_dir: Path, base_name: str, version: int, name: str, adapter: str | None,
                 merged: Path) -> bool:
    """Restart `server` on policy `version` merged into the weights (the base, under `base_name`,
    for v0), merging into `merged`/v<version> first where no copy is there; nothing when it serves
    them already. True if it restarted."""
    weights, served = (Path(base_dir), base_name) if version == 0 else (Path(merged) / f"v{version}", name)
    if version > 0 and not (weights / "config.json").exists():
        assert adapter is not None, f"policy v{version} was published without an adapter"
        merge_adapter(base_dir, Path(adapter), weights)
    if server.running() and (server.model_dir, server.served_name) == (weights, served):
        return False
    server.serve(weights, served)
    return True


def train_device(setting: str) -> torch.device:
    """`auto`: the GPU when torch sees one (a training step there takes seconds, not minutes)."""
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if setting == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device is cuda, but torch sees no GPU (torch.cuda.is_available() is False)")
    return torch.device(setting)


def compute_dtype(device: torch.device) -> torch.dtype:
    """bf16 where the hardware computes in it, fp32 elsewhere. A CPU without AVX-512 (an AMD
    Zen 3 here) emulates bf16: a training step ran 10-80x slower in it than in fp32."""
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if cpu_computes_bf16() else torch.float32  # the server's rule too


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    """The process's resident memory now (Linux), in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def release_memory() -> tuple[float, float]:
    """Give the memory a training step freed back to the system; (RSS before, after) in MB.

    A step's activations are tensors of tens of MB, which glibc serves from its heaps and keeps
    after they are freed: the trainer's process stayed near its peak (11+ GB) while vLLM
    restarted beside it, and on a 24 GB machine vLLM once found 1.25 GB free for its 4 GB KV
    cache and would not start. malloc_trim hands the free pages back."""
    before = rss_mb()
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim this way
        pass
    return before, rss_mb()
