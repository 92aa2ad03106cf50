"""Trusted scorer for circle packing. Runs in the engine process, on plain data only.

The candidate's output arrives as JSON-decoded data: `[centers, radii]`. The verdict has
zero tolerance: exact shapes, finite int/float values, radii > 0, every circle inside the
unit square, no two circles overlapping. The score is the sum of the radii, recomputed here.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

import numpy as np

BORDER_GAP = 1e-3  # a circle closer than this to a side counts as touching the border


def score(args: dict, output: Any) -> float:
    """Sum of radii of a valid packing; raises ValueError(reason) for anything else."""
    n = args["n"]
    centers, radii = _unpack(output, n)
    _check_inside(centers, radii)
    _check_disjoint(centers, radii)
    return math.fsum(radii)


def descriptors(outputs: dict[str, Any], code: str = "") -> dict[str, float]:
    """Behaviour of one packing, from the VALID outputs by case name (the caller filters).

    `code` is the candidate's source (unused here: the packing itself says how it behaves).
    Uses the n=26 packing when present (the headline case), else the first one.
    """
    if not outputs:
        return {}
    output = outputs.get("n26", next(iter(outputs.values())))
    centers = np.asarray(output[0], dtype=float)
    radii = np.asarray(output[1], dtype=float)
    x, y = centers[:, 0], centers[:, 1]
    gaps = np.min([x - radii, 1 - x - radii, y - radii, 1 - y - radii], axis=0)
    return {
        "radius_cv": float(np.std(radii) / np.mean(radii)),
        "border_share": float(np.mean(gaps < BORDER_GAP)),
    }


def _unpack(output: Any, n: int) -> tuple[list[tuple[float, float]], list[float]]:
    # Exactly (centers, radii): a third item such as a self-reported sum is a shape error.
    if not isinstance(output, (list, tuple)) or len(output) != 2:
        raise ValueError("expected (centers, radii)")
    centers, radii = output
    if not isinstance(centers, (list, tuple)) or len(centers) != n:
        raise ValueError(f"expected {n} centers, got {_length(centers)}")
    if not isinstance(radii, (list, tuple)) or len(radii) != n:
        raise ValueError(f"expected {n} radii, got {_length(radii)}")
    for i, center in enumerate(centers):
        if not isinstance(center, (list, tuple)) or len(center) != 2:
            raise ValueError(f"center {i} is not a pair (x, y)")
    points = [(_number(x, f"center {i} x"), _number(y, f"center {i} y"))
              for i, (x, y) in enumerate(centers)]
    sizes = [_number(r, f"radius {i}") for i, r in enumerate(radii)]
    for i, r in enumerate(sizes):
        if not r > 0:
            raise ValueError(f"radius {i} is {r!r}, must be > 0")
    return points, sizes


def _number(value: Any, what: str) -> int | float:
    # Exact types: bool is an int subclass, and strings, None or lists are not numbers.
    if type(value) not in (int, float):
        raise ValueError(f"{what} is not a number: {type(value).__name__}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{what} is not finite: {value!r}")
    return value


# Containment and overlap are decided in exact rational arithmetic. Every float is a
# dyadic rational, so Fraction(x) is its exact value and the comparisons below are exact:
# rounding can neither accept an overlap of 1e-12 (float math may round the gap to >= 0)
# nor reject a pair that touches exactly (float math may round it to < 0). Zero tolerance
# is then a real mathematical statement about the numbers the candidate returned.

def _check_inside(centers, radii) -> None:
    for i, ((x, y), r) in enumerate(zip(centers, radii)):
        x, y, r = Fraction(x), Fraction(y), Fraction(r)
        if x - r < 0 or x + r > 1 or y - r < 0 or y + r > 1:
            raise ValueError(f"circle {i} is not inside the unit square")


def _check_disjoint(centers, radii) -> None:
    exact = [(Fraction(x), Fraction(y), Fraction(r)) for (x, y), r in zip(centers, radii)]
    for i, j in _pairs_needing_exact_check(centers, radii):
        xi, yi, ri = exact[i]
        xj, yj, rj = exact[j]
        if (xi - xj) ** 2 + (yi - yj) ** 2 < (ri + rj) ** 2:
            raise ValueError(f"circles {i} and {j} overlap")


def _pairs_needing_exact_check(centers, radii) -> list[tuple[int, int]]:
    """Pairs that float math cannot prove disjoint; all others are certainly disjoint.

    Inputs are already known to lie in [0, 1], so the float values of d² = dx² + dy² and
    s² = (ri + rj)² are each within a few ulps (relative error < 1e-15) of the exact ones,
    plus an absolute error below 1e-300 from underflow. A pair with
    d²_float > s²_float * (1 + 1e-9) + 1e-290 is therefore disjoint in exact arithmetic too;
    the prefilter can skip work but never change a verdict.
    """
    xy = np.asarray(centers, dtype=float)
    r = np.asarray(radii, dtype=float)
    i, j = np.triu_indices(len(r), k=1)
    d2 = (xy[i, 0] - xy[j, 0]) ** 2 + (xy[i, 1] - xy[j, 1]) ** 2
    s2 = (r[i] + r[j]) ** 2
    close = ~(d2 > s2 * (1 + 1e-9) + 1e-290)
    return list(zip(i[close].tolist(), j[close].tolist()))


def _length(value: Any) -> str:
    return str(len(value)) if isinstance(value, (list, tuple)) else type(value).__name__


def draw(ax, args: dict, output: Any) -> None:
    """Draw one packing to scale on a matplotlib axis (used by `evolve export`).

    Optional hook: a problem's scorer may define `draw(ax, args, output)`; the output is the
    same plain data the scorer judges (it comes from the sandbox, never from running the
    candidate here). The title says whether the packing is valid and its recomputed sum.
    """
    from matplotlib.patches import Circle, Rectangle

    centers = np.asarray(output[0], dtype=float)
    radii = np.asarray(output[1], dtype=float)
    try:
        title, colour = f"n={args['n']}: sum of radii {score(args, output):.6f}", "black"
    except ValueError as exc:
        title, colour = f"n={args['n']}: invalid ({exc})", "firebrick"
    ax.add_patch(Rectangle((0, 0), 1, 1, fill=False, linewidth=1.2, edgecolor="black"))
    spread = float(np.ptp(radii)) or 1.0
    for (x, y), r in zip(centers, radii):
        shade = 0.25 + 0.6 * (r - radii.min()) / spread  # larger circles darker: the size mix at a glance
        ax.add_patch(Circle((x, y), r, facecolor=(0.16, 0.44, 0.70, shade), edgecolor="#1f3d5c",
                            linewidth=0.6))
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_aspect("equal")
    ax.set_xticks([0, 0.5, 1])
    ax.set_yticks([0, 0.5, 1])
    ax.set_title(title, fontsize=9, color=colour)
