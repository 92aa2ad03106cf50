"""Sharing the cores between the LLM and tuning: fixed, or following where the best rises."""
import json

import pytest

from evolve.search.allocation import Allocation


def cycles(alloc: Allocation, n: int, llm_gain: float, tuning_gain: float, llm_s=60.0, tuning_s=60.0):
    return [alloc.record({"llm": llm_gain, "tuning": tuning_gain}, {"llm": llm_s, "tuning": tuning_s})
            for _ in range(n)]


def test_a_fixed_share_never_moves():
    alloc = Allocation(0.5)
    assert cycles(alloc, 3, 0.0, 0.1) == [0.5, 0.5, 0.5]


def test_the_share_follows_the_operator_that_raises_the_best():
    alloc = Allocation(0.5, adaptive=True)
    assert cycles(alloc, 1, 0.0, 0.0) == [0.5]  # nothing shown yet: the prior, half and half
    assert cycles(alloc, 3, 0.0, 0.02)[-1] == 0.8  # tuning climbs: it gets the most, not all
    assert cycles(alloc, 3, 0.05, 0.0)[-1] == 0.2  # the LLM found a better structure: the floor for tuning


def test_on_a_plateau_the_share_leans_toward_the_run_long_yield():
    """Both flat: not half and half, but toward what each has made per second so far (no cap)."""
    alloc = Allocation(0.5, adaptive=True)
    cycles(alloc, 3, 0.0, 0.02)
    assert cycles(alloc, 20, 0.0, 0.0) == [0.8] * 20  # only tuning ever paid: it keeps the cores
    cycles(alloc, 1, 0.06, 0.0)  # the LLM found a structure worth as much as tuning's climb
    shares = cycles(alloc, 20, 0.0, 0.0)
    assert shares[0] == 0.2 and shares == sorted(shares)  # its recent gain fades into the record,
    assert shares[-1] == pytest.approx(0.5, abs=0.01)  # where both made as much in as many seconds


def test_a_tuning_plateau_caps_tunings_share_until_it_climbs_again():
    """Tuning made every gain, then nothing: after PLATEAU_CYCLES flat cycles the LLM gets at
    least 1 - plateau_share, however large tuning's record; a new climb lifts the cap."""
    from evolve.search.allocation import PLATEAU_CYCLES
    alloc = Allocation(0.5, adaptive=True, plateau_share=0.5)
    cycles(alloc, 3, 0.0, 0.02)
    flat = cycles(alloc, 10, 0.0, 0.0)
    assert flat[:PLATEAU_CYCLES - 1] == [0.8] * (PLATEAU_CYCLES - 1) and flat[PLATEAU_CYCLES - 1:] == [0.5] * (11 - PLATEAU_CYCLES)
    assert cycles(alloc, 1, 0.0, 0.02) == [0.8]


def test_an_operator_without_gains_keeps_its_floor():
    alloc = Allocation(0.5, adaptive=True)
    assert min(cycles(alloc, 50, 0.0, 0.05)) == 0.8  # the LLM still gets a fifth of the time


def test_gains_far_below_the_prior_do_not_move_the_share():
    alloc = Allocation(0.5, adaptive=True)
    assert cycles(alloc, 5, 0.0, 1e-5) == [0.5] * 5  # a tuned plateau creeping up is no progress


def test_adaptive_turns_need_a_starting_share():
    from pydantic import ValidationError

    from evolve.config import Tuning
    with pytest.raises(ValidationError, match="adaptive moves the share"):
        Tuning(enabled=True, adaptive=True)


def test_the_bounds_are_each_operators_floor():
    from pydantic import ValidationError

    from evolve.config import Tuning
    alloc = Allocation(0.5, True, 0.2, 0.5)
    assert cycles(alloc, 5, 0.0, 0.05)[-1] == 0.5  # a slow LLM keeps half the time
    with pytest.raises(ValidationError, match="0 <= low <= high < 1"):
        Tuning(background=0.5, adaptive=True, bounds=[0.8, 0.2])


def test_adaptive_turns_in_a_run_report_each_cycle(tmp_path):
    """The real engine with a scripted LLM: each cycle's gains and next share are in the events,
    within the run's bounds, and the run ends at its budget."""
    from scripted_run import make_run

    run = make_run(tmp_path / "run", evaluations=40,
                   tuning={"enabled": True, "trials": 6, "share": 0.0, "new_best": False, "background": 0.5,
                           "turn_s": 1.0, "adaptive": True, "bounds": [0.3, 0.6]})
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    turns = [e for e in events if e["kind"] == "turns"]
    assert turns, "no cycle was recorded"
    # The seed's tuning, before the first turn, is start-up: every recorded cycle had an LLM turn.
    assert all(e["fields"]["llm_s"] > 0 for e in turns)
    for e in turns:
        f = e["fields"]
        assert 0.3 <= f["share"] <= 0.6 and f["tuning_gain"] >= 0 and f["tuning_s"] >= 0


def test_a_resume_goes_on_from_the_runs_record_of_turns(tmp_path):
    """Each cycle is stored with the run; a resumed controller replays them and starts with the
    share and the record the run had, not from `background` again."""
    from scripted_run import ScriptedClient, make_run

    from evolve.config import load_policy, load_problem
    from evolve.run import open_database
    from evolve.search.controller import Controller

    run = make_run(tmp_path / "run", evaluations=40,
                   tuning={"enabled": True, "trials": 6, "share": 0.0, "new_best": False, "background": 0.5,
                           "turn_s": 1.0, "adaptive": True})
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    expected = Allocation(0.5, adaptive=True)
    for e in (e for e in events if e["kind"] == "turns"):
        f = e["fields"]
        expected.record({"llm": f["llm_gain"], "tuning": f["tuning_gain"]},
                        {"llm": f["llm_s"], "tuning": f["tuning_s"]})
    assert expected.total_s["tuning"] > 0, "no cycle was recorded"
    spec = json.loads((run / "run.json").read_text())
    problem, policy = load_problem(spec["problem"]), load_policy(spec["policy"])
    db = open_database(spec, problem, policy, run)
    try:
        assert [t.share for t in db.turns()] == pytest.approx(
            [e["fields"]["share"] for e in events if e["kind"] == "turns"])
        resumed = Controller(problem, policy, db, None, ScriptedClient(), problem.budget, 0, lambda event: None)
        assert resumed.scheduler.allocation.share == 0.5
        resumed.scheduler.replay_turns()
    finally:
        db.close()
    allocation = resumed.scheduler.allocation
    assert allocation.share == pytest.approx(expected.share)
    assert allocation.total_gain == pytest.approx(expected.total_gain)
    assert allocation.total_s == pytest.approx(expected.total_s)
