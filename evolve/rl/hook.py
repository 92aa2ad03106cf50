"""The RL hook: retrain the mutator on the run's own archive and hot-swap it into vLLM.

After every `train_every_answers` answers of the current policy version (on-policy; rounded
up to whole groups), the controller pauses generation and calls `step`: advantages (GRPO or VPO) -> one LoRA training
step -> the adapter saved under RUN_DIR/adapters/vN -> loaded into the running server by name
-> a new policy version recorded -> later calls go to it. A resume loads the latest adapter.
"""
from __future__ import annotations

import asyncio
import json
import math
import shutil
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from evolve.config import Policy, Problem
from evolve.judge.evaluator import Evaluator
from evolve.rl import advantages
from evolve.rl.guard import Guard
from evolve.rl.publish import Publisher
from evolve.rl.rollouts import Group, complete_groups
from evolve.serving.adapters import load_adapter
from evolve.serving.client import Sampler
from evolve.store.database import ProgramDatabase
from evolve.store.schema import PolicyVersion, TrainingStep

if TYPE_CHECKING:  # torch and peft: imported at the first step, not with the hook
    from evolve.rl.trainer import Trainer


class HookError(RuntimeError):
    pass


# Served vs trained log-probs of the same tokens, in nats: bf16 kernels differ between vLLM's
# CPU backend and torch, so exact equality is not expected; an adapter that is not the
# trained one (or not loaded at all) moves them by far more (tests/rl/test_rl_run.py).
SERVED_TOLERANCE = {"mean": 0.1, "max": 1.0}
CHECK_TOKENS = 32  # the served-equals-trained probe's answer length: seconds, not minutes
# But a step can move log-probs by far less than that tolerance (one step's KL to the base was
# 8e-5), and a bf16 merge rounds a small change of a weight back to the weight itself. So the
# check also measures the update: the share of (trained - base) that the server reproduces,
# (served - base) projected on it. Where the update is larger than the kernels' own noise
# (UPDATE_FLOOR nats per token on average) and the server shows less than MIN_SHARE of it, the
# server is not serving the trained version. Below the floor 32 tokens cannot tell: recorded only.
UPDATE_FLOOR, MIN_SHARE = 0.1, 0.5


@dataclass
class ServedCheck:
    """Served against trained log-probs of the tokens of one short answer (stored with the step)."""
    ok: bool
    tokens: int  # 0: the server gave nothing to compare, so no verdict
    seconds: float
    mean: float = 0.0  # |served - trained| in nats
    max: float = 0.0
    tolerance: dict[str, float] = field(default_factory=dict)
    update: float = 0.0  # |trained - base| in nats, per token on average: the step's size here
    update_share: float | None = None  # of (trained - base), the share the server reproduces

    def mismatch(self) -> str:
        if self.update_share is not None and self.update >= UPDATE_FLOOR and self.update_share < MIN_SHARE:
            return (f"the server reproduces {self.update_share:.0%} of the trained update (|trained - base| "
                    f"{self.update:.3f} nats per token over {self.tokens} tokens): its weights lost the step "
                    "(a bf16 merge rounds small changes away); serve it hot-loaded or from float32 weights")
        return (f"the server does not reproduce the trained adapter: its log-probs of {self.tokens} "
                f"sampled tokens differ by {self.mean:.3f} nats on average and {self.max:.3f} at most "
                f"(tolerance {self.tolerance['mean']:.3f} / {self.tolerance['max']:.3f}); a remote "
                "vLLM must run with --logprobs-mode processed_logprobs")


async def serve_current(db: ProgramDatabase, mode: str, base_url: str) -> None:
    """An endpoint back from an outage may have restarted: serve it the run's current version
    (hot-loaded; a merged version is the server's own weights)."""
    current = db.policy_version()
    if current.version > 0 and mode == "hot_load" and current.adapter_path:
        await load_adapter(base_url.rstrip("/").removesuffix("/v1"), current.model, current.adapter_path)


class RLHook:
    def __init__(self, policy: Policy, problem: Problem, db: ProgramDatabase, run_dir: Path,
                 model_dir: Path, server_url: str, emit: Callable[..., None], run_seed: int = 0,
                 server=None, replicas: tuple[str, ...] | list[str] = (), unreachable: Callable[[str, str], None] | None = None):
        assert policy.train is not None
        seed = run_seed if policy.train.seed is None else policy.train.seed
        self.policy, self.train, self.db = policy, policy.train.model_copy(update={"seed": seed}), db
        self.components = [c.name for c in problem.components]
        weights = problem.weight_vector()
        self.weights = np.array([weights[c] for c in self.components])
        self.adapters = Path(run_dir) / "adapters"
        self.model_dir, self.emit = model_dir, emit
        self.trainer: Trainer | None = None  # loaded at the first step: ~7 GB not needed before
        self.stop = threading.Event()  # set on interrupt: a step in progress is abandoned
        self.held_since: float | None = None  # a step found no signal: wait for a step's worth of new groups
        self.guard = Guard(self.train.guard, problem, policy, db) if self.train.guard is not None else None
        self.saved: dict | None = None  # the trainer's state before the step, while the guard decides
        self.publish = Publisher(policy.model, self.train.serve, run_dir, server_url, server, replicas, unreachable)
        if self.train.serve == "merge" and self.publish.mode != "merge":
            emit("adapter", "serve: merge needs the run's own embedded server; hot-loading adapters instead")

    @property
    def served(self) -> str:
        """The name the current version is served under: every search call names it."""
        return self.publish.served

    # ---- when -------------------------------------------------------------------------------
    def groups_per_step(self) -> int:
        """Calls (groups) that bring `train_every_answers` answers: G completions of m answers each."""
        per_call = self.policy.sampling.group_size * self.policy.answers
        return -(-self.train.train_every_answers // per_call)

    def _answered(self) -> int:
        """Calls of the current version answered since the last step that published nothing."""
        return self.db.calls_of(self.db.policy_version().version, since=self.held_since)

    def due(self) -> bool:
        """A step's worth of groups of the current version were generated (since the last step
        that published nothing); the controller then waits until they are all scored before it
        calls `step` (so rewards are known)."""
        return self._answered() >= self.groups_per_step()

    def full(self, in_flight: int) -> bool:
        """The calls answered and in flight make a step: a call started now would be one too many.
        (With two loops, the call in flight joined the step: up to 7 groups where 6 were due.)"""
        return self._answered() + in_flight >= self.groups_per_step()

    def _groups(self, version: int) -> list[Group]:
        """A step's groups: exactly `groups_per_step`, the newest of the version, so that every
        step is the same size (a step that found no signal leaves its groups behind)."""
        groups = complete_groups(self.db.rollout_rows(version, logprobs=True), self.components,
                                 penalties=self.train.penalties, reward=self.train.reward)
        return groups[-self.groups_per_step():]

    # ---- resume -----------------------------------------------------------------------------
    async def resume(self, client: Sampler) -> None:
        """Serve the run's latest adapter again (a fresh server knows none)."""
        current = self.db.policy_version()
        if self.guard is not None:
            self.guard.restore(self.db.last_guard())
        took = await self.publish.resume(current)
        if current.version > 0 and (self.publish.mode == "hot_load" or took > 1.0):
            how = f"served merged into the weights in {took:.0f} s" if self.publish.mode == "merge" \
                else f"loaded in {took:.2f} s"
            self.emit("adapter", f"resumed policy v{current.version} ({current.model}), {how}",
                      version=current.version, load_s=took)

    # ---- one step ---------------------------------------------------------------------------
    async def step(self, client: Sampler, evaluator: Evaluator) -> TrainingStep | None:
        current = self.db.policy_version()
        groups = self._groups(current.version)
        if not groups:  # due() said generated; the controller drained: they must be complete
            raise HookError(f"policy v{current.version}: groups were generated but none is fully "
                            "scored; refusing to train on partial rewards")
        new = current.version + 1
        adv, rewards = self.advantages(groups, new)
        if not any(np.any(a != 0) for a in adv):  # nothing to learn: publish nothing
            self.held_since = time.time()
            self.emit("training", f"policy v{current.version} keeps serving: no signal in {len(groups)} "
                      f"groups (every advantage is zero); trying again after {self.groups_per_step()} more",
                      version=current.version, groups=len(groups), published=False)
            return None
        guard = self.guard
        # the name the current version is served under ("base" is only its label)
        if guard is not None and not await guard.prepare(client, (current.version, self.served), evaluator):
            self.held_since = time.time()  # unmeasurable is not known to be no worse: do not train yet
            self.emit("training", f"policy v{current.version} keeps serving: no held-out parent for the guard "
                      "yet (an elite that no call used as its parent); trying again after "
                      f"{self.groups_per_step()} more groups", version=current.version, groups=len(groups),
                      published=False)
            return None
        self.emit("training", f"training policy v{new} ({self.train.algorithm}) on {len(groups)} groups",
                  version=new, groups=len(groups))
        if self.publish.mode == "merge":  # it restarts after the step anyway; meanwhile the trainer gets
            # its memory (~8 GB with the KV cache): beside it, a 12 GB step thrashed a 24 GB machine
            await asyncio.to_thread(self.publish.stop_server, f"training policy v{new}")
        step = await asyncio.to_thread(self._train, groups, adv, current)
        from evolve.rl.trainer import release_memory

        rss = await asyncio.to_thread(release_memory)  # before a server starts beside the trainer
        path = self.adapters / f"v{new}"
        name = f"{self.policy.name}-v{new}"
        version = PolicyVersion(run_id=self.db.run_id, version=new, model=name, adapter_path=str(path))
        step.run_id, step.version = self.db.run_id, new
        step.groups, step.reward_mean = len(groups), float(np.mean(np.concatenate(rewards)))
        step.mean_abs_advantage = float(np.mean(np.abs(np.concatenate(adv))))
        step.published = True
        # served as the run will serve it: merged (a restart) or hot-loaded; the guard measures it so
        step.load_s = await self.publish.serve(version)
        if guard is not None:
            verdict = await guard.check(client, current.version, (new, name), evaluator)
            step.guard, step.published = verdict.record(), verdict.ok
            if not verdict.ok:
                await self._refuse(step, name, path, current, f"{verdict.why} (guard: {len(verdict.parent_ids)} "
                                   f"held-out parents, {verdict.after.seconds:.0f} s)")
                return None
        check = await self._served_check(client, name, groups[-1])
        step.served_check = asdict(check)
        if not check.ok:
            step.published = False
            await self._refuse(step, name, path, current, check.mismatch())
            return None
        self.db.add(version)
        self.db.add(step)
        await self.publish.switch(version, current)
        said = f", guard: {step.guard['why']}" if step.guard else ""
        served = "merged and restarted in" if self.publish.mode == "merge" else "loaded"
        self.emit("adapter", f"policy v{new} serving: loss {step.loss:+.4f}, KL {step.kl:.2e}, "
                  f"{_sampler_kl(step)}mean |A| {step.mean_abs_advantage:.3f}, trained {step.train_s:.1f} s, "
                  f"{served} {step.load_s:.2f} s{_served_line(check)}{said}, the process held "
                  f"{rss[0] / 1024:.1f} GB after the step, {rss[1] / 1024:.1f} GB once it gave freed memory back",
                  version=new, loss=step.loss, kl=step.kl, served_check=step.served_check, rss_mb=rss,
                  sampler_kl=step.sampler_kl, mean_abs_advantage=step.mean_abs_advantage,
                  train_s=step.train_s, load_s=step.load_s)
        return step

    async def _refuse(self, step: TrainingStep, name: str, path: Path, current: PolicyVersion, why: str) -> None:
        """The new version must not serve (the guard measured it worse, or the server does not
        reproduce it): the trainer goes back to the state it had before the step, and the hook
        waits for a step's worth of new groups. A merged server goes back to the current version."""
        await self.publish.withdraw(name, current)
        assert self.saved is not None, "_train saved the trainer's state before the step"
        await asyncio.to_thread(self._trainer().restore, self.saved)
        shutil.rmtree(path, ignore_errors=True)  # the next step saves its own v{new}
        shutil.rmtree(self.publish.merged / f"v{step.version}", ignore_errors=True)
        self.held_since = time.time()
        self.db.add(step)
        self.emit("training", f"policy v{step.version} not published, v{current.version} keeps serving: {why}",
                  version=current.version, refused=step.version, published=False, why=why)

    async def _served_check(self, client: Sampler, name: str, group: Group) -> ServedCheck:
        """The first call to a newly served version, against the trainer's log-probs of the
        tokens it sampled. A server that serves another adapter (or none, or a stale merged
        copy) moves them by far more than the kernels' bf16 noise."""
        started = time.time()
        sample = await client.sample(group.messages, 1, seed=self.train.seed, max_tokens=CHECK_TOKENS, model=name)
        ids, served = (sample.token_ids or [None])[0], (sample.logprobs or [None])[0]
        prompt = sample.prompt_token_ids or group.prompt_token_ids
        if not ids or served is None or prompt is None or len(served) != len(ids):
            return ServedCheck(True, 0, time.time() - started)  # nothing to compare
        trained = np.array(await asyncio.to_thread(self._trainer().logprobs, prompt, ids))
        base = np.array(await asyncio.to_thread(self._trainer().logprobs, prompt, ids, False))
        gaps = np.abs(np.array(served) - trained)
        # top_p renormalises the nucleus: a sampled token's served log-prob may exceed the
        # trainer's (which has no top_p) by up to -log(top_p).
        slack = -math.log(self.policy.sampling.top_p)
        tolerance = {k: v + slack for k, v in SERVED_TOLERANCE.items()}
        mean, most = float(gaps.mean()), float(gaps.max())
        update = trained - base
        size, moved = float(np.dot(update, update)), float(np.abs(update).mean())
        share = float(np.dot(np.array(served) - base, update) / size) if size > 0 else None
        shown = share is None or moved < UPDATE_FLOOR or share >= MIN_SHARE
        return ServedCheck(mean <= tolerance["mean"] and most <= tolerance["max"] and shown, len(gaps),
                           time.time() - started, mean, most, tolerance, moved, share)

    def _trainer(self) -> Trainer:
        assert self.trainer is not None, "a step is refused or checked only after it trained"
        return self.trainer

    def advantages(self, groups: list[Group], version: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per group: (advantage per rollout, the algorithm's reward per rollout)."""
        out_a, out_r = [], []
        for g in groups:
            matrices = [r.answers for r in g.rollouts]
            if self.train.algorithm == "grpo":
                # m = 1: the scalar reward of the rollout's answer (zero when it failed)
                rewards = advantages.scalar_rewards([m[0] if len(m) else None for m in matrices],
                                                    self.weights.tolist())
            else:
                # Fresh Dirichlet weights per group and step, reproducible from the seeds.
                rng = np.random.default_rng([self.train.seed or 0, version, g.call_id])  # (seed: set in __init__)
                _, rewards = advantages.vpo(matrices, self.train.dirichlet_k, self.train.dirichlet_alpha, rng)
            # what the rollout's failed answers cost (all 0 unless train.penalties grades them)
            rewards = rewards - np.array([r.penalty for r in g.rollouts])
            a = advantages.normalize(rewards)
            out_a.append(np.asarray(a, dtype=float))
            out_r.append(np.asarray(rewards, dtype=float))
        return out_a, out_r

    def _train(self, groups, adv, current: PolicyVersion) -> TrainingStep:
        """Runs in a worker thread: no database access here."""
        from evolve.rl.trainer import Trainer

        if self.trainer is None:
            adapter = Path(current.adapter_path) if current.adapter_path else None
            self.trainer = Trainer(self.model_dir, self.train, self.policy.sampling.temperature, adapter)
        started = time.time()
        self.saved = self.trainer.checkpoint()  # the guard or the served check may refuse the step
        stats = self.trainer.step([self.trainer.encode(g, a) for g, a in zip(groups, adv)], self.stop)
        self.trainer.save(self.adapters / f"v{current.version + 1}")
        return TrainingStep(algorithm=self.train.algorithm, rollouts=stats.rollouts, loss=stats.loss,
                            kl=stats.kl, clip_fraction=stats.clip_fraction, train_s=time.time() - started,
                            sampler_kl=stats.sampler_kl,
                            peak_rss_mb=stats.peak_rss_mb, started_at=started)


def _sampler_kl(step: TrainingStep) -> str:
    """The sampler-to-trainer KL for a log line, when the sampler's log-probs were served."""
    return "" if step.sampler_kl is None else f"sampler KL {step.sampler_kl:.2e}, "


def _served_line(check: ServedCheck) -> str:
    if not check.tokens:
        return ""
    share = "" if check.update_share is None else \
        f"; {check.update_share:.0%} of the update |Δ| {check.update:.3f}" + (" (too small to verify)"
                                                                          if check.update < UPDATE_FLOOR else "")
    return f", serves as trained (Δ log p {check.mean:.3f} mean, {check.max:.3f} max{share})"


def train_offline(db: ProgramDatabase, problem: Problem, policy: Policy, out_dir: Path,
                  max_steps: int | None, emit: Callable[..., None]) -> list[TrainingStep]:
    """`evolve train`: train on every completed group of a stored run, a step's worth at a time.

    The run's own history is left as it is (its calls were made by its own policy versions):
    the adapters and a metrics.jsonl go to `out_dir`, ready to be served by any vLLM.
    """
    from evolve.serving.models import model_path

    hook = RLHook(policy, problem, db, out_dir, model_path(policy.model), "", emit, db.run_seed())
    hook.adapters = Path(out_dir)
    hook.guard = None  # offline: no server to measure on, every adapter is written
    groups = complete_groups(db.rollout_rows(logprobs=True), hook.components, penalties=hook.train.penalties,
                             reward=hook.train.reward)
    size = hook.groups_per_step()
    batches = [groups[i:i + size] for i in range(0, len(groups) - size + 1, size)]
    steps = []
    with open(Path(out_dir) / "metrics.jsonl", "a") as log:
        for version, batch in enumerate(batches[:max_steps], start=1):
            adv, rewards = hook.advantages(batch, version)
            previous = PolicyVersion(version=version - 1, adapter_path=None)
            step = hook._train(batch, adv, previous)
            step.version, step.groups = version, len(batch)
            step.reward_mean = float(np.mean(np.concatenate(rewards)))
            step.mean_abs_advantage = float(np.mean(np.abs(np.concatenate(adv))))
            row = {k: getattr(step, k) for k in ("version", "algorithm", "groups", "rollouts", "loss", "kl",
                                                 "sampler_kl", "clip_fraction", "mean_abs_advantage",
                                                 "reward_mean", "train_s", "peak_rss_mb")}
            log.write(json.dumps(row) + "\n")
            log.flush()
            emit("training", f"step {version}/{len(batches[:max_steps])}: loss {step.loss:+.4f}, "
                 f"KL {step.kl:.2e}, {_sampler_kl(step)}mean |A| {step.mean_abs_advantage:.3f}, "
                 f"{step.train_s:.1f} s, "
                 f"peak RSS {step.peak_rss_mb:.0f} MB -> {hook.adapters / f'v{version}'}", **row)
            steps.append(step)
    return steps
