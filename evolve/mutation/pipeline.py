"""One mutation path for every caller: the search's LLM calls, the held-out measurement, the
RL guard and the mutation benchmark all go prompt -> sample -> split -> apply -> dedupe here,
so an answer means the same child wherever it is scored."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from evolve.config import Policy, Problem
from evolve.mutation.code import MutationError, normalise, split_answers
from evolve.mutation.literals import restored, rounded
from evolve.mutation.prompt import REPAIR, ProgramText, Shown, answer_format, build_messages, make_child
from evolve.mutation.versions import repair_messages


def request_seed(*key: int) -> int:
    """A well-mixed 31-bit seed per call, from its key (a run's seed and call index; the held-out
    salt, parent and call). vLLM seeds the n choices of a request with consecutive values, so
    consecutive request seeds would repeat samples across calls."""
    return int(np.random.SeedSequence(list(key)).generate_state(1)[0] & 0x7FFFFFFF)


def prompt(problem: Problem, policy: Policy, parent: Shown, inspirations: list,
           call_index: int, directive: str | None = None) -> tuple[list[dict], str]:
    """The chat messages of one call, and the answer format it asks for."""
    fmt = answer_format(policy, call_index)
    digits = policy.literal_digits
    return build_messages(problem, shown(parent, digits), [shown(i, digits) for i in inspirations],
                          policy.answers, policy.sampling.max_prompt_tokens, fmt, directive,
                          view=policy.program_view, notes=policy.judge_notes), fmt


def repair_prompt(problem: Problem, policy: Policy, broken: Shown, parent: Shown,
                  call_index: int) -> tuple[list[dict], str]:
    """The re-ask of a broken child (search.repair): it is shown with the judge's reason and the
    model asked to mend it; the answer applies to the broken child."""
    fmt = answer_format(policy, call_index)
    digits = policy.literal_digits
    if fmt == "complete":
        return repair_messages(problem, shown(parent, digits), shown(broken, digits)), fmt
    return build_messages(problem, shown(broken, digits), [], 1, policy.sampling.max_prompt_tokens, fmt,
                          REPAIR, view=policy.program_view, plain_example=True, notes=True), fmt


def asks_knob(problem: Problem, seed: int, call_index: int) -> bool:
    """Whether call `call_index` of a run asks for a knob (search.tuning.knobs): a draw keyed
    by the call, so a resumed run asks the same calls. Only where tuning will set it."""
    t = problem.search.tuning
    if not (t.enabled and t.knobs):
        return False
    return bool(np.random.default_rng([seed, call_index, 1]).random() < t.knobs)


@dataclass(frozen=True)
class Answer:
    text: str
    child: str | None  # the program the answer makes of its parent; None: it does not apply
    error: str | None = None  # why it does not apply


def shown(program: Shown, digits: int | None) -> Shown | ProgramText:
    """A program as the model sees it: its float literals rounded (Policy.literal_digits)."""
    if digits is None:
        return program
    return ProgramText(rounded(program.code, digits), program.status, program.objective, program.headline,
                       program.fitness, program.error)


def apply(parent_code: str, text: str, fmt: str, entry: str, digits: int | None = None) -> Answer:
    """The child an answer makes. `digits`: the parent was shown rounded, so the answer applies
    to what was shown, and the child gets the parent's exact numbers back where it kept them."""
    seen = parent_code if digits is None else rounded(parent_code, digits)
    try:
        return Answer(text, restored(parent_code, seen, make_child(seen, text, fmt, entry)))
    except MutationError as exc:
        return Answer(text, None, str(exc))


def answers(completion: str, m: int) -> list[str]:
    """The (at most m) answers of one completion."""
    return split_answers(completion, m)


def distinct(codes: Iterable[str | None]) -> dict[str, str]:
    """Each distinct child once, keyed by its normalised text: what gets evaluated."""
    return {normalise(code): code for code in codes if code}
