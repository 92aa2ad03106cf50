"""Benchmark: the smallest difference a comparison's seeds can detect, before it is run.

A training arm's version is read against its base model on the held-out parents, paired by
parent (evolve/compare/report.py: the sign-flip test of the per-parent rate differences). This
script simulates that test from a committed report's base pools: each simulated parent keeps a
base rate drawn from the report's parents (their spread between parents is the noise pairing
removes), the version adds `delta` to every parent's rate, and each side answers `answers` times
per parent. Printed: the share of simulated comparisons the test calls "above" at p < 0.05, per
delta, for one seed's parents and for the seeds' parents pooled.

    python tests/benchmarks/power.py docs/compare-he141/seed-0/figures.json --seeds 3

The final best objective is paired by seed: with n seeds its smallest possible p is 2 / 2^n,
so three seeds can detect nothing there at 0.05, whatever the difference (six are needed).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ALPHA = 0.05


def base_rates(figures: Path) -> dict[str, np.ndarray]:
    """Per frozen arm of the report: its held-out parents' valid and improving rates."""
    fig = json.loads(figures.read_text())
    trained = {r["base"] for r in fig["versions"] if "base" in r}
    out = {}
    for arm in sorted(trained):
        parents = fig["heldout_arms"][arm]["parents"].values()
        out[f"{arm} valid"] = np.array([p["valid"] / p["n"] for p in parents])
        out[f"{arm} improving"] = np.array([p["beats_parent"] / p["n"] for p in parents])
    return out


def sign_flip_p(d: np.ndarray, rng: np.random.Generator, flips: int = 2000) -> np.ndarray:
    """Two-sided sign-flip p of each row of paired differences d (sims x parents), sampled flips."""
    signs = rng.choice([-1.0, 1.0], size=(flips, d.shape[1]))
    observed = np.abs(d.mean(axis=1))
    null = np.abs(d @ signs.T / d.shape[1])  # sims x flips
    return (1 + (null >= observed[:, None] - 1e-12).sum(axis=1)) / (flips + 1)


def power(rates: np.ndarray, parents: int, answers: int, delta: float, sims: int, rng: np.random.Generator) -> float:
    p = rng.choice(rates, size=(sims, parents))
    base = rng.binomial(answers, p) / answers
    version = rng.binomial(answers, np.clip(p + delta, 0, 1)) / answers
    d = version - base
    return float(np.mean((sign_flip_p(d, rng) < ALPHA) & (d.mean(axis=1) > 0)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("figures", type=Path, help="a comparison's figures.json with held-out pools per parent")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--answers", type=int, default=16, help="answers per parent (--heldout-samples)")
    ap.add_argument("--deltas", type=float, nargs="+", default=[0.02, 0.04, 0.06, 0.08, 0.10, 0.15, 0.20])
    ap.add_argument("--sims", type=int, default=2000)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    for name, rates in base_rates(args.figures).items():
        per_seed = len(rates)
        print(f"\n{name}: base rate {rates.mean():.1%} over {per_seed} parents "
              f"(between parents: sd {rates.std():.2f})")
        print(f"| delta | power, one seed ({per_seed} parents) | power, {args.seeds} seeds pooled "
              f"({args.seeds * per_seed} parents) |\n|---|---|---|")
        for delta in args.deltas:
            one = power(rates, per_seed, args.answers, delta, args.sims, rng)
            pooled = power(rates, args.seeds * per_seed, args.answers, delta, args.sims, rng)
            print(f"| {delta:+.2f} | {one:.0%} | {pooled:.0%} |")


if __name__ == "__main__":
    main()
