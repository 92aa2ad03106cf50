"""Circle packing on a hexagonal lattice (a foreign seed: written without this project's helpers).

Equal circles in staggered rows, the lattice spacing chosen so that n of them fit; every
circle has the same radius, half the spacing.
"""
import math

import numpy as np


# EVOLVE-BLOCK-START
def construct_packing(n):
    cols = max(1, int(math.ceil(math.sqrt(n * 1.15))))
    rows = int(math.ceil(n / cols))
    # the spacing that fits `cols` circles across (with the half offset) and `rows` rows up
    d = min(1.0 / (cols + 0.5), 1.0 / (1.0 + (rows - 1) * math.sqrt(3) / 2))
    r = 0.5 * d * 0.999
    points = []
    for row in range(rows):
        offset = 0.5 * d if row % 2 else 0.0
        for col in range(cols):
            points.append((r + offset + col * d, r + row * d * math.sqrt(3) / 2))
    centers = np.array(points[:n])
    radii = np.full(n, r)
    return centers, radii
# EVOLVE-BLOCK-END
