"""The statistics of `evolve compare` on fixed inputs with known answers."""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from evolve.compare import stats


# ---- best@k ---------------------------------------------------------------------------------------
def brute_best_at_k(values, k):
    """The definition: the mean of max over every k-subset."""
    subsets = list(itertools.combinations(values, k))
    return sum(max(s) for s in subsets) / len(subsets)


def test_best_at_k_known_values():
    # pool {1, 2, 3}: pairs (1,2) (1,3) (2,3) have maxima 2, 3, 3 -> 8/3
    assert stats.best_at_k([3, 1, 2], 2) == pytest.approx(8 / 3)
    assert stats.best_at_k([3, 1, 2], 1) == pytest.approx(2.0)  # k = 1: the mean
    assert stats.best_at_k([3, 1, 2], 3) == pytest.approx(3.0)  # k = n: the maximum
    assert stats.best_at_k([0, 0, 0, 5], 2) == pytest.approx(2.5)  # 5 is in 3 of the 6 pairs


def test_best_at_k_matches_the_definition_with_ties_and_zeros():
    rng = np.random.default_rng(0)
    values = list(rng.choice([0.0, 0.0, 0.5, 0.7, 0.7, 0.9], size=9))
    for k in range(1, 10):
        assert stats.best_at_k(values, k) == pytest.approx(brute_best_at_k(values, k))


def test_best_at_k_is_monotone_and_stable_for_large_pools():
    values = np.linspace(0, 1, 500)
    curve = [stats.best_at_k(values, k) for k in (1, 2, 10, 100, 500)]
    assert curve == sorted(curve) and curve[0] == pytest.approx(0.5) and curve[-1] == pytest.approx(1.0)
    assert stats.best_at_k(values, 2) == pytest.approx(2 / 3, abs=2e-3)  # E[max of 2 uniforms]


@pytest.mark.parametrize("k", [0, 4])
def test_best_at_k_rejects_impossible_k(k):
    with pytest.raises(ValueError):
        stats.best_at_k([1, 2, 3], k)


# ---- pass@k ---------------------------------------------------------------------------------------
def test_pass_at_k_known_values():
    assert stats.pass_at_k(2, 1, 1) == pytest.approx(0.5)
    assert stats.pass_at_k(10, 0, 5) == 0.0
    assert stats.pass_at_k(10, 6, 5) == 1.0  # only 4 failures: any 5 include a success
    assert stats.pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert stats.pass_at_k(30, 3, 1) == pytest.approx(0.1)


def test_pass_at_k_matches_enumeration():
    n, c = 7, 2
    pool = [True] * c + [False] * (n - c)
    for k in range(1, n + 1):
        subsets = list(itertools.combinations(pool, k))
        assert stats.pass_at_k(n, c, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))


def test_pass_at_k_rejects_bad_counts():
    with pytest.raises(ValueError):
        stats.pass_at_k(5, 6, 1)


# ---- diversity, coverage, QD-score -------------------------------------------------------------------
def test_diversity_is_the_mean_pairwise_l1():
    vectors = [[0, 0], [1, 0], [1, 1]]  # distances 1, 2, 1
    assert stats.diversity(vectors) == pytest.approx(4 / 3)
    assert stats.diversity([[0.3, 0.2]] * 4) == 0.0  # duplicates: no diversity
    assert stats.diversity([[1, 2]]) is None  # one answer: undefined
    # (the report passes valid answers only: failures, all zero vectors, would look diverse)
    assert stats.diversity([[0, 0, 0], [0.5, 0.5, 0.5]]) == pytest.approx(1.5)


def test_set_quality_values_whole_completions():
    # m = 2: completions {(1,0), (0,1)} and {(0.3,0.3), (0.3,0.3)}. E_w max(w1, w2) = 3/4 for
    # w ~ Dirichlet(1,1) (w1 uniform on [0,1]); the weak pair gives 0.3 whatever w.
    q = stats.set_quality([[1, 0], [0, 1], [0.3, 0.3], [0.3, 0.3]], m=2)
    assert q == pytest.approx((0.75 + 0.3) / 2, abs=0.01)
    # the same answers paired the other way: E max(w1, 0.3) = 0.09 + 0.455 for both completions
    other = stats.set_quality([[1, 0], [0.3, 0.3], [0, 1], [0.3, 0.3]], m=2)
    assert other == pytest.approx(0.545, abs=0.01)  # sets, not answers drawn apart
    assert stats.set_quality([[1, 0], [0, 1]], m=1) == pytest.approx(0.5, abs=0.02)  # m = 1: the mean
    assert stats.set_quality([], m=3) is None


def test_coverage_and_qd_score():
    assert stats.coverage(16, [8, 8]) == pytest.approx(0.25)
    assert stats.coverage(16, [8, 8], islands=4) == pytest.approx(1 / 16)
    assert stats.qd_score([0.5, 0.25, 0.25]) == pytest.approx(1.0)
    assert stats.qd_score([]) == 0.0


# ---- bootstrap -------------------------------------------------------------------------------------
def test_bootstrap_ci_of_two_values_is_their_range():
    # resampled means of [0, 1] are 0, 1/2, 1 with probabilities 1/4, 1/2, 1/4: the 95% interval is [0, 1]
    assert stats.bootstrap_ci([0, 1]) == pytest.approx((0.0, 1.0))


def test_bootstrap_ci_degenerate_and_reproducible():
    assert stats.bootstrap_ci([0.7, 0.7, 0.7]) == (0.7, 0.7)
    assert stats.bootstrap_ci([0.42]) == (0.42, 0.42)
    x = [0.1, 0.4, 0.35, 0.8, 0.2, 0.5]
    low, high = stats.bootstrap_ci(x, seed=3)
    assert (low, high) == stats.bootstrap_ci(x, seed=3)  # seeded
    assert low < np.mean(x) < high and min(x) <= low and high <= max(x)


def test_bootstrap_diff_ci():
    assert stats.bootstrap_diff_ci([1, 1], [0, 0]) == (1.0, 1.0)
    low, high = stats.bootstrap_diff_ci([10, 11, 12, 13], [0, 1, 2, 3])
    assert 7 <= low < 10 < high <= 13  # resampled medians differ by 7..13; the observed difference is 10


# ---- the rank permutation test and verdicts --------------------------------------------------------
def test_rank_permutation_test_small_samples():
    u, p = stats.rank_permutation_test([5, 6, 7, 8], [1, 2, 3, 4])
    assert u == 16 and p == pytest.approx(2 / math.comb(8, 4))
    u, p = stats.rank_permutation_test([1, 2, 3], [4, 5, 6])
    assert u == 0 and p == pytest.approx(0.1)
    assert stats.rank_permutation_test([0.5, 0.5], [0.5, 0.5]) == (2.0, 1.0)  # all tied


def test_ties_are_counted_exactly():
    # Four seeds that never left the seed value against four that did: U = 16 only for the
    # observed split (and its mirror, U = 0) of the 70, so p = 2/70.
    a, b = [2.1667] * 4, [2.2, 2.3, 2.3, 2.4]
    u, p = stats.rank_permutation_test(b, a)
    assert u == 16 and p == pytest.approx(2 / 70)
    pooled = [2.1667] * 3 + [2.3] * 3  # ties across the arms too: enumerate the 20 splits by hand
    x, y = [2.1667, 2.1667, 2.3], [2.1667, 2.3, 2.3]
    from itertools import combinations

    from scipy.stats import rankdata
    ranks = rankdata(pooled)
    def u_of(idx):
        return sum(ranks[i] for i in idx) - 6
    observed = u_of([0, 1, 3])
    splits = [u_of(c) for c in combinations(range(6), 3)]
    mean = sum(splits) / len(splits)
    low, high = sum(s <= observed for s in splits) / 20, sum(s >= observed for s in splits) / 20
    u, p = stats.rank_permutation_test(x, y)
    assert u == observed < mean and p == pytest.approx(min(1.0, 2 * min(low, high)))
    # scipy's "exact" Mann-Whitney counts splits as if there were no ties: too small a p here.
    assert stats.rank_permutation_test([1, 1, 1, 2], [1, 2, 2, 2])[1] == pytest.approx(34 / 70)


def test_min_p_value():
    assert stats.min_p_value(3, 3) == pytest.approx(0.1)
    assert stats.min_p_value(4, 4) == pytest.approx(1 / 35)
    assert stats.min_p_value(1, 1) == 1.0


def test_verdict_claims_a_winner_only_when_significant():
    v = stats.verdict("vpo", [0.9, 0.91, 0.92, 0.93], "grpo", [0.8, 0.81, 0.82, 0.83])
    assert v.winner == "vpo" and v.text.startswith("vpo better than grpo")
    assert "p=0.0286" in v.text and "n=4 vs 4 seeds" in v.text
    v = stats.verdict("grpo", [0.8, 0.81, 0.82, 0.83], "vpo", [0.9, 0.91, 0.92, 0.93])
    assert v.winner == "vpo" and v.text.startswith("vpo better than grpo")


def test_verdict_no_significant_difference():
    v = stats.verdict("a", [0.5, 0.7, 0.6, 0.8], "b", [0.55, 0.65, 0.75, 0.6])
    assert v.winner is None and v.text.startswith("no significant difference between a and b")
    # three seeds each can never reach p < 0.05, and the text says so
    v = stats.verdict("a", [1, 2, 3], "b", [4, 5, 6])
    assert v.winner is None and v.p == pytest.approx(0.1) and "smallest possible p is 0.1" in v.text


def test_paired_sign_flip_test_is_exact_for_small_samples():
    assert stats.paired_permutation_test([1, 2, 3], [0, 1, 2]) == pytest.approx((1.0, 0.25))  # 2 of 8 signs
    assert stats.min_paired_p(3) == 0.25 and stats.min_paired_p(6) == pytest.approx(1 / 32)
    assert stats.paired_permutation_test([0.5, 0.7], [0.5, 0.7]) == (0.0, 1.0)  # no difference at all
    # differences +3, -1, -1: every one of the 8 sign patterns is as far from 0, so p = 1
    mean, p = stats.paired_permutation_test([3, 0, 0], [0, 1, 1])
    assert mean == pytest.approx(1 / 3) and p == pytest.approx(1.0)


def test_a_paired_verdict_sees_what_seeds_hide():
    """Six seeds, each a little better under `a` than under `b` on the same seed, while the seeds
    differ a lot: paired by seed it is a win (p = 2/64); the rank test on the pooled values sees
    two overlapping samples."""
    b = [0.50, 0.60, 0.70, 0.80, 0.90, 1.00]
    a = [x + 0.01 for x in b]
    v = stats.verdict("vpo", a, "grpo", b, paired=True)
    assert v.winner == "vpo" and "paired by seed" in v.text and v.p == pytest.approx(1 / 32)
    assert stats.verdict("vpo", a, "grpo", b).winner is None
    v = stats.verdict("vpo", a[:3], "grpo", b[:3], paired=True)
    assert v.winner is None and "smallest possible p is 0.25" in v.text
    with pytest.raises(ValueError, match="one per seed"):
        stats.verdict("vpo", a, "grpo", b[:4], paired=True)


def test_rates_paired_by_parent():
    """The unit is the parent: 8 parents, the version ahead on every one, is p = 2/256."""
    d, p, (low, high) = stats.paired_rate_difference([10] * 8, [16] * 8, [8] * 8, [16] * 8)
    assert d == pytest.approx(2 / 16) and p == pytest.approx(2 / 256) and low == high == pytest.approx(2 / 16)
    d, p, _ = stats.paired_rate_difference([16, 0, 16, 0], [16] * 4, [0, 16, 0, 16], [16] * 4)
    assert d == 0 and p == 1.0  # the same total, opposite parents: no evidence


def test_verdict_one_seed_makes_no_claim():
    v = stats.verdict("frozen", [0.8], "grpo", [0.9])
    assert v.winner is None and v.p is None
    assert v.text.startswith("frozen vs grpo: one seed: no statistical claim")


def test_wilson_and_newcombe_reproduce_the_published_examples():
    """Newcombe (1998), Stat. Med. 17: 81/263 (single rate) and examples (a), (c) of method 10."""
    assert stats.wilson(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)
    assert stats.wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert stats.rate_difference_ci(56, 70, 48, 80) == pytest.approx((0.0524, 0.3339), abs=1e-4)
    assert stats.rate_difference_ci(9, 10, 3, 10) == pytest.approx((0.1705, 0.8090), abs=1e-4)
    assert stats.wilson(0, 0) == (0.0, 1.0)
