"""The mutator: prompts built from a parent and inspirations, answered by an
OpenAI-compatible server (the embedded vLLM, a GPU vLLM, or a hosted API)."""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

from openai import AsyncOpenAI

from .code import apply_answer, evolve_block, outline
from .config import Policy, Problem
from .versions import STOP, apply_completion, versions_messages

SYSTEM = """You are an expert programmer improving a program by evolution.
You change only the code between `# EVOLVE-BLOCK-START` and `# EVOLVE-BLOCK-END`.
"""

# How an answer is written. Small models copy the worked example whatever its format, so each
# format has its own (DESIGN §6: 0/10 valid diffs zero-shot, 6-10/10 with one example).
RULES = {
    "diff": """Answer with SEARCH/REPLACE blocks. SEARCH copies lines of the current program exactly,
indentation included; REPLACE holds the new lines:

<<<<<<< SEARCH
exact lines from the current program
=======
new lines that replace them
>>>>>>> REPLACE

Keep the function names and the return format. Write one short sentence of intent, then
the blocks, nothing else.""",
    "rewrite": """Answer with one short sentence of intent, then the complete new code of the block in one
```python fenced block: every line between the markers, changed or not, nothing outside them.
Keep the function names and the return format.""",
}
FORMATS = tuple(RULES)  # what `mix` alternates; `complete` (evolve/versions.py) has no rules

# A worked example given as a previous chat turn is followed far more reliably than one
# embedded in the instructions.
EXAMPLE_PROGRAM = """import math

# EVOLVE-BLOCK-START
def place_points(n):
    \"\"\"Return n points in the unit interval, as far apart as possible.\"\"\"
    step = 1.0 / n
    points = [i * step for i in range(n)]
    return points
# EVOLVE-BLOCK-END
"""

EXAMPLE_EDITS = [
    ("Centre the points so the end gaps are equal.",
     "    points = [i * step for i in range(n)]", "    points = [(i + 0.5) * step for i in range(n)]"),
    ("Use the whole interval, both ends included.",
     "    step = 1.0 / n\n    points = [i * step for i in range(n)]",
     "    step = 1.0 / max(n - 1, 1)\n    points = [i * step for i in range(n)]"),
    ("Spread the points with a cosine law.",
     "    points = [i * step for i in range(n)]",
     "    points = [0.5 - 0.5 * math.cos(math.pi * (i + 0.5) / n) for i in range(n)]"),
]


def _diff(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}\n=======\n{replace}\n>>>>>>> REPLACE"


def _rewrite(search: str, replace: str) -> str:
    block = EXAMPLE_PROGRAM.split("# EVOLVE-BLOCK-START\n")[1].split("# EVOLVE-BLOCK-END")[0]
    return f"```python\n{block.replace(search, replace).rstrip()}\n```"


def example_turns(m: int, fmt: str = "diff") -> list[dict]:
    """A worked example as one user/assistant exchange, in the answer format asked for."""
    user = (f"## Problem\nPlace n points in [0, 1] with the largest minimum gap.\n\n"
            f"### Current program (min gap 0.0000)\n```python\n{EXAMPLE_PROGRAM}```\n\n"
            f"## Task\n{_answer_instructions(m, fmt)}")
    edits = [EXAMPLE_EDITS[i % len(EXAMPLE_EDITS)] for i in range(m)]
    write = _diff if fmt == "diff" else _rewrite
    if m == 1:
        intent, search, replace = edits[0]
        answer = f"{intent}\n{write(search, replace)}"
    else:
        answer = "\n".join(f"<answer_{i}>\n{intent}\n{write(search, replace)}\n</answer_{i}>"
                           for i, (intent, search, replace) in enumerate(edits, 1))
    return [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]


def scores_line(program, problem: Problem) -> str:
    """What the model is told about a program: its status, headline and vector fitness."""
    if program.status != "ok":
        return f"status {program.status}"
    comps = ", ".join(f"{k}={v:.4f}" for k, v in (program.fitness or {}).items())
    if problem.headline == "objective":
        head = ""
    elif program.headline is None:  # valid on other components, not on the headline's
        head = f"{problem.headline} invalid; "
    else:
        head = f"{problem.headline} = {program.headline:.6f}; "
    return f"{head}objective {program.objective:.4f}; normalised components: {comps}"


def _program_section(title: str, program, problem: Problem, whole: bool) -> str:
    code = program.code if whole else evolve_block(program.code)
    return f"### {title} ({scores_line(program, problem)})\n```python\n{code.rstrip()}\n```\n"


def _current_section(parent, problem: Problem, view: str) -> str:
    """The parent whole, or (view "block") the code around its block as an outline, then the block."""
    context = outline(parent.code) if view == "block" else ""
    if not context:
        return _program_section("Current program", parent, problem, view == "whole")
    return (f"### Code outside the EVOLVE-BLOCK (fixed; the block may use it)\n```python\n"
            f"{context.strip()}\n```\n"
            + _program_section("Current EVOLVE-BLOCK", parent, problem, False))


def _answer_instructions(m: int, fmt: str = "diff") -> str:
    how = ("SEARCH/REPLACE blocks against the current program" if fmt == "diff"
           else "the complete new code of the EVOLVE-BLOCK in a ```python block")
    if m == 1:
        return f"Propose one improvement as {how}."
    tags = " ".join(f"<answer_{i}>...</answer_{i}>" for i in range(1, m + 1))
    return (f"Propose {m} genuinely different improvements, each aiming at a different trade-off "
            f"between the components. Write each as {how}, inside numbered sections: {tags}. "
            f"Later answers should differ from earlier ones.")


def build_messages(problem: Problem, parent, inspirations: list, m: int,
                   max_prompt_tokens: int, fmt: str = "diff", directive: str | None = None,
                   view: str = "whole") -> list[dict]:
    """Chat messages for one mutation request in answer format `fmt` (diff | rewrite | complete),
    dropping inspirations to stay in budget. `directive`: the kind of change asked for;
    `view`: how the parent is shown (Policy.program_view)."""
    insp = list(inspirations)
    current = _current_section(parent, problem, view) if fmt != "complete" else ""
    while True:
        if fmt == "complete":
            messages = versions_messages(problem, parent, insp)
        else:
            messages = _chat(problem, current, insp, m, fmt, directive)
        if not insp or estimate_tokens(messages) <= max_prompt_tokens:
            return messages
        insp.pop()  # the last inspirations are the least useful (diverse ones come last)


def _chat(problem: Problem, current: str, insp: list, m: int, fmt: str, directive: str | None) -> list[dict]:
    """The instructions, a worked example in the answer format, then the request."""
    user = (f"## Problem\n{problem.description.strip()}\n\n"
            + "".join(_program_section(f"Inspiration {i + 1}", p, problem, False) for i, p in enumerate(insp))
            + current
            + "\n## Task\n" + (f"{directive}\n" if directive else "") + _answer_instructions(m, fmt))
    return [{"role": "system", "content": SYSTEM + "\n" + RULES[fmt]}, *example_turns(m, fmt),
            {"role": "user", "content": user}]


def answer_format(policy: Policy, call_index: int) -> str:
    """The format of one call: the policy's, or alternating diff / rewrite for `mix`."""
    if policy.answer_format != "mix":
        return policy.answer_format
    return FORMATS[call_index % len(FORMATS)]


def make_child(parent: str, answer: str, fmt: str, entry: str) -> str:
    """The child program an answer in format `fmt` makes of the parent (MutationError if none)."""
    return apply_completion(parent, answer, entry) if fmt == "complete" else apply_answer(parent, answer)


def estimate_tokens(messages: list[dict]) -> int:
    # ~3.5 characters per token for code with BPE tokenizers; only used for budgeting.
    return int(sum(len(m["content"]) for m in messages) / 3.5) + 8


@dataclass
class Sample:
    texts: list[str]
    finish_reasons: list[str | None]
    prompt_tokens: int | None
    completion_tokens: int | None
    started_at: float
    latency_s: float
    token_ids: list[list[int] | None] | None = None  # per choice, as served (vLLM only)
    prompt_token_ids: list[int] | None = None
    logprobs: list[list[float] | None] | None = None  # per choice, the sampler's (training only)


class PolicyClient:
    """Async OpenAI-compatible client; one call samples a whole group with `n`."""

    def __init__(self, policy: Policy, base_url: str, model: str):
        self.policy = policy
        self.model = model  # the served name requests go to: the base model or an adapter
        self.is_vllm = policy.server.embedded or policy.train is not None
        key = os.environ.get(policy.server.api_key_env, "") if policy.server.api_key_env else ""
        # No silent retries in the SDK: evolve.faults.PolicyLink retries, says so, and restarts
        # the embedded server when it is gone.
        self.client = AsyncOpenAI(base_url=base_url, api_key=key or "EMPTY", max_retries=0,
                                  timeout=policy.server.request_timeout_s)

    async def sample(self, messages: list[dict], n: int, seed: int | None = None,
                     max_tokens: int | None = None) -> Sample:
        s = self.policy.sampling
        extra = {"seed": seed} if (s.seed_requests and seed is not None) else {}
        # vLLM returns the exact token ids it sampled, so training needs no re-tokenising;
        # other OpenAI-compatible servers may reject the unknown field, so only ask vLLM.
        body = {"return_token_ids": True} if self.is_vllm else {}
        if self.is_vllm and self.policy.train is not None:
            body["logprobs"] = True  # q(token) of every sampled token: the trainer's IS weights
        if messages[-1]["role"] == "assistant":
            # A prefix to continue (the `complete` format): vLLM's continue_final_message, and
            # the answer ends with the function it completes.
            body |= {"continue_final_message": True, "add_generation_prompt": False}
            extra["stop"] = STOP
        started = time.time()
        resp = await self.client.chat.completions.create(
            model=self.model, messages=messages, n=n, temperature=s.temperature, top_p=s.top_p,
            max_tokens=max_tokens or s.max_tokens, extra_body=body or None, **extra)
        choices = sorted(resp.choices, key=lambda c: c.index)
        usage = resp.usage
        return Sample(texts=[c.message.content or "" for c in choices],
                      finish_reasons=[c.finish_reason for c in choices],
                      prompt_tokens=usage.prompt_tokens if usage else None,
                      completion_tokens=usage.completion_tokens if usage else None,
                      started_at=started, latency_s=time.time() - started,
                      token_ids=[getattr(c, "token_ids", None) for c in choices],
                      prompt_token_ids=getattr(resp, "prompt_token_ids", None),
                      logprobs=[_logprobs(c) for c in choices])

    async def close(self) -> None:
        await self.client.close()


def _logprobs(choice) -> list[float] | None:
    content = getattr(getattr(choice, "logprobs", None), "content", None)
    return None if content is None else [float(t.logprob) for t in content]


def dump_messages(messages: list[dict]) -> str:
    """Prompts are stored as the exact chat messages so training can re-render them."""
    return json.dumps(messages, ensure_ascii=False)
