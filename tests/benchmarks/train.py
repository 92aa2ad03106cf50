"""Benchmark the RL hook's costs.

    python tests/benchmarks/train.py steps RUN_DIR [--policy policies/grpo.yaml] [--steps 2]
        Offline training steps on a stored run's archive (a copy of the run directory is used,
        so the run itself is untouched): seconds per step, tokens, peak RSS of the trainer.
    python tests/benchmarks/train.py group [--prompt-tokens 1600] [--lengths 60 80 ...]
        One group on the shipped Qwen 0.5B (by default a 1.6k-token prompt, 8 completions of
        60-250 tokens, the sizes of a circle-packing call; a VPO call on HumanEval: --prompt-tokens
        1027 --lengths 420 480 520 560 600 640 700 880): seconds of the KL reference pass and of
        the training forward/backward, and the trainer's peak RSS.
    python tests/benchmarks/train.py share RUN_DIR
        For a run made with a training policy: time spent training and hot-loading adapters,
        and its share of the run's wall time.
"""
from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from evolve.rundir import RunDir
from evolve.store.database import connect
from evolve.store.schema import Session as RunSession
from evolve.store.schema import TrainingStep

ROOT = Path(__file__).resolve().parents[2]


def steps(run_dir: Path, policy: Path, n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / run_dir.name
        shutil.copytree(run_dir, copy, ignore=shutil.ignore_patterns("adapters", "offline-*", "vllm.log"))
        spec = json.loads((copy / "run.json").read_text())
        spec["db_url"] = None  # the copy's own database
        (copy / "run.json").write_text(json.dumps(spec))
        out = Path(tmp) / "out"
        subprocess.run([sys.executable, "-m", "evolve.cli", "train", str(copy), "--policy", str(policy),
                        "--steps", str(n), "--out", str(out)], check=True, cwd=ROOT)
        rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    print(f"{'step':>4} {'groups':>6} {'rollouts':>8} {'train s':>8} {'peak RSS MB':>11} {'loss':>8} {'mean|A|':>7}")
    for r in rows:
        print(f"{r['version']:>4} {r['groups']:>6} {r['rollouts']:>8} {r['train_s']:>8.1f} "
              f"{r['peak_rss_mb']:>11.0f} {r['loss']:>8.4f} {r['mean_abs_advantage']:>7.3f}")


def share(run_dir: Path) -> None:
    spec = RunDir(run_dir).spec()
    with Session(connect(spec["db_url"])) as s:
        rows = s.scalars(select(TrainingStep).order_by(TrainingStep.version)).all()
        sessions = s.scalars(select(RunSession).where(RunSession.ended_at.is_not(None))).all()
    wall = sum(x.ended_at - x.started_at for x in sessions)
    train = sum(r.train_s for r in rows)
    load = [r.load_s for r in rows if r.load_s is not None]
    print(f"training steps: {len(rows)}; train {train:.0f} s; hot-load median "
          f"{sorted(load)[len(load) // 2] if load else float('nan'):.2f} s, max {max(load, default=float('nan')):.2f} s")
    print(f"wall time {wall:.0f} s; training share {100 * (train + sum(load)) / max(wall, 1e-9):.1f} %")
    for r in rows:
        print(f"  v{r.version}: {r.groups} groups, {r.rollouts} rollouts, {r.train_s:.1f} s, "
              f"peak RSS {r.peak_rss_mb or 0:.0f} MB, loss {r.loss:+.4f}, KL {r.kl:.2e}, "
              f"mean |A| {r.mean_abs_advantage:.3f}")


def group(prompt_tokens: int, lengths: list[int], runs: int) -> None:
    import time

    import torch

    from evolve.config import Train
    from evolve.rl.trainer import Sequence, Trainer, peak_rss_mb
    from evolve.serving.models import ensure_model

    t = Trainer(ensure_model("qwen2.5-coder-0.5b-instruct"), Train(algorithm="grpo"), temperature=0.8)
    print(f"trainer loaded: peak RSS {peak_rss_mb():.0f} MB")
    g = torch.Generator().manual_seed(0)
    for run in range(runs):  # the first pays one-off kernel set-up
        seq = Sequence(torch.randint(0, 1000, (prompt_tokens,), generator=g),
                       [torch.randint(0, 1000, (n,), generator=g) for n in lengths], torch.randn(len(lengths)))
        started = time.time()
        t._logprobs(seq, adapter=False, stop=None)
        ref = time.time() - started
        started = time.time()
        for _ in t._group_losses(seq, None, None, float(sum(lengths)), None):
            pass
        print(f"run {run}: reference pass {ref:.1f} s, train forward+backward {time.time() - started:.1f} s, "
              f"peak RSS {peak_rss_mb():.0f} MB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["steps", "share", "group"])
    p.add_argument("run_dir", type=Path, nargs="?")
    p.add_argument("--policy", type=Path, default=ROOT / "policies" / "grpo.yaml")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=1600, help="group: the prompt's length")
    p.add_argument("--lengths", type=int, nargs="+", default=[60, 80, 100, 113, 120, 150, 200, 250],
                   help="group: the completions' lengths in tokens")
    p.add_argument("--runs", type=int, default=2, help="group: times the group is run (the first pays set-up)")
    args = p.parse_args()
    if args.mode == "group":
        group(args.prompt_tokens, args.lengths, args.runs)
    elif args.mode == "steps":
        steps(args.run_dir, args.policy, args.steps)
    else:
        share(args.run_dir)


if __name__ == "__main__":
    main()
