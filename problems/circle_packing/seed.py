"""Seed program for circle packing: centres on a grid, radii from a linear program.

The search changes only `construct_packing` (the EVOLVE-BLOCK): where the centres go. For
any centres, `max_radii` (fixed, outside the block) returns the largest radii that keep
every circle inside the square and no two overlapping, so every small move of a centre or
of a number in the block moves the score, and most edits stay valid.
"""
import numpy as np
from scipy.optimize import linprog, minimize


def max_radii(centers):
    """The radii with the largest sum for the given (n, 2) centres (a linear program).

    Constraints: r_i + r_j <= |c_i - c_j| for every pair, r_i <= the distance from c_i to
    the nearest side. The judge has zero tolerance, and the solver meets the constraints
    only to within its own tolerance (about 1e-7; more in the sandbox's older scipy), so
    the largest excess is taken off every radius, then all are shrunk by 1e-7 (relative)
    against rounding. Centres outside the square get 0.
    """
    centers = np.clip(np.asarray(centers, dtype=float), 0.0, 1.0)
    n = len(centers)
    i, j = np.triu_indices(n, k=1)
    pairs = np.zeros((len(i), n))
    pairs[np.arange(len(i)), i] = 1.0
    pairs[np.arange(len(i)), j] = 1.0
    gaps = np.hypot(*(centers[i] - centers[j]).T)
    border = np.minimum(centers, 1.0 - centers).min(axis=1)
    result = linprog(-np.ones(n), A_ub=pairs, b_ub=gaps, bounds=list(zip(np.zeros(n), border)),
                     method="highs")
    radii = np.clip(result.x, 0.0, None) if result.success else np.zeros(n)
    excess = max((pairs @ radii - gaps).max(initial=0.0), (radii - border).max(initial=0.0))
    return np.clip(radii - excess, 0.0, None) * (1.0 - 1e-7)


def refine(centers):
    """The given centres moved to a nearby local optimum of the sum of the radii.

    SLSQP over the centres and radii together, starting from the centres and their
    max_radii; returns only the centres (max_radii then sizes the circles). Where it ends
    depends on where it starts: a better start gives a better end.
    """
    centers = np.clip(np.asarray(centers, dtype=float), 0.0, 1.0)
    n = len(centers)
    i, j = np.triu_indices(n, k=1)

    def room(v):  # >= 0 where no two circles overlap and every circle is inside
        c, r = v[: 2 * n].reshape(n, 2), v[2 * n:]
        return np.concatenate([np.hypot(*(c[i] - c[j]).T) - r[i] - r[j],
                               c[:, 0] - r, 1 - c[:, 0] - r, c[:, 1] - r, 1 - c[:, 1] - r])

    start = np.concatenate([centers.ravel(), max_radii(centers)])
    v = minimize(lambda v: -v[2 * n:].sum(), start, jac=lambda v: np.r_[np.zeros(2 * n), -np.ones(n)],
                 method="SLSQP", constraints=[{"type": "ineq", "fun": room}], options={"maxiter": 300}).x
    return np.clip(v[: 2 * n].reshape(n, 2), 0.0, 1.0)


# EVOLVE-BLOCK-START
def construct_packing(n):
    """Return (centers, radii): an (n, 2) array of circle centres and an (n,) array of radii.

    Puts the centres row by row on a grid of about sqrt(n) columns and lets max_radii size
    the circles. Simple and valid, but the rows are not staggered and the last one is left
    part empty.
    """
    cols = int(np.ceil(np.sqrt(n) * 1.0))  # 1.0: as many columns as rows
    rows = int(np.ceil(n / cols))
    margin = 0.5  # the outer centres sit this many spacings in from the border
    stagger = 0.0  # every other row moves right by this share of a spacing
    rise = 1.0  # the spacing of the rows, relative to that of the columns
    index = np.arange(n)
    row, col = index // cols, index % cols
    x = (margin + col + stagger * (row % 2)) / (cols - 1.0 + 2.0 * margin + stagger)
    y = (margin + rise * row) / (rise * (rows - 1.0) + 2.0 * margin)
    centers = np.stack([x, y], axis=1)
    return centers, max_radii(centers)
# EVOLVE-BLOCK-END
