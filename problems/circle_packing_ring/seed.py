"""Circle packing from concentric rings (a foreign seed: written without this project's helpers).

One circle in the middle, the others on rings around it; each circle then gets the largest
radius that the border and its neighbours leave it.
"""
import numpy as np


# EVOLVE-BLOCK-START
def construct_packing(n):
    centers = np.zeros((n, 2))
    centers[0] = [0.5, 0.5]
    inner = min(8, n - 1)  # the first ring
    for i in range(inner):
        angle = 2 * np.pi * i / inner
        centers[1 + i] = [0.5 + 0.25 * np.cos(angle), 0.5 + 0.25 * np.sin(angle)]
    outer = n - 1 - inner  # the rest on a wider ring
    for i in range(outer):
        angle = 2 * np.pi * i / outer + 0.1
        centers[1 + inner + i] = [0.5 + 0.42 * np.cos(angle), 0.5 + 0.42 * np.sin(angle)]
    centers = np.clip(centers, 0.01, 0.99)
    return centers, compute_radii(centers)


def compute_radii(centers):
    """Each radius as large as the border allows, then pairs that overlap scaled down together."""
    n = len(centers)
    radii = np.minimum(np.minimum(centers[:, 0], 1 - centers[:, 0]),
                       np.minimum(centers[:, 1], 1 - centers[:, 1]))
    for i in range(n):
        for j in range(i + 1, n):
            gap = np.sqrt(np.sum((centers[i] - centers[j]) ** 2))
            if radii[i] + radii[j] > gap:
                scale = gap / (radii[i] + radii[j])
                radii[i] *= scale
                radii[j] *= scale
    return radii * 0.999999
# EVOLVE-BLOCK-END
