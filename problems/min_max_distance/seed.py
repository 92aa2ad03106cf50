"""Seed program for the min/max distance ratio: n points of a square lattice.

The lattice has knobs at their plain values: every other layer shifted along the first axis
(`shift`), the other axes' step (`squash`), and a preference for points near the middle
(`roundness`). As written it keeps the first n points of a square grid; the numbers, once
moved, give staggered lattices and rounder patches, so small edits move the score.
"""
import itertools

import numpy as np


# EVOLVE-BLOCK-START
def construct_points(n, d):
    """Return an (n, d) array of n distinct points in d dimensions.

    The judge computes (max pairwise distance / min pairwise distance) squared; smaller is
    better. This seed takes n points of the smallest square lattice with at least n points:
    valid, but a square grid is far from optimal (its corners are far apart).
    """
    side = int(np.ceil(n ** (1.0 / d) - 1e-9))  # lattice points per axis
    lattice = np.array(list(itertools.product(range(side), repeat=d)), dtype=float)
    shift = 0.0  # every other layer moves along the first axis by this share of a step
    squash = 1.0  # the step along the other axes, relative to the first
    roundness = 0.0  # above 0: prefer points near the middle over the lattice's order
    lattice[:, 0] += shift * (lattice[:, 1:].sum(axis=1) % 2)
    lattice[:, 1:] *= squash
    spread = np.sum((lattice - lattice.mean(axis=0)) ** 2, axis=1)
    rank = np.arange(len(lattice)) / len(lattice)
    order = np.argsort(rank + roundness * spread / spread.max(), kind="stable")
    return lattice[order[:n]]
# EVOLVE-BLOCK-END
