"""Training data from the archive: each LLM call is a group, each completion a rollout whose
answers are linked to child programs and their reward vectors (docs/design.md §7).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from evolve.config import Penalties
from evolve.mutation.code import NOT_PARSED, UNCHANGED
from evolve.store.database import RolloutRows
from evolve.store.schema import Completion, LLMCall, Program


@dataclass
class Rollout:
    completion_id: int
    text: str
    token_ids: list[int] | None  # as served by vLLM; None: re-tokenise the text
    finish_reason: str | None
    answers: np.ndarray  # (m_g, k): one reward vector per parsed answer; failures are zeros
    valid: np.ndarray | None = None  # (m_g,) bool: the answer applied and its child scored
    logprobs: list[float] | None = None  # the sampler's, per token of token_ids (vLLM only)
    penalty: float = 0.0  # the mean over its answers of what their failures cost (Penalties)
    # (m_g,) bool: valid and found something new, not its parent's outputs nor a copy of a stored
    # program (outcome `same`, whose reward row is zeros): what valid rates and diversity count
    new: np.ndarray | None = None


@dataclass
class Group:
    call_id: int
    policy_version: int
    messages: list[dict]
    prompt_token_ids: list[int] | None
    rollouts: list[Rollout]


def reward_vector(program: Program, components: list[str], parent: Program | None = None) -> np.ndarray:
    """An answer's reward: its normalised fitness if it ran and scored, else the zero vector;
    with `parent` (train.reward: improvement), what it gained over the parent per component,
    clipped at 0, so that a valid answer worse than its parent earns what a failed one does.

    An answer that found nothing new (outcome `same`: its parent's outputs, or a copy of a
    stored program such as an inspiration) earns nothing: copying is not progress."""
    if program.status != "ok" or not program.fitness or program.outcome == "same":
        return np.zeros(len(components))
    own = fitness_vector(program.fitness, components)
    return own if parent is None else gain(own, fitness_vector(parent.fitness, components))


def fitness_vector(fitness: dict | None, components: list[str]) -> np.ndarray:
    """Normalised components in the given order, each >= 0 (a missing one is 0)."""
    return np.array([max(float((fitness or {}).get(c, 0.0)), 0.0) for c in components])


def gain(own: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """train.reward: improvement: what an answer gained over its parent per component, clipped at
    0, so that a valid answer worse than its parent earns what a failed one does."""
    return np.clip(own - parent, 0.0, None)


def failure_kind(program: Program) -> str | None:
    """How far a failed answer got (a field of Penalties), or None for one that found something
    new (valid, with outputs of its own)."""
    if program.status == "ok":
        return "unchanged" if program.outcome == "same" else None
    if program.status == "mutation_failed":
        error = program.error or ""
        if error.startswith(UNCHANGED):
            return "unchanged"
        return "error" if error.startswith(NOT_PARSED) else "no_code"
    return "error" if program.status in ("error", "timeout") else "invalid"


def penalty(answers: list[Program], penalties: Penalties | None) -> float:
    if penalties is None or not answers:
        return 0.0
    return float(np.mean([getattr(penalties, kind) if (kind := failure_kind(a)) else 0.0 for a in answers]))


def complete_groups(rows: RolloutRows, components: list[str], limit: int | None = None,
                    penalties: Penalties | None = None, reward: str = "absolute") -> list[Group]:
    """Groups (oldest first) whose every answer has been evaluated, from a run's rollout rows
    (`ProgramDatabase.rollout_rows`, or `rollout_rows` on a read-only session); `reward`: the
    answers' reward vectors, absolute or their improvement over the call's parent (train.reward).

    A group with a child still pending is not complete: its rewards are not known yet.
    """
    groups = []
    for call in rows.calls:
        parent = rows.parents.get(call.id) if reward == "improvement" else None
        group = _group(call, rows.completions.get(call.id, []), rows.children, components, rows.logprobs,
                       penalties, parent)
        if group is not None:
            groups.append(group)
            if limit is not None and len(groups) >= limit:
                break
    return groups


def _group(call: LLMCall, completions: list[Completion], by_completion: dict[int, list[Program]],
           components: list[str], logprobs: bool, penalties: Penalties | None,
           parent: Program | None = None) -> Group | None:
    if not completions:
        return None
    rollouts = []
    for completion in completions:
        answers = by_completion.get(completion.id, [])
        if any(a.status == "pending" for a in answers):
            return None
        matrix = np.array([reward_vector(a, components, parent)
                           for a in answers]).reshape(len(answers), len(components))
        rollouts.append(Rollout(completion.id, completion.text, completion.token_ids,
                                completion.finish_reason, matrix,
                                np.array([a.status == "ok" for a in answers], dtype=bool),
                                completion.logprobs if logprobs else None, penalty(answers, penalties),
                                np.array([a.status == "ok" and a.outcome != "same" for a in answers], dtype=bool)))
    return Group(call.id, call.policy_version, json.loads(call.prompt), call.prompt_token_ids, rollouts)
