"""Wires one run together: config, database, policy server, sandbox, controller."""
from __future__ import annotations

import asyncio
from contextlib import ExitStack
from pathlib import Path


from .config import Policy, Problem, load_policy, load_problem
from .controller import Controller
from .database import ProgramDatabase
from .evaluator import Evaluator
from .events import Event, EventLog, print_sink
from .policy import PolicyClient


def open_database(spec: dict, problem: Problem, policy: Policy, run_dir: Path) -> ProgramDatabase:
    return ProgramDatabase.open(
        spec["db_url"], run_name=run_dir.resolve().name,
        problem_yaml=Path(spec["problem"]).read_text(), policy_yaml=Path(spec["policy"]).read_text(),
        seed=spec["seed"], axes=problem.descriptors, search=problem.search, problem_name=problem.name)


def start_policy_server(policy: Policy, run_dir: Path, seed: int, stack: ExitStack) -> tuple[str, str]:
    """(base_url, served model name): the embedded vLLM, started here, or the YAML's endpoint."""
    if not policy.server.embedded:
        return policy.server.base_url, policy.model
    from .models import model_path
    from .server import VLLMServer

    server = VLLMServer(model_path(policy.model), served_name=policy.model, server=policy.server,
                        log_path=run_dir / "vllm.log", seed=seed)
    stack.enter_context(server)
    return server.base_url, policy.model


def run_search(run_dir: Path, spec: dict) -> str:
    problem = load_problem(spec["problem"])
    policy = load_policy(spec["policy"])
    budget = problem.budget.model_copy(update=spec.get("budget", {}))
    with ExitStack() as stack:
        report = stack.enter_context(EventLog(run_dir, print_sink))
        db = open_database(spec, problem, policy, run_dir)
        stack.callback(db.close)
        report(Event("run", f"run {run_dir} | problem {problem.name} | policy {policy.name} "
                     f"({policy.model}) | seed {spec['seed']} | budget {budget.max_evaluations} "
                     "evaluations", {"run_dir": str(run_dir), "problem": problem.name,
                                     "policy": policy.name, "seed": spec["seed"],
                                     "budget": budget.max_evaluations}))
        base_url, model = start_policy_server(policy, run_dir, spec["seed"], stack)
        client = PolicyClient(policy, base_url, model)
        evaluator = Evaluator(problem)
        stack.callback(evaluator.sandbox.close)
        report(Event("sandbox", f"sandbox: {evaluator.sandbox.backend}",
                     {"backend": evaluator.sandbox.backend}))
        controller = Controller(problem, policy, db, evaluator, client, budget, spec["seed"], report)
        return asyncio.run(_run(controller, client))


async def _run(controller: Controller, client: PolicyClient) -> str:
    try:
        return await controller.run()
    finally:
        await client.close()
