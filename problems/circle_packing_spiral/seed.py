"""Circle packing on a sunflower spiral (a foreign seed: written without this project's helpers).

Centres on Vogel's spiral (the k-th at radius sqrt(k / n), turned by the golden angle), squeezed
into the square; each circle as large as its nearest neighbour and the border allow.
"""
import numpy as np


# EVOLVE-BLOCK-START
def construct_packing(n):
    k = np.arange(n) + 0.5
    angle = k * np.pi * (3.0 - np.sqrt(5.0))
    rho = 0.45 * np.sqrt(k / n)
    centers = 0.5 + np.stack([rho * np.cos(angle), rho * np.sin(angle)], axis=1)
    dist = np.linalg.norm(centers[:, None] - centers[None, :], axis=2) + 10.0 * np.eye(n)
    radii = 0.5 * dist.min(axis=1)
    radii = np.minimum(radii, np.minimum(centers, 1.0 - centers).min(axis=1))
    return centers, radii * 0.999
# EVOLVE-BLOCK-END
