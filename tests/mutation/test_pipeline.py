"""Controller pieces that need no server."""
from types import SimpleNamespace

from evolve.mutation.pipeline import request_seed


def test_request_seeds_never_overlap_across_a_group():
    """vLLM seeds choice i of a request with seed + i (v1/engine/parallel_sampling.py), so
    the seeds of consecutive calls must be far apart or calls repeat each other's samples."""
    group = 8
    used = set()
    for call in range(2000):
        s = request_seed(0, call)
        assert 0 <= s < 2**31
        choices = set(range(s, s + group))
        assert not (choices & used)
        used |= choices
    assert request_seed(0, 5) == request_seed(0, 5) and request_seed(0, 5) != request_seed(1, 5)


def test_knob_requests_follow_the_share_only_where_tuning_sets_them():
    from evolve.config import Tuning
    from evolve.mutation.pipeline import asks_knob

    def problem(**tuning):
        return SimpleNamespace(search=SimpleNamespace(tuning=Tuning(**tuning)))

    calls = range(400)
    assert not any(asks_knob(problem(enabled=False, knobs=1.0), 0, k) for k in calls)
    assert not any(asks_knob(problem(enabled=True, knobs=0.0), 0, k) for k in calls)
    assert all(asks_knob(problem(enabled=True, knobs=1.0), 0, k) for k in calls)
    half = [asks_knob(problem(enabled=True, knobs=0.5), 0, k) for k in calls]
    assert 150 < sum(half) < 250  # a fixed draw per call: this count is the same every run
    assert half == [asks_knob(problem(enabled=True, knobs=0.5), 0, k) for k in calls]  # a resume asks the same
