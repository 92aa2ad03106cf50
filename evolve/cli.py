"""`evolve` command line: run, resume, status, best, sandbox."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from .config import ConfigError, load_policy, load_problem

PROJECT = Path(__file__).resolve().parent.parent
DEFAULT_POLICY = PROJECT / "policies" / "frozen.yaml"
RUN_FILE = "run.json"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args) or 0
    except (ConfigError, RunDirError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


class RunDirError(Exception):
    pass


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="evolve", description=__doc__)
    sub = p.add_subparsers(required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="start a run (or continue one whose run directory exists)")
    run.add_argument("problem", type=Path, help="problem YAML, e.g. problems/circle_packing.yaml")
    run.add_argument("--policy", type=Path, default=DEFAULT_POLICY, help="policy YAML (default: %(default)s)")
    run.add_argument("--run-dir", type=Path, help="default: runs/<problem>-<time>")
    run.add_argument("--db-url", help="any SQLAlchemy URL (default: SQLite in the run directory)")
    run.add_argument("--seed", type=int, help="overrides the problem's seed")
    _budget_args(run)
    run.set_defaults(func=cmd_run)

    resume = sub.add_parser("resume", help="continue a stopped run where it left off")
    resume.add_argument("run_dir", type=Path)
    _budget_args(resume)
    resume.set_defaults(func=cmd_resume)

    status = sub.add_parser("status", help="summary of a run")
    status.add_argument("run_dir", type=Path)
    status.set_defaults(func=cmd_status)

    best = sub.add_parser("best", help="the best program of a run")
    best.add_argument("run_dir", type=Path)
    best.add_argument("--code", action="store_true", help="print its code")
    best.set_defaults(func=cmd_best)

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


def _budget_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-evaluations", type=int, help="evaluated candidates (overrides the YAML)")
    p.add_argument("--max-llm-calls", type=int)
    p.add_argument("--wall-time", type=float, help="seconds, summed over every session of the run")


# ---- run / resume ----------------------------------------------------------------------------
def cmd_run(args) -> int:
    if args.run_dir and (args.run_dir / RUN_FILE).exists():
        print(f"{args.run_dir} exists: resuming it")
        return cmd_resume(args)
    problem = load_problem(args.problem)
    load_policy(args.policy)  # fail before creating anything
    run_dir = args.run_dir or Path("runs") / f"{problem.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = {"problem": str(args.problem.resolve()), "policy": str(args.policy.resolve()),
            "seed": problem.seed if args.seed is None else args.seed,
            "db_url": args.db_url or f"sqlite:///{(run_dir / 'evolve.db').resolve()}",
            "budget": {}}
    _write_spec(run_dir, spec)
    return _launch(run_dir, args)


def cmd_resume(args) -> int:
    return _launch(args.run_dir, args)


def _write_spec(run_dir: Path, spec: dict) -> None:
    (run_dir / RUN_FILE).write_text(json.dumps(spec, indent=2) + "\n")


def read_spec(run_dir: Path) -> dict:
    path = run_dir / RUN_FILE
    if not path.exists():
        raise RunDirError(f"{run_dir}: not a run directory (no {RUN_FILE})")
    return json.loads(path.read_text())


def _launch(run_dir: Path, args) -> int:
    """Open everything a run needs, run the controller, and always clean up."""
    from .runner import run_search  # heavy imports only for commands that need them

    spec = read_spec(run_dir)
    for key, value in (("max_evaluations", args.max_evaluations),
                       ("max_llm_calls", args.max_llm_calls), ("wall_time_s", args.wall_time)):
        if value is not None:
            spec["budget"][key] = value  # remembered: a later resume keeps the raised budget
    _write_spec(run_dir, spec)
    reason = run_search(run_dir, spec)
    print(f"stopped: {reason}. Inspect with `evolve status {run_dir}`; continue with `evolve resume {run_dir}`")
    return 130 if reason == "interrupted" else 0


# ---- inspection ------------------------------------------------------------------------------
def cmd_status(args) -> int:
    from .report import print_status
    print_status(args.run_dir, read_spec(args.run_dir))


def cmd_best(args) -> int:
    from .report import print_best
    return print_best(args.run_dir, read_spec(args.run_dir), args.code)


# ---- sandbox ---------------------------------------------------------------------------------
def cmd_sandbox_build(args) -> int:
    from .docker_sandbox import build
    return build(dockerfile=args.dockerfile, mirror=args.mirror, force=args.force)


def cmd_sandbox_check(args) -> int:
    from .docker_sandbox import check
    return check()


if __name__ == "__main__":
    sys.exit(main())
