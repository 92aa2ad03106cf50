"""The fast tier: the real controller, operators, scheduler and database on in-memory fakes of the
sandbox and the policy (tests/fakes.py). Each test runs a whole search in about a second."""
from __future__ import annotations

import asyncio

from fakes import NO_LITERALS, LiteralSandbox, PausableSampler, ScriptedSampler, toy_policy, toy_problem, toy_run
from sqlalchemy import func, select

from evolve.judge.evaluator import Evaluator
from evolve.run import open_database
from evolve.rundir import Stop
from evolve.search.controller import Controller
from evolve.search.llm import LLMMutation
from evolve.search.scheduler import operators
from evolve.search.tuner import Tuner
from evolve.store.schema import LLMCall, Program, Tuning, Turn

TUNING = {"enabled": True, "trials": 12, "sigma": 0.2, "share": 0.0, "new_best": True}


def programs(db) -> list[Program]:
    return list(db.session.scalars(select(Program).where(Program.run_id == db.run_id).order_by(Program.id)))


def test_an_llm_search_spends_exactly_its_budget_and_keeps_every_answer(tmp_path):
    sampler = ScriptedSampler()
    reason, db, events = toy_run(tmp_path, toy_problem(tmp_path), sampler)
    assert reason == Stop.BUDGET and db.evaluations_done() == 40
    rows = programs(db)
    calls = db.session.scalar(select(func.count(LLMCall.id)))
    children = [p for p in rows if p.origin == "mutation"]
    assert len(children) == 4 * calls == 4 * sampler.calls  # every answer is stored, whatever became of it
    assert {p.status for p in children} >= {"ok", "error", "mutation_failed"}
    assert all(db.get(p.parent_id) is not None for p in children)
    assert any(p.outcome == "better" for p in children)
    assert db.best().objective > rows[0].objective  # the seed's
    assert any(e.kind == "migration" for e in events) and any(e.kind == "best" for e in events)
    assert len(set(sampler.seeds)) == len(sampler.seeds)  # each call its own request seed


def test_the_same_seed_makes_the_same_search(tmp_path):
    runs = []
    for name in ("a", "b"):
        _, db, _ = toy_run(tmp_path / name, toy_problem(tmp_path / name, tuning=TUNING), seed=3)
        runs.append([(p.origin, p.parent_id, p.code) for p in programs(db)])
        db.close()
    assert runs[0] == runs[1]


def test_tuning_alone_stores_each_tunings_best_and_counts_every_trial(tmp_path):
    """Each tuning is a row with its trials; its best is a child only where it beats the parent."""
    problem = toy_problem(tmp_path, llm=False, tuning=TUNING, budget={"max_evaluations": 60})
    reason, db, events = toy_run(tmp_path, problem)
    assert reason == Stop.BUDGET and db.evaluations_done() == 60
    tuned = {p.id: p for p in programs(db) if p.origin == "tuned"}
    rows = list(db.session.scalars(select(Tuning)))
    assert tuned and {r.child_id for r in rows} - {None} == set(tuned) and sum(r.trials for r in rows) == 60
    assert all(p.objective > db.get(p.parent_id).objective for p in tuned.values())
    assert db.best().objective > programs(db)[0].objective
    assert db.archive.islands[0].generation + db.archive.islands[1].generation == len(rows)


def test_tuning_turns_go_on_with_each_islands_best(tmp_path):
    """`background_pick: best`: every tuning starts from the best its island had when it began."""
    problem = toy_problem(tmp_path, llm=False, tuning={**TUNING, "background_pick": "best"},
                          budget={"max_evaluations": 60})
    reason, db, _ = toy_run(tmp_path, problem)
    assert reason == Stop.BUDGET
    rows = list(db.session.scalars(select(Tuning).order_by(Tuning.id)))
    everything = programs(db)
    for row in rows:
        parent = db.get(row.parent_id)
        before = [p.objective for p in everything if p.island == parent.island and p.status == "ok"
                  and p.created_at <= row.started_at]
        assert parent.objective == max(before)
    assert len({row.parent_id for row in rows}) > 2  # it moved on with the tuned children


def test_tuning_alone_stops_on_a_program_without_numbers(tmp_path):
    problem = toy_problem(tmp_path, seed_code=NO_LITERALS, llm=False, tuning=TUNING)
    reason, db, _ = toy_run(tmp_path, problem)
    assert reason == Stop.NOTHING_TO_TUNE and db.evaluations_done() == 0


def test_turns_share_the_cores_and_record_each_cycle(tmp_path):
    tuning = {**TUNING, "background": 0.5, "turn_s": 0.2, "adaptive": True}
    problem = toy_problem(tmp_path, tuning=tuning, budget={"max_evaluations": 200})
    reason, db, events = toy_run(tmp_path, problem, ScriptedSampler(delay_s=0.02))
    assert reason == Stop.BUDGET and db.evaluations_done() == 200
    turns = list(db.session.scalars(select(Turn)))
    assert turns and all(0.2 <= t.share <= 0.8 and t.llm_s > 0 for t in turns)
    assert len(turns) == sum(e.kind == "turns" for e in events)
    origins = {p.origin for p in programs(db)}
    assert {"seed", "mutation", "tuned"} <= origins


def test_a_paused_llm_turn_ends_with_its_calls_in_flight_and_they_go_on_in_the_next(tmp_path):
    """`pause_llm`: the LLM's turn ends by pausing the server with the answers in flight, not by
    waiting for them; they end in a later LLM turn, every answer is stored, and the server is
    never left paused. Without it the scheduler never pauses (the turn drains)."""
    for pause in (True, False):
        tuning = {**TUNING, "background": 0.5, "turn_s": 0.2, "pause_llm": pause}
        problem = toy_problem(tmp_path / str(pause), tuning=tuning, budget={"max_evaluations": 120})
        sampler = PausableSampler(delay_s=0.3)  # a call outlasts the LLM's turn (0.1 s)
        reason, db, _ = toy_run(tmp_path / str(pause), problem, sampler)
        assert reason == Stop.BUDGET and not sampler.paused
        children = [p for p in programs(db) if p.origin == "mutation"]
        assert len(children) == 4 * db.session.scalar(select(func.count(LLMCall.id)))
        assert (sampler.pauses > 0 and sampler.spanned > 0) if pause else sampler.pauses == 0
        db.close()


def test_a_resumed_run_goes_on_to_its_new_budget(tmp_path):
    problem = toy_problem(tmp_path, tuning=TUNING, budget={"max_evaluations": 20})
    _, db, _ = toy_run(tmp_path, problem)
    assert db.evaluations_done() == 20
    policy, _ = toy_policy(tmp_path)
    events: list = []
    more = problem.budget.model_copy(update={"max_evaluations": 50})
    controller = Controller(problem, policy, db, Evaluator(problem, sandbox=LiteralSandbox()), ScriptedSampler(),
                            more, 0, events.append)
    assert asyncio.run(controller.run()) == Stop.BUDGET
    assert db.evaluations_done() == 50 and events[0].kind == "resume"


def test_the_operators_come_from_the_problems_search_section(tmp_path):
    def names(**search) -> list[str]:
        problem = toy_problem(tmp_path, **search)
        controller = Controller(problem, toy_policy(tmp_path)[0], None, None, ScriptedSampler(), problem.budget, 0)
        return [op.name for op in controller.operators]

    assert names() == ["llm"]
    assert names(tuning=TUNING) == ["llm", "tuning"]
    assert names(llm=False, tuning=TUNING) == ["tuning"]


def test_the_tuner_takes_only_the_children_worth_tuning(tmp_path):
    problem = toy_problem(tmp_path, tuning={**TUNING, "structural": False})
    controller = Controller(problem, toy_policy(tmp_path)[0], None, None, ScriptedSampler(), problem.budget, 0)
    tuner = next(op for op in operators(controller, toy_policy(tmp_path)[0], ScriptedSampler())
                 if isinstance(op, Tuner))
    tuner.queued = True
    ok = Program(status="ok", parent_id=None, code="x = 1.0\n")
    tuner.offer(ok, island_best=False)  # neither a new best nor a share (0)
    tuner.offer(Program(status="error", code="x = 1.0\n"), island_best=True)  # not valid
    tuner.offer(Program(status="ok", code="x = 1.0\n", duplicate_of=3), island_best=True)  # a copy
    assert not tuner.waiting
    tuner.offer(ok, island_best=True)
    assert list(tuner.waiting) == [ok]
    assert isinstance(controller.operators[0], LLMMutation)


class StaggeredSampler(ScriptedSampler):
    """A group's answers end one after another, as on a real server; the second call fails
    after two of its answers ended (a server error: the group is lost, the search goes on)."""

    def __init__(self):
        super().__init__()
        self.running, self.at_start = 0, []

    async def sample(self, messages, n, seed=None, max_tokens=None, model=None, on_answer=None):
        self.at_start.append(self.running)  # answers running on the server when this call starts
        self.running += n
        sample = await super().sample(messages, n, seed)
        for i in range(n):
            await asyncio.sleep(0.01)
            if self.calls == 2 and i == 2:
                self.running -= n - i  # the server drops the rest of the group
                raise RuntimeError("the server dropped the request")
            self.running -= 1
            on_answer()
        return sample


def test_a_new_call_starts_once_fewer_than_llm_batch_answers_run(tmp_path):
    """Three loops, groups of 4, llm_batch 6: a call starts only with fewer than 6 answers
    running (without the gate the third loop starts with 8); a failed call's answers stop
    counting, and none is counted once the run is over."""
    for batch, most in ((6, 5), (None, 8)):
        folder, sampler = tmp_path / str(batch), StaggeredSampler()
        problem = toy_problem(folder, budget={"max_evaluations": 40, "llm_concurrency": 3, "llm_batch": batch})
        policy, policy_path = toy_policy(folder)
        spec = {"policy": str(policy_path), "seed": 0, "db_url": f"sqlite:///{folder / 'evolve.db'}", "run_name": "b"}
        db = open_database(spec, problem, policy, folder)
        controller = Controller(problem, policy, db, Evaluator(problem, sandbox=LiteralSandbox()), sampler,
                                problem.budget, 0, lambda event: None)
        assert asyncio.run(controller.run()) == Stop.BUDGET
        assert max(sampler.at_start) <= most and (batch is not None or most in sampler.at_start)
        assert controller.scheduler.llm.answers_running == 0
        db.close()
