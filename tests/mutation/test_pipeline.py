"""Controller pieces that need no server."""
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
