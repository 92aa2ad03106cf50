"""Benchmark: serve a trained LoRA by hot-loading it, or merge it into the weights and restart?

On a CPU server every token through a LoRA costs the adapter's extra matmuls (measured in a
run: 50 -> 20-24 tok/s). Merging removes that cost but needs a merged copy of the model and
a server restart for every published version. This measures both on the shipped model:

    python tests/benchmarks/serving.py [--model qwen2.5-coder-0.5b-instruct] [--rank 16]

1. A LoRA-enabled server: tokens/s of the base model and of a hot-loaded adapter (the same
   prompt, n and length: `ignore_eos`, so every answer has max_tokens tokens), and the load.
2. The adapter merged into the weights (peft `merge_and_unload`) and saved: seconds.
3. A plain server on the merged weights: start-up seconds and tokens/s.
It prints the generation time per answer both ways and the answers a version must serve
before merging has paid for its merge and restart.

    python tests/benchmarks/serving.py --batches 8 16

only measures the base model's tokens/s for one call of each n (why a held-out pool asks
for its n answers in one call).
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import httpx
import torch

from evolve.config import Server
from evolve.rl.trainer import merge_adapter
from evolve.serving.adapters import load_adapter
from evolve.serving.models import ensure_model
from evolve.serving.server import VLLMServer

PORT = 8131
PROMPT = [{"role": "user", "content": "Write a Python function that places 26 circles in the unit square so "
                                      "that the sum of their radii is as large as possible. Explain each step."}]


def make_adapter(model_dir: Path, rank: int, out: Path) -> Path:
    """A LoRA of the hook's shape with non-zero weights (a trained one costs the same to serve)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    lora = LoraConfig(r=rank, lora_alpha=2 * rank, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                      task_type="CAUSAL_LM")
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16), lora)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 1e-3)
    model.save_pretrained(out)
    return out


def merge(model_dir: Path, adapter: Path, out: Path) -> float:
    started = time.time()
    merge_adapter(model_dir, adapter, out)  # what the hook does for `train.serve: merge`
    return time.time() - started


def tokens_per_s(server: VLLMServer, model: str, n: int, max_tokens: int, repeats: int) -> float:
    body = {"model": model, "messages": PROMPT, "n": n, "max_tokens": max_tokens, "temperature": 0.8,
            "seed": 0, "ignore_eos": True}
    httpx.post(f"{server.base_url}/chat/completions", json=body | {"max_tokens": 8}, timeout=600)  # warm
    rates = []
    for _ in range(repeats):
        started = time.time()
        usage = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=600).json()["usage"]
        rates.append(usage["completion_tokens"] / (time.time() - started))
    return sorted(rates)[len(rates) // 2]


def batches(model_dir: Path, args, settings: Server) -> None:
    with tempfile.TemporaryDirectory() as tmp, VLLMServer(model_dir, args.model, settings, Path(tmp) / "log") as srv:
        for n in args.batches:
            rate = tokens_per_s(srv, args.model, n, args.max_tokens, args.repeats)
            print(f"n={n:3d}  {rate:6.1f} tok/s  (one call, {args.max_tokens} tokens per answer, "
                  f"median of {args.repeats})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batches", type=int, nargs="+", metavar="N", help="only the base model's tokens/s at these n")
    args = ap.parse_args()
    model_dir = ensure_model(args.model)
    settings = Server(port=PORT, max_model_len=4096, extra_args=["--enforce-eager"])
    if args.batches:
        return batches(model_dir, args, settings)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        adapter = make_adapter(model_dir, args.rank, tmp / "adapter")
        with VLLMServer(model_dir, args.model, settings, tmp / "lora.log", lora_rank=args.rank) as srv:
            base = tokens_per_s(srv, args.model, args.n, args.max_tokens, args.repeats)
            load_s = asyncio.run(load_adapter(srv.root_url, "v1", str(adapter)))
            lora = tokens_per_s(srv, "v1", args.n, args.max_tokens, args.repeats)
        merge_s = merge(model_dir, adapter, tmp / "merged")
        started = time.time()
        with VLLMServer(tmp / "merged", "merged", settings, tmp / "merged.log") as srv:
            start_s = time.time() - started
            merged = tokens_per_s(srv, "merged", args.n, args.max_tokens, args.repeats)
    print(f"{args.model}, LoRA rank {args.rank}, n={args.n}, {args.max_tokens} tokens per answer, "
          f"median of {args.repeats} calls")
    print(f"base model                 {base:6.1f} tok/s")
    print(f"hot-loaded adapter         {lora:6.1f} tok/s   load {load_s:.2f} s")
    print(f"merged weights, restarted  {merged:6.1f} tok/s   merge+save {merge_s:.1f} s, server start {start_s:.1f} s")
    saved = args.max_tokens / lora - args.max_tokens / merged  # seconds saved per answer by merging
    cost = merge_s + start_s - load_s
    if saved > 0:
        print(f"merging pays after {cost / saved:.0f} answers of {args.max_tokens} tokens per version "
              f"({cost:.0f} s of merge and restart against {saved:.2f} s saved per answer)")
    else:
        print("merging saves nothing per answer here: hot-loading is the cheaper way")


if __name__ == "__main__":
    main()
