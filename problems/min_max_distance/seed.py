"""Seed program for the min/max distance ratio: the first n points of a square grid."""
import itertools

import numpy as np


# EVOLVE-BLOCK-START
def construct_points(n, d):
    """Return an (n, d) array of n distinct points in d dimensions.

    The judge computes (max pairwise distance / min pairwise distance) squared; smaller is
    better. This seed takes the first n points of the smallest grid with at least n points:
    valid, but a grid is far from optimal (its corners are far apart).
    """
    side = int(np.ceil(n ** (1.0 / d) - 1e-9))
    grid = np.array(list(itertools.product(range(side), repeat=d)), dtype=float)
    return grid[:n]
# EVOLVE-BLOCK-END
