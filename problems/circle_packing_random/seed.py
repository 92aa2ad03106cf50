"""Circle packing by random placement (a foreign seed: written without this project's helpers).

Centres drawn at random (a fixed generator, so the packing is the same every time), every
circle started at one size and the overlapping ones shrunk until nothing overlaps or sticks out.
"""
import numpy as np


# EVOLVE-BLOCK-START
def construct_packing(n):
    rng = np.random.default_rng(12345)
    centers = 0.05 + 0.9 * rng.random((n, 2))
    radii = np.full(n, 0.12)
    for _ in range(500):
        wall = np.minimum(centers, 1 - centers).min(axis=1)
        radii = np.minimum(radii, wall)
        gaps = np.linalg.norm(centers[:, None] - centers[None, :], axis=2) + 10.0 * np.eye(n)
        overlap = radii[:, None] + radii[None, :] > gaps
        if not overlap.any():
            break
        radii = np.where(overlap.any(axis=1), radii * 0.95, radii)
    return centers, radii * 0.9999
# EVOLVE-BLOCK-END
