"""The trainer's CUDA path against its CPU path, on a GPU machine without model weights.

The lent GPU machines have torch, transformers and peft but no vLLM and no weights, and only
64 MiB travel with a call. So the model is built from a shipped model's config with random
weights (the same architecture and tokenizer), saved, and trained by `evolve.rl.trainer.Trainer`
on `cuda` and on `cpu` from the same LoRA initialisation and the same synthetic groups:

    python tests/benchmarks/trainer_cuda.py --config-dir DIR   # config.json + tokenizer files

Prints the log-prob gap between the two devices before and after one step (bf16 kernels
differ, so it is small, not zero), the step's statistics and its seconds on each device.

    python tests/benchmarks/trainer_cuda.py --config-dir DIR --steps policies/grpo.yaml policies/vpo.yaml

also times, on cuda only, one training step of each policy's own settings at the size its
steps have in `runs/compare-he141` (HumanEval/141 on this CPU: GRPO 6 groups of 8 answers of
~350 tokens, VPO 2 groups of 8 completions of ~900 tokens, prompts of ~2,350 tokens), to
price what the trainer costs per step on a GPU against the CPU's 450-750 s.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from evolve.config import Train, load_policy
from evolve.rl.trainer import Sequence, Trainer

FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def random_model(config_dir: Path, out: Path) -> Path:
    """The architecture of config_dir with random weights (seed 0), saved as a model directory."""
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(config_dir), dtype=torch.bfloat16)
    model.save_pretrained(out)
    for name in FILES[1:]:
        if (config_dir / name).exists():
            shutil.copy(config_dir / name, out / name)
    return out


def groups(vocab: int, n: int = 4) -> list[Sequence]:
    g = torch.Generator().manual_seed(1)
    return [Sequence(torch.randint(0, vocab, (400,), generator=g),
                     [torch.randint(0, vocab, (int(n),), generator=g) for n in (60, 120, 90, 30)],
                     torch.tensor([1.0, -0.5, 0.3, -0.8])) for _ in range(n)]


def measure(model_dir: Path, device: str) -> dict:
    train = Train(algorithm="grpo", device=device, seed=0, lr=1e-3, minibatches=1, micro_batch=2)
    trainer = Trainer(model_dir, train, temperature=1.0)
    seqs = groups(trainer.model.config.vocab_size)
    before = torch.cat([trainer._logprobs(s, adapter=True, stop=None).flatten() for s in seqs])
    if device == "cuda":
        torch.cuda.synchronize()
    started = time.time()
    stats = trainer.step(seqs)
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.time() - started
    after = torch.cat([trainer._logprobs(s, adapter=True, stop=None).flatten() for s in seqs])
    peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else stats.peak_rss_mb
    return {"before": before, "after": after, "stats": stats, "seconds": seconds, "peak_mb": peak}


# A step's size in runs/compare-he141 (sqlite: avg prompt_tokens, completion_tokens / n per call).
STEP_SHAPE = {"grpo": (6, 2350, 350), "vpo": (2, 2350, 900)}  # groups, prompt, mean completion


def real_groups(vocab: int, groups: int, prompt: int, mean: int, cap: int) -> list[Sequence]:
    """Groups of 8 with a run's lengths: completions spread 0.75-1.25x the mean, at most `cap`."""
    g = torch.Generator().manual_seed(2)
    lengths = lambda: [min(cap, int(mean * (0.75 + 0.5 * torch.rand(1, generator=g).item()))) for _ in range(8)]  # noqa: E731
    return [Sequence(torch.randint(0, vocab, (prompt,), generator=g),
                     [torch.randint(0, vocab, (n,), generator=g) for n in lengths()],
                     torch.randn(8, generator=g)) for _ in range(groups)]


def time_steps(model_dir: Path, policy_path: Path, repeats: int = 2) -> None:
    """One step at a policy's own settings and a run's step size, on cuda; the first warms up."""
    policy = load_policy(policy_path)
    train = policy.train.model_copy(update={"device": "cuda", "seed": 0})
    trainer = Trainer(model_dir, train, temperature=policy.sampling.temperature)
    groups, prompt, mean = STEP_SHAPE[train.algorithm]
    seqs = real_groups(trainer.model.config.vocab_size, groups, prompt, mean, policy.sampling.max_tokens)
    for i in range(repeats):
        torch.cuda.reset_peak_memory_stats()
        torch.cuda.synchronize()
        started = time.time()
        stats = trainer.step(seqs)
        torch.cuda.synchronize()
        print(f"{policy.name} step {i + 1}/{repeats} on cuda: {time.time() - started:.2f} s, {stats.rollouts} rollouts, "
              f"{stats.tokens} completion tokens, loss {stats.loss:+.4f}, "
              f"peak {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB", flush=True)
    del trainer
    torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config-dir", type=Path, required=True, help="config.json and tokenizer files")
    ap.add_argument("--steps", type=Path, nargs="*", default=[], help="policy files to time a step of")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no GPU: torch.cuda.is_available() is False")
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = random_model(args.config_dir, Path(tmp))
        cuda, cpu = measure(model_dir, "cuda"), measure(model_dir, "cpu")
        report(cuda, cpu)
        for path in args.steps:
            time_steps(model_dir, path)


def report(cuda: dict, cpu: dict) -> None:
    for when in ("before", "after"):
        gap = (cuda[when] - cpu[when]).abs()
        print(f"log-prob gap cuda vs cpu {when} the step: mean {gap.mean():.4f}, max {gap.max():.4f} nats")
    for name, m in (("cuda", cuda), ("cpu", cpu)):
        s = m["stats"]
        moved = (m["after"] - m["before"]).abs().mean()
        print(f"{name}: step {m['seconds']:.2f} s, loss {s.loss:+.4f}, KL {s.kl:.2e}, {s.tokens} tokens, "
              f"mean |change of log-prob| {moved:.4f}, peak {m['peak_mb']:.0f} MB")


if __name__ == "__main__":
    main()
