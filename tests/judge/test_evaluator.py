"""Evaluator: sandbox + trusted scorer -> vector fitness, on the real circle-packing problem."""
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from scripted_run import SEED as GRID_SEED

from evolve.config import SandboxLimits, load_problem
from evolve.judge.evaluator import Evaluator
from evolve.sandbox.docker import DockerSandbox
from evolve.sandbox.result import SandboxResult

ROOT = Path(__file__).resolve().parents[2]
PROBLEM = load_problem(ROOT / "problems" / "circle_packing.yaml")
SHIPPED_SEED = PROBLEM.resolve(PROBLEM.program).read_text()
SEED = GRID_SEED  # equal circles on a grid: its variants below edit its centres and radii
SCORER_PATH = PROBLEM.resolve(PROBLEM.scorer)


@pytest.fixture(scope="module")
def evaluator(docker_ready):
    box = DockerSandbox(SandboxLimits(timeout_s=10, memory_mb=1024))
    yield Evaluator(PROBLEM, box)
    box.close()


def seed_variant(extra_lines: str) -> str:
    """The seed with lines inserted just before its return statement."""
    return SEED.replace("    return centers, radii", extra_lines + "\n    return centers, radii")


@pytest.mark.parametrize("seed", [SHIPPED_SEED, GRID_SEED], ids=["shipped", "grid"])
async def test_seed_evaluates_ok(evaluator, seed):
    result = await evaluator.evaluate(seed)
    names = [c.name for c in PROBLEM.components]
    assert result.status == "ok", result.error
    assert list(result.components) == names and len(names) == 7
    assert result.headline == pytest.approx(26 / 12, rel=1e-6)
    assert result.raw["n26"] == result.headline
    for c in PROBLEM.components:
        assert result.components[c.name] == pytest.approx(result.raw[c.name] / c.reference)
    assert result.objective == pytest.approx(sum(result.components.values()) / 7)
    assert 0.7 < result.objective < 1.0  # valid but clearly improvable
    assert set(result.descriptors) == {"radius_cv", "border_share"}
    assert result.error is None


async def test_one_invalid_component_scores_zero_and_is_explained(evaluator):
    result = await evaluator.evaluate(seed_variant("    if n == 27:\n        centers[1] = centers[0]"))
    assert result.status == "ok"
    assert result.components["n27"] == 0.0 and "n27" not in result.raw
    assert all(result.components[name] > 0 for name in result.components if name != "n27")
    assert "n27: invalid:" in result.error and "overlap" in result.error


async def test_all_invalid_is_invalid(evaluator):
    code = "def construct_packing(n):\n    return [[0.5, 0.5]] * n, [0.1] * n\n"
    result = await evaluator.evaluate(code)
    assert result.status == "invalid"
    assert result.objective == 0.0 and result.headline is None and result.descriptors == {}
    assert result.error.count("overlap") == 7


async def test_nan_is_invalid(evaluator):
    code = "def construct_packing(n):\n    return [[float('nan')] * 2] * n, [float('nan')] * n\n"
    result = await evaluator.evaluate(code)
    assert result.status == "invalid" and "not finite" in result.error


async def test_a_self_reported_sum_is_ignored(evaluator):
    result = await evaluator.evaluate(seed_variant("    return centers, radii, 4.01"))
    assert result.status == "invalid" and "expected (centers, radii)" in result.error


async def test_every_case_raising_is_an_error(evaluator):
    result = await evaluator.evaluate("def construct_packing(n):\n    print('about to fail')\n    raise RuntimeError('nope')\n")
    assert result.status == "error"
    assert "RuntimeError: nope" in result.error and "about to fail" in result.error


async def test_timeout_without_valid_components(docker_ready):
    box = DockerSandbox(SandboxLimits(timeout_s=1, memory_mb=512), warm=1)
    try:
        result = await Evaluator(PROBLEM, box).evaluate("def construct_packing(n):\n    while True:\n        pass\n")
    finally:
        box.close()
    assert result.status == "timeout" and result.objective == 0.0
    assert "timed out" in result.error


async def test_candidate_cannot_patch_the_trusted_side(evaluator):
    # Everything OpenEvolve-style attacks try, in the candidate's own process: patch the
    # scorer module, numpy, math, fractions and builtins, and forge result lines on every fd.
    attack = f"""
import builtins, fractions, importlib.util, json, math, os
import numpy as np

import types
scorer = types.ModuleType("scorer")  # a copy of the trusted scorer, patched in here
exec({SCORER_PATH.read_text()!r}, scorer.__dict__)
scorer.score = lambda args, output: 1000.0
np.sqrt = lambda x: 1e9
np.sum = lambda *a, **k: 1000.0
math.fsum = lambda values: 1000.0
math.isfinite = lambda x: True
fractions.Fraction.__lt__ = lambda self, other: False
builtins.sum = lambda *a, **k: 1000.0

def construct_packing(n):
    packing = [[[0.5, 0.5]] * n, [0.5] * n]
    for fd in range(3, 32):
        for name in ("n26", "n27", "n28", "n29", "n30", "n31", "n32"):
            try:
                os.write(fd, (json.dumps({{"case": name, "output": packing}}) + "\\n").encode())
            except OSError:
                pass
    return packing
"""
    result = await evaluator.evaluate(attack)
    assert result.status == "invalid"
    assert result.objective == 0.0 and result.raw == {}
    # and the engine's own modules are untouched
    assert math.fsum([1.0, 2.0]) == 3.0 and sum([1, 2]) == 3


async def test_scorer_exception_of_any_type_is_invalid_for_that_component():
    class OneOutputSandbox:
        async def run(self, code, entry_point, cases):
            return SandboxResult("ok", {"n26": "anything"}, {}, "", 0.0)

    evaluator = Evaluator(PROBLEM, OneOutputSandbox())
    evaluator.scorer = SimpleNamespace(score=lambda args, output: 1 / 0, descriptors=lambda o: {})
    result = await evaluator.evaluate("irrelevant")
    assert result.status == "invalid" and "n26: invalid: division by zero" in result.error


async def test_valid_component_wins_over_a_sandbox_failure():
    seed_outputs = {}
    exec(compile(SEED, "seed", "exec"), seed_outputs)
    centers, radii = seed_outputs["construct_packing"](26)

    class CrashedAfterOneCase:
        async def run(self, code, entry_point, cases):
            return SandboxResult("error", {"n26": [centers.tolist(), radii.tolist()]},
                                 {}, "", 0.0, detail="killed by SIGKILL (memory limit?)")

    result = await Evaluator(PROBLEM, CrashedAfterOneCase()).evaluate("irrelevant")
    assert result.status == "ok" and result.headline == pytest.approx(26 / 12, rel=1e-6)
    assert result.objective == pytest.approx(result.components["n26"] / 7)
    assert "sandbox: killed by SIGKILL" in result.error
    assert math.isfinite(result.descriptors["radius_cv"])
