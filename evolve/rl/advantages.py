"""Group-relative advantages for the mutator's policy gradient: GRPO and VPO (docs/design.md §7).

Vocabulary: a group is the G rollouts sampled for one prompt; a rollout holds m >= 1 answers;
an answer is a reward vector r in R^k (all components >= 0, higher better; a failed answer is
the zero vector). Both methods end in the same normalisation, so the loss (evolve/rl/loss.py) cannot
tell them apart; only the reward that is normalised differs:

    GRPO  s_g = w^T r_g                            (m = 1, the problem's fixed weights w)
    VPO   R_g = 1/K sum_j max_{y in M_g} w_j^T y   (w_j ~ Dirichlet(alpha 1_k), shared by the group)

Everything here is plain numpy and deterministic given its inputs (VPO: given the rng).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

STD_EPS = 1e-6


def normalize(rewards: Sequence[float] | np.ndarray, eps: float = STD_EPS) -> np.ndarray:
    """A_g = (x_g - mean(x)) / (popstd(x) + eps); all zeros when popstd(x) < eps.

    A group whose rollouts all scored the same carries no signal, so it gets zero advantages
    (instead of amplifying float noise by 1/eps).
    """
    x = np.asarray(rewards, dtype=np.float64).reshape(-1)
    if x.size == 0:
        return x
    std = x.std()  # population std (ddof=0)
    if std < eps:
        return np.zeros_like(x)
    return (x - x.mean()) / (std + eps)


def grpo(rewards: Sequence[float], eps: float = STD_EPS) -> np.ndarray:
    """GRPO advantages from one scalar reward per rollout: A_g = (s_g - mean s) / (popstd s + eps)."""
    return normalize(rewards, eps)


def scalar_rewards(answers: Sequence[np.ndarray | None], weights: Sequence[float]) -> np.ndarray:
    """GRPO's scalar reward s_g = w^T r_g for m = 1 rollouts.

    answers[g] is rollout g's reward vector (k,), or None / an empty array when the rollout had
    no valid answer (scored as the zero vector, so s_g = 0).
    """
    w = np.asarray(weights, dtype=np.float64).reshape(-1)
    out = np.zeros(len(answers))
    for g, r in enumerate(answers):
        if r is None or np.size(r) == 0:
            continue
        r = np.asarray(r, dtype=np.float64).reshape(-1)
        if r.shape != w.shape:
            raise ValueError(f"rollout {g}: reward vector has {r.size} components, weights have {w.size}")
        out[g] = float(w @ r)
    return out


def _as_matrices(answer_matrices: Sequence[np.ndarray]) -> tuple[list[np.ndarray], int | None]:
    """Check that every answer matrix is (m_g, k) with one shared k >= 1; empty sets become (0, k).

    Returns k = None when every set is empty (nothing to infer it from; every R_g is then 0).
    """
    mats = [np.asarray(M, dtype=np.float64) for M in answer_matrices]
    k = None
    for g, M in enumerate(mats):
        if M.size == 0 and (M.ndim == 1 or M.shape == (0, 0)):
            continue  # empty set of unknown width: [], (0,), (0, 0)
        if M.ndim != 2 or M.shape[1] < 1:
            raise ValueError(f"rollout {g}: answer matrix must be (m_g, k) with k >= 1, got shape {M.shape}")
        if k is None:
            k = M.shape[1]
        elif M.shape[1] != k:
            raise ValueError(f"rollout {g}: answers have {M.shape[1]} components, expected {k}")
    return [M.reshape(0, k or 0) if M.size == 0 else M for M in mats], k


def set_reward(M: np.ndarray, W: np.ndarray) -> float:
    """R = 1/K sum_j max_{rows y of M} w_j^T y; an empty set (0 rows) scores 0.

    M is (m, k) answers, W is (K, k) weight vectors. The max over answers is what makes duplicates
    add nothing and rewards a set of specialists over copies of one generalist.
    """
    if M.shape[0] == 0:
        return 0.0
    scores = W @ M.T  # (K, m): w_j^T y for every weight vector and answer
    return float(scores.max(axis=1).mean())


def vpo_from_weights(answer_matrices: Sequence[np.ndarray], W: np.ndarray,
                     eps: float = STD_EPS) -> tuple[np.ndarray, np.ndarray]:
    """VPO with given weights W (K, k): returns (advantages, set rewards R), both (G,)."""
    mats, k = _as_matrices(answer_matrices)
    W = np.asarray(W, dtype=np.float64)
    if W.ndim != 2 or W.shape[0] < 1 or (k is not None and W.shape[1] != k):
        raise ValueError(f"weights must be (K >= 1, k={k}), got shape {W.shape}")
    R = np.array([set_reward(M, W) for M in mats])
    return normalize(R, eps), R


def vpo(answer_matrices: Sequence[np.ndarray], K: int, alpha: float,
        rng: np.random.Generator, eps: float = STD_EPS) -> tuple[np.ndarray, np.ndarray]:
    """VPO advantages and set rewards for one group (docs/design.md §7).

        W = (w_1..w_K) ~ Dirichlet(alpha 1_k), drawn ONCE, shared by every rollout of the group
        R_g = 1/K sum_j max_{rows y of M_g} w_j^T y        (empty set: R_g = 0)
        A_g = (R_g - mean R) / (popstd R + 1e-6)            (all zeros if popstd R < 1e-6)

    answer_matrices[g] is rollout g's (m_g, k) reward vectors (failed answers are zero rows).
    With m = 1, E_w[w^T y] = mean(y), so VPO is GRPO on the uniform mean of the components.
    """
    if K < 1 or alpha <= 0:
        raise ValueError(f"need K >= 1 and alpha > 0, got K={K}, alpha={alpha}")
    _, k = _as_matrices(answer_matrices)
    if k is None:  # every rollout failed: all R_g = 0, nothing to learn (and no draw from rng)
        zeros = np.zeros(len(answer_matrices))
        return zeros, zeros.copy()
    W = rng.dirichlet(np.full(k, float(alpha)), size=K)
    return vpo_from_weights(answer_matrices, W, eps)
