"""Merge-and-restart serving (`train.serve: merge`, the CPU default) through the real parts:
`evolve run` with a GRPO policy on its own embedded vLLM, the real trainer, SQLite.

A module of its own: the run's server and trainer must not share the machine's memory with
tests/rl/test_rl_run.py's module-wide LoRA server (together they exceed 24 GB).
"""
from __future__ import annotations

import pytest
from sqlalchemy import select

from evolve.config import load_policy, load_problem
from evolve.rl import heldout
from evolve.rundir import RunDir
from evolve.store.schema import LLMCall, PolicyVersion, Program, TrainingStep
from tests.rl.test_rl_run import HUMANEVAL, HUMANEVAL_ARGS, PORT, grpo_policy, run_humaneval
from tests.test_run import MODEL, db_session, evolve

pytestmark = pytest.mark.real


def test_merged_versions_are_served_by_restarting_on_merged_weights(tmp_path):
    """`train.serve: merge` (the CPU default): the run's own server restarts on each published
    version merged into the weights, later calls go to it by name, one merged copy stays on
    disk, a resume comes back on it, and those weights give the trainer's log-probs (the
    run-time check on the first call after each restart). The guard measures each version as it
    is served, with no restart of its own."""
    policy = tmp_path / "merge.yaml"
    policy.write_text(grpo_policy(tmp_path / "x.yaml", "test-merge", "null").read_text()
                      .replace(f"port: {PORT}", f"port: {PORT + 1}")
                      # the guard as a CPU run has it (merged), on one parent; a margin that never refuses
                      .replace("guard: null}", "guard: {parents: 1, answers: 2, margin: 1.0}, serve: merge}")
                      # the default suite's one whole RL run, on short answers (1,205 s with 320
                      # tokens on an AVX2-only CPU). Three calls: the two in flight at once train
                      # v1, the third is served by it; fewer and the run ends before any step.
                      .replace("max_tokens: 320", "max_tokens: 160"))
    run_dir = tmp_path / "run"
    first = run_humaneval(policy, run_dir, 3)
    assert first.returncode == 0, first.stdout + first.stderr
    with db_session(run_dir) as s:
        versions = s.scalars(select(PolicyVersion).order_by(PolicyVersion.version)).all()
        calls = s.scalars(select(LLMCall).order_by(LLMCall.id)).all()
        steps = [st for st in s.scalars(select(TrainingStep)) if st.published]
        checks, guards = [st.served_check for st in steps], [st.guard for st in steps]
    assert checks and all(c["ok"] and c["tokens"] > 0 for c in checks), checks  # the merged weights, at run time
    assert all(g["after"]["answers"] > 0 for g in guards), guards  # measured merged, before it served
    latest = versions[-1]
    assert latest.version >= 1, first.stdout  # HumanEval/0 gives the 0.5B model a signal
    assert "merged and restarted in" in first.stdout
    model_of = {v.version: v.model for v in versions} | {0: MODEL}
    assert all(c.model == model_of[c.policy_version] for c in calls)
    assert [p.name for p in (run_dir / "merged").iterdir()] == [f"v{latest.version}"]
    log = (run_dir / "vllm.log").read_text()
    assert f"serving {latest.model} from {run_dir / 'merged' / f'v{latest.version}'}" in log
    # the trainer had the server's memory: stopped for the step, back on the new version after it
    assert log.index("stopping: training policy v1") < log.index("serving test-merge-v1 from")
    # from the trainer's step straight to the new weights: no restart on the base for the guard
    assert "] serving " not in log[log.index("stopping: training policy v1"):log.index("serving test-merge-v1 from")]

    # `evolve compare`'s held-out measurement serves it as the run did: merged, by its name
    measured = measure_merged(policy, run_dir, tmp_path / "heldout")
    assert measured["model"] == latest.model and [len(p["answers"]) for p in measured["parents"].values()] == [2]
    log = (tmp_path / "heldout" / "arm" / "vllm.log").read_text()
    assert f"serving {latest.model} from {tmp_path / 'heldout' / 'arm' / 'merged' / f'v{latest.version}'}" in log
    assert not (tmp_path / "heldout" / "arm" / "merged").exists()  # a model's size on disk, removed after

    second = evolve("resume", run_dir, "--max-llm-calls", 4)  # calls count over sessions: one more
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"resumed policy v{latest.version} ({latest.model}), served merged" in second.stdout
    with db_session(run_dir) as s:
        call = s.scalars(select(LLMCall).order_by(LLMCall.id.desc())).first()
        assert call.policy_version >= latest.version and call.error is None and call.model.startswith("test-merge-v")



def measure_merged(policy, run_dir, folder) -> dict:
    """The run's last version's held-out pool: 2 answers for the seed program as the parent."""
    spec = RunDir(run_dir).spec()
    with db_session(run_dir) as s:
        seed = s.scalars(select(Program).where(Program.origin == "seed")).first()
        parent = heldout._parent("run", seed, [], held_out=False)
    folder.mkdir()
    arm = {"name": "arm", "seed": 0, "evaluations": 0,
           "version": heldout.versions(spec["db_url"], spec["run_name"])[-1]}
    problem = load_problem(HUMANEVAL, [a for a in HUMANEVAL_ARGS if a != "--set"])
    [record] = heldout.measure_arm([(folder / "arm.json", arm)], problem, load_policy(policy), [parent],
                                   heldout.Settings(2, heldout.digest([parent])), print)
    return record
