"""The trusted circle-packing scorer: strict, zero tolerance, exact arithmetic."""
import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest

PROBLEM_DIR = Path(__file__).resolve().parents[2] / "problems" / "circle_packing"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"cp_{name}", PROBLEM_DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


scorer = _load("scorer")
seed = _load("seed")


def seed_output(n):
    centers, radii = seed.construct_packing(n)
    return [centers.tolist(), radii.tolist()]


def two_circles(x1=0.25, x2=0.75, r1=0.25, r2=0.25, y=0.5):
    return [[[x1, y], [x2, y]], [r1, r2]]


def invalid(output, n=2, match=None):
    with pytest.raises(ValueError, match=match):
        scorer.score({"n": n}, output)


@pytest.mark.parametrize("n", range(26, 33))
def test_seed_packing_is_valid_and_sum_is_recomputed(n):
    output = seed_output(n)
    assert scorer.score({"n": n}, output) == pytest.approx(math.fsum(output[1]))


def test_seed_is_improvable():
    assert 2.0 < scorer.score({"n": 26}, seed_output(26)) < 2.3


def test_tuples_are_accepted_like_lists():
    centers, radii = two_circles()
    assert scorer.score({"n": 2}, (tuple(map(tuple, centers)), tuple(radii))) == 0.5


def test_tangent_circles_are_accepted():
    # Exactly tangent to each other and to three sides each: all equalities, no slack.
    assert scorer.score({"n": 2}, two_circles()) == 0.5


def naive_float_overlap(output):
    """The check a float-only scorer would make; used to show the cases below matter."""
    (x1, y1), (x2, y2) = output[0]
    r1, r2 = output[1]
    return (x1 - x2) ** 2 + (y1 - y2) ** 2 < (r1 + r2) ** 2


def test_exactly_tangent_pair_that_floats_call_overlapping_is_accepted():
    # dx = 3a, dy = 4a, r1 + r2 = 5a with a dyadic: tangent exactly (found by search).
    output = [[[0.5, 0.5], [0.46160058827746664, 0.4488007843699555]],
              [0.0319995097687778, 0.0319995097687778]]
    assert naive_float_overlap(output)  # float rounding would wrongly reject it
    assert scorer.score({"n": 2}, output) == 2 * 0.0319995097687778


def test_overlap_of_1e_17_that_floats_miss_is_rejected():
    # The pair overlaps by 1.4e-17 in exact arithmetic (found by search).
    output = [[[0.2251440608216108, 0.5], [0.5633938934911842, 0.5]],
              [0.2251440608216108, 0.11310577184796262]]
    assert not naive_float_overlap(output)  # float rounding would wrongly accept it
    invalid(output, match="overlap")


def test_circle_out_by_less_than_float_resolution_is_rejected():
    r = 0.25 + 2.0 ** -54  # representable; 0.75 + r = 1 + 2^-54 rounds to 1.0 in floats
    assert 0.75 + r == 1.0
    invalid([[[0.25, 0.25], [0.75, 0.75]], [0.25, r]], match="inside")


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_centres_are_rejected(bad):
    invalid(two_circles(x1=bad), match="not finite")
    invalid([[[0.25, bad], [0.75, 0.5]], [0.25, 0.25]], match="not finite")


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_radii_are_rejected(bad):
    invalid(two_circles(r1=bad), match="not finite")


def test_nan_everywhere_is_rejected():
    nan = float("nan")
    invalid([[[nan, nan]] * 26, [nan] * 26], n=26)


def test_overlap_by_1e_12_is_rejected():
    invalid(two_circles(x2=0.75 - 1e-12), match="overlap")
    invalid(two_circles(r2=0.25 + 1e-12, x2=0.75 - 1e-12), match="overlap")


def test_circle_out_of_square_by_1e_12_is_rejected():
    invalid(two_circles(x1=0.25 - 1e-12), match="inside")
    invalid(two_circles(x2=0.75 + 1e-12, x1=0.2), match="inside")
    invalid([[[0.25, 0.75 + 1e-12], [0.75, 0.5]], [0.25, 0.25]], match="inside")
    invalid([[[0.25, 0.25 - 1e-12], [0.75, 0.5]], [0.25, 0.25]], match="inside")


@pytest.mark.parametrize("radius", [0.0, -0.0, -0.1, 0])
def test_zero_and_negative_radii_are_rejected(radius):
    invalid(two_circles(r1=radius), match="must be > 0")


def test_wrong_shapes_are_rejected():
    centers, radii = seed_output(26)
    invalid([centers[:-1], radii[:-1]], n=26, match="expected 26 centers")
    invalid([centers, radii[:-1]], n=26, match="expected 26 radii")
    invalid([[c + [0.0] for c in centers], radii], n=26, match="not a pair")
    invalid([c for pair in centers for c in pair] + radii, n=26, match="expected")
    invalid({"centers": centers, "radii": radii}, n=26, match=r"expected \(centers, radii\)")
    invalid([centers], n=26, match=r"expected \(centers, radii\)")
    invalid(None, n=26)
    invalid("circles", n=26)


def test_self_reported_sum_is_a_shape_error():
    centers, radii = seed_output(26)
    invalid([centers, radii, 4.01], n=26, match=r"expected \(centers, radii\)")
    invalid((centers, radii, {"sum": 4.01}), n=26, match=r"expected \(centers, radii\)")


@pytest.mark.parametrize("bad", ["0.25", None, True, False, [0.25], {"x": 0.25}])
def test_non_numeric_values_are_rejected(bad):
    invalid(two_circles(x1=bad), match="not a number")
    invalid(two_circles(r1=bad), match="not a number")


def test_huge_numbers_are_rejected_without_crashing():
    invalid(two_circles(x1=1e308), match="inside")
    invalid(two_circles(r1=1e308), match="inside")
    invalid(two_circles(x1=10 ** 400), match="inside")
    invalid(two_circles(r1=10 ** 400), match="inside")
    invalid(two_circles(r1=5e-324, x1=-1e308), match="inside")


def test_tiny_circles_are_checked_exactly():
    # Subnormal radii: the float prefilter's underflow margin must not change the verdict.
    tiny = 5e-324  # the smallest subnormal; its square underflows to 0.0
    assert scorer.score({"n": 2}, two_circles(x1=tiny, x2=3 * tiny, r1=tiny, r2=tiny)) == 2 * tiny
    invalid(two_circles(x1=tiny, x2=2 * tiny, r1=tiny, r2=tiny), match="overlap")


def test_coincident_circles_are_rejected():
    invalid([[[0.5, 0.5]] * 26, [0.1] * 26], n=26, match="overlap")


def test_descriptors_use_the_n26_packing():
    values = scorer.descriptors({"n27": seed_output(27), "n26": seed_output(26)})
    centers, radii = seed_output(26)
    assert values["radius_cv"] == pytest.approx(np.std(radii) / np.mean(radii))
    touching = sum(min(x - r, 1 - x - r, y - r, 1 - y - r) < 1e-3
                   for (x, y), r in zip(centers, radii))
    assert values["border_share"] == pytest.approx(touching / 26)


def test_descriptors_fall_back_to_first_valid_and_handle_none():
    assert scorer.descriptors({}) == {}
    values = scorer.descriptors({"n30": [[[0.25, 0.5], [0.75, 0.5]], [0.25, 0.125]]})
    assert values["radius_cv"] == pytest.approx((0.0625 / 0.1875))
    assert values["border_share"] == 0.5  # only the first circle touches a side
