"""The problem suite: every shipped problem's scorer, HumanEval's test splitting and judging,
templates and --set, `evolve check` on every problem, and the target that stops a run.

Judging goes through the real sandbox (Docker).
"""
import asyncio
import importlib.util
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from evolve.config import ConfigError, load_problem
from evolve.judge.evaluator import Evaluator

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = ROOT / "problems"
HUMANEVAL = PROBLEMS / "humaneval.yaml"
# Plain asserts, setup lines before the asserts, a call by the function's own name (33),
# loops of asserts over random inputs with helpers from the prompt (32, 38), floats (2, 4).
TASKS = ["HumanEval/0", "HumanEval/2", "HumanEval/4", "HumanEval/32", "HumanEval/33",
         "HumanEval/38", "HumanEval/53", "HumanEval/100", "HumanEval/151"]


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


template = _load(PROBLEMS / "humaneval" / "template.py", "he_template")
he_scorer = _load(PROBLEMS / "humaneval" / "scorer.py", "he_scorer")
md_scorer = _load(PROBLEMS / "min_max_distance" / "scorer.py", "md_scorer")
md_seed = _load(PROBLEMS / "min_max_distance" / "seed.py", "md_seed")


def task(tid: str, backend: str | None = None):
    sets = [f"task={tid}"] + ([f"sandbox.backend={backend}"] if backend else [])
    return load_problem(HUMANEVAL, sets)


def canonical(tid: str) -> str:
    row = template.dataset()[tid]
    return row["prompt"] + row["canonical_solution"]


def evaluate(problem, code: str):
    evaluator = Evaluator(problem)
    try:
        return asyncio.run(evaluator.evaluate(code))
    finally:
        evaluator.sandbox.close()


# ---- HumanEval: splitting --------------------------------------------------------------------
def asserts_in_check(tid: str) -> int:
    """Counted from the text, independently of the AST split: the check() lines that start an
    assert on the candidate, or a loop whose body asserts on it (one case per loop)."""
    body = template.dataset()[tid]["test"].split("def check(candidate):", 1)[1]
    statements = re.split(r"\n(?=    \S)", body)
    return sum(1 for s in statements if "assert" in s and "candidate" in s)


@pytest.mark.parametrize("tid", TASKS)
def test_one_component_per_assert(tid):
    problem = task(tid)
    assert len(problem.components) == asserts_in_check(tid) > 0
    assert [c.name for c in problem.components] == [f"test_{i:02d}" for i in range(1, len(problem.components) + 1)]
    assert all(c.reference == 1.0 and c.judge["function"] == problem.entry_point for c in problem.components)


def test_known_counts_and_setup_lines():
    assert len(task("HumanEval/0").components) == 7
    loop = task("HumanEval/32").components
    assert len(loop) == 1 and "rng = random.Random(42)" in loop[0].judge["setup"]
    assert loop[0].judge["test"].startswith("for _ in range(100):")
    assert len(loop[0].args["calls"]) == 100  # the loop's calls, recorded on the canonical solution


def test_padding_asserts_that_never_call_the_candidate_are_left_out():
    padded = [t for t, row in template.dataset().items() if "assert True" in row["test"]]
    assert padded, "HumanEval pads some tests with assert True"
    for tid in padded[:5]:
        assert all("assert True" not in c.judge["test"] for c in task(tid).components)


def test_seed_is_the_prompt_with_an_empty_body_inside_the_evolve_block():
    problem = task("HumanEval/38")
    code = problem.seed_code()
    assert code.index("def encode_cyclic") < code.index("# EVOLVE-BLOCK-START") < code.index("def decode_cyclic")
    assert code.rstrip().endswith("# EVOLVE-BLOCK-END") and "pass" in code
    assert problem.name == "humaneval-38" and problem.headline == "objective"


# ---- HumanEval: judging in the real sandbox --------------------------------------------------------
@pytest.mark.parametrize("tid", TASKS)
def test_canonical_solution_scores_all_ones_and_the_empty_function_zeros(tid, docker_ready):
    problem = task(tid)
    right = evaluate(problem, canonical(tid))
    assert right.status == "ok" and set(right.components.values()) == {1.0}, right.error
    assert right.objective == 1.0 == right.headline
    empty = evaluate(problem, problem.seed_code())
    assert empty.status == "ok" and set(empty.components.values()) == {0.0}, empty.error
    assert set(empty.descriptors) == {"statements", "branches"}


def test_partial_solution_gets_a_partial_vector(docker_ready):
    # has_close_elements that only looks at neighbours in the given order: right on some tests.
    code = canonical("HumanEval/0").split("    for idx")[0] + (
        "    return any(abs(a - b) < threshold for a, b in zip(numbers, numbers[1:]))\n")
    result = evaluate(task("HumanEval/0"), code)
    values = list(result.components.values())
    assert result.status == "ok" and 0 < sum(values) < len(values), values
    assert set(values) <= {0.0, 1.0} and result.objective == pytest.approx(sum(values) / len(values))
    assert result.error is None  # wrong answers get no note: the score says it all (see explain)


HOSTILE = {
    # The classic HumanEval exploit: an object equal to everything.
    "always_equal": "class Yes:\n    def __eq__(self, other): return True\n    def __ne__(self, other): return False\n"
                    "def has_close_elements(numbers, threshold):\n    return Yes()\n",
    # Patching the builtins of the process it runs in cannot reach the engine's assert.
    "patch_builtins": "import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.AssertionError = type('E', (BaseException,), {})\n"
                      "def has_close_elements(numbers, threshold):\n    return None\n",
    # Leaving before the test can fail.
    "exit": "import os\ndef has_close_elements(numbers, threshold):\n    os._exit(0)\n",
    "raise": "def has_close_elements(numbers, threshold):\n    raise SystemExit(0)\n",
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_candidate_cannot_make_an_assert_pass(name):
    result = evaluate(task("HumanEval/0"), HOSTILE[name])
    assert result.objective == 0.0, (name, result.components)


def test_a_candidate_that_uses_random_or_mutates_its_input_is_judged_fairly():
    # HumanEval/38's test draws its inputs from `random`; the candidate draws too and
    # scrambles the list it is given: neither may change what the test checks.
    tid = "HumanEval/38"
    code = canonical(tid) + "\nimport random\n_orig = decode_cyclic\n" \
        "def decode_cyclic(s):\n    random.random()\n    return _orig(s)\n"
    assert evaluate(task(tid), code).objective == 1.0
    tid = "HumanEval/33"
    code = canonical(tid) + "\n_orig = sort_third\ndef sort_third(l):\n    out = _orig(l)\n    l.clear()\n    return out\n"
    assert evaluate(task(tid), code).objective == 1.0


def test_only_the_inputs_enter_the_sandbox():
    # What the sandbox receives holds the calls' arguments, never the test's source or its
    # expected values (which a candidate could read by walking up the stack).
    for tid in ("HumanEval/0", "HumanEval/32", "HumanEval/38"):
        problem = task(tid)
        driver = (PROBLEMS / "humaneval" / "driver.py").read_text()  # the same for every task
        cases = problem.cases()
        assert all(case.pop("driver") == driver for case in cases)
        sent = json.dumps(cases)
        assert "assert" not in sent and "candidate" not in sent, tid
        for c in problem.components:
            assert set(c.args) == {"calls"} and "assert" in c.judge["test"]
    first = task("HumanEval/0").components[0]
    assert first.args["calls"] == ["(([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3), [])"]


# Walks every frame and every string in the sandbox for the test's expected values.
STACK_WALKER = """
import gc, sys
def has_close_elements(numbers, threshold):
    seen = []
    frame = sys._getframe()
    while frame is not None:
        seen += [repr(v) for v in frame.f_locals.values()]
        frame = frame.f_back
    seen += [o for o in gc.get_objects() if isinstance(o, str)]
    leaks = [s for s in seen if "== True" in s or "== False" in s]
    if leaks:
        raise ValueError(f"leaks: {len(leaks)}: {leaks[0][:80]}")
    return False
"""


def test_a_candidate_that_walks_the_stack_finds_no_expected_values(docker_ready):
    result = evaluate(task("HumanEval/0"), STACK_WALKER)
    assert result.status == "ok" and "leaks" not in (result.error or ""), result.error
    assert 0 < result.objective < 1.0  # right only where the answer is False


def test_scorer_replays_calls_and_rejects_malformed_output():
    first = task("HumanEval/0").components[0]  # candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True
    args = {**first.args, **first.judge}
    call = "(([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3), [])"
    assert he_scorer.score(args, [{"call": call, "result": "True"}]) == 1.0
    assert he_scorer.score(args, [{"call": call, "result": "False"}]) == 0.0
    assert he_scorer.score(args, [{"call": call, "error": "ValueError: no"}]) == 0.0
    assert he_scorer.score(args, [{"call": "(([1.0], 0.3), [])", "result": "True"}]) == 0.0  # another call
    assert he_scorer.score(args, [{"call": call, "result": "__import__('os')"}]) == 0.0  # not a literal
    assert he_scorer.score(args, []) == 0.0
    for bad in ("True", [["call", "True"]], [{"call": call, "result": 1}], {"call": call}):
        with pytest.raises(ValueError):
            he_scorer.score(args, bad)


def test_a_failed_case_is_explained_by_the_call_that_raised_never_by_a_wrong_answer():
    first = task("HumanEval/0").components[0]  # candidate([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3) == True
    args = {**first.args, **first.judge}
    call = "(([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3), [])"
    shown = "has_close_elements([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3)"
    assert he_scorer.explain(args, [{"call": call, "result": "True"}]) is None  # passes: nothing to say
    # A wrong boolean named with its call would give the right one away.
    assert he_scorer.explain(args, [{"call": call, "result": "False"}]) is None
    assert he_scorer.explain(args, [{"call": call, "error": "ValueError: no"}]) == f"{shown}: raised ValueError: no"
    assert he_scorer.explain(args, [{"call": call, "result": "__import__('os')"}]) == (
        f"{shown}: returned a value that is not a Python literal")
    assert he_scorer.explain(args, []) is None


def test_a_test_that_calls_again_in_its_assert_message_gets_no_note():
    """HumanEval/77 asserts `candidate(-1) == True, "..." + str(candidate(-1))`: on a wrong
    answer the message makes a call the sandbox never recorded. That is the replay's view, and
    naming the call would give the expected boolean away."""
    case = next(c for c in task("HumanEval/77").components if "candidate(-1)" in c.judge["test"])
    args = {**case.args, **case.judge}
    wrong = [{"call": "((-1,), [])", "result": "False"}]
    assert he_scorer.score(args, wrong) == 0.0 and he_scorer.explain(args, wrong) is None


# ---- templates and --set ------------------------------------------------------------------------
def test_task_comes_from_set_or_the_yaml():
    assert task("17").name == "humaneval-17"
    assert load_problem(HUMANEVAL).name == "humaneval-0"  # the YAML's own task field


@pytest.mark.parametrize("sets, message", [
    (["task=HumanEval/999"], r"humaneval.yaml: field 'task': no task 'HumanEval/999'"),
    (["task"], r"humaneval.yaml: --set 'task': expected KEY=VALUE"),
    (["budget.max_evaluations=lots"], r"humaneval.yaml: field 'budget.max_evaluations'"),
    (["typo=1"], r"humaneval.yaml: field 'typo': Extra inputs are not permitted"),
])
def test_bad_parameters_are_one_clear_line(sets, message):
    with pytest.raises(ConfigError, match=message):
        load_problem(HUMANEVAL, sets)


def test_set_overrides_nested_fields():
    problem = load_problem(PROBLEMS / "circle_packing.yaml", ["budget.max_evaluations=7", "sandbox.timeout_s=5"])
    assert problem.budget.max_evaluations == 7 and problem.sandbox.timeout_s == 5


# ---- mathematics ----------------------------------------------------------------------------------
def test_min_max_distance_seed_and_exact_ratios():
    grid = md_seed.construct_points(16, 2).tolist()
    assert md_scorer.score({"n": 16, "d": 2}, grid) == 18.0  # corners sqrt(18) apart, neighbours 1
    assert md_scorer.score({"n": 14, "d": 3}, md_seed.construct_points(14, 3).tolist()) == 9.0
    # Regular hexagon plus its centre: every nearest pair at distance 1, the farthest at 2.
    hexagon = [[0.0, 0.0]] + [[math.cos(k * math.pi / 3), math.sin(k * math.pi / 3)] for k in range(6)]
    assert md_scorer.score({"n": 7, "d": 2}, hexagon) == pytest.approx(4.0, rel=1e-12)
    assert md_scorer.score({"n": 2, "d": 2}, [[0, 0], [3, 4]]) == 1.0


@pytest.mark.parametrize("output, reason", [
    ([[0.0, 0.0]] * 2, "coincide"),
    ([[0.0, 0.0], [1.0]], "2 coordinates"),
    ([[0.0, 0.0], [1.0, float("nan")]], "not finite"),
    ([[0.0, 0.0], [True, 1.0]], "not a number: bool"),
    ([[0.0, 0.0], ["1", 1.0]], "not a number: str"),
    ([[0.0, 0.0]], "expected 2 points"),
    ("points", "expected 2 points"),
])
def test_min_max_distance_rejects_invalid_sets(output, reason):
    with pytest.raises(ValueError, match=reason):
        md_scorer.score({"n": 2, "d": 2}, output)


def test_min_max_distance_is_exact_for_nearly_coincident_points():
    # 1e-200 apart: the squared distance underflows to 0.0 in floats (a float scorer would call
    # them coincident or divide by zero); exactly, they are distinct and the ratio is too large.
    with pytest.raises(ValueError, match="too large"):
        md_scorer.score({"n": 3, "d": 2}, [[0.0, 0.0], [1e-200, 0.0], [1.0, 0.0]])
    assert md_scorer.score({"n": 3, "d": 2}, [[0.0, 0.0], [1e-100, 0.0], [1.0, 0.0]]) == pytest.approx(1e200)


def test_minimize_components_normalise_as_reference_over_value():
    problem = load_problem(PROBLEMS / "min_max_distance.yaml")
    c = problem.components[0]
    assert c.goal == "minimize" and c.normalise(c.reference) == 1.0
    assert c.normalise(18.0) == pytest.approx(12.889266112 / 18.0) and c.normalise(2 * c.reference) == 0.5


def test_circle_packing_32_is_its_own_headline():
    problem = load_problem(PROBLEMS / "circle_packing_32.yaml")
    assert [c.name for c in problem.components] == ["n32"] and problem.headline == "n32"
    assert problem.components[0].reference == 2.939572771205


# An optimiser's layout leaves many pairs touching; on such centres the sandbox's (older) scipy
# returned radii that overlapped by up to ~1e-7, and the strict judge scored 4 of the 7 n zero.
def test_the_seeds_helpers_stay_valid_on_an_optimisers_tight_layouts(docker_ready):
    problem = load_problem(PROBLEMS / "circle_packing.yaml")
    seed, returns = problem.seed_code(), "\n    return centers, max_radii(centers)\n"
    code = (seed.replace("    margin = 0.5 ", "    margin = 0.05 ").replace("    stagger = 0.0 ", "    stagger = 0.05 ")
            .replace("    rise = 1.0 ", "    rise = 1.1 ")
            .replace(returns, "\n    centers = refine(centers)" + returns))
    assert "margin = 0.05" in code and "centers = refine(centers)" in code
    result = evaluate(problem, code)
    assert result.status == "ok" and min(result.components.values()) > 0.95, result.components
    assert evaluate(problem, seed).headline == pytest.approx(2.1666666, abs=1e-6)  # the seed does not call it


@pytest.mark.parametrize("name", ["ring", "random", "hex", "spiral", "grid"])
def test_a_foreign_seed_runs_the_flagships_search(name):
    """The foreign seed programs test whether the engine's defaults, not the seed, do the work:
    only the program and its description may differ from circle_packing.yaml."""
    flagship, foreign = (load_problem(PROBLEMS / f) for f in ("circle_packing.yaml", f"circle_packing_{name}.yaml"))
    for field in ("search", "budget", "sandbox", "components", "descriptors", "headline", "scorer"):
        assert getattr(foreign, field) == getattr(flagship, field), field
    assert foreign.policy == flagship.policy and foreign.seed_code() != flagship.seed_code()


@pytest.mark.parametrize("name", ["circle_packing_32", "min_max_distance"])
def test_the_other_optimisation_problems_run_the_flagships_search(name):
    """Every shipped problem uses the search and mutator measured to pay (issue 58): the flagship's,
    all but its wall time (these run half an hour)."""
    flagship, other = (load_problem(PROBLEMS / f"{f}.yaml") for f in ("circle_packing", name))
    assert other.search == flagship.search and other.policy == flagship.policy
    assert other.budget.model_copy(update={"wall_time_s": flagship.budget.wall_time_s}) == flagship.budget


# ---- evolve check on every shipped problem ----------------------------------------------------------
def shipped_problems() -> list[Path]:
    return sorted(p for p in PROBLEMS.glob("*.yaml") if "vary" not in yaml.safe_load(p.read_text()))


def test_every_problem_yaml_is_covered():
    names = {p.name for p in shipped_problems()}
    assert {"circle_packing.yaml", "circle_packing_32.yaml", "min_max_distance.yaml", "humaneval.yaml"} <= names


@pytest.mark.parametrize("path", shipped_problems(), ids=lambda p: p.stem)
def test_check_every_shipped_problem(path, docker_ready):
    out = subprocess.run([sys.executable, "-m", "evolve.cli", "check", str(path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "docker sandbox" in out.stdout and "status ok" in out.stdout
    problem = load_problem(path)
    assert all(c.name in out.stdout for c in problem.components[:5])
    assert "MAP-Elites cell" in out.stdout


def test_check_fails_for_a_seed_that_fails_its_scorer(tmp_path):
    data = yaml.safe_load((PROBLEMS / "circle_packing_32.yaml").read_text())
    data.update(program_code="def construct_packing(n):\n    return [[0.5, 0.5]] * n, [0.5] * n\n",
                program=None, scorer=str(PROBLEMS / "circle_packing" / "scorer.py"), policy=str(PROBLEMS / data["policy"]))
    path = tmp_path / "overlapping.yaml"
    path.write_text(yaml.safe_dump(data))
    out = subprocess.run([sys.executable, "-m", "evolve.cli", "check", str(path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and "status invalid" in out.stdout and "overlap" in out.stdout


# ---- budget.target_objective stops a run ---------------------------------------------------------------
class CanonicalClient:
    """Answers every request with the diff that writes HumanEval/0's canonical body."""
    model = "scripted"

    def __init__(self):
        body = template.dataset()["HumanEval/0"]["canonical_solution"].rstrip("\n")
        self.answer = f"Write it.\n<<<<<<< SEARCH\n    pass  # to be written\n=======\n{body}\n>>>>>>> REPLACE"

    async def sample(self, messages, n, seed=None, max_tokens=None, model=None, on_answer=None):
        from evolve.serving.client import Sample
        await asyncio.sleep(0.01)  # a real client waits on the network; the loop relies on it
        return Sample(texts=[self.answer] * n, finish_reasons=["stop"] * n, prompt_tokens=100,
                      completion_tokens=50 * n, started_at=0.0, latency_s=0.01)

    async def close(self):
        pass


def test_a_run_stops_when_the_target_objective_is_reached(tmp_path):
    from scripted_run import write_policy

    from evolve.config import load_policy
    from evolve.run import open_database
    from evolve.search.controller import Controller

    problem = task("HumanEval/0")
    assert problem.budget.target_objective == 1.0
    budget = problem.budget.model_copy(update={"max_evaluations": 50, "llm_concurrency": 1})
    policy_path = write_policy(tmp_path)
    spec = {"problem": str(HUMANEVAL), "set": ["task=HumanEval/0"], "policy": str(policy_path), "seed": 0,
            "db_url": f"sqlite:///{tmp_path / 'evolve.db'}", "run_name": "target"}
    policy = load_policy(policy_path)
    db = open_database(spec, problem, policy, tmp_path)
    try:
        controller = Controller(problem, policy, db, Evaluator(problem), CanonicalClient(), budget, 0,
                                lambda event: None)
        assert asyncio.run(controller.run()) == "target reached"
        assert db.best().objective == 1.0
        # Before the budget: how many groups were asked first depends on the machine (a group's
        # evaluation runs beside the next call; 10 evaluations on a loaded machine, not 5)
        assert db.evaluations_done() < budget.max_evaluations
    finally:
        db.close()
    # The run stores the expanded problem, so its views need neither the template nor the task.
    from evolve.views.snapshot import RunReader
    reader = RunReader(tmp_path, spec)
    try:
        snap = reader.snapshot()
    finally:
        reader.close()
    assert snap.problem == "humaneval-0" and snap.headline == "objective" and snap.best.objective == 1.0
    assert len(snap.components) == 7 and snap.state == "stopped: target reached"


# ---- the judge's notes reach the mutator ---------------------------------------------------------
# Right on the tests with at most five numbers; raises on the others.
PARTIAL_BODY = ("    if len(numbers) > 5:\n        raise ValueError('too many numbers')\n"
                "    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])")


class RecordingClient:
    """Stands in for the LLM: answers with the partial solution and keeps every prompt."""
    model = "scripted"

    def __init__(self, block: str, scored):
        self.block, self.scored = block, scored  # scored(): the first child has been judged
        self.prompts: list[str] = []

    async def sample(self, messages, n, seed=None, max_tokens=None, model=None, on_answer=None):
        import time

        from evolve.serving.client import Sample
        self.prompts.append(messages[-1]["content"])
        deadline = time.time() + 120  # a child never judged fails the asserts below, not the suite
        while len(self.prompts) > 1 and not self.scored() and time.time() < deadline:
            await asyncio.sleep(0.05)  # later calls may have the first child as their parent
        answer = f"Compare neighbours.\n```python\n{self.block}\n```"
        return Sample(texts=[answer] * n, finish_reasons=["stop"] * n, prompt_tokens=900,
                      completion_tokens=60 * n, started_at=time.time(), latency_s=0.01)

    async def close(self) -> None:
        pass


def test_a_parent_that_fails_tests_is_shown_with_the_failing_calls(tmp_path, docker_ready):
    """The real engine, Docker sandbox and database, a scripted LLM: the child that passes some
    tests and raises on others is stored with the judge's notes, and the prompts that have it
    as their parent say which calls raised and what."""
    from evolve.config import load_policy
    from evolve.events import EventLog
    from evolve.mutation.code import evolve_block
    from evolve.run import open_database
    from evolve.search.controller import Controller
    from evolve.store.schema import Program

    problem = load_problem(HUMANEVAL, ["task=HumanEval/0", "search.islands=1", "budget.max_llm_calls=6",
                                       "budget.llm_concurrency=1"])
    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text("name: scripted\nmodel: scripted\nanswer_format: rewrite\n"
                           "server: {embedded: false, base_url: 'http://127.0.0.1:9/v1'}\n"
                           "sampling: {group_size: 2, max_prompt_tokens: 4000}\n")
    spec = {"problem": str(HUMANEVAL), "policy": str(policy_path), "seed": 0,
            "db_url": f"sqlite:///{tmp_path / 'evolve.db'}", "run_name": "notes", "budget": {}}
    db = open_database(spec, problem, load_policy(policy_path), tmp_path)
    client = RecordingClient(evolve_block(problem.seed_code()).replace("    pass  # to be written", PARTIAL_BODY),
                             lambda: db.best().objective > 0)
    evaluator = Evaluator(problem)
    try:
        with EventLog(tmp_path, lambda event: None) as log:
            asyncio.run(Controller(problem, load_policy(policy_path), db, evaluator, client,
                                   problem.budget, 0, log).run())
        child = next(p for p in db.session.query(Program).filter(Program.origin == "mutation")
                     if p.status == "ok")
    finally:
        evaluator.sandbox.close()
    assert 0 < child.objective < 1 and child.error, (child.objective, child.error)
    later = [p for p in client.prompts if PARTIAL_BODY in p.split("### Current program")[1]]
    assert later, "no call had the partial child as its parent"
    notes = later[0].split("### What the judge said about the current program")[1]
    assert "has_close_elements([" in notes and "raised ValueError: too many numbers" in notes
    first_failure = child.error.splitlines()[0]
    assert first_failure.split(": ", 1)[1] in notes
    db.close()
