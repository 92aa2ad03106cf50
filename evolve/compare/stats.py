"""Statistics for `evolve compare` (docs/design.md §8): pure functions of numbers, no I/O.

- best@k and pass@k over a pool of n sampled answers (k drawn without replacement);
- diversity of a group's answers (mean pairwise L1 between reward vectors);
- MAP-Elites coverage and QD-score;
- a seeded bootstrap confidence interval, and a permutation verdict for a pair of arms: paired
  by seed (sign flips of the per-seed differences) where the arms ran the same seeds, as a
  comparison's arms do (same seeds, parents and request seeds), the rank test where they did not;
- Wilson intervals of a rate; the difference of two rates paired by held-out parent (the version
  and its base answer the same parents), or Newcombe's interval where no pairing is known.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from scipy import stats
from scipy.spatial.distance import pdist

ALPHA = 0.05  # two-sided significance level of a verdict
CONFIDENCE = 0.95
RESAMPLES = 10_000


# ---- pooled-sample estimators ------------------------------------------------------------------
def best_at_k(values: Sequence[float], k: int) -> float:
    """E[max of k answers drawn without replacement from a pool of n], exactly.

    With the pool sorted ascending v_(1) <= ... <= v_(n), the maximum of a random k-subset is
    v_(i) when v_(i) is in it and the other k-1 come from the i-1 below it:

        best@k = sum_{i=k..n} v_(i) * C(i-1, k-1) / C(n, k)

    (k = 1: the mean; k = n: the maximum). The same unbiased-estimator idea as pass@k.
    """
    v = np.sort(np.asarray(values, dtype=float))
    n = v.size
    _check_k(n, k)
    total = math.comb(n, k)
    # Python ints are exact, and int / int rounds correctly however large they grow.
    weights = np.array([math.comb(i - 1, k - 1) / total for i in range(k, n + 1)])
    return float(weights @ v[k - 1:])


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k answers drawn from n succeeds), c of the n being successes:

        pass@k = 1 - C(n - c, k) / C(n, k)      (Chen et al. 2021, unbiased)
    """
    _check_k(n, k)
    if not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n, got c={c}, n={n}")
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)  # comb is 0 when n - c < k


def _check_k(n: int, k: int) -> None:
    if not 1 <= k <= n:
        raise ValueError(f"need 1 <= k <= n, got k={k}, n={n}")


# ---- diversity and the archive -------------------------------------------------------------------
def diversity(vectors: Sequence[Sequence[float]]) -> float | None:
    """Mean pairwise L1 distance between answers' reward vectors (pass valid answers only: the
    zero vectors of failures all look alike, and would make failing count as diverse):

        D = 2 / (A (A - 1)) * sum_{i<j} ||r_i - r_j||_1

    None for fewer than two answers. Duplicates add zero distances, so they lower D.
    """
    x = np.asarray(vectors, dtype=float)
    if x.ndim != 2 or x.shape[0] < 2:
        return None
    return float(pdist(x, "cityblock").mean())


SET_WEIGHTS = 1000  # Dirichlet draws for set_quality (fixed: every arm is measured alike)


def set_quality(vectors: Sequence[Sequence[float]], m: int, alpha: float = 1.0, seed: int = 0) -> float | None:
    """VPO's own held-out quantity: answers in completions of m (in order), each completion
    valued E_w[max over its answers of w.r] with w ~ Dirichlet(alpha), then averaged over
    completions. Whole completions, never answers drawn apart: the set is what VPO trains."""
    x = np.asarray(vectors, dtype=float)
    if x.ndim != 2 or x.shape[0] == 0:
        return None
    W = np.random.default_rng(seed).dirichlet(np.full(x.shape[1], alpha), size=SET_WEIGHTS)
    sets = [x[i:i + m] for i in range(0, len(x), m)]
    return float(np.mean([(W @ s.T).max(axis=1).mean() for s in sets]))


def coverage(filled: int, bins: Sequence[int], islands: int = 1) -> float:
    """Filled cells / all cells of `islands` grids of prod(bins) cells each."""
    return filled / (math.prod(bins) * islands)


def qd_score(elite_objectives: Sequence[float]) -> float:
    """Sum of the elites' objectives (all >= 0 here: failed programs never hold a cell)."""
    return float(np.sum(np.asarray(elite_objectives, dtype=float)))


# ---- confidence intervals --------------------------------------------------------------------------
def bootstrap_ci(values: Sequence[float], statistic: Callable = np.mean, level: float = CONFIDENCE,
                 seed: int = 0, resamples: int = RESAMPLES) -> tuple[float, float]:
    """Percentile bootstrap CI of statistic(values), seeded so a report is reproducible.

    Percentile rather than BCa: BCa is undefined for constant samples, common here (e.g. every
    seed stuck at the seed program). A constant sample (one value included) gives the degenerate
    interval (x, x) for any location statistic.
    """
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("no values")
    if np.all(x == x[0]):
        return float(x[0]), float(x[0])
    res = stats.bootstrap((x,), statistic, confidence_level=level, n_resamples=resamples,
                          method="percentile", rng=np.random.default_rng(seed), vectorized=True)
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def bootstrap_diff_ci(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, statistic: Callable = np.median,
                      level: float = CONFIDENCE, seed: int = 0,
                      resamples: int = RESAMPLES) -> tuple[float, float]:
    """Percentile bootstrap CI of statistic(a) - statistic(b), the two samples resampled apart."""
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    point = float(statistic(x) - statistic(y))
    if (x.size < 2 or np.all(x == x[0])) and (y.size < 2 or np.all(y == y[0])):
        return point, point  # nothing to resample

    def diff(u, v, axis=-1):
        return statistic(u, axis=axis) - statistic(v, axis=axis)

    res = stats.bootstrap((x, y), diff, confidence_level=level, n_resamples=resamples,
                          method="percentile", rng=np.random.default_rng(seed), vectorized=True)
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


# ---- verdicts ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Verdict:
    a: str
    b: str
    n_a: int
    n_b: int
    median_a: float
    median_b: float
    u: float | None  # Mann-Whitney U of a
    p: float | None  # two-sided
    min_p: float | None  # the smallest p these sample sizes allow
    diff_ci: tuple[float, float] | None  # bootstrap CI of median(a) - median(b)
    winner: str | None  # a, b, or None (no significant difference / no claim)
    text: str


def min_p_value(n_a: int, n_b: int) -> float:
    """Smallest two-sided p of the rank permutation test for these sizes: 2 / C(n_a + n_b, n_a).

    With 3 seeds per arm it is 0.1: no difference can be significant at 0.05, whatever the data.
    """
    return min(1.0, 2 / math.comb(n_a + n_b, n_a))


TEST_NAME = "rank permutation test (Mann-Whitney U; exact over every split of the pooled seeds, ties at mid-ranks)"


def rank_permutation_test(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray, seed: int = 0) -> tuple[float, float]:
    """(U of a, two-sided p): Mann-Whitney's U, with p from its permutation distribution.

    scipy's "exact" Mann-Whitney p assumes no ties, and seeds of a search often tie (runs
    that never left the seed). Permuting the pooled values with their mid-ranks handles ties
    exactly: every split is enumerated (C(n_a + n_b, n_a) of them; sampled beyond 20,000).
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if np.all(np.concatenate([x, y]) == x[0]):
        return x.size * y.size / 2, 1.0  # all tied: no evidence either way

    def u_of_first(u, v, axis=-1):
        ranks = stats.rankdata(np.concatenate([u, v], axis=axis), axis=axis)
        return ranks[..., : u.shape[axis]].sum(axis=axis) - u.shape[axis] * (u.shape[axis] + 1) / 2

    res = stats.permutation_test((x, y), u_of_first, permutation_type="independent", vectorized=True,
                                 n_resamples=20_000, alternative="two-sided", random_state=seed)
    return float(res.statistic), float(min(res.pvalue, 1.0))


PAIRED_TEST_NAME = "paired sign-flip permutation test (exact over every sign of the paired differences)"


def min_paired_p(n: int) -> float:
    """Smallest two-sided p of the sign-flip test on n pairs: 2 / 2^n (0.25 for three seeds)."""
    return min(1.0, 2 / 2 ** n)


def paired_permutation_test(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray,
                            seed: int = 0) -> tuple[float, float]:
    """(mean of a - b, two-sided p) for paired values: under no difference each pair's sign is a
    coin flip. Exact over the 2^n signs up to 20,000 of them, sampled beyond. Arms that share
    seeds (or held-out parents) differ by less within a pair than between pairs; an unpaired test
    spends that variation as noise."""
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if d.size == 0:
        raise ValueError("no pairs")
    if np.all(d == 0):
        return 0.0, 1.0
    res = stats.permutation_test((d,), np.mean, permutation_type="samples", vectorized=True,
                                 n_resamples=20_000, alternative="two-sided", random_state=seed)
    return float(res.statistic), float(min(res.pvalue, 1.0))


def verdict(name_a: str, a: Sequence[float], name_b: str, b: Sequence[float], what: str = "final best objective",
            alpha: float = ALPHA, seed: int = 0, paired: bool = False) -> Verdict:
    """A plain-language comparison of two arms on per-seed values (higher is better).

    `paired`: a[i] and b[i] ran the same seed, so the sign-flip test on the per-seed differences
    decides; else the rank permutation test. "A better than B" only when the two-sided p < alpha;
    the direction is the side with the larger mean difference (paired) or U (P(A > B) + P(tie)/2
    > 1/2). With one seed on either side there is no test at all, and the text says so.
    """
    x, y = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    ma, mb = float(np.median(x)), float(np.median(y))
    medians = f"median {what} {name_a} {ma:.4f} vs {name_b} {mb:.4f}"
    if x.size < 2 or y.size < 2:
        text = f"{name_a} vs {name_b}: one seed: no statistical claim ({medians})"
        return Verdict(name_a, name_b, x.size, y.size, ma, mb, None, None, None, None, None, text)
    if paired and x.size != y.size:
        raise ValueError(f"paired values need one per seed on both sides, got {x.size} and {y.size}")
    if paired:
        mean_d, p = paired_permutation_test(x, y, seed)
        low, high = bootstrap_ci(x - y, np.mean, seed=seed)
        floor, u = min_paired_p(x.size), None
        support = (f"paired by seed: sign-flip permutation p={p:.3g}, n={x.size} seeds; {medians}; mean paired "
                   f"difference {mean_d:+.4f}, 95% bootstrap CI [{low:+.4f}, {high:+.4f}]")
        ahead = mean_d > 0
    else:
        u, p = rank_permutation_test(x, y, seed)
        low, high = bootstrap_diff_ci(x, y, np.median, seed=seed)
        floor = min_p_value(x.size, y.size)
        support = (f"U={u:g}, two-sided permutation p={p:.3g}, n={x.size} vs {y.size} seeds; "
                   f"{medians}; difference {ma - mb:+.4f}, 95% bootstrap CI [{low:+.4f}, {high:+.4f}]")
        ahead = u > x.size * y.size / 2
    winner = None
    if p < alpha:
        winner = name_a if ahead else name_b
        loser = name_b if winner == name_a else name_a
        text = f"{winner} better than {loser} on {what} ({support})"
    else:
        text = f"no significant difference between {name_a} and {name_b} on {what} ({support})"
        if floor >= alpha:
            text += f"; with these seeds the smallest possible p is {floor:.3g}: add seeds for a claim"
    return Verdict(name_a, name_b, x.size, y.size, ma, mb, u, p, floor, (low, high), winner, text)


# ---- rates (held-out quality per policy version) --------------------------------------------------
def wilson(k: int, n: int, level: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson score interval of the rate k/n (sound at 0/n and n/n, unlike the normal one)."""
    if n == 0:
        return (0.0, 1.0)
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=level, method="wilson")
    return (float(ci.low), float(ci.high))


def paired_rate_difference(k1: Sequence[int], n1: Sequence[int], k2: Sequence[int], n2: Sequence[int],
                           seed: int = 0) -> tuple[float, float, tuple[float, float]]:
    """Two rates measured on the same units (held-out parents): (mean per-unit difference, its
    sign-flip p, a 95% bootstrap CI of it). The unit is the parent, not the answer: one parent's
    answers share its prompt and stand or fall together, so counting them as independent (as
    Newcombe's interval does) makes an interval too narrow."""
    r1 = np.asarray(k1, dtype=float) / np.maximum(np.asarray(n1, dtype=float), 1)
    r2 = np.asarray(k2, dtype=float) / np.maximum(np.asarray(n2, dtype=float), 1)
    mean_d, p = paired_permutation_test(r1, r2, seed)
    return mean_d, p, bootstrap_ci(r1 - r2, np.mean, seed=seed)


def rate_difference_ci(k1: int, n1: int, k2: int, n2: int, level: float = CONFIDENCE) -> tuple[float, float]:
    """Interval of k1/n1 - k2/n2 from the two Wilson intervals (Newcombe 1998, method 10)."""
    p1, p2 = k1 / max(n1, 1), k2 / max(n2, 1)
    (l1, u1), (l2, u2) = wilson(k1, n1, level), wilson(k2, n2, level)
    d = p1 - p2
    return (d - math.hypot(p1 - l1, u2 - p2), d + math.hypot(u1 - p1, p2 - l2))
