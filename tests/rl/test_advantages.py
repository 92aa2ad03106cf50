"""GRPO and VPO advantages (evolve/rl/advantages.py) against numbers worked out by hand."""
import numpy as np
import pytest

from evolve.rl.advantages import (
    grpo,
    normalize,
    scalar_rewards,
    set_reward,
    vpo,
    vpo_from_weights,
)

EPS = 1e-6


def test_grpo_hand_values():
    # [1,0,0,1]: mean 0.5, popstd 0.5 -> (x - 0.5) / 0.5 = [1,-1,-1,1] (up to the eps in the denominator)
    np.testing.assert_allclose(grpo([1, 0, 0, 1]), np.array([1, -1, -1, 1]) * 0.5 / (0.5 + EPS))
    # [0,0,1]: mean 1/3, popstd sqrt(((1/3)^2 * 2 + (2/3)^2) / 3) = sqrt(2)/3
    # -> (-1/3)/(sqrt(2)/3) = -1/sqrt(2), (2/3)/(sqrt(2)/3) = sqrt(2)
    np.testing.assert_allclose(grpo([0, 0, 1]), [-2 ** -0.5, -2 ** -0.5, 2 ** 0.5], rtol=1e-5)
    # shift and scale invariance: only ranks/gaps within the group matter
    np.testing.assert_allclose(grpo([3, 5, 7]), grpo([0.1, 0.2, 0.3]), rtol=1e-4, atol=1e-9)
    assert abs(grpo([0.2, 0.9, 0.4, 0.4]).sum()) < 1e-9  # advantages are centred


def test_zero_variance_group_gives_zero_advantages():
    for rewards in ([0.7] * 8, [0.0] * 4, [1.0], [0.5, 0.5 + 1e-9]):
        adv = grpo(rewards)
        assert adv.shape == (len(rewards),) and not adv.any()
    assert normalize([]).shape == (0,)


def test_scalar_rewards_uses_fixed_weights_and_scores_failures_zero():
    # w = (0.25, 0.75): (1,0) -> 0.25; (0.5,0.5) -> 0.5; no answer -> 0; (0,1) -> 0.75
    s = scalar_rewards([np.array([1.0, 0.0]), [0.5, 0.5], None, np.zeros(0), [0, 1]], [0.25, 0.75])
    np.testing.assert_allclose(s, [0.25, 0.5, 0.0, 0.0, 0.75])
    with pytest.raises(ValueError, match="components"):
        scalar_rewards([[1.0, 0.0, 0.0]], [0.5, 0.5])


def test_set_reward_hand_values():
    W = np.array([[1.0, 0.0], [0.0, 1.0], [0.5, 0.5]])
    # specialists {(1,0), (0,1)}: per weight the best answer scores 1, 1, 0.5 -> R = 2.5/3
    assert set_reward(np.array([[1.0, 0.0], [0.0, 1.0]]), W) == pytest.approx(2.5 / 3)
    # one generalist (0.6,0.6) scores 0.6 under every weight vector that sums to 1 -> R = 0.6
    assert set_reward(np.array([[0.6, 0.6]]), W) == pytest.approx(0.6)
    assert set_reward(np.zeros((0, 2)), W) == 0.0


def test_vpo_from_weights_hand_values():
    W = np.array([[1.0, 0.0], [0.0, 1.0]])  # K = 2
    # rollout 0: {(1,0),(0,1)}  -> (max(1,0) + max(0,1)) / 2 = 1
    # rollout 1: {(0.5,0.5)}    -> (0.5 + 0.5) / 2           = 0.5
    # rollout 2: {} (no answer) -> 0
    # R = [1, 0.5, 0]: mean 0.5, popstd sqrt((0.25 + 0 + 0.25) / 3) = sqrt(1/6)
    # A = [0.5, 0, -0.5] / sqrt(1/6) = [sqrt(1.5), 0, -sqrt(1.5)] = [1.2247449, 0, -1.2247449]
    adv, R = vpo_from_weights([np.array([[1.0, 0.0], [0.0, 1.0]]), np.array([[0.5, 0.5]]),
                               np.zeros((0, 2))], W)
    np.testing.assert_allclose(R, [1.0, 0.5, 0.0])
    np.testing.assert_allclose(adv, [1.5 ** 0.5, 0.0, -1.5 ** 0.5], rtol=1e-5)


def test_duplicates_and_dominated_answers_add_nothing():
    rng = np.random.default_rng(0)
    W = rng.dirichlet(np.ones(3), size=50)
    M = rng.uniform(size=(2, 3))
    base = set_reward(M, W)
    assert set_reward(np.vstack([M, M[:1]]), W) == pytest.approx(base)  # a duplicated row
    assert set_reward(np.vstack([M, M]), W) == pytest.approx(base)  # every row twice
    assert set_reward(np.vstack([M, 0.5 * M[1]]), W) == pytest.approx(base)  # dominated (w >= 0)
    assert set_reward(np.vstack([M, np.zeros(3)]), W) == pytest.approx(base)  # a failed answer
    assert set_reward(np.vstack([M, [1.0, 1.0, 1.0]]), W) > base  # a dominating answer does count


def test_empty_and_failed_rollouts_score_zero():
    rng = np.random.default_rng(1)
    good = np.array([[0.3, 0.8]])
    adv, R = vpo([good, np.zeros((0, 2)), np.zeros((3, 2)), np.empty(0), np.zeros((1, 2))], 16, 1.0, rng)
    assert R[0] > 0 and not R[1:].any()
    assert adv[0] > 0 and np.allclose(adv[1:], adv[1])  # all failures share the same (negative) advantage
    # a group where every rollout failed: zero rewards and zero advantages, k need not be known
    adv, R = vpo([np.zeros((0, 2)), np.empty(0)], 16, 1.0, rng)
    assert not adv.any() and not R.any()
    adv, R = vpo([np.zeros((2, 2)), np.zeros((1, 2))], 16, 1.0, rng)  # failures only: zero variance
    assert not adv.any() and not R.any()


def test_vpo_m1_is_grpo_on_uniform_mean():
    # with m = 1, R_g = mean_j w_j^T y -> E[w]^T y = mean(y) as K grows (E[w] = 1/k under Dirichlet(alpha 1))
    rng = np.random.default_rng(2)
    answers = rng.uniform(size=(8, 3))
    means = answers.mean(axis=1)
    for alpha in (1.0, 0.3):
        adv, R = vpo([a[None, :] for a in answers], K=20000, alpha=alpha, rng=rng)
        np.testing.assert_allclose(R, means, atol=0.01)
        np.testing.assert_allclose(adv, grpo(means), atol=0.05)
        # and exactly GRPO on the uniform mean when the weights are the uniform vector itself
    adv, R = vpo_from_weights([a[None, :] for a in answers], np.full((1, 3), 1 / 3))
    np.testing.assert_allclose(R, scalar_rewards(list(answers), np.full(3, 1 / 3)))
    np.testing.assert_allclose(adv, grpo(means))


def test_vpo_is_deterministic_given_seed_and_shares_weights():
    group = [np.random.default_rng(i).uniform(size=(3, 2)) for i in range(6)]
    a1, r1 = vpo(group, 100, 1.0, np.random.default_rng(7))
    a2, r2 = vpo(group, 100, 1.0, np.random.default_rng(7))
    _, r3 = vpo(group, 100, 1.0, np.random.default_rng(8))
    assert np.array_equal(a1, a2) and np.array_equal(r1, r2)
    assert not np.allclose(r1, r3)
    # shared weights: identical answer sets in one group get identical rewards, whatever K is
    _, r = vpo([group[0], group[0].copy(), group[1]], 3, 1.0, np.random.default_rng(9))
    assert r[0] == r[1]


def test_specialist_pair_beats_two_generalists():
    specialists = np.array([[1.0, 0.0], [0.0, 1.0]])
    generalists = np.array([[0.55, 0.55], [0.55, 0.55]])
    # on the uniform mean the generalist wins (0.55 vs 0.5 per answer) ...
    assert generalists.mean() > specialists.mean()
    # ... but with the max over answers: E_{w1~U(0,1)} max(w1, 1-w1) = 3/4 > 0.55
    adv, R = vpo([specialists, generalists], K=2000, alpha=1.0, rng=np.random.default_rng(3))
    assert R[0] == pytest.approx(0.75, abs=0.02) and R[1] == pytest.approx(0.55)
    assert adv[0] > 0 > adv[1]


def test_shape_validation():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="expected 2"):
        vpo([np.ones((1, 2)), np.ones((2, 3))], 4, 1.0, rng)
    with pytest.raises(ValueError, match="expected 2"):
        vpo([np.ones((1, 2)), np.zeros((0, 3))], 4, 1.0, rng)
    with pytest.raises(ValueError, match="m_g, k"):
        vpo([np.ones(2)], 4, 1.0, rng)  # a bare vector: ambiguous, must be (1, k)
    with pytest.raises(ValueError, match="k >= 1"):
        vpo([np.ones((2, 0)), np.ones((2, 0))], 4, 1.0, rng)
    with pytest.raises(ValueError, match="K >= 1"):
        vpo([np.ones((1, 2))], 0, 1.0, rng)
    with pytest.raises(ValueError, match="weights must be"):
        vpo_from_weights([np.ones((1, 2))], np.ones((4, 3)))
