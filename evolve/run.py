"""Wires one run together: config, database, policy server, sandbox, controller."""
from __future__ import annotations

import asyncio
import signal
from contextlib import ExitStack
from functools import partial
from pathlib import Path
from typing import Callable

from evolve.config import Policy, Problem, ensemble_members, load_policy, problem_snapshot, run_problem
from evolve.events import Event, EventLog, print_sink
from evolve.faults import DATABASE_AWAY, wait_for_database
from evolve.judge.evaluator import Evaluator
from evolve.rl.hook import RLHook, serve_current
from evolve.search.controller import Controller
from evolve.serving.adapters import serve_mode
from evolve.serving.client import PolicyClient, Sampler
from evolve.serving.endpoints import EndpointPool
from evolve.serving.ensemble import Ensemble
from evolve.serving.link import PolicyLink
from evolve.serving.server import start_policy_server
from evolve.store.database import ProgramDatabase


def open_database(spec: dict, problem: Problem, policy: Policy, run_dir: Path) -> ProgramDatabase:
    return ProgramDatabase.open(
        spec["db_url"], run_name=spec["run_name"],
        problem_yaml=problem_snapshot(problem), policy_yaml=Path(spec["policy"]).read_text(),
        seed=spec["seed"], axes=problem.descriptors, search=problem.search, problem_name=problem.name)


def run_search(run_dir: Path, spec: dict, screen=None, server: tuple | None = None) -> str:
    """One run to its budget (or an interrupt, or a fault); `server` = start_policy_server's
    answer for a running policy server to share (`evolve suite`), instead of starting one;
    `screen(run_dir, spec)`: a live view that takes the events (the CLI's dashboard on a terminal).

    A database server that goes away stops the session; once it answers again the run resumes
    here, as `evolve resume` would (the policy server keeps running)."""
    problem = run_problem(spec)
    policy = load_policy(spec["policy"])
    budget = problem.budget.model_copy(update=spec.get("budget", {}))
    with ExitStack() as stack:
        # on a terminal the live screen shows the events instead of log lines
        sink = print_sink if screen is None else stack.enter_context(screen(run_dir, spec))
        report = stack.enter_context(EventLog(run_dir, sink))
        db = open_database(spec, problem, policy, run_dir)
        stack.callback(lambda: db.close())  # whichever database the last session opened
        report(Event("run", f"run {run_dir} | problem {problem.name} | policy {policy.name} "
                     f"({policy.model}) | seed {spec['seed']} | budget {budget.max_evaluations} "
                     "evaluations", {"run_dir": str(run_dir), "problem": problem.name,
                                     "policy": policy.name, "seed": spec["seed"],
                                     "budget": budget.max_evaluations}))
        endpoints = []
        if problem.search.llm:  # a tuning-only search needs no policy server
            endpoints = [server or start_policy_server(policy, run_dir, spec["seed"], stack)]
            endpoints += [start_policy_server(member, run_dir, spec["seed"], stack, f"vllm-{member.name}.log")
                          for member, _ in ensemble_members(policy)[1:]]
        while True:
            reason = _session(run_dir, problem, policy, budget, spec["seed"], db, report, endpoints,
                              shared=server is not None)
            if not reason.startswith(DATABASE_AWAY):
                return reason
            db.close()
            if not wait_for_database(spec["db_url"], report):
                return reason
            # the next session's controller says where it goes on from ("resume")
            db = open_database(spec, problem, policy, run_dir)


def _session(run_dir: Path, problem: Problem, policy: Policy, budget, seed: int, db: ProgramDatabase,
             report, endpoints: list[tuple], shared: bool) -> str:
    """One session of the run on an open database: the policy client (one per model of an
    ensemble), the RL hook, the sandbox and the controller, to a stop reason."""
    with ExitStack() as stack:
        client: Sampler | None = None
        hook: RLHook | None = None
        if endpoints:
            client, hook = _policy_client(policy, problem, db, run_dir, endpoints, report, seed, shared)
        evaluator = Evaluator(problem, report=report)
        stack.callback(evaluator.sandbox.close)
        warning = getattr(evaluator.sandbox, "warning", "")  # the process backend: not a jail
        report(Event("sandbox", f"sandbox: {evaluator.sandbox.backend}" + (f" ({warning})" if warning else ""),
                     {"backend": evaluator.sandbox.backend, "warning": warning}))
        controller = Controller(problem, policy, db, evaluator, client, budget, seed, report, hook)
        return asyncio.run(_run(controller, client))


def _policy_client(policy: Policy, problem: Problem, db: ProgramDatabase, run_dir: Path, endpoints: list[tuple],
                   report, seed: int, shared: bool) -> tuple[Sampler, RLHook | None]:
    """The policy's patient client (an ensemble: one per model) and the RL hook if it trains.

    Wired at construction: with several endpoints, one that comes back is served the current
    version (`rejoin`) and one that cannot load a version is taken out (`unreachable`); after a
    restart of the embedded server the hook serves the current version again (`on_restart`)."""
    members = ensemble_members(policy)
    if len(members) > 1:  # an ensemble never trains (config.Policy)
        links: list[tuple[Sampler, float]] = [
            (_link(member.model_copy(update={"sampling": policy.sampling}), endpoint, report), share)
            for (member, share), endpoint in zip(members, endpoints)]
        return Ensemble(links, seed), None
    base_url, _, vllm = endpoints[0]
    server = None if shared else vllm  # a server shared with other runs is never restarted on merged weights
    rejoin = None if policy.train is None else partial(serve_current, db, serve_mode(policy.train.serve, server))
    raw = _client(policy, endpoints[0], report, rejoin)
    hook = make_hook(policy, problem, db, run_dir, base_url, report, server, replicas=_urls(policy, base_url)[1:],
                     unreachable=raw.take_out if isinstance(raw, EndpointPool) else None)
    return PolicyLink(raw, report, vllm, on_restart=hook.resume if hook is not None else None), hook


def _urls(policy: Policy, base_url: str) -> list[str]:
    return [base_url] if policy.server.embedded else policy.server.endpoints()


def _client(policy: Policy, endpoint: tuple, report, rejoin=None) -> Sampler:
    """One model's client: one endpoint, or a pool of them."""
    base_url, model, server = endpoint
    urls = _urls(policy, base_url)
    if len(urls) == 1:  # an embedded server may be paused between turns: its clock times requests
        return PolicyClient(policy, base_url, model, clock=server.active_time if server is not None else None)
    return EndpointPool({u: PolicyClient(policy, u, model) for u in urls}, report, rejoin)


def _link(policy: Policy, endpoint: tuple, report) -> PolicyLink:
    """The patient client of one model (an ensemble's member: it never trains)."""
    return PolicyLink(_client(policy, endpoint, report), report, endpoint[2])


def make_hook(policy: Policy, problem: Problem, db: ProgramDatabase, run_dir: Path, base_url: str,
              report, server=None, replicas: list[str] | None = None,
              unreachable: Callable[[str, str], None] | None = None) -> RLHook | None:
    """The RL hook when the policy trains; None for a frozen mutator."""
    if policy.train is None:
        return None
    from evolve.serving.models import model_path

    def emit(kind: str, message: str, **fields) -> None:
        report(Event(kind, message, fields))

    server_url = base_url.removesuffix("/").removesuffix("/v1")
    return RLHook(policy, problem, db, run_dir, model_path(policy.model), server_url, emit, db.run_seed(),
                  server=server, replicas=[u.removesuffix("/").removesuffix("/v1") for u in replicas or []],
                  unreachable=unreachable)


async def _run(controller: Controller, client: Sampler | None) -> str:
    # SIGTERM stops a run the way Ctrl-C does: the controller is cancelled, in-flight work is
    # abandoned (children stay pending for the resume), and the ExitStack stops the server
    # and the sandbox containers.
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None  # called from a coroutine
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await controller.run()
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        terminate_as_interrupt()
        if client is not None:
            await client.close()


def terminate_as_interrupt() -> None:
    """Outside the event loop (e.g. while the server starts), SIGTERM raises KeyboardInterrupt,
    so the same cleanup runs as for Ctrl-C."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, interrupt)
