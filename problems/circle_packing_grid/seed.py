"""Circle packing on a square grid (a foreign seed: written without this project's helpers).

The first thing one tries: the smallest square grid that holds n circles, filled row by row
inside a small margin, every circle a little smaller than half the grid's step.
"""
import numpy as np


# EVOLVE-BLOCK-START
def construct_packing(n):
    side = int(np.ceil(np.sqrt(n)))
    margin = 0.02
    step = (1.0 - 2 * margin) / side
    radius = 0.48 * step
    centers = []
    for i in range(n):
        row, col = divmod(i, side)
        centers.append((margin + (col + 0.5) * step, margin + (row + 0.5) * step))
    return np.array(centers), np.full(n, radius)
# EVOLVE-BLOCK-END
