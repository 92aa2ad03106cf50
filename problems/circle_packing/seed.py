"""Seed program for circle packing: equal circles on a square grid."""
import numpy as np


# EVOLVE-BLOCK-START
def construct_packing(n):
    """Return (centers, radii): an (n, 2) array of circle centres and an (n,) array of radii.

    Places the circles row by row on the smallest square grid with at least n cells, one
    circle per cell. Simple and valid, but it wastes the empty cells and ignores the gaps.
    """
    side = int(np.ceil(np.sqrt(n)))
    cell = 1.0 / side
    # Slightly smaller than half a cell: the judge has zero tolerance for rounding errors.
    radius = 0.5 * cell * (1 - 1e-9)
    index = np.arange(n)
    centers = np.stack([(index % side + 0.5) * cell, (index // side + 0.5) * cell], axis=1)
    radii = np.full(n, radius)
    return centers, radii
# EVOLVE-BLOCK-END
