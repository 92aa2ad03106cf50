"""Rollout records and the hook's bookkeeping on a real SQLite archive (no server needed)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from sqlalchemy import select

from evolve.config import Descriptor, Policy, Search, load_policy
from evolve.mutation import pipeline
from evolve.rl.hook import RLHook
from evolve.rl.rollouts import complete_groups, failure_kind
from evolve.store.database import ProgramDatabase
from evolve.store.schema import Completion, LLMCall, PolicyVersion, Program
from tests.mutation.test_prompt import PROBLEM, ROOT

AXES = [Descriptor(name="a", low=0, high=1, bins=2)]
COMPONENTS = ["x", "y"]


def open_db(tmp_path) -> ProgramDatabase:
    return ProgramDatabase.open(f"sqlite:///{tmp_path / 'evolve.db'}", "test", "p: 1", "q: 2", 0,
                                AXES, Search(islands=1), "toy")


def add_group(db, answers: list[list[tuple[str, dict | None]]], version=0, error=None, started_at=0.0) -> LLMCall:
    """One call; answers[i] = the (status, fitness[, error]) of completion i's children."""
    seed = db.best() or db.add_seed(Program(island=0, origin="seed", status="ok", objective=0.0,
                                            headline=0.0, code="x = 0\n", descriptors={"a": 0.1}))[0]
    call = db.add_call(LLMCall(island=0, parent_id=seed.id, policy_version=version, model="m",
                               prompt=json.dumps([{"role": "user", "content": "hi"}]), n=len(answers),
                               started_at=started_at, error=error, prompt_token_ids=[1, 2]))
    for i, children in enumerate(answers):
        completion = Completion(call_id=call.id, index=i, text=f"answer {i}", token_ids=[5, 6],
                                finish_reason="stop")
        db.add(completion)
        for j, (status, fitness, *error) in enumerate(children):
            db.add(Program(run_id=db.run_id, island=0, origin="mutation", parent_id=seed.id,
                           completion_id=completion.id, answer_index=j, status=status,
                           fitness=fitness, code=f"x = {call.id}{i}{j}\n", error=error[0] if error else None))
    return call


def test_groups_link_answers_to_reward_vectors(tmp_path):
    db = open_db(tmp_path)
    add_group(db, [[("ok", {"x": 0.5, "y": 0.25})], [("invalid", {"x": 0.9, "y": 0.9})],
                   [("mutation_failed", None)], []])
    (group,) = complete_groups(db.rollout_rows(), COMPONENTS)
    assert group.prompt_token_ids == [1, 2] and group.messages[0]["content"] == "hi"
    assert [r.token_ids for r in group.rollouts] == [[5, 6]] * 4
    assert np.array_equal(group.rollouts[0].answers, [[0.5, 0.25]])
    assert np.array_equal(group.rollouts[1].answers, [[0.0, 0.0]])  # invalid: the zero vector
    assert np.array_equal(group.rollouts[2].answers, [[0.0, 0.0]])  # failed to apply: zero
    assert group.rollouts[3].answers.shape == (0, 2)  # no answer at all: an empty set
    assert [r.valid.tolist() for r in group.rollouts] == [[True], [False], [False], []]


def test_pending_errors_and_other_versions_are_not_training_data(tmp_path):
    db = open_db(tmp_path)
    add_group(db, [[("ok", {"x": 1, "y": 0})], [("pending", None)]])
    add_group(db, [[("ok", {"x": 1, "y": 0})]], error="cancelled")
    done = add_group(db, [[("ok", {"x": 1, "y": 0})], [("error", None)]])
    newer = add_group(db, [[("ok", {"x": 0, "y": 1})]], version=1)
    assert [g.call_id for g in complete_groups(db.rollout_rows(0), COMPONENTS)] == [done.id]
    assert [g.call_id for g in complete_groups(db.rollout_rows(1), COMPONENTS)] == [newer.id]
    assert len(complete_groups(db.rollout_rows(), COMPONENTS)) == 2


def _hook(tmp_path, db, algorithm: str, groups=2, emit=lambda *a, **k: None) -> RLHook:
    """A hook that trains every `groups` calls (answers: groups x G x m)."""
    policy = load_policy(ROOT / "policies" / f"{algorithm}.yaml")
    answers = groups * policy.sampling.group_size * policy.answers
    policy = Policy.model_validate({**policy.model_dump(), "train": {**policy.train.model_dump(),
                                                                      "train_every_answers": answers}})
    problem = PROBLEM.model_copy(update={"components": PROBLEM.components[:2],
                                         "headline": PROBLEM.components[0].name, "weights": None})
    hook = RLHook(policy, problem, db, tmp_path, tmp_path, "", emit)
    hook.components = COMPONENTS
    return hook


def test_new_valid_answers_leave_out_the_parents_outputs_and_copies(tmp_path):
    """An answer with its parent's outputs (or a copy) ran, but found nothing: its reward row is
    zeros, and a comparison's valid rate and diversity must not count it (issue 59, defect 5)."""
    from evolve.compare.report import _diversity

    db = open_db(tmp_path)
    add_group(db, [[("ok", {"x": 1, "y": 0})], [("ok", {"x": 0, "y": 1})], [("ok", {"x": 1, "y": 0})],
                   [("invalid", None)]])
    same = db.session.scalars(select(Program).where(Program.origin == "mutation").order_by(Program.id)).all()[1]
    same.outcome = "same"
    db.session.commit()
    [group] = complete_groups(db.rollout_rows(0), COMPONENTS)
    assert [bool(r.valid[0]) for r in group.rollouts] == [True, True, True, False]
    assert [bool(r.new[0]) for r in group.rollouts] == [True, False, True, False]
    problem = SimpleNamespace(components=[SimpleNamespace(name=c) for c in COMPONENTS])
    [row] = _diversity(db.session, db.run_id, problem)
    assert row["valid_rate"] == 0.5 and row["diversity"] == 0.0  # two new answers, alike


def test_an_improvement_reward_pays_only_what_an_answer_gained_over_its_parent(tmp_path):
    """train.reward: improvement (issue 59, defect 4): a valid answer worse than its parent earns
    what a failed one does, where the absolute reward paid it most of a better one's."""
    db = open_db(tmp_path)
    db.add_seed(Program(island=0, origin="seed", status="ok", objective=0.5, headline=0.5, code="x = 0\n",
                        fitness={"x": 0.5, "y": 0.5}, descriptors={"a": 0.1}))
    add_group(db, [[("ok", {"x": 0.8, "y": 0.5})], [("ok", {"x": 0.4, "y": 0.4})], [("ok", {"x": 0.9, "y": 0.1})],
                   [("invalid", None)]])
    rows = db.rollout_rows(0)
    absolute = [r.answers[0].tolist() for r in complete_groups(rows, COMPONENTS)[0].rollouts]
    gained = [r.answers[0].tolist() for r in complete_groups(rows, COMPONENTS, reward="improvement")[0].rollouts]
    assert absolute == [[0.8, 0.5], [0.4, 0.4], [0.9, 0.1], [0.0, 0.0]]
    assert np.allclose(gained, [[0.3, 0.0], [0.0, 0.0], [0.4, 0.0], [0.0, 0.0]])
    hook = _hook(tmp_path, db, "grpo")
    hook.train = hook.train.model_copy(update={"reward": "improvement"})
    [adv], _ = hook.advantages(hook._groups(0), 1)
    assert adv[1] == adv[3] < 0 < adv[0]  # worse = failed, below the group's mean; better above


def test_the_hook_is_due_after_train_every_groups_of_the_current_version(tmp_path):
    db = open_db(tmp_path)
    hook = _hook(tmp_path, db, "grpo")
    add_group(db, [[("ok", {"x": 1, "y": 0})]])
    add_group(db, [[("ok", {"x": 1, "y": 0})]], error="cancelled")  # redone on resume: not counted
    assert not hook.due()
    add_group(db, [[("pending", None)]])  # generated: the controller waits for its scores
    assert hook.due()
    db.add(PolicyVersion(run_id=db.run_id, version=1, model="grpo-v1", adapter_path="x"))
    assert not hook.due()


def test_grpo_and_vpo_advantages_from_the_archive(tmp_path):
    db = open_db(tmp_path)
    add_group(db, [[("ok", {"x": 1.0, "y": 0.0})], [("ok", {"x": 0.0, "y": 0.5})], [("invalid", None)],
                   [("ok", {"x": 1.0, "y": 0.0})]])
    groups = complete_groups(db.rollout_rows(), COMPONENTS)
    adv, rewards = _hook(tmp_path, db, "grpo").advantages(groups, 1)
    assert np.allclose(rewards[0], [0.5, 0.25, 0.0, 0.5])  # uniform weights . reward vector
    s = np.array([0.5, 0.25, 0.0, 0.5])
    assert np.allclose(adv[0], (s - s.mean()) / (s.std() + 1e-6))
    vpo = _hook(tmp_path, db, "vpo")
    a1, r1 = vpo.advantages(groups, 1)
    a2, _ = vpo.advantages(groups, 1)
    a3, _ = vpo.advantages(groups, 2)  # a new step draws new Dirichlet weights
    assert np.array_equal(a1[0], a2[0]) and not np.array_equal(a1[0], a3[0])
    assert r1[0][2] == 0 and r1[0][0] == r1[0][3]



def test_training_draws_follow_the_run_seed_unless_the_policy_fixes_one(tmp_path):
    db = open_db(tmp_path)
    add_group(db, [[("ok", {"x": 1.0, "y": 0.0})], [("ok", {"x": 0.0, "y": 0.5})], [("invalid", None)]])
    groups = complete_groups(db.rollout_rows(), COMPONENTS)
    vpo = _hook(tmp_path, db, "vpo")
    assert vpo.policy.train.seed is None and vpo.train.seed == db.run_seed()
    other = RLHook(vpo.policy, PROBLEM, db, tmp_path, tmp_path, "", lambda *a, **k: None, run_seed=7)
    other.components = COMPONENTS
    assert other.train.seed == 7  # the LoRA initialisation (Trainer) and the Dirichlet stream
    assert not np.array_equal(vpo.advantages(groups, 1)[0][0], other.advantages(groups, 1)[0][0])
    fixed = Policy.model_validate({**vpo.policy.model_dump(), "train": {**vpo.policy.train.model_dump(), "seed": 3}})
    assert RLHook(fixed, PROBLEM, db, tmp_path, tmp_path, "", lambda *a, **k: None, run_seed=7).train.seed == 3


def test_training_is_counted_in_answers_so_grpo_and_vpo_train_equally_often_per_evaluation(tmp_path):
    grpo, vpo = (load_policy(ROOT / "policies" / f"{a}.yaml") for a in ("grpo", "vpo"))
    assert grpo.train.train_every_answers == vpo.train.train_every_answers
    db = open_db(tmp_path)
    g, v = (RLHook(p, PROBLEM, db, tmp_path, tmp_path, "", print) for p in (grpo, vpo))
    assert (g.groups_per_step() * 8 * 1, v.groups_per_step() * 8 * 3) == (48, 48)
    with pytest.raises(ValueError, match="train_every .*is now train_every_answers"):
        Policy.model_validate({**grpo.model_dump(), "train": {"algorithm": "grpo", "train_every": 4}})


async def test_a_step_without_signal_publishes_nothing_and_waits_for_new_groups(tmp_path):
    db = open_db(tmp_path)
    said = []
    hook = _hook(tmp_path, db, "grpo", emit=lambda kind, message, **f: said.append((kind, message, f)))
    add_group(db, [[("invalid", None)], [("invalid", None)]], started_at=1.0)  # every reward zero
    add_group(db, [[("ok", {"x": 0.5, "y": 0.5})], [("ok", {"x": 0.5, "y": 0.5})]], started_at=2.0)  # equal
    assert hook.due()
    assert await hook.step(client=None, evaluator=None) is None
    assert db.policy_version().version == 0  # nothing published: v0 keeps serving
    kind, message, fields = said[-1]
    assert kind == "training" and "no signal" in message and fields["published"] is False
    assert not hook.due()  # the same groups do not trigger another attempt
    add_group(db, [[("ok", {"x": 1.0, "y": 0.0})]], started_at=hook.held_since + 1)
    assert not hook.due()
    add_group(db, [[("invalid", None)]], started_at=hook.held_since + 2)
    assert hook.due()  # a step's worth of new groups: try again, on those two
    assert [g.call_id for g in hook._groups(0)] == [3, 4]


def test_a_step_is_exactly_its_size_and_no_call_starts_past_it(tmp_path):
    """Every step trains on `train_every_answers`: the newest groups of the version, and a call in
    flight that completes the step keeps the other loop from asking one more (issue 59: with two
    loops a GRPO step took up to 7 groups where 6 were due)."""
    db = open_db(tmp_path)
    hook = _hook(tmp_path, db, "grpo", groups=2)
    add_group(db, [[("ok", {"x": 1, "y": 0})]])
    assert not hook.due() and not hook.full(in_flight=0)
    assert hook.full(in_flight=1)  # the call out completes the step: no new one
    for _ in range(2):
        add_group(db, [[("ok", {"x": 0, "y": 1})]])
    assert [g.call_id for g in hook._groups(0)] == [2, 3]  # 3 generated (an older run's way): the newest 2


def test_merging_needs_the_runs_own_server_and_is_the_cpu_default():
    import torch

    from evolve.serving.adapters import serve_mode

    own, shared = SimpleNamespace(reused=False), SimpleNamespace(reused=True)
    assert serve_mode("merge", own) == "merge"
    assert serve_mode("merge", shared) == serve_mode("merge", None) == "hot_load"
    assert serve_mode("hot_load", own) == "hot_load"
    assert serve_mode("auto", own) == ("hot_load" if torch.cuda.is_available() else "merge")
    assert serve_mode("auto", None) == "hot_load"  # an external server is never restarted


async def test_the_first_call_after_a_load_must_reproduce_the_trainers_logprobs(tmp_path):
    """The run-time served-equals-trained check, its arithmetic isolated: a stand-in server
    reports log-probs, a stand-in trainer its own for the same tokens (the real parts:
    tests/rl/test_rl_run.py)."""
    from dataclasses import asdict

    from evolve.rl.hook import SERVED_TOLERANCE
    from evolve.serving.client import Sample

    db = open_db(tmp_path)
    hook = _hook(tmp_path, db, "grpo")
    add_group(db, [[("ok", {"x": 1, "y": 0})]])
    (group,) = complete_groups(db.rollout_rows(), COMPONENTS)
    trained, base = [-0.5, -1.0, -2.0], [-0.5, -1.0, -2.0]
    hook.trainer = SimpleNamespace(logprobs=lambda prompt, ids, adapter=True:
                                   (trained if adapter else base) if prompt == [1, 2] else None)

    class Server:
        def __init__(self, served):
            self.model, self.served, self.asked = "base", served, []

        async def sample(self, messages, n, seed=None, max_tokens=None, model=None, on_answer=None):
            self.asked.append((model, n, max_tokens))
            return Sample(texts=["x"], finish_reasons=["length"], prompt_tokens=2, completion_tokens=3,
                          started_at=0.0, latency_s=0.1, token_ids=[[7, 8, 9]], prompt_token_ids=[1, 2],
                          logprobs=[self.served])

    slack = -np.log(hook.policy.sampling.top_p)  # top_p lifts a sampled token's served log-prob
    close = Server([t + slack for t in trained])
    check = await hook._served_check(close, "grpo-v1", group)
    assert check.ok is True and check.tokens == 3 and close.model == "base"  # the client is not switched
    json.dumps(asdict(check))  # stored as JSON with the step
    assert close.asked == [("grpo-v1", 1, 32)]  # one short answer, from the new version
    assert check.tolerance["max"] == pytest.approx(SERVED_TOLERANCE["max"] + slack)
    far = await hook._served_check(Server([-0.5, -1.0, -0.5]), "grpo-v1", group)  # one token 1.5 nats off
    assert not far.ok and far.max == pytest.approx(1.5) and far.mean == pytest.approx(0.5)
    assert "does not reproduce the trained adapter" in far.mismatch()
    unknown = await hook._served_check(Server(None), "grpo-v1", group)  # no log-probs served: no verdict
    assert unknown.ok and unknown.tokens == 0
    # Measured against the update's own size: training moved these tokens by 0.12 nats each; a
    # server that kept a fifth of it (a bf16 merge's rounding) is within the fixed tolerance of the
    # trained log-probs, yet not serving the trained version; one that kept it all is.
    base[:] = [t - 0.12 for t in trained]
    lost = await hook._served_check(Server([b + 0.024 for b in base]), "grpo-v1", group)
    assert lost.mean == pytest.approx(0.096) and lost.max < lost.tolerance["max"]  # the fixed bounds pass it
    assert lost.mean < lost.tolerance["mean"]
    assert not lost.ok and lost.update == pytest.approx(0.12) and lost.update_share == pytest.approx(0.2)
    assert "reproduces 20% of the trained update" in lost.mismatch()
    kept = await hook._served_check(Server(trained), "grpo-v1", group)
    assert kept.ok and kept.update_share == pytest.approx(1.0)
    base[:] = [t - 0.01 for t in trained]  # an update below the kernels' noise: recorded, not judged
    small = await hook._served_check(Server([b + 0.002 for b in base]), "grpo-v1", group)
    assert small.ok and small.update_share == pytest.approx(0.2)


def _graded(tmp_path, db, algorithm: str, **penalties) -> RLHook:
    hook = _hook(tmp_path, db, algorithm)
    hook.train = hook.train.model_copy(update={"penalties": hook.train.penalties.model_copy(update=penalties)})
    return hook


def test_failed_answers_are_graded_by_how_far_they_got():
    """ThetaEvolve's order: no code < unchanged < error < invalid; the messages are the pipeline's own."""
    parent = "# EVOLVE-BLOCK-START\ndef f():\n    return 1\n# EVOLVE-BLOCK-END\n"
    same = pipeline.apply(parent, "```python\ndef f():\n    return 1  # same\n```", "rewrite", "f")
    broken = pipeline.apply(parent, "```python\ndef f(:\n    return 2\n```", "rewrite", "f")
    nothing = pipeline.apply(parent, "I would make it faster.", "rewrite", "f")
    cases = [(("mutation_failed", nothing.error), "no_code"), (("mutation_failed", same.error), "unchanged"),
             (("mutation_failed", broken.error), "error"), (("error", "boom"), "error"),
             (("timeout", None), "error"), (("invalid", "overlap"), "invalid"), (("ok", None), None)]
    for (status, error), kind in cases:
        assert failure_kind(Program(status=status, error=error)) == kind, (status, error)
    assert failure_kind(Program(status="ok", outcome="same")) == "unchanged"


@pytest.mark.parametrize("algorithm", ["grpo", "vpo"])
def test_graded_penalties_give_a_group_of_failures_a_signal(tmp_path, algorithm):
    db = open_db(tmp_path)
    failures = [("mutation_failed", None, "no SEARCH/REPLACE block or code block in the answer"),
                ("error", None, "ZeroDivisionError"), ("invalid", None, "overlap")]
    m = 3 if algorithm == "vpo" else 1
    add_group(db, [[f] * m for f in failures])
    groups = complete_groups(db.rollout_rows(), COMPONENTS)
    flat, _ = _hook(tmp_path, db, algorithm).advantages(groups, 1)
    assert not np.any(flat[0])  # ungraded: every failure is worth nothing, nothing to learn
    graded = _graded(tmp_path, db, algorithm, no_code=0.3, error=0.1, invalid=0.05)
    groups = complete_groups(db.rollout_rows(), COMPONENTS, penalties=graded.train.penalties)
    adv, rewards = graded.advantages(groups, 1)
    assert np.allclose(rewards[0], [-0.3, -0.1, -0.05])
    assert adv[0][0] < adv[0][1] < adv[0][2]


def test_a_vpo_rollout_pays_for_the_examples_it_copies_beside_an_answer_that_scored(tmp_path):
    """VPO's set reward takes the best answer, so without a penalty a copy of the prompt's
    example beside it costs nothing and is reinforced with it (the collapse measured in issue 21)."""
    db = open_db(tmp_path)
    good = ("ok", {"x": 0.5, "y": 0.5})
    copy = ("mutation_failed", None, "SEARCH block 1 not found in the parent: points = [i * step]")
    add_group(db, [[good, copy, copy], [good, good, good]])
    hook = _graded(tmp_path, db, "vpo", no_code=0.2)
    _, plain = _hook(tmp_path, db, "vpo").advantages(complete_groups(db.rollout_rows(), COMPONENTS), 1)
    assert plain[0][0] == plain[0][1]  # the same best answer: the copies are free
    groups = complete_groups(db.rollout_rows(), COMPONENTS, penalties=hook.train.penalties)
    adv, rewards = hook.advantages(groups, 1)
    assert np.isclose(rewards[0][1] - rewards[0][0], 0.2 * 2 / 3) and adv[0][0] < 0 < adv[0][1]


async def test_a_server_that_does_not_restart_after_a_step_stops_the_run_with_one_line(tmp_path):
    """vLLM once found too little memory beside the trainer and exited while starting: the run
    must stop as a fault (resumable, one line), not with a traceback."""
    from evolve.faults import fault_of
    from evolve.serving.server import ServerError

    class Server:
        log_path, reused, model_dir, served_name = tmp_path / "vllm.log", False, None, None

        def running(self):
            return False

        def serve(self, weights, name):
            raise ServerError(f"vLLM exited with code 1 while starting; last lines of {self.log_path}:\nValueError: ...")

    hook = _hook(tmp_path, open_db(tmp_path), "vpo")
    hook.publish.server, hook.publish.base_dir = Server(), tmp_path / "base"
    with pytest.raises(Exception) as caught:
        await hook.publish._restart_on(PolicyVersion(version=0, model="base"))
    line = fault_of(caught.value)
    assert line is not None and "\n" not in line
    assert line.startswith("the policy server did not restart on base: vLLM exited with code 1 while starting")
    assert str(tmp_path / "vllm.log") in line and "evolve resume" in line


async def test_a_failed_step_stops_the_run_and_the_other_loop_does_not_train_again(tmp_path):
    """Two generation loops: while one trains, the other waits on the lock; once the step has
    failed, it must not start the step again (it did: a second trainer while the run stopped)."""
    import asyncio
    import threading

    from scripted_run import ScriptedClient, write_policy, write_problem

    from evolve.config import load_problem
    from evolve.events import EventLog
    from evolve.faults import Fault
    from evolve.judge.evaluator import Evaluator
    from evolve.run import open_database
    from evolve.search.controller import Controller

    class Hook:
        stop, steps, served = threading.Event(), 0, "scripted"

        def due(self):
            return True

        async def resume(self, client):
            pass

        async def step(self, client, evaluator):
            self.steps += 1
            await asyncio.sleep(0.2)
            raise Fault("the policy server did not restart on vpo-v2")

    problem_path = write_problem(tmp_path, 20)
    problem = load_problem(problem_path)
    problem = problem.model_copy(update={"budget": problem.budget.model_copy(update={"llm_concurrency": 2})})
    policy_path = write_policy(tmp_path)
    policy = load_policy(policy_path)
    spec = {"db_url": f"sqlite:///{tmp_path / 'evolve.db'}", "run_name": "t", "seed": 0, "policy": str(policy_path)}
    db = open_database(spec, problem, policy, tmp_path)
    evaluator, hook = Evaluator(problem), Hook()
    try:
        with EventLog(tmp_path, lambda event: None) as log:
            controller = Controller(problem, policy, db, evaluator, ScriptedClient(), problem.budget, 0, log,
                                    hook=hook)
            assert await controller.run() == "the policy server did not restart on vpo-v2"
    finally:
        evaluator.sandbox.close()
        db.close()
    assert hook.steps == 1


async def test_two_generation_loops_give_every_step_the_same_number_of_calls(tmp_path):
    """Through the controller with two loops of calls: each step finds exactly its calls, none
    that started while the step's worth was already in flight."""
    import threading

    from scripted_run import ScriptedClient, write_policy, write_problem

    from evolve.config import load_problem
    from evolve.events import EventLog
    from evolve.judge.evaluator import Evaluator
    from evolve.run import open_database
    from evolve.search.controller import Controller

    class Hook:  # the RL hook's bookkeeping (due, full) on the run's own calls, without a trainer
        stop, served, per_step = threading.Event(), "scripted", 3

        def __init__(self, db):
            self.db, self.sizes = db, []

        def _answered(self):
            return self.db.calls_of(self.db.policy_version().version)

        def due(self):
            return self._answered() >= self.per_step

        def full(self, in_flight):
            return self._answered() + in_flight >= self.per_step

        async def resume(self, client):
            pass

        async def step(self, client, evaluator):
            version = self.db.policy_version().version
            self.sizes.append(self._answered())
            self.db.add(PolicyVersion(run_id=self.db.run_id, version=version + 1, model="scripted"))

    problem = load_problem(write_problem(tmp_path, 1000, calls=9))  # 3 steps' worth of calls
    problem = problem.model_copy(update={"budget": problem.budget.model_copy(update={"llm_concurrency": 2})})
    policy_path = write_policy(tmp_path)
    policy = load_policy(policy_path)
    spec = {"db_url": f"sqlite:///{tmp_path / 'evolve.db'}", "run_name": "t", "seed": 0, "policy": str(policy_path)}
    db = open_database(spec, problem, policy, tmp_path)
    evaluator, hook = Evaluator(problem), Hook(db)
    try:
        with EventLog(tmp_path, lambda event: None) as log:
            await Controller(problem, policy, db, evaluator, ScriptedClient(), problem.budget, 0, log,
                             hook=hook).run()
    finally:
        evaluator.sandbox.close()
        db.close()
    assert len(hook.sizes) >= 2 and set(hook.sizes) == {hook.per_step}


def test_the_trainer_gives_freed_memory_back_before_a_server_starts():
    import numpy as np

    from evolve.rl.trainer import release_memory, rss_mb

    # Trim first: freed pages the suite left resident would serve the arrays below without
    # raising RSS (CI once saw +582 MB for 800 MB of arrays), and the baseline would be the peak.
    release_memory()
    start = rss_mb()
    held = [np.ones(2_000_000) for _ in range(50)]  # 16 MB each: served from glibc's heaps
    peak = rss_mb()
    del held
    before, after = release_memory()
    assert before >= after and after < start + 200 and peak - after > 400


async def test_the_guard_judges_each_algorithm_by_what_it_optimises(tmp_path, monkeypatch):
    """VPO by its set reward: a completion of two specialists is worth E max(w1, w2) = 3/4, three
    copies of one 1/2, at the same valid and improving rates; GRPO by its reward per answer."""
    from evolve.rl.guard import Rates

    db = open_db(tmp_path)
    vpo = _hook(tmp_path, db, "vpo").guard

    def records(*vectors):
        return [{"status": "ok", "vector": list(v), "beats_parent": False, "same": False} for v in vectors]

    spread, copies = records((1, 0), (0, 1), (0, 0)), records((1, 0), (1, 0), (1, 0))
    assert vpo.reward(spread) == pytest.approx(0.75, abs=0.02) and vpo.reward(copies) == pytest.approx(0.5, abs=0.02)
    assert vpo.reward(records((1, 0), (0, 1), (0, 0))[:2] + [{**spread[0], "same": True}]) == \
        pytest.approx(0.75, abs=0.02)  # an answer with its parent's outputs counts as nothing
    vpo.parents, vpo.measured = [{"id": 1}], {0: Rates(0, 3, 1.0, 0.0, 1.0, vpo.reward(spread))}

    async def measure(client, model, version, evaluator):
        return Rates(version, 3, 1.0, 0.0, 1.0, vpo.reward(copies))

    monkeypatch.setattr(vpo, "measure", measure)
    verdict = await vpo.check(None, 0, (1, "vpo-v1"), evaluator=None)
    assert not verdict.ok and verdict.why.startswith("worse than v0") and "reward 0.742 -> 0.509" in verdict.why
    grpo = _hook(tmp_path, db, "grpo").guard
    assert grpo.reward(spread) == pytest.approx(1 / 3) and grpo.reward(copies) == pytest.approx(0.5)
    old = Rates(**{k: v for k, v in vars(Rates(0, 3, 1.0, 0.0, 1.0)).items() if k != "reward"})
    assert old.reward is None  # a record of before the reward: judged on the two rates only


async def test_the_guard_measures_each_version_as_the_run_serves_it(tmp_path, monkeypatch):
    """Merged serving: the predecessor is measured before the step, on the weights it serves
    (the server then stops for the trainer); the new version on its merged restart. No restart
    for the guard's sake, and a refused version sends the server back to the current one."""
    import evolve.rl.trainer
    from evolve.rl.guard import Rates
    from evolve.rl.hook import ServedCheck
    from evolve.store.schema import TrainingStep

    db = open_db(tmp_path)
    hook, seen = _hook(tmp_path, db, "grpo"), []
    base = hook.served  # v0 is served under the base model's own name
    served = [base]
    hook.publish.mode, hook.trainer = "merge", SimpleNamespace(restore=lambda state: seen.append("restore"))
    hook.publish.server = SimpleNamespace(stop=lambda why: seen.append("stop"))
    rates = {base: 0.5, "grpo-v1": 0.1}  # v1 worse by more than the margin: refused

    async def serve(version):
        served.append(hook.publish.name_of(version))
        seen.append(f"serve {version.model}")
        return 1.0

    async def measure(client, model, version, evaluator):
        assert model == served[-1], "measured as served, not through a LoRA on other weights"
        seen.append(f"measure {model}")
        return Rates(version, 8, rates[model], rates[model], 1.0)

    async def served_check(client, name, group):
        return ServedCheck(True, 0, 0.0)

    def train(groups, adv, current):
        seen.append("train")
        hook.saved = {}  # the trainer's state before the step, which a refusal restores
        return TrainingStep(algorithm="grpo", rollouts=2, loss=0.0, kl=0.0, clip_fraction=0.0, train_s=1.0)

    monkeypatch.setattr(evolve.rl.trainer, "release_memory", lambda: (1.0, 1.0))
    monkeypatch.setattr(hook.publish, "_restart_on", serve)
    monkeypatch.setattr(hook, "_train", train)
    monkeypatch.setattr(hook, "_served_check", served_check)
    monkeypatch.setattr(hook.guard, "measure", measure)
    monkeypatch.setattr(hook.guard, "choose_parents", lambda: [{"id": 1}] * hook.guard.settings.parents)
    client = SimpleNamespace(model="base")
    add_group(db, [[("ok", {"x": 1.0, "y": 0.0})], [("invalid", None)]], started_at=1.0)
    add_group(db, [[("ok", {"x": 0.0, "y": 1.0})], [("invalid", None)]], started_at=2.0)

    assert await hook.step(client, evaluator=object()) is None
    assert seen == [f"measure {base}", "stop", "train", "serve grpo-v1", "measure grpo-v1", "serve base", "restore"]
    assert db.policy_version().version == 0 and hook.served == base

    seen.clear()
    rates["grpo-v1"] = 0.45  # within the margin: served, and v0 is not measured again
    assert (await hook.step(client, evaluator=object())).published
    assert seen == ["stop", "train", "serve grpo-v1", "measure grpo-v1"]
    assert db.policy_version().version == 1 and hook.served == "grpo-v1" and client.model == "base"

    # A resumed run keeps the guard's parents and v1's rates: its next step measures v2 only.
    again = _hook(tmp_path, db, "grpo")
    again.publish.mode = "merge"
    monkeypatch.setattr(again.publish, "_restart_on", serve)
    monkeypatch.setattr(again.guard, "measure", measure)
    await again.resume(client)
    assert [p["id"] for p in again.guard.parents] == [1] * again.guard.settings.parents
    assert again.guard.parents[0]["code"] == db.get(1).code
    assert again.guard.measured == {1: Rates(1, 8, 0.45, 0.45, 1.0)}
    seen.clear()
    assert await again.guard.prepare(client, (1, "grpo-v1"), evaluator=object())
    assert seen == [], "v1 was measured before the resume: not again"


async def test_no_held_out_parent_yet_means_no_training_yet(tmp_path):
    """A new version that the guard cannot measure would not be served: its step is not trained
    (minutes of CPU for nothing); the hook waits for a step's worth of new groups."""
    db = open_db(tmp_path)
    said = []
    hook = _hook(tmp_path, db, "grpo", emit=lambda kind, message, **f: said.append((kind, message, f)))
    add_group(db, [[("ok", {"x": 1.0, "y": 0.0})], [("invalid", None)]], started_at=1.0)
    add_group(db, [[("ok", {"x": 0.0, "y": 1.0})], [("invalid", None)]], started_at=2.0)
    assert not db.unasked_elites()  # every child's parent was the seed, and no child is an elite yet
    assert await hook.step(SimpleNamespace(model="base"), evaluator=object()) is None
    assert hook.trainer is None and not hook.due()
    kind, message, fields = said[-1]
    assert kind == "training" and "no held-out parent" in message and fields["published"] is False
