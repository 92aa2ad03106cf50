"""In-the-loop tuning: which literals are tuned, how they are replaced, and the CMA-ES loop."""
import asyncio

import numpy as np
import pytest

from evolve.mutation.code import check_syntax, evolve_block
from evolve.mutation.literals import changes_structure, float_literals, substitute
from evolve.search.tuning import Trial, tune

PROGRAM = '''import numpy as np
SCALE = 2.5  # outside the block: never tuned

# EVOLVE-BLOCK-START
def f(n):
    """Docstring 1.5 is text, not a number."""
    a = 0.5 * n + 1e-3
    b = np.arange(n)[3]  # ints are structure
    return a - 2.0 + 0x1F + 1_000.25
# EVOLVE-BLOCK-END
'''


def test_only_float_literals_of_the_block():
    assert [lit.value for lit in float_literals(PROGRAM)] == [0.5, 1e-3, 2.0, 1000.25]


def test_substitute_keeps_everything_else_and_parenthesises_negatives():
    lits = float_literals(PROGRAM)
    child = substitute(PROGRAM, lits, [0.25, 2e-3, -1.0, 7.0])
    check_syntax(child)
    assert "a = 0.25 * n + 0.002" in child and "return a - (-1.0) + 0x1F + 7.0" in child
    assert child.replace(evolve_block(child), "") == PROGRAM.replace(evolve_block(PROGRAM), "")
    assert substitute(PROGRAM, lits, [lit.value for lit in lits]).count("SCALE = 2.5") == 1


def test_a_program_that_does_not_tokenize_has_no_literals():
    assert float_literals("# EVOLVE-BLOCK-START\nx = (1.5\n# EVOLVE-BLOCK-END\n") == []


def test_a_change_of_numbers_or_comments_is_not_a_change_of_structure():
    numbers = substitute(PROGRAM, float_literals(PROGRAM), [0.7, 2e-3, -1.0, 3.0])
    assert not changes_structure(PROGRAM, numbers)
    assert not changes_structure(PROGRAM, PROGRAM.replace("# ints are structure", "# new words"))
    assert not changes_structure(PROGRAM, PROGRAM.replace('    """Docstring 1.5 is text, not a number."""\n', ""))
    assert not changes_structure(PROGRAM, PROGRAM.replace("Docstring 1.5", "Other words"))
    assert changes_structure(PROGRAM, PROGRAM.replace("np.arange(n)[3]", "np.arange(n)['3']"))
    assert changes_structure(PROGRAM, PROGRAM.replace("[3]", "[4]"))  # ints are structure
    assert changes_structure(PROGRAM, PROGRAM.replace("a - 2.0", "a * 2.0"))
    assert changes_structure(PROGRAM, PROGRAM.replace("    return", "    a = a ** 2\n    return"))
    assert changes_structure(PROGRAM, "# EVOLVE-BLOCK-START\nx = (1.5\n# EVOLVE-BLOCK-END\n")


def _evaluator(target: np.ndarray, budget: list):
    """A scored candidate: minus the distance of its literals to `target`; None when the budget is out."""
    async def evaluate(code: str):
        if budget[0] <= 0:
            return None
        budget[0] -= 1
        values = np.array([lit.value for lit in float_literals(code)])
        return Trial(code, -float(np.sum((values - target) ** 2)), None)
    return evaluate


def test_tune_climbs_and_spends_at_most_its_trials():
    code = "# EVOLVE-BLOCK-START\ndef f():\n    return 1.0 * 2.0 + 0.5\n# EVOLVE-BLOCK-END\n"
    target = np.array([1.3, 1.7, 0.6])
    start = -float(np.sum((np.array([1.0, 2.0, 0.5]) - target) ** 2))
    budget = [1000]
    tuned = asyncio.run(tune(code, start, _evaluator(target, budget), trials=60, sigma=0.2, seed=1,
                             max_parameters=12, rng=np.random.default_rng(0)))
    assert tuned.trials == 60 == 1000 - budget[0]
    assert tuned.parameters == 3
    assert tuned.best.objective > start
    check_syntax(tuned.best.code)


def test_tune_stops_when_the_budget_runs_out_and_keeps_what_ran():
    code = "# EVOLVE-BLOCK-START\nx = 1.0\n# EVOLVE-BLOCK-END\n"
    budget = [3]
    tuned = asyncio.run(tune(code, -1.0, _evaluator(np.array([2.0]), budget), trials=40, sigma=0.2,
                             seed=0, max_parameters=12, rng=np.random.default_rng(0)))
    assert tuned.trials == 3 and tuned.best is not None


def test_nothing_to_tune():
    tuned = asyncio.run(tune("# EVOLVE-BLOCK-START\nx = 1\n# EVOLVE-BLOCK-END\n", 0.0,
                             _evaluator(np.array([]), [10]), 40, 0.1, 0, 12, np.random.default_rng(0)))
    assert tuned.best is None and tuned.trials == 0


def test_many_literals_tune_a_random_subset():
    code = "# EVOLVE-BLOCK-START\nx = [" + ", ".join(f"{i}.5" for i in range(20)) + "]\n# EVOLVE-BLOCK-END\n"
    tuned = asyncio.run(tune(code, -1e9, _evaluator(np.zeros(20), [100]), 12, 0.1, 0, 5,
                             np.random.default_rng(0)))
    assert tuned.parameters == 5
    changed = [a.value != b.value for a, b in zip(float_literals(code), float_literals(tuned.best.code))]
    assert sum(changed) <= 5


@pytest.mark.parametrize("fields, message", [
    ({"llm": False}, "no operator"),
    ({"parents": "island"}, "parents"),
])
def test_search_settings_are_checked(fields, message):
    from pydantic import ValidationError

    from evolve.config import Search
    with pytest.raises(ValidationError, match=message):
        Search(**fields)


def test_a_run_with_tuning_stores_tuned_children_with_lineage_and_budget(tmp_path):
    """The real engine (controller, SQLite, process sandbox, judge) with a scripted LLM: tuned
    children carry their operator, parent and trials; the budget counts every trial; status
    shows the same improving rates as the database."""
    from scripted_run import make_run
    from sqlalchemy import create_engine, func, select
    from sqlalchemy.orm import Session

    from evolve.rundir import RunDir
    from evolve.store.counts import LLM_ORIGINS
    from evolve.store.database import EVALUATED
    from evolve.store.schema import Program, Tuning
    from evolve.views.report import _snapshot

    run = make_run(tmp_path / "run", evaluations=40,
                   tuning={"enabled": True, "trials": 6, "share": 1.0, "sigma": 0.05})
    with Session(create_engine(f"sqlite:///{run / 'evolve.db'}")) as s:
        tuned = s.scalars(select(Program).where(Program.origin == "tuned")).all()
        tunings = s.scalars(select(Tuning)).all()
        rows = {t.child_id: t for t in tunings if t.child_id is not None}
        # (the scripted seed's numbers are at their best already: most tunings beat nothing and
        # store no child, only their row)
        assert tunings and set(rows) == {p.id for p in tuned}
        for child in tuned:
            parent = s.get(Program, child.parent_id)
            assert parent.origin in ("mutation", "tuned", "seed") and parent.status == "ok"
            assert child.island == parent.island and child.generation == parent.generation + 1
            assert rows[child.id].parent_id == parent.id and 1 <= rows[child.id].trials <= 6
            assert child.outcome == "better" and child.objective > parent.objective  # never below its parent
        llm = s.scalar(select(func.count(Program.id)).where(
            Program.origin.in_(LLM_ORIGINS), Program.status.in_(EVALUATED), Program.duplicate_of.is_(None)))
        trials = sum(t.trials for t in tunings)
        assert llm + trials == 40  # the whole budget, every trial counted, nothing over
        children = s.scalars(select(Program).where(Program.origin.in_(("mutation", "tuned")),
                                                   Program.status.in_(EVALUATED))).all()
        assert all(c.outcome is not None for c in children)
        counts = {(o, k): sum(c.origin == o and c.outcome == k for c in children)
                  for o in ("mutation", "tuned") for k in ("better", "same")}
    snap = _snapshot(run, RunDir(run).spec())
    for origin in ("mutation", "tuned"):
        rates = snap.operators[origin]
        assert (rates.better, rates.same) == (counts[origin, "better"], counts[origin, "same"])
    assert snap.operators["tuned"].trials == trials and snap.evaluations == 40


def test_background_tuning_beside_the_llm_ends_with_the_budget(tmp_path):
    """`tuning.background`: tuning turns alternate with the LLM's; the seed is tuned first (the
    first best of its island), and the run stops at its budget with every evaluation counted."""
    from scripted_run import make_run
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session

    from evolve.store.counts import LLM_ORIGINS
    from evolve.store.database import EVALUATED
    from evolve.store.schema import LLMCall, Program, Tuning
    from evolve.store.schema import Session as RunSession

    run = make_run(tmp_path / "run", evaluations=30,
                   tuning={"enabled": True, "trials": 6, "share": 0.0, "new_best": False, "background": 0.5,
                           "turn_s": 1.0})
    with Session(create_engine(f"sqlite:///{run / 'evolve.db'}")) as s:
        tunings = s.scalars(select(Tuning).order_by(Tuning.id)).all()
        assert tunings and s.get(Program, tunings[0].parent_id).origin == "seed"
        assert s.scalars(select(LLMCall)).first() is not None  # the LLM ran beside it
        assert [x.stop_reason for x in s.scalars(select(RunSession))] == ["budget reached"]
        llm = s.scalars(select(Program).where(Program.origin.in_(LLM_ORIGINS), Program.status.in_(EVALUATED),
                                              Program.duplicate_of.is_(None))).all()
        assert len(llm) + sum(t.trials for t in tunings) == 30


def test_with_turns_the_llm_children_are_tuned_in_tuning_turns_not_beside_the_server(tmp_path):
    """`tuning.background`: an LLM child worth tuning waits for the next tuning turn, which takes
    it before the archive's programs, so no tuning of an LLM child runs while a call is in
    flight (two cores serve one or the other). The seed is tuned before the first turn."""
    import asyncio
    import time

    from scripted_run import ScriptedClient, make_run
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session

    from evolve.store.schema import LLMCall, Program, Tuning

    class SlowClient(ScriptedClient):  # calls that take a while, as a server's do
        async def sample(self, messages, n, seed=None, max_tokens=None, model=None, on_answer=None):
            started = time.time()
            await asyncio.sleep(0.3)
            sample = await super().sample(messages, n, seed)
            sample.started_at, sample.latency_s = started, time.time() - started
            return sample

    run = make_run(tmp_path / "run", evaluations=80, client=SlowClient(),
                   tuning={"enabled": True, "trials": 4, "share": 1.0, "background": 0.5, "turn_s": 1.0})
    with Session(create_engine(f"sqlite:///{run / 'evolve.db'}")) as s:
        calls = [(c.started_at, c.started_at + c.latency_s) for c in s.scalars(select(LLMCall))]
        tunings = s.scalars(select(Tuning).order_by(Tuning.id)).all()
        of_llm = [t for t in tunings if s.get(Program, t.parent_id).origin == "mutation"]
        assert s.get(Program, tunings[0].parent_id).origin == "seed"
    assert calls and of_llm and tunings[0].started_at + tunings[0].elapsed_s <= min(start for start, _ in calls)
    for t in of_llm:
        assert not any(start < t.started_at + t.elapsed_s and t.started_at < end for start, end in calls)


def test_a_knob_the_llm_adds_is_tuned_though_its_outputs_are_the_parents(tmp_path):
    """`tuning.knobs`: the calls ask for a new number at its neutral value. The child that adds
    one has its parent's outputs (outcome `same`, earning nothing) but is tuned, since its new
    number is a dimension the parent lacks; a child with its parent's outputs and no new number
    is not (a comment alone no longer runs at all: it is identical to its parent)."""
    from scripted_run import ScriptedClient, diff, make_run
    from sqlalchemy import create_engine, select
    from sqlalchemy.orm import Session

    from evolve.mutation.prompt import KNOB
    from evolve.serving.client import Sample
    from evolve.store.schema import Completion, LLMCall, Program, Tuning

    stack = "    centers = np.stack([(index % side + 0.5) * cell, (index // side + 0.5) * cell], axis=1)"
    knob = diff("A tilt to tune.", stack, f"{stack}\n    tilt = 0.0\n    centers[:, 1] += tilt * centers[:, 0]")
    no_knob = diff("Keep a copy.", stack, f"{stack}\n    centers = centers.copy()")

    class KnobClient(ScriptedClient):
        async def sample(self, messages, n, seed=None, max_tokens=None, model=None, on_answer=None) -> Sample:
            sample = await super().sample(messages, n, seed)
            sample.texts = [(knob, no_knob)[i % 2] for i in range(n)]
            return sample

    # Three calls, then the run ends once every tuning they started has run (the budget's
    # evaluations are far from spent, so none is cut short).
    run = make_run(tmp_path / "run", evaluations=200, calls=3, client=KnobClient(),
                   tuning={"enabled": True, "trials": 4, "share": 0.0, "new_best": False, "knobs": 1.0})
    with Session(create_engine(f"sqlite:///{run / 'evolve.db'}")) as s:
        calls = s.scalars(select(LLMCall)).all()
        assert calls and all(KNOB in call.prompt for call in calls)
        tuned_parents = {t.parent_id for t in s.scalars(select(Tuning))}
        llm = s.scalars(select(Program).where(Program.origin == "mutation", Program.status == "ok",
                                              Program.duplicate_of.is_(None))).all()
        answer = {c.id: c.text for c in s.scalars(select(Completion))}
        knobs = [p for p in llm if answer[p.completion_id] == knob and p.outcome == "same"]
        no_knobs = [p for p in llm if answer[p.completion_id] == no_knob]
        assert knobs and no_knobs
        assert all(p.id in tuned_parents for p in knobs)
        assert not any(p.id in tuned_parents for p in no_knobs)


@pytest.mark.parametrize("sigma", [0.0, -0.1, [0.5, 0.1], [0.0, 0.3]])
def test_a_step_must_be_positive_and_a_range_ordered(sigma):
    from pydantic import ValidationError

    from evolve.config import Tuning
    with pytest.raises(ValidationError, match="sigma"):
        Tuning(sigma=sigma)


def test_a_tuning_never_returns_below_the_program_it_tuned():
    """The start is the first incumbent: where every trial is worse, nothing is returned (the
    old tuner returned its best trial, below the start, and it was stored as progress)."""
    code = "# EVOLVE-BLOCK-START\nx = [1.0, 2.0]\n# EVOLVE-BLOCK-END\n"
    budget = [1000]
    tuned = asyncio.run(tune(code, 0.0, _evaluator(np.array([1.0, 2.0]), budget), trials=60,
                             sigma=(0.05, 0.5), seed=0, max_parameters=12, rng=np.random.default_rng(0)))
    assert tuned.best is None and tuned.trials == 60 and tuned.start_objective == 0.0


@pytest.mark.parametrize("literals, size", [([1.0, 1e-9, 0.0, 1.0, 0.0], 1.0), ([0.5, 0.25, 0.0], 0.375),
                                             ([0.0, 0.0], 1.0), ([], 1.0), ([3e-9, 1e-9], 2e-9)])
def test_a_literals_scale_leaves_out_zeros_and_tolerances(literals, size):
    """min_max_distance's seed: with its zeros and a 1e-9 guard counted, the median was 1e-9 and
    no tuning ever moved a point (bar 4); tiny literals alone are their own scale."""
    from evolve.search.tuning import literal_size
    assert literal_size(np.array(literals)) == pytest.approx(size)


def test_a_tuning_of_a_seed_with_zeros_and_a_guard_moves_its_numbers():
    """Through the tuner: the step is the working literals' size, so a zero knob leaves its start."""
    code = "# EVOLVE-BLOCK-START\nx = [1.0, 1e-9, 0.0, 1.0, 0.0]\n# EVOLVE-BLOCK-END\n"
    target = np.array([1.0, 1e-9, 0.3, 1.0, 0.2])
    start = -float(np.sum((np.array([1.0, 1e-9, 0.0, 1.0, 0.0]) - target) ** 2))  # -0.13
    tuned = asyncio.run(tune(code, start, _evaluator(target, [1000]), trials=300, sigma=(0.05, 0.5),
                             seed=0, max_parameters=12, rng=np.random.default_rng(0)))
    assert tuned.best is not None and tuned.best.objective > start / 10


def test_restarts_alternate_small_and_large_steps_with_a_growing_population():
    from evolve.search.tuning import Restarts
    restarts = Restarts(0.05, 0.5, 6, np.random.default_rng(0))
    first, large1, small1, large2 = (restarts.next() for _ in range(4))
    assert first == (0.05, 6)
    assert large1 == (0.5, 12) and large2 == (0.5, 24)  # IPOP: the population doubles
    assert 0.005 <= small1[0] <= 0.05 and small1[1] == 6  # below the first step


def test_steps_the_judge_refuses_are_made_smaller():
    from evolve.search.tuning import Restarts
    restarts = Restarts(0.05, 0.5, 6, np.random.default_rng(0))
    restarts.refused(0.5)
    assert restarts.large == 0.125 and restarts.small == 0.05
    restarts.refused(0.05)
    assert restarts.small == 0.0125


def test_a_stalled_descent_restarts_from_the_best_point():
    """A flat objective: each descent stalls, and the tuning restarts instead of sitting there."""
    from evolve.search.tuning import STALL_TRIALS
    code = "# EVOLVE-BLOCK-START\nx = [1.0, 2.0]\n# EVOLVE-BLOCK-END\n"

    async def flat(variant: str):
        return Trial(variant, 0.0, None)
    tuned = asyncio.run(tune(code, 0.0, flat, trials=4 * STALL_TRIALS, sigma=(0.05, 0.5), seed=0, stall=STALL_TRIALS,
                             max_parameters=12, rng=np.random.default_rng(0)))
    assert tuned.trials == 4 * STALL_TRIALS and tuned.descents >= 3 and tuned.best is None


def test_a_descent_whose_steps_the_judge_refuses_restarts_smaller_and_still_climbs():
    """Trials that move a literal by more than 1 % are refused (scored -10, not ok): the first
    descent adapts its step as plain CMA-ES would, refused restarts shrink theirs, and the
    tuning still finds a better point."""
    code = "# EVOLVE-BLOCK-START\nx = [1.0, 2.0]\n# EVOLVE-BLOCK-END\n"
    start = np.array([1.0, 2.0])

    async def strict(variant: str):
        values = np.array([lit.value for lit in float_literals(variant)])
        if np.any(np.abs(values / start - 1) > 0.01):
            return Trial(variant, -10.0, None, ok=False)
        return Trial(variant, float(values.sum() - 3.0), None)
    tuned = asyncio.run(tune(code, 0.0, strict, trials=200, sigma=(0.2, 0.5), seed=0, max_parameters=12,
                             rng=np.random.default_rng(0)))
    assert tuned.descents >= 2 and tuned.best is not None and tuned.best.objective > 0.0


def test_the_first_descent_goes_on_where_the_judge_refuses_most_steps():
    """Plain CMA-ES ranks refused trials last and goes on; so does the first descent (a program on
    the edge of validity was never left when its first generation ended the descent)."""
    code = "# EVOLVE-BLOCK-START\nx = [1.0, 2.0]\n# EVOLVE-BLOCK-END\n"
    calls = []

    async def mostly_refused(variant: str):
        calls.append(variant)
        ok = len(calls) % 6 == 0  # one trial in each generation of 6
        return Trial(variant, -1.0 if ok else -10.0, None, ok=ok)
    tuned = asyncio.run(tune(code, 0.0, mostly_refused, trials=36, sigma=(0.05, 0.5), seed=0,
                             max_parameters=12, rng=np.random.default_rng(0)))
    assert tuned.trials == 36 and tuned.descents == 1


def test_a_resumed_tuning_goes_on_with_its_descent_instead_of_starting_afresh():
    """TuningState between runs keeps its CMA-ES descent (step and covariance): the second run
    continues the first's descent from its best, and returns a best only above where it began."""
    from evolve.search.tuning import TuningState
    code = "# EVOLVE-BLOCK-START\ndef f():\n    return 1.0 * 2.0 + 0.5\n# EVOLVE-BLOCK-END\n"
    target = np.array([1.3, 1.7, 0.6])
    start = -float(np.sum((np.array([1.0, 2.0, 0.5]) - target) ** 2))
    evaluate = _evaluator(target, [10_000])
    state = TuningState(code, start, 0.2, 1, 12, np.random.default_rng(0), stall=None)
    first = asyncio.run(state.run(evaluate, 60))
    descent = state.descent
    second = asyncio.run(state.run(evaluate, 60))
    assert state.descent is descent and state.restarts.count == 1  # the same descent, not a restart
    assert descent.trials == first.trials + second.trials == 120
    assert second.start_objective == first.best.objective
    assert second.best is None or second.best.objective > first.best.objective
    assert state.objective == max(first.best.objective, second.best.objective if second.best else -np.inf)


def test_without_a_stall_rule_a_descent_restarts_only_when_cma_stops():
    """stall=None: a descent that stops gaining is not cut after STALL_TRIALS (plain CMA-ES's
    long descent); with the rule it restarts. Noise, not a flat line: cma stops on flat fitness."""
    from evolve.search.tuning import STALL_TRIALS, TuningState
    code = "# EVOLVE-BLOCK-START\nx = [0.1, 0.2, 0.3]\n# EVOLVE-BLOCK-END\n"

    def restarts(stall):
        noise = np.random.default_rng(0)

        async def noisy(variant):
            return Trial(variant, -1.0 + 0.5 * float(noise.random()), None)
        state = TuningState(code, -1.0, (0.05, 0.5), 0, 16, np.random.default_rng(0), stall=stall)
        asyncio.run(state.run(noisy, 4 * STALL_TRIALS))
        return state.restarts.count
    assert restarts(None) == 1 and restarts(STALL_TRIALS) > 1


def test_the_tuner_keeps_a_tunings_state_with_the_code_it_ended_on():
    """The operator's bookkeeping: a tuning's state is kept under the code it ended on and taken
    back for any program with that code (once: a second tuning of it at the same time starts
    afresh), so the seed's copy on every island goes on with one descent, not one each; a
    program whose objective is not the state's, or `resume: false`, gets a fresh state."""
    from types import SimpleNamespace

    from evolve.config import Tuning as TuningConfig
    from evolve.search.tuner import Tuner
    from evolve.store.database import code_hash
    code = "# EVOLVE-BLOCK-START\nx = [0.1, 0.2]\n# EVOLVE-BLOCK-END\n"
    engine = SimpleNamespace(seed=0, rng=np.random.default_rng(0), db=SimpleNamespace(tunings_of=lambda pid: 0))
    def stored(pid, text, objective):  # as the store keeps it: the code and its hash
        return SimpleNamespace(id=pid, code=text, code_hash=code_hash(text), objective=objective)
    program = stored(7, code, 0.5)
    tuner = Tuner(engine, TuningConfig(enabled=True), queued=True, generations=False)
    state = tuner._tuning(program)
    tuner._keep(program, state)
    assert tuner._tuning(program) is state and tuner._tuning(program) is not state
    tuner._keep(program, state)
    assert tuner._tuning(stored(8, code, 0.5)) is state  # a copy on another island
    tuner._keep(program, state)
    assert tuner._tuning(stored(9, code.replace("0.2", "0.3"), 0.5)) is not state  # other code
    assert tuner._tuning(stored(7, code, 0.6)) is not state
    fresh = Tuner(engine, TuningConfig(enabled=True, resume=False), queued=True, generations=False)
    fresh._keep(program, state)
    assert fresh._tuning(program) is not state


def test_a_descent_that_learned_nothing_is_drawn_again_at_its_step():
    """Every trial of the first generation refused: cma stops on the flat fitness, which is no
    convergence. The next descent is the same step and population with another seed (plain
    CMA-ES's restart), not the schedule's large step; REDRAWS such redraws in a row at most."""
    from evolve.search.tuning import REDRAWS, TuningState
    code = "# EVOLVE-BLOCK-START\nx = [1.0, 2.0]\n# EVOLVE-BLOCK-END\n"
    calls = []

    async def refuses_the_first_generation(variant: str):
        calls.append(variant)
        ok = len(calls) > 6
        distance = float(np.sum((np.array([lit.value for lit in float_literals(variant)]) - 1.5) ** 2))
        return Trial(variant, -distance if ok else 0.0, None, ok=ok)
    state = TuningState(code, 0.5, (0.05, 0.5), 0, 12, np.random.default_rng(0))
    asyncio.run(state.run(refuses_the_first_generation, 24))
    assert state.descents == 2 and state.restarts.count == 1
    assert state.descent.sigma == 0.05 and state.descent.es.popsize == 6 and not state.descent.may_refuse
    assert calls[6] not in calls[:6]  # another seed: other trials

    async def refuses_all(variant: str):
        return Trial(variant, 0.0, None, ok=False)
    state = TuningState(code, 0.5, (0.05, 0.5), 0, 12, np.random.default_rng(0))
    asyncio.run(state.run(refuses_all, 6 * (REDRAWS + 2)))
    assert state.restarts.count == 2 and state.descent.sigma == 0.5  # then the schedule moves on


def test_a_tuning_turn_takes_the_islands_best_or_the_archives_pick():
    """`background_pick`: `best` tunes each island's best in turn (the seed while it has none), so
    its descent goes on; `archive` takes the archive's pick, as the LLM's parents."""
    from types import SimpleNamespace

    from evolve.config import Tuning as TuningConfig
    from evolve.search.tuner import Tuner
    programs = {i: SimpleNamespace(id=i) for i in (1, 5, 9)}
    bests = {0: (0.9, 5), 1: None}
    db = SimpleNamespace(archive=SimpleNamespace(best=bests.get), get=programs.__getitem__,
                         seed=lambda island: programs[1],
                         ask=lambda island, rng: SimpleNamespace(parent=programs[9]))
    engine = SimpleNamespace(db=db, rng=np.random.default_rng(0))
    best = Tuner(engine, TuningConfig(enabled=True, background_pick="best"), queued=True, generations=False)
    assert best._background(0).id == 5 and best._background(1).id == 1
    archive = Tuner(engine, TuningConfig(enabled=True, background_pick="archive"), queued=True, generations=False)
    assert archive._background(0).id == 9
