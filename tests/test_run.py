"""End to end through the real parts: `evolve run` as a user runs it, against the real vLLM
server (Qwen2.5-Coder-0.5B, the CPU default), the process sandbox and the SQLite database;
then Ctrl-C and resume."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import create_engine, func, select
from sqlalchemy.exc import DatabaseError
from sqlalchemy.orm import Session

from evolve.config import Server
from evolve.mutation.literals import float_literals
from evolve.rundir import RunDir
from evolve.serving.models import ensure_model
from evolve.serving.server import VLLMServer
from evolve.store.schema import Completion, Evaluation, LLMCall, Program, Tuning
from evolve.store.schema import Session as RunSession

pytestmark = pytest.mark.real
ROOT = Path(__file__).resolve().parent.parent
PROBLEM = ROOT / "problems" / "circle_packing.yaml"
PORT = 8125
MODEL = "qwen2.5-coder-0.5b-instruct"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the module; `evolve run` finds it on the port and reuses it."""
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    settings = Server(port=PORT, max_model_len=8192, extra_args=["--enforce-eager"])
    with VLLMServer(ensure_model(MODEL), MODEL, settings, log, seed=0) as srv:
        yield srv


@pytest.fixture(scope="module")
def grid_problem(tmp_path_factory) -> Path:
    """Circle packing from the grid seed, whose lines the 0.5B model's diffs match, with tuning
    off: these tests are about the run's plumbing (store, resume, interrupt), not the search."""
    from scripted_run import write_problem
    return write_problem(tmp_path_factory.mktemp("problem"), evaluations=10**6)


@pytest.fixture
def policy(tmp_path):
    path = tmp_path / "policy.yaml"
    path.write_text(f"""
name: test-qwen
model: {MODEL}
server: {{embedded: true, port: {PORT}, max_model_len: 8192}}
sampling: {{temperature: 0.7, max_tokens: 320, group_size: 4, max_prompt_tokens: 4000}}
""")
    return path


def evolve(*args, timeout: float = 900, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "evolve.cli", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, **kw)


def db_session(run_dir: Path) -> Session:
    return Session(create_engine(RunDir(run_dir).spec()["db_url"]))


def calls_stored(run_dir: Path) -> bool:
    """Polling a run that is starting: its database file exists before its tables do."""
    if not (run_dir / "evolve.db").exists():
        return False
    try:
        with db_session(run_dir) as s:
            return bool(s.scalar(select(func.count(LLMCall.id))))
    except DatabaseError:  # no tables yet, or a header half-written ("not a database")
        return False


def snapshot(s: Session) -> dict:
    """Everything about stored programs that a resume must not change."""
    return {p.id: (p.status, p.code, p.objective, json.dumps(p.fitness, sort_keys=True))
            for p in s.scalars(select(Program)) if p.status != "pending"}


def test_run_then_resume_with_real_server(server, policy, grid_problem, tmp_path):
    run_dir = tmp_path / "run"
    first = evolve("run", grid_problem, "--policy", policy, "--run-dir", run_dir, "--max-llm-calls", 2)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "llm call budget reached" in first.stdout
    with db_session(run_dir) as s:
        calls = s.scalars(select(LLMCall)).all()
        assert len(calls) == 2 and all(c.error is None and c.completion_tokens > 0 for c in calls)
        assert s.scalar(select(func.count(Completion.id))) == 8  # n=4 per call
        children = s.scalars(select(Program).where(Program.origin == "mutation")).all()
        assert len(children) == 8  # m=1: one child per completion, failures included
        assert all(c.status != "pending" for c in children)
        for c in children:
            assert c.status in ("ok", "invalid", "error", "timeout", "mutation_failed")
            if c.status == "mutation_failed":
                assert c.error and c.code is None
        # How many of the 8 diffs apply is the model's luck, not the run's contract (on one CI
        # machine none did): what applied is checked, whatever the count. Evaluated children
        # through the real parts every time: the tuned ones of the tuning test below.
        evaluated = [c for c in children if c.status in ("ok", "invalid", "error", "timeout")]
        for c in evaluated:
            assert c.code and c.code != s.get(Program, c.parent_id).code
            if c.status == "ok":
                assert set(c.fitness) == {f"n{n}" for n in range(26, 33)} and c.objective > 0
        before = snapshot(s)
        evals_before = s.scalar(select(func.count(Evaluation.id)))

    second = evolve("resume", run_dir, "--max-llm-calls", 3)
    assert second.returncode == 0, second.stdout + second.stderr
    with db_session(run_dir) as s:
        assert s.scalar(select(func.count(LLMCall.id))) == 3
        after = snapshot(s)
        assert {k: after[k] for k in before} == before  # nothing stored changed
        # nothing evaluated twice: each program has at most one evaluation row
        per_program = s.execute(select(Evaluation.program_id, func.count()).group_by(Evaluation.program_id)).all()
        assert all(n == 1 for _, n in per_program)
        assert s.scalar(select(func.count(Evaluation.id))) >= evals_before
        sessions = s.scalars(select(RunSession)).all()
        assert [x.stop_reason for x in sessions] == ["llm call budget reached"] * 2


def test_ctrl_c_stops_cleanly_and_resume_finishes(server, policy, grid_problem, tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "evolve.cli", "run", str(grid_problem), "--policy", str(policy),
                             "--run-dir", str(run_dir), "--max-llm-calls", "3"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 300
    while time.time() < deadline and not calls_stored(run_dir):  # interrupt once the first group is stored
        time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 130, out
    assert "stopped: interrupted" in out
    with db_session(run_dir) as s:
        assert s.scalars(select(RunSession)).one().stop_reason == "interrupted"
        stored = snapshot(s)
        assert s.scalar(select(func.count(LLMCall.id))) >= 1

    done = evolve("resume", run_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    with db_session(run_dir) as s:
        counted = select(func.count(LLMCall.id)).where(LLMCall.error.is_distinct_from("cancelled"))
        assert s.scalar(counted) == 3  # a call cut by Ctrl-C is stored as cancelled and redone
        assert not s.scalars(select(Program).where(Program.status == "pending")).all()
        after = snapshot(s)
        assert {k: after[k] for k in stored} == stored
        per_program = s.execute(select(Evaluation.program_id, func.count()).group_by(Evaluation.program_id)).all()
        assert all(n == 1 for _, n in per_program)

    status = evolve("status", run_dir)
    assert status.returncode == 0 and "valid mutation rate" in status.stdout
    best = evolve("best", run_dir, "--code")
    assert best.returncode == 0 and "EVOLVE-BLOCK-START" in best.stdout


def test_a_run_with_tuning_stores_both_operators_and_status_shows_their_rates(server, policy, tmp_path):
    """The embedded model and in-the-loop tuning together: LLM children and tuned children are
    stored with their operator and lineage, and `evolve status` reports what the database holds.
    The model is shown every program's numbers rounded (literal_digits), the tuned ones too."""
    import yaml
    policy.write_text(policy.read_text() + "literal_digits: 2\n")
    # The shipped problem with one long number in its seed: whether or not a tuning beats the
    # seed in its few trials, a prompt has a literal to round.
    data = yaml.safe_load(PROBLEM.read_text())
    seed = (PROBLEM.parent / data.pop("program")).read_text()
    assert "    margin = 0.5  #" in seed
    data["program_code"] = seed.replace("    margin = 0.5  #", "    margin = 0.5123457  #")
    data["scorer"] = str(PROBLEM.parent / data["scorer"])
    del data["policy"]
    problem = tmp_path / "problem.yaml"
    problem.write_text(yaml.safe_dump(data, sort_keys=False))
    run_dir = tmp_path / "run"
    run = evolve("run", problem, "--policy", policy, "--run-dir", run_dir, "--max-llm-calls", 2,
                 "--set", "search.tuning.trials=24", "--set", "search.tuning.share=1.0")
    assert run.returncode == 0, run.stdout + run.stderr
    with db_session(run_dir) as s:
        llm = s.scalars(select(Program).where(Program.origin == "mutation")).all()
        tuned = s.scalars(select(Program).where(Program.origin == "tuned")).all()
        first = s.scalars(select(Tuning).order_by(Tuning.id)).first()
        assert len(llm) == 8 and first is not None  # the seed is tuned at the start, whatever the LLM wrote
        assert s.get(Program, first.parent_id).origin == "seed"
        hidden = 0  # no prompt shows a literal of an earlier program (the tuned seed's too) in full
        for call in s.scalars(select(LLMCall)):
            for shown in s.scalars(select(Program).where(Program.created_at < call.started_at)):
                for lit in float_literals(shown.code):
                    text = shown.code[lit.start:lit.end]
                    if text != repr(float(f"{lit.value:.2g}")):
                        assert text not in call.prompt, text
                        hidden += 1
        assert hidden
        for child in tuned:
            parent = s.get(Program, child.parent_id)
            assert parent.status == "ok" and child.generation == parent.generation + 1
            assert child.code != parent.code and child.outcome in ("better", "same", "worse")
        counts = {}
        for p in llm + tuned:
            if p.outcome is not None:
                counts[p.origin, p.outcome] = counts.get((p.origin, p.outcome), 0) + 1
    status = evolve("status", run_dir, env={**os.environ, "COLUMNS": "300"})  # one line per row
    assert status.returncode == 0, status.stderr
    line = next(x for x in status.stdout.splitlines() if "improving children" in x)
    tuned_done = sum(v for (o, _), v in counts.items() if o == "tuned")
    assert f"tuned {counts.get(('tuned', 'better'), 0)}/{tuned_done} " in line
    llm_done = sum(v for (o, _), v in counts.items() if o == "mutation")
    if llm_done:
        assert f"LLM {counts.get(('mutation', 'better'), 0)}/{llm_done} " in line


def test_a_broken_answer_is_re_asked_of_the_real_model_and_its_repair_stored_with_its_lineage(
        server, grid_problem, tmp_path):
    """search.repair through the real parts: the first call's answers are replaced by one known
    near-miss (a new offset, never defined: NameError in the sandbox); the engine re-asks the real
    model with the judge's reason, and stores the repairs as children of the broken answer, each
    evaluated, with its attempt in the lineage."""
    from scripted_run import diff

    from evolve.config import load_policy, load_problem
    from evolve.judge.evaluator import Evaluator
    from evolve.mutation.prompt import REPAIR
    from evolve.run import open_database
    from evolve.search.controller import Controller
    from evolve.serving.client import PolicyClient

    stack = "    centers = np.stack([(index % side + 0.5) * cell, (index // side + 0.5) * cell], axis=1)"
    broken = diff("Shift every centre by an offset.", stack, f"{stack}\n    centers = centers * 0.98 + offset")

    class FirstCallBroken(PolicyClient):  # the real server answers every call; the first call's texts are replaced
        first = True

        async def sample(self, messages, n, seed=None, max_tokens=None, model=None, on_answer=None):
            sample = await super().sample(messages, n, seed, max_tokens)
            if self.first and REPAIR not in messages[-1]["content"]:
                self.first, sample.texts = False, [broken] * n
            return sample

    policy_path = tmp_path / "policy.yaml"
    policy_path.write_text(f"name: test-qwen\nmodel: {MODEL}\nserver: {{embedded: true, port: {PORT}}}\n"
                           "sampling: {temperature: 0.7, max_tokens: 320, group_size: 2, max_prompt_tokens: 4000}\n")
    problem = load_problem(grid_problem).model_copy(deep=True)
    problem.search.repair = problem.search.repair.model_copy(update={"attempts": 1, "n": 2})  # (off in write_problem)
    problem.budget.max_llm_calls = 3
    policy = load_policy(policy_path)
    spec = {"policy": str(policy_path), "seed": 0, "db_url": f"sqlite:///{tmp_path / 'evolve.db'}",
            "run_name": "repair"}
    db = open_database(spec, problem, policy, tmp_path)
    evaluator = Evaluator(problem)
    client = FirstCallBroken(policy, server.base_url, MODEL)
    try:
        import asyncio
        asyncio.run(Controller(problem, policy, db, evaluator, client, problem.budget, 0, lambda e: None).run())
    finally:
        evaluator.sandbox.close()
    first = db.session.scalars(select(Program).where(Program.origin == "mutation").order_by(Program.id)).first()
    assert first is not None and first.status == "error" and "offset" in first.error
    reask = db.session.scalars(select(LLMCall).where(LLMCall.parent_id == first.id)).one()
    assert "NameError" in reask.prompt and reask.n == 2 and reask.error is None  # the judge's words, the real model
    repairs = db.session.scalars(select(Program).where(Program.parent_id == first.id)).all()
    assert len(repairs) == 2 and all(p.origin == "repair" and p.generation == first.generation + 1 for p in repairs)
    for p in repairs:
        assert p.status != "pending" and p.completion_id is not None
        if p.status != "mutation_failed" and p.duplicate_of is None:  # it ran: an evaluation of its own
            assert db.session.scalars(select(Evaluation).where(Evaluation.program_id == p.id)).one()
    db.close()


SMOL, SMOL_PORT = "smollm2-135m-instruct", 8142


def test_an_ensemble_answers_each_call_with_the_model_its_seed_draws(server, grid_problem, tmp_path):
    """Two real vLLM servers behind one policy: SmolLM2 (started by the run) and the module's
    Qwen server (a member policy on its port). Each call is answered by the member its seed
    draws, records that model, and `evolve status` gives each model's rates."""
    from evolve.config import ensemble_members, load_policy
    from evolve.mutation.pipeline import request_seed
    from evolve.serving.ensemble import Ensemble

    (tmp_path / "qwen.yaml").write_text(
        f"name: test-qwen\nmodel: {MODEL}\nserver: {{embedded: true, port: {PORT}, max_model_len: 8192}}\n")
    policy = tmp_path / "ensemble.yaml"
    policy.write_text(f"""
name: test-ensemble
model: {SMOL}
server: {{embedded: true, port: {SMOL_PORT}, max_model_len: 4096, extra_args: ["--enforce-eager"]}}
sampling: {{temperature: 0.7, max_tokens: 200, group_size: 2, max_prompt_tokens: 3000}}
ensemble: [{{policy: qwen.yaml, share: 0.5}}]
""")
    run_dir, calls, seed = tmp_path / "run", 6, 0
    run = evolve("run", grid_problem, "--policy", policy, "--run-dir", run_dir, "--seed", seed,
                 "--max-llm-calls", calls)
    assert run.returncode == 0, run.stdout + run.stderr
    members = [(type("Member", (), {"model": p.model})(), share) for p, share in ensemble_members(load_policy(policy))]
    drawn = [Ensemble(members, seed).pick(request_seed(seed, k)).model for k in range(calls)]
    assert set(drawn) == {SMOL, MODEL}  # this seed draws both models
    with db_session(run_dir) as s:
        rows = s.execute(select(LLMCall.model, LLMCall.n, LLMCall.error)).all()
        answered = s.execute(select(LLMCall.model, func.count(Completion.id))
                             .join(Completion, Completion.call_id == LLMCall.id).group_by(LLMCall.model)).all()
    assert sorted(m for m, _, _ in rows) == sorted(drawn) and all(e is None for _, _, e in rows)
    assert dict(answered) == {m: 2 * drawn.count(m) for m in set(drawn)}  # n = 2 each
    assert (run_dir / "vllm.log").exists()  # the run's own server (SmolLM2); Qwen's is the module's
    status = evolve("status", run_dir, env={**os.environ, "COLUMNS": "300"})
    assert status.returncode == 0, status.stderr
    assert "mutator quality per model" in status.stdout
    for model in (SMOL, MODEL):
        row = next(x for x in status.stdout.splitlines() if x.strip().startswith(model))
        assert [c.strip() for c in row.split("│")][1] == str(drawn.count(model))  # its calls
