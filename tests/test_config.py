"""Problem and policy YAML: the shipped files load; a bad file gives one clear line."""
from pathlib import Path

import pytest

from evolve.config import ConfigError, load_policy, load_problem

ROOT = Path(__file__).resolve().parent.parent


def test_shipped_problem_and_policies_load():
    problem = load_problem(ROOT / "problems" / "circle_packing.yaml")
    assert [c.args["n"] for c in problem.components] == list(range(26, 33))
    assert abs(sum(problem.weight_vector().values()) - 1) < 1e-12
    assert load_policy(problem.resolve(problem.policy)).name == "frozen_1.5b_complete"
    for path in (ROOT / "policies").glob("*.yaml"):
        assert load_policy(path).name


def write(tmp_path, text, name="p.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def problem_text(**changes):
    base = (ROOT / "problems" / "circle_packing.yaml").read_text()
    base = base.replace("program: circle_packing/seed.py", f"program: {ROOT}/problems/circle_packing/seed.py")
    base = base.replace("scorer: circle_packing/scorer.py", f"scorer: {ROOT}/problems/circle_packing/scorer.py")
    base = base.replace("policy: ../policies/", f"policy: {ROOT}/policies/")
    for old, new in changes.items():
        assert old in base
        base = base.replace(old, new)
    return base


@pytest.mark.parametrize("old,new,field,expect", [
    ("timeout_s: 60", "timeout_s: -1", "sandbox.timeout_s", "greater than 0"),
    ("timeout_s: 60", "timeout_s: soon", "sandbox.timeout_s", "valid number"),
    ("headline: n26", "headline: n99", "(top level)", "not a component name"),
    ("exploit_ratio: 0.7", "exploit_ratio: 0.9", "search", "must be 1"),
    ("islands: 4", "islandz: 4", "search.islandz", "Extra inputs"),
    ("bins: 8\n    why: >\n      Spread", "bins: 0\n    why: >\n      Spread", "descriptors.0.bins", "greater than or equal to 1"),
])
def test_bad_field_names_file_field_and_expectation(tmp_path, old, new, field, expect):
    path = write(tmp_path, problem_text(**{old: new}))
    with pytest.raises(ConfigError) as err:
        load_problem(path)
    msg = str(err.value)
    assert str(path) in msg and f"field '{field}'" in msg and expect in msg
    assert "\n" not in msg  # one line


def test_missing_file_and_bad_yaml_and_missing_program(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_problem(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_problem(write(tmp_path, "name: [unclosed"))
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_problem(write(tmp_path, "- a list"))
    text = problem_text(**{f"{ROOT}/problems/circle_packing/seed.py": "missing_seed.py"})
    with pytest.raises(ConfigError, match=r"field 'program': file .*missing_seed.py does not exist"):
        load_problem(write(tmp_path, text))


def test_policy_errors(tmp_path):
    with pytest.raises(ConfigError, match=r"field 'server': .*base_url \(or base_urls\) is required"):
        load_policy(write(tmp_path, "name: x\nmodel: m\nserver: {embedded: false}\n"))
    with pytest.raises(ConfigError, match=r"field 'model': Field required"):
        load_policy(write(tmp_path, "name: x\n"))
    with pytest.raises(ConfigError, match=r"field 'sampling.group_size'"):
        load_policy(write(tmp_path, "name: x\nmodel: m\nsampling: {group_size: 0}\n"))
