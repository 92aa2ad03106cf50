"""Benchmark: how much of a LoRA update survives being merged into bf16 weights.

On a CPU the hook merges each adapter into the base weights and restarts the server on them
(`train.serve: merge`). The shipped models' weights are bf16: a weight plus a change below half
its spacing rounds back to itself, so a small update can be lost in the merge. Per target weight
W (as stored) and update D (the adapter's scale * B @ A, or a random change of a given std):

    kept  = <M - W, D> / <D, D>     the share of D along its own direction after the merge
    error = |M - W - D| / |D|       what the rounding added, relative to D

for M = bf16(W + D) (what the server loads) and M = W + D in float32 (the alternative).

    python tests/benchmarks/merge.py --model ~/.cache/evolve/models/qwen2.5-coder-1.5b-instruct \
        --synthetic 1e-5 3e-5 1e-4
    python tests/benchmarks/merge.py --model DIR --adapter RUN_DIR/adapters/v1 RUN_DIR/adapters/v2
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def base_weights(model: Path, targets: tuple[str, ...]) -> dict[str, torch.Tensor]:
    out = {}
    for shard in sorted(model.glob("*.safetensors")):
        with safe_open(shard, "pt") as f:
            for key in f.keys():
                if key.endswith(".weight") and any(f".{t}." in key for t in targets):
                    out[key.removesuffix(".weight")] = f.get_tensor(key)
    return out


def adapter_updates(adapter: Path) -> dict[str, torch.Tensor]:
    """module name (as in the base model) -> scale * B @ A, in float32."""
    config = json.loads((adapter / "adapter_config.json").read_text())
    scale = config["lora_alpha"] / config["r"]
    with safe_open(adapter / "adapter_model.safetensors", "pt") as f:
        tensors = {k: f.get_tensor(k).float() for k in f.keys()}
    out = {}
    for key, a in tensors.items():
        if ".lora_A." in key:
            b = tensors[key.replace(".lora_A.", ".lora_B.")]
            name = key.split(".lora_A.")[0].removeprefix("base_model.model.")
            out[name] = scale * (b @ a)
    return out


def survival(w: torch.Tensor, d: torch.Tensor) -> dict[str, float]:
    w32 = w.float()
    dd = float((d * d).sum())
    row = {}
    for name, merged in (("bf16", (w32 + d).to(w.dtype).float()), ("fp32", w32 + d)):
        eff = merged - w32
        row[f"kept_{name}"] = float((eff * d).sum()) / dd
        row[f"error_{name}"] = float(torch.linalg.norm(eff - d)) / dd ** 0.5
    return row


def report(rows: dict[str, dict[str, float]], title: str) -> None:
    print(f"\n{title} ({len(rows)} weights)")
    print("| module | weights | kept, bf16 merge (median [min, max]) | error, bf16 | kept, fp32 merge |")
    print("|---|---|---|---|---|")
    for target in (*TARGETS, "all"):
        picked = [r for name, r in rows.items() if target == "all" or name.endswith(target)]
        if not picked:
            continue
        col = lambda k: np.array([r[k] for r in picked])  # noqa: E731
        kept = col("kept_bf16")
        print(f"| {target} | {len(picked)} | {np.median(kept):.1%} [{kept.min():.1%}, {kept.max():.1%}] | "
              f"{np.median(col('error_bf16')):.1%} | {np.median(col('kept_fp32')):.2%} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True, help="the base model's HF safetensors folder")
    ap.add_argument("--adapter", type=Path, nargs="*", default=[], help="PEFT adapter folders a run trained")
    ap.add_argument("--synthetic", type=float, nargs="*", default=[], metavar="STD",
                    help="random changes of this element std instead of an adapter")
    args = ap.parse_args()
    weights = base_weights(args.model.expanduser(), TARGETS)
    median_w = float(np.median(np.concatenate([w.float().abs().flatten()[::97].numpy() for w in weights.values()])))
    print(f"{args.model.name}: {len(weights)} target weights ({', '.join(TARGETS)}), dtype "
          f"{next(iter(weights.values())).dtype}, median |w| {median_w:.2e}")
    for std in args.synthetic:
        gen = torch.Generator().manual_seed(0)
        rows = {name: survival(w, std * torch.randn(w.shape, generator=gen)) for name, w in weights.items()}
        report(rows, f"a random change of std {std:g}")
    for adapter in args.adapter:
        updates = adapter_updates(adapter)
        rows = {name: survival(weights[name], d) for name, d in updates.items() if name in weights}
        sizes = np.array([float(d.abs().mean()) for d in updates.values()])
        report(rows, f"{adapter}: the update's mean |element| {np.median(sizes):.2e} (median over weights)")


if __name__ == "__main__":
    main()
