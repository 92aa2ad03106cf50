"""An ensemble policy: the draw of a member per call, and the policy file's checks. The run
through two real vLLM servers is in tests/test_run.py."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from evolve.config import ConfigError, ensemble_members, load_policy
from evolve.mutation.pipeline import request_seed
from evolve.serving.client import Sample
from evolve.serving.ensemble import Ensemble

ROOT = Path(__file__).resolve().parents[2]


class Recorder:
    """A member that says who it is (an isolated unit: the real servers are in test_run.py)."""

    def __init__(self, model: str):
        self.model, self.seeds, self.closed = model, [], False

    async def sample(self, messages, n, seed=None, max_tokens=None, model=None, on_answer=None):
        self.seeds.append(seed)
        return Sample([self.model] * n, ["stop"] * n, 1, n, 0.0, 0.0, model=self.model)

    async def close(self):
        self.closed = True


def test_each_call_goes_to_the_member_its_seed_draws_in_proportion_to_the_shares():
    small, large = Recorder("small"), Recorder("large")
    ensemble = Ensemble([(small, 0.75), (large, 0.25)], seed=0)
    seeds = [request_seed(0, k) for k in range(2000)]
    answered = [asyncio.run(ensemble.sample([], 2, seed=s)).model for s in seeds]
    assert answered == [ensemble.pick(s).model for s in seeds]  # the draw depends on the seed alone
    assert small.seeds + large.seeds and sorted(small.seeds + large.seeds) == sorted(seeds)
    assert 0.22 < answered.count("large") / len(answered) < 0.28
    assert ensemble.model == "small"  # the policy's own model names the ensemble
    asyncio.run(ensemble.close())
    assert small.closed and large.closed


def test_the_shipped_ensemble_loads_its_member():
    members = ensemble_members(load_policy(ROOT / "policies" / "ensemble.yaml"))
    assert [(p.model, share) for p, share in members] == [
        ("qwen2.5-coder-0.5b-instruct", 0.5), ("qwen2.5-coder-1.5b-instruct", 0.5)]


MEMBER = "name: m\nmodel: smollm2-135m-instruct\nserver: {embedded: true, port: 8301}\n"


@pytest.mark.parametrize("policy, member, expect", [
    ("ensemble: [{policy: m.yaml, share: 0.5}]\ntrain: {algorithm: grpo}\n", MEMBER, "cannot train"),
    ("ensemble: [{policy: m.yaml, share: 0.6}, {policy: m.yaml, share: 0.4}]\n", MEMBER, "sum to 1"),
    ("ensemble: [{policy: m.yaml, share: 1.5}]\n", MEMBER, "ensemble.0.share"),
    ("ensemble: [{policy: m.yaml, share: 0.5}]\n", MEMBER + "train: {algorithm: vpo}\nanswers: 3\n",
     "ensemble.0.policy': m.yaml must be a frozen single-model policy"),
    ("ensemble: [{policy: m.yaml, share: 0.5}]\n", MEMBER.replace("8301", "8300"), "port 8300"),
    ("ensemble: [{policy: gone.yaml, share: 0.5}]\n", MEMBER, "gone.yaml: file not found"),
])
def test_a_bad_ensemble_is_one_line_naming_the_file_and_field(tmp_path, policy, member, expect):
    (tmp_path / "m.yaml").write_text(member)
    path = tmp_path / "e.yaml"
    path.write_text("name: e\nmodel: qwen2.5-coder-0.5b-instruct\nserver: {embedded: true, port: 8300}\n" + policy)
    with pytest.raises(ConfigError) as err:
        load_policy(path)
    message = str(err.value)
    assert "\n" not in message and expect in message and message.startswith(str(path)), message
