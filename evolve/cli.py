"""`evolve` command line: run, resume, status, best, show, dashboard, export, train, check, compare,
suite, sandbox."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from evolve.config import ConfigError, load_policy, load_problem, run_problem
from evolve.rundir import FINISHED, RunDir, RunDirError, Stop

# policies/ at the top of the repository, shipped as package data through this link
DEFAULT_POLICY = Path(__file__).resolve().parent / "policies" / "frozen.yaml"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from evolve.faults import FAULT_EXIT, SandboxFault, fault_of
    from evolve.store.database import RunInUse, SchemaError
    try:
        return args.func(args) or 0
    except (ConfigError, RunDirError, SchemaError, RunInUse) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a part that failed before or after a run: one line, not a traceback
        fault = f"sandbox unavailable: {exc}" if _sandbox_down(exc) or isinstance(exc, SandboxFault) \
            else fault_of(exc)
        if fault is None:
            raise
        print(f"error: {fault}", file=sys.stderr)
        return FAULT_EXIT


def _sandbox_down(exc: Exception) -> bool:
    from evolve.sandbox.result import SandboxUnavailable
    return isinstance(exc, SandboxUnavailable)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="evolve", description=__doc__)
    sub = p.add_subparsers(required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="start a run (or continue one whose run directory exists)")
    run.add_argument("problem", type=Path, help="problem YAML, e.g. problems/circle_packing.yaml")
    run.add_argument("--policy", type=Path, help="policy YAML (default: the problem's `policy`, else "
                     f"{DEFAULT_POLICY.relative_to(DEFAULT_POLICY.parents[1])})")
    run.add_argument("--run-dir", type=Path, help="default: runs/<problem>-<time>")
    run.add_argument("--db-url", help="any SQLAlchemy URL (default: SQLite in the run directory)")
    run.add_argument("--seed", type=int, help="overrides the problem's seed")
    _set_arg(run)
    _budget_args(run)
    _dashboard_arg(run)
    run.set_defaults(func=cmd_run)

    resume = sub.add_parser("resume", help="continue a stopped run where it left off")
    resume.add_argument("run_dir", type=Path)
    _budget_args(resume)
    _dashboard_arg(resume)
    resume.set_defaults(func=cmd_resume)

    status = sub.add_parser("status", help="summary of a run")
    status.add_argument("run_dir", type=Path)
    status.set_defaults(func=cmd_status)

    best = sub.add_parser("best", help="the best program of a run")
    best.add_argument("run_dir", type=Path)
    best.add_argument("--code", action="store_true", help="print its code")
    best.set_defaults(func=cmd_best)

    show = sub.add_parser("show", help="one program: diff against its parent, scores, error, lineage")
    show.add_argument("run_dir", type=Path)
    show.add_argument("program_id", type=int)
    show.set_defaults(func=cmd_show)

    dash = sub.add_parser("dashboard", help="the live dashboard of a running or finished run (read-only)")
    dash.add_argument("run_dir", type=Path)
    dash.add_argument("--once", action="store_true", help="print one frame and exit")
    dash.add_argument("--refresh", type=float, default=1.0, help="seconds between frames (default: %(default)s)")
    dash.set_defaults(func=cmd_dashboard)

    export = sub.add_parser("export", help="PNG plots and a CSV/JSON of the archive")
    export.add_argument("run_dir", type=Path)
    export.add_argument("--out", type=Path, help="default: RUN_DIR/export")
    export.set_defaults(func=cmd_export)

    train = sub.add_parser("train", help="train a mutator offline on a stored run's archive")
    train.add_argument("run_dir", type=Path)
    train.add_argument("--policy", type=Path, required=True, help="a policy YAML with a train: section")
    train.add_argument("--out", type=Path, help="where the adapters go (default: RUN_DIR/offline-<policy>)")
    train.add_argument("--steps", type=int, help="at most this many training steps")
    train.set_defaults(func=cmd_train)

    check = sub.add_parser("check", help="run a problem's seed program through the sandbox and scorer")
    check.add_argument("problem", type=Path, help="problem YAML")
    _set_arg(check)
    check.add_argument("--backend", choices=["docker", "process"], help="default: the problem's sandbox.backend")
    check.set_defaults(func=cmd_check)

    _compare_parser(sub)

    suite = sub.add_parser("suite", help="a fixed budget on every instance of a suite; how many are solved")
    suite.add_argument("suite", type=Path, help="suite YAML, e.g. problems/humaneval_hard.yaml")
    suite.add_argument("--policy", type=Path, default=DEFAULT_POLICY, help="policy YAML (default: %(default)s)")
    suite.add_argument("--out", type=Path, help="suite directory (default: runs/suite-<name>-<time>); "
                       "an existing one is resumed")
    suite.add_argument("--max-evaluations", type=int, help="per instance (overrides the suite YAML)")
    suite.set_defaults(func=cmd_suite)

    sandbox = sub.add_parser("sandbox", help="the Docker sandbox: build its image, check it")
    actions = sandbox.add_subparsers(required=True, metavar="ACTION")
    build = actions.add_parser("build", help="build the sandbox image if the recipe changed "
                               "(offline: debootstrap + docker import, as root)")
    build.add_argument("--dockerfile", action="store_true",
                       help="docker build the Dockerfile instead (needs a container registry)")
    build.add_argument("--mirror", default="http://deb.debian.org/debian",
                       help="Debian mirror for the offline build (default: %(default)s)")
    build.add_argument("--force", action="store_true", help="rebuild even if the image exists")
    build.set_defaults(func=cmd_sandbox_build)
    check = actions.add_parser("check", help="report the engine, the image and a test evaluation")
    check.set_defaults(func=cmd_sandbox_check)
    return p


def _set_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a field of the problem YAML, e.g. --set task=HumanEval/0 or "
                        "--set sandbox.timeout_s=10 (repeatable; a resume keeps them)")


def _budget_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-evaluations", type=int, help="evaluated candidates (overrides the YAML)")
    p.add_argument("--max-llm-calls", type=int)
    p.add_argument("--wall-time", type=float, help="seconds, summed over every session of the run")


def _dashboard_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-dashboard", action="store_true",
                   help="one log line per event even on a terminal (the default off a terminal)")


# ---- run / resume ----------------------------------------------------------------------------
def cmd_run(args) -> int:
    if args.run_dir and RunDir(args.run_dir).exists():
        print(f"{args.run_dir} exists: resuming it")
        return cmd_resume(args)
    problem = load_problem(args.problem, args.set)
    policy = args.policy or (problem.resolve(problem.policy) if problem.policy else DEFAULT_POLICY)
    check_policy(policy)  # fail before creating anything
    check_seed(problem)
    run_dir = args.run_dir or Path("runs") / f"{problem.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    RunDir.create(run_dir, args.problem, args.set or [], policy,
                  problem.seed if args.seed is None else args.seed, args.db_url)
    return _launch(run_dir, args)


def check_policy(path: Path) -> None:
    """The policy file validates and, when the engine serves it, names a model that exists.

    A shipped model is not built here: the run's server builds it when it starts, after the
    seed and the run directory have been checked.
    """
    from evolve.serving.models import policy_model_path

    policy = load_policy(path)
    if policy.server.embedded:
        policy_model_path(policy, build=False)


def check_seed(problem) -> None:
    """A seed that fails its own scorer is a bad problem file: say so before making a run."""
    from evolve.judge.check import SeedError, evaluate_seed, seed_failure

    result, _ = evaluate_seed(problem)
    if result.status != "ok":
        raise SeedError(seed_failure(problem, result))


def cmd_resume(args) -> int:
    return _launch(args.run_dir, args)


def _launch(run_dir: Path, args) -> int:
    """Open everything a run needs, run the controller, and always clean up."""
    # heavy imports only for commands that need them
    from evolve.store.database import refuse_newer_schema

    run = RunDir(run_dir)
    stored = run.spec()  # a bad policy or a newer database changes nothing, not even run.json
    check_policy(stored["policy"])
    refuse_newer_schema(stored["db_url"])
    with run.lock():
        reason = _run_locked(run_dir, args)
    print(f"stopped: {reason}. Inspect with `evolve status {run_dir}`; continue with `evolve resume {run_dir}`")
    from evolve.faults import FAULT_EXIT
    if reason == Stop.INTERRUPTED:
        return 130
    return 0 if reason in FINISHED else FAULT_EXIT


def _run_locked(run_dir: Path, args) -> str:
    from evolve.run import run_search, terminate_as_interrupt
    from evolve.views.dashboard import LiveDashboard, wants_dashboard

    spec = RunDir(run_dir).update_budget({"max_evaluations": args.max_evaluations,
                                          "max_llm_calls": args.max_llm_calls, "wall_time_s": args.wall_time})
    terminate_as_interrupt()
    try:
        return run_search(run_dir, spec, LiveDashboard if wants_dashboard(args.no_dashboard) else None)
    except KeyboardInterrupt:  # before the controller took over, e.g. while the policy server starts
        return Stop.INTERRUPTED


def cmd_train(args) -> int:
    from evolve.events import Event, print_sink
    from evolve.rl.hook import train_offline
    from evolve.run import open_database

    spec = RunDir(args.run_dir).spec()
    problem, policy = run_problem(spec), load_policy(args.policy)
    if policy.train is None:
        raise ConfigError(f"{args.policy}: field 'train': required by `evolve train` (this policy is frozen)")
    out = args.out or args.run_dir / f"offline-{policy.name}"
    out.mkdir(parents=True, exist_ok=True)
    db = open_database(spec, problem, load_policy(spec["policy"]), args.run_dir)
    try:
        steps = train_offline(db, problem, policy, out, args.steps,
                              lambda kind, message, **f: print_sink(Event(kind, message, f)))
    finally:
        db.close()
    print(f"{len(steps)} training step(s); adapters in {out}")
    return 0


def cmd_check(args) -> int:
    from evolve.judge.check import check
    return check(load_problem(args.problem, args.set), args.backend)


# ---- inspection (read-only) --------------------------------------------------------------------
def _inspection(command):
    """An inspection that cannot be done is one line on stderr and exit status 1."""
    def run(args) -> int:
        from evolve.rundir import InspectError
        try:
            return command(args)
        except InspectError as exc:
            print(exc, file=sys.stderr)
            return 1
    return run


@_inspection
def cmd_status(args) -> int:
    from evolve.views.report import print_status
    return print_status(args.run_dir, RunDir(args.run_dir).spec())


@_inspection
def cmd_best(args) -> int:
    from evolve.views.report import print_best
    return print_best(args.run_dir, RunDir(args.run_dir).spec(), args.code)


@_inspection
def cmd_show(args) -> int:
    from evolve.views.report import print_show
    return print_show(args.run_dir, RunDir(args.run_dir).spec(), args.program_id)


@_inspection
def cmd_dashboard(args) -> int:
    from evolve.views.dashboard import attach
    return attach(args.run_dir, RunDir(args.run_dir).spec(), once=args.once, refresh=args.refresh)


@_inspection
def cmd_export(args) -> int:
    from evolve.views.export import export
    return export(args.run_dir, RunDir(args.run_dir).spec(), args.out or args.run_dir / "export")


# ---- compare ---------------------------------------------------------------------------------
def _compare_parser(sub) -> None:
    c = sub.add_parser("compare", help="policies head to head: runs, held-out best@k/pass@k, report")
    c.add_argument("problem", type=Path, nargs="?", help="problem YAML (not with --resume)")
    c.add_argument("--policies", type=Path, nargs="+", help="policy YAMLs, e.g. policies/frozen.yaml policies/grpo.yaml")
    _set_arg(c)
    c.add_argument("--seeds", metavar="N|A-B|A,B", help="seeds 0..N-1 for every policy (default: 3), or the "
                   "seeds themselves (2-2: seed 2 alone); may be changed on --resume: dropped seeds' arms stay "
                   "on disk, out of the report, and run again if added back")
    c.add_argument("--budget", type=int, help="evaluated candidates per arm (may be raised on --resume)")
    c.add_argument("--out", type=Path, help="comparison directory (default: runs/compare-<problem>-<time>); "
                   "an existing one with the same settings is resumed")
    c.add_argument("--resume", type=Path, metavar="DIR", help="continue the comparison in DIR")
    c.add_argument("--max-llm-calls", type=int, help="also stop an arm after this many LLM calls (a guard "
                   "against a mutator that never yields a valid child)")
    c.add_argument("--parallel", type=int, default=1, help="arms run at once (default: %(default)s)")
    c.add_argument("--port-base", type=int, default=8150,
                   help="with --parallel, embedded servers use ports from here (default: %(default)s)")
    c.add_argument("--heldout-parents", type=int, default=8, help="held-out parents P, never the seed "
                   "(default: %(default)s)")
    c.add_argument("--heldout-from", type=Path, action="append", metavar="RUN_DIR",
                   help="also draw held-out parents from this finished run of the same problem (repeatable)")
    c.add_argument("--heldout-samples", type=int, default=30, help="answers n per parent (default: %(default)s)")
    c.add_argument("--k-max", type=int, default=30, help="best@k, pass@k for k = 1..K (default: %(default)s)")
    c.add_argument("--skip-heldout", action="store_true", help="no held-out measurement")
    c.add_argument("--heldout-versions", type=int, nargs="?", const=0, metavar="N",
                   help="measure the policy versions a training arm published on the held-out parents, not "
                   "only its last (quality per version): every one, or with N those up to vN and the last")
    c.add_argument("--tuning", action="store_true", help="keep the problem's in-the-loop tuning on in every "
                   "arm (off by default: the comparison is about the mutator)")
    c.add_argument("--report-only", action="store_true", help="only rewrite the report from what is there")
    c.add_argument("--merge", type=Path, nargs="+", metavar="REPORT", help="one report, in --out, from the "
                   "reports of one comparison's seeds run apart (comparison directories, report folders or "
                   "figures.json files)")
    _dashboard_arg(c)
    c.set_defaults(func=cmd_compare)


def cmd_compare(args) -> int:
    if args.merge:
        from evolve.compare.merge import main as merge_main
        return merge_main(args)
    from evolve.compare.plan import main as compare_main
    from evolve.views.compare import ComparisonView
    from evolve.views.dashboard import wants_dashboard
    return compare_main(args, ComparisonView if wants_dashboard(args.no_dashboard) else None)


def cmd_suite(args) -> int:
    from evolve.suite import main as suite_main
    return suite_main(args)


# ---- sandbox ---------------------------------------------------------------------------------
def cmd_sandbox_build(args) -> int:
    from evolve.sandbox.verbs import build
    return build(dockerfile=args.dockerfile, mirror=args.mirror, force=args.force)


def cmd_sandbox_check(args) -> int:
    from evolve.sandbox.verbs import check
    return check()


if __name__ == "__main__":
    sys.exit(main())
