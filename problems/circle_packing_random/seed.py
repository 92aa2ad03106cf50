"""Circle packing by random placement (a foreign seed: written without this project's helpers).

Centres drawn at random (a fixed generator, so the packing is the same every time), every
circle started at one size and shrunk until nothing overlaps or sticks out.
"""
import numpy as np


# EVOLVE-BLOCK-START
def construct_packing(n):
    rng = np.random.default_rng(12345)
    centers = 0.05 + 0.9 * rng.random((n, 2))
    radii = np.full(n, 0.12)
    for _ in range(500):
        changed = False
        for i in range(n):
            wall = min(centers[i, 0], 1 - centers[i, 0], centers[i, 1], 1 - centers[i, 1])
            if radii[i] > wall:
                radii[i] = wall
                changed = True
            for j in range(i + 1, n):
                gap = np.linalg.norm(centers[i] - centers[j])
                if radii[i] + radii[j] > gap:
                    radii[i] *= 0.95
                    radii[j] *= 0.95
                    changed = True
        if not changed:
            break
    return centers, radii * 0.9999
# EVOLVE-BLOCK-END
