"""Trusted scorer for the min/max distance ratio. Runs in the engine process, on plain data.

The output must be exactly n points of d finite int/float coordinates, all distinct. The
value is (max pairwise distance / min pairwise distance)^2, computed in exact rational
arithmetic (every float is a dyadic rational), so no rounding can flatter a configuration.
Smaller is better: the components are normalised as reference / value (goal: minimize).
"""
from __future__ import annotations

import math
from fractions import Fraction
from itertools import combinations
from typing import Any

import numpy as np


def score(args: dict, output: Any) -> float:
    """(d_max / d_min)^2 of a valid point set; raises ValueError(reason) for anything else."""
    points = _unpack(output, args["n"], args["d"])
    squared = [sum((a - b) ** 2 for a, b in zip(p, q)) for p, q in combinations(points, 2)]
    smallest = min(squared)
    if smallest == 0:
        i, j = next(pair for pair, s in zip(combinations(range(len(points)), 2), squared) if s == 0)
        raise ValueError(f"points {i} and {j} coincide")
    try:
        return float(max(squared) / smallest)
    except OverflowError:
        raise ValueError("the ratio is too large to represent (points nearly coincide)") from None


def descriptors(outputs: dict[str, Any], code: str = "") -> dict[str, float]:
    """Behaviour of the headline configuration (the first valid one if it is missing)."""
    if not outputs:
        return {}
    points = np.asarray(outputs.get("p16_d2", next(iter(outputs.values()))), dtype=float)
    gaps = np.sqrt(((points[:, None, :] - points[None, :, :]) ** 2).sum(-1))
    np.fill_diagonal(gaps, np.inf)
    nearest = gaps.min(axis=1)
    return {"hull_share": _hull_share(points), "nn_spread": float(np.std(nearest) / np.mean(nearest))}


def _hull_share(points: np.ndarray) -> float:
    """Share of the points that are vertices of the convex hull (ring-like vs filled)."""
    from scipy.spatial import ConvexHull, QhullError

    try:
        return len(ConvexHull(points).vertices) / len(points)
    except (QhullError, ValueError):  # flat configuration: every point is on its boundary
        return 1.0


def _unpack(output: Any, n: int, d: int) -> list[tuple[Fraction, ...]]:
    if not isinstance(output, (list, tuple)) or len(output) != n:
        raise ValueError(f"expected {n} points, got {len(output) if isinstance(output, (list, tuple)) else type(output).__name__}")
    points = []
    for i, point in enumerate(output):
        if not isinstance(point, (list, tuple)) or len(point) != d:
            raise ValueError(f"point {i} does not have {d} coordinates")
        points.append(tuple(Fraction(_number(x, f"point {i}")) for x in point))
    return points


def _number(value: Any, what: str) -> int | float:
    # Exact types: bool is an int subclass, and strings, None or lists are not numbers.
    if type(value) not in (int, float):
        raise ValueError(f"{what}: a coordinate is not a number: {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{what}: a coordinate is not finite: {value!r}")
    return value


def draw(ax, args: dict, output: Any) -> None:
    """The point set with its closest and farthest pairs marked (2D; a projection for 3D)."""
    points = np.asarray(output, dtype=float)
    try:
        title, colour = f"n={args['n']}, d={args['d']}: ratio² {score(args, output):.6f}", "black"
    except ValueError as exc:
        title, colour = f"n={args['n']}, d={args['d']}: invalid ({exc})", "firebrick"
    xy = points[:, :2]
    gaps = ((points[:, None, :] - points[None, :, :]) ** 2).sum(-1)
    i, j = np.triu_indices(len(points), k=1)
    near, far = np.argmin(gaps[i, j]), np.argmax(gaps[i, j])
    ax.plot(*xy[[i[near], j[near]]].T, color="#2ca02c", linewidth=2, label="closest pair")
    ax.plot(*xy[[i[far], j[far]]].T, color="#d62728", linewidth=1, linestyle="--", label="farthest pair")
    ax.scatter(xy[:, 0], xy[:, 1], s=30, color="#1f77b4", zorder=3)
    ax.set_aspect("equal")
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title(title, fontsize=9, color=colour)
