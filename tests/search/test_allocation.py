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
    shares = cycles(alloc, 8, 0.0, 0.0)  # a plateau: the share fades back toward half
    assert shares == sorted(shares, reverse=True) and 0.5 <= shares[-1] < 0.6
    assert cycles(alloc, 3, 0.02, 0.0)[-1] == 0.2  # the LLM found a structure: the floor for tuning


def test_gains_far_below_the_prior_do_not_move_the_share():
    alloc = Allocation(0.5, adaptive=True)
    assert cycles(alloc, 5, 0.0, 1e-5)[-1] == pytest.approx(0.5, abs=0.01)


def test_adaptive_turns_need_a_starting_share():
    from pydantic import ValidationError

    from evolve.config import Tuning
    with pytest.raises(ValidationError, match="adaptive moves the share"):
        Tuning(enabled=True, adaptive=True)


def test_adaptive_turns_in_a_run_report_each_cycle(tmp_path):
    """The real engine with a scripted LLM: each cycle's gains and next share are in the events,
    within the bounds, and the run ends at its budget."""
    from scripted_run import make_run

    run = make_run(tmp_path / "run", evaluations=40,
                   tuning={"enabled": True, "trials": 6, "share": 0.0, "new_best": False, "background": 0.5,
                           "turn_s": 1.0, "adaptive": True})
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    turns = [e for e in events if e["kind"] == "turns"]
    assert turns, "no cycle was recorded"
    for e in turns:
        f = e["fields"]
        assert 0.2 <= f["share"] <= 0.8 and f["tuning_gain"] >= 0 and f["tuning_s"] >= 0
