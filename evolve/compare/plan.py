"""`evolve compare`: mutator policies head to head at the same evaluation budget (docs/design.md §8).

    evolve compare problems/circle_packing.yaml \\
        --policies policies/frozen.yaml policies/frozen_m3.yaml policies/grpo.yaml policies/vpo.yaml \\
            --seeds 4 --budget 200

Layout of the comparison directory (default runs/compare-<problem>-<time>):

    compare.json           what is compared: problem, policies, seeds, budget, held-out settings
    policies/<name>.yaml   the policies as they were when the comparison started
    arms/<name>-s<seed>/   one ordinary run directory per (policy, seed): `evolve status` etc. work
    heldout/               held-out parents and each arm's answer pools (evolve/rl/heldout.py)
    report/                report.md, the PNG plots and figures.json (evolve/compare/report.py)

Arms differ only in the policy: the same problem, run seed s for every policy's seed-s arm, and
the same number of evaluated candidates. Each arm is `evolve run` in a child process (so its memory
is freed when it ends); on a terminal the comparison's live view shows the running arm's dashboard
under a line saying which arm it is and the overall progress. An arm whose last session stopped
at the comparison's budget is done; every other arm is resumed, so re-running the command (or
`evolve compare --resume DIR`) continues an interrupted comparison where it stopped.
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from sqlalchemy import select
from sqlalchemy.exc import DatabaseError

from evolve.config import load_policy, load_problem
from evolve.rundir import DONE, RUN_FILE, InspectError, RunDir
from evolve.store.connection import readonly_engine
from evolve.store.counts import evaluations_done
from evolve.store.schema import Run
from evolve.store.schema import Session as RunSession

COMPARE_FILE = "compare.json"
DEFAULT_SEEDS = 3
# A session that stopped at a budget the comparison set; anything else (interrupted, error,
# a crash that left no stop reason) means the arm has more to do.
POLL_S = 5.0  # how often --parallel reports progress


class CompareError(Exception):
    pass


# ---- what is compared ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Arm:
    index: int
    policy: str  # the policy's name
    seed: int
    dir: Path
    trains: bool

    @property
    def name(self) -> str:
        return f"{self.policy}-s{self.seed}"


@dataclass
class Plan:
    dir: Path
    problem: str
    policies: list[dict]  # {"name", "source", "path"}: path is the snapshot under dir/policies
    seeds: list[int]
    budget: int  # evaluated candidates per arm
    max_llm_calls: int | None  # a guard per arm against a mutator that never yields a valid child
    heldout: dict  # {"parents", "samples", "k_max", "skip", "all_versions", "up_to", "from"}
    sets: list[str] = field(default_factory=list)  # --set overrides of the problem, for every arm

    def arms(self) -> list[Arm]:
        """Seed-major order: an interrupted comparison has whole seeds of every policy first."""
        arms: list[Arm] = []
        for seed in self.seeds:
            for p in self.policies:
                trains = load_policy(p["path"]).train is not None
                arms.append(Arm(len(arms), p["name"], seed, self.dir / "arms" / f"{p['name']}-s{seed}", trains))
        return arms

    def save(self) -> None:
        data = {k: getattr(self, k) for k in ("problem", "sets", "policies", "seeds", "budget", "max_llm_calls", "heldout")}
        (self.dir / COMPARE_FILE).write_text(json.dumps(data, indent=2) + "\n")

    @classmethod
    def load(cls, directory: Path) -> "Plan":
        path = Path(directory) / COMPARE_FILE
        if not path.exists():
            raise CompareError(f"{directory}: not a comparison directory (no {COMPARE_FILE})")
        return cls(dir=Path(directory), **json.loads(path.read_text()))


def new_plan(args, seeds: list[int] | None = None) -> Plan:
    """The plan the command line asks for; snapshots of the policies are written on first use."""
    problem = load_problem(args.problem, args.set)
    policies = [load_policy(p) for p in args.policies]
    names = [p.name for p in policies]
    if len(set(names)) != len(names):
        raise CompareError(f"two policies share a name ({names}): arms are named after them")
    out = args.out or Path("runs") / f"compare-{problem.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    k_max = min(args.k_max, args.heldout_samples)
    # The comparison is about the mutator and its fair budget is evaluations: tuning (which
    # spends evaluations without the LLM) is off unless asked for, and the wall time is no limit.
    fixed = ["budget.wall_time_s=null"] + ([] if args.tuning else ["search.tuning.enabled=false"])
    return Plan(dir=out, problem=str(Path(args.problem).resolve()), sets=fixed + list(args.set or []),
                policies=[{"name": p.name, "source": str(Path(path).resolve()),
                           "path": str((out / "policies" / f"{p.name}.yaml").resolve())}
                          for p, path in zip(policies, args.policies)],
                seeds=seeds or list(range(DEFAULT_SEEDS)), budget=args.budget, max_llm_calls=args.max_llm_calls,
                heldout={"parents": args.heldout_parents, "samples": args.heldout_samples, "k_max": k_max,
                         "skip": args.skip_heldout, **_versions(args.heldout_versions),
                         "from": [str(Path(d).resolve()) for d in args.heldout_from or []]})


def parse_seeds(text: str | int | None) -> list[int] | None:
    """--seeds: N (seeds 0..N-1), or the seeds themselves: `1,2` or `1-2`. A seed of its own lets a
    later seed run without the earlier ones (on another machine, or after a machine was lost);
    its held-out parents then come from its own frozen arms."""
    if text is None:
        return None
    text = str(text).strip()
    try:
        if text.isdigit():
            seeds = list(range(int(text)))
        elif "-" in text:
            first, last = (int(part) for part in text.split("-"))
            seeds = list(range(first, last + 1))
        else:
            seeds = [int(part) for part in text.split(",")]
    except ValueError:
        seeds = None
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise CompareError(f"--seeds {text}: expected a count N (seeds 0..N-1, at least 1), a range such as "
                           "1-2, or distinct seeds such as 0,2")
    return sorted(seeds)


def _versions(asked: int | None) -> dict:
    """--heldout-versions: none (None), every published version (0), or those up to vN."""
    return {"all_versions": asked is not None, "up_to": asked or None}


def start_or_resume(wanted: Plan, seeds: list[int] | None = None) -> Plan:
    """Write a new comparison, or check that an existing one is the same comparison.

    The budget may be raised (every arm then continues to it), seeds added or dropped, held-out
    settings changed (the pools are measured again). Anything else is a different comparison: a new --out.
    seeds: the seeds asked for (parse_seeds), None to keep the stored plan's.
    """
    path = wanted.dir / COMPARE_FILE
    if not path.exists():
        (wanted.dir / "policies").mkdir(parents=True, exist_ok=True)
        for p in wanted.policies:
            Path(p["path"]).write_text(Path(p["source"]).read_text())
        wanted.save()
        return wanted
    stored = Plan.load(wanted.dir)
    for key in ("problem", "sets", "max_llm_calls"):
        if getattr(stored, key) != getattr(wanted, key):
            raise CompareError(f"{wanted.dir} compares {key} {getattr(stored, key)!r}, not "
                               f"{getattr(wanted, key)!r}: use another --out, or --resume {wanted.dir}")
    if [p["name"] for p in stored.policies] != [p["name"] for p in wanted.policies]:
        raise CompareError(f"{wanted.dir} compares policies {[p['name'] for p in stored.policies]}")
    for old, new in zip(stored.policies, wanted.policies):
        if Path(new["source"]).read_text() != Path(old["path"]).read_text():
            raise CompareError(f"{new['source']} changed since {wanted.dir} started: its arms would not "
                               f"be comparable. Use another --out, or --resume {wanted.dir}")
    return amend(stored, wanted.budget, wanted.heldout, seeds)


def amend(plan: Plan, budget: int | None, heldout: dict | None = None, seeds: list[int] | None = None) -> Plan:
    """Raise the budget, change the held-out settings or the number of seeds. An arm is one seed's,
    so dropping seeds (to report the ones done) or adding them back changes no other arm."""
    if budget is not None and budget < plan.budget:
        raise CompareError(f"{plan.dir} has a budget of {plan.budget}; it can be raised, not lowered")
    plan.budget = budget or plan.budget
    plan.seeds = seeds or plan.seeds
    plan.heldout = heldout or plan.heldout
    plan.save()
    return plan


# ---- an arm's state, read from its run directory ----------------------------------------------------
@dataclass(frozen=True)
class ArmState:
    evaluations: int
    stop_reason: str | None  # of the last session; None before the first one ends
    budget: dict  # the run's budget overrides (run.json)


def arm_state(arm: Arm) -> ArmState:
    run = RunDir(arm.dir)
    if not run.exists():
        return ArmState(0, None, {})
    try:
        spec = run.stored()
    except json.JSONDecodeError:  # the arm is writing it right now
        return ArmState(0, None, {})
    try:
        engine = readonly_engine(run.database_url(spec))
    except InspectError:  # created, but its database not yet
        return ArmState(0, None, spec.get("budget", {}))
    try:
        with engine.connect() as conn:
            run_id = conn.execute(select(Run.id).where(Run.name == spec["run_name"])).scalar()
            evaluations = evaluations_done(conn, run_id) if run_id is not None else 0
            reason = conn.execute(select(RunSession.stop_reason).where(RunSession.run_id == run_id)
                                  .order_by(RunSession.id.desc()).limit(1)).scalar()
    except DatabaseError:  # the arm is creating its database: no tables yet, or a header half-written
        return ArmState(0, None, spec.get("budget", {}))
    finally:
        engine.dispose()
    return ArmState(evaluations, reason, spec.get("budget", {}))


def is_done(state: ArmState, plan: Plan) -> bool:
    """Stopped at this comparison's budget (a raised budget makes a finished arm go on)."""
    return (state.stop_reason in DONE and state.budget.get("max_evaluations") == plan.budget
            and state.budget.get("max_llm_calls") == plan.max_llm_calls)


# ---- running arms ----------------------------------------------------------------------------------
def arm_command(plan: Plan, arm: Arm, policy: Path) -> list[str]:
    """`evolve run` for the arm: creates its run directory the first time, resumes it after."""
    cmd = [sys.executable, "-m", "evolve.cli", "run", plan.problem, "--policy", str(policy),
           "--run-dir", str(arm.dir), "--seed", str(arm.seed), "--max-evaluations", str(plan.budget)]
    cmd += [f"--set={item}" for item in plan.sets]
    if plan.max_llm_calls is not None:
        cmd += ["--max-llm-calls", str(plan.max_llm_calls)]
    return cmd + ["--no-dashboard"]  # the comparison's own view shows it (evolve/views/compare.py)


def arm_policy(plan: Plan, arm: Arm, port: int | None = None) -> Path:
    """The arm's own copy of its policy; `port` moves its embedded server (arms side by side)."""
    source = next(Path(p["path"]) for p in plan.policies if p["name"] == arm.policy)
    target = arm.dir / "policy.yaml"
    text = source.read_text()
    if port is not None:
        data = yaml.safe_load(text)
        if data.get("server", {}).get("embedded", True):
            data.setdefault("server", {})["port"] = port
            text = f"# {source} with its server on port {port} (--parallel)\n" + yaml.safe_dump(data, sort_keys=False)
    arm.dir.mkdir(parents=True, exist_ok=True)
    if not target.exists() or target.read_text() != text:
        target.write_text(text)
    return target


def progress(plan: Plan, arms: list[Arm]) -> tuple[int, int]:
    """(evaluations done, evaluations planned) over every arm."""
    done = sum(min(arm_state(a).evaluations, plan.budget) for a in arms)
    return done, plan.budget * len(arms)


def run_arms(plan: Plan, arms: list[Arm], parallel: int = 1, view=None,
             port_base: int = 8150, say=print) -> str:
    """Run every unfinished arm, `parallel` at a time; 'done', 'interrupted' or 'failed: <arms>'.

    view: the comparison's live view (evolve/views/compare.py), given by the CLI on a terminal:
    it owns the terminal and the arms write their output to their run directories. Otherwise one arm at a time writes its normal
    run output here, and parallel arms write to their run directories with a progress line here.
    """
    todo = [a for a in arms if not is_done(arm_state(a), plan)]
    for a in arms:
        if a not in todo:
            say(f"arm {a.index + 1}/{len(arms)}: {a.name} is done ({arm_state(a).evaluations} evaluations)")
    if not todo:
        return "done"
    if view is None:
        return _schedule(plan, arms, todo, parallel, port_base, None, say)
    with view(plan, arms) as live:
        return _schedule(plan, arms, todo, parallel, port_base, live, live.say)


def _schedule(plan: Plan, arms: list[Arm], todo: list[Arm], parallel: int, port_base: int, view, say) -> str:
    queue, running, failed = list(todo), dict[Arm, tuple](), list[Arm]()
    previous = signal.signal(signal.SIGTERM, _forward_term(running))
    try:
        return _loop(plan, arms, queue, running, failed, parallel, port_base, view, say)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _forward_term(running: dict):
    """SIGTERM (kill, a scheduler) reaches only us, not the arms' process group as Ctrl-C
    does: pass it on to each running arm, which stops cleanly on it, then stop like Ctrl-C.
    Without this the arms ran on, orphaned, after the comparison had died."""
    def handler(signum, frame):
        for proc, _ in list(running.values()):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        raise KeyboardInterrupt
    return handler


def _loop(plan: Plan, arms: list[Arm], queue: list, running: dict, failed: list, parallel: int,
          port_base: int, view, say) -> str:
    quiet = view is not None or parallel > 1  # arms write to their run directories, not here
    slots, last = list(range(parallel)), None
    try:
        while queue or running:
            while queue and slots:
                arm, slot = queue.pop(0), slots.pop(0)
                running[arm] = (_start(plan, arms, arm, slot if parallel > 1 else None, port_base, quiet, say), slot)
                if view is not None:
                    view.started(arm)
            finished = _wait_any([proc for proc, _ in running.values()], POLL_S)
            for arm, (proc, slot) in list(running.items()):
                if proc not in finished:
                    continue
                del running[arm]
                slots.append(slot)
                if view is not None:
                    view.finished(arm)
                if proc.returncode == 130:
                    return _stop(running)
                if proc.returncode != 0 or not is_done(arm_state(arm), plan):
                    say(f"arm {arm.name} did not finish (exit status {proc.returncode}); see {arm.dir / 'evolve.log'}")
                    failed.append(arm.name)
                else:
                    say(f"arm {arm.index + 1}/{len(arms)}: {arm.name} done ({arm_state(arm).evaluations} evaluations)")
            if parallel > 1 and view is None and (line := _overall(plan, arms, running)) != last:
                say(line)
                last = line
    except KeyboardInterrupt:
        return _stop(running)
    return f"failed: {', '.join(failed)}" if failed else "done"


def _start(plan: Plan, arms: list[Arm], arm: Arm, slot: int | None, port_base: int, quiet: bool,
           say) -> subprocess.Popen:
    """Launch `evolve run` for the arm; with a slot, its embedded server moves to its own port."""
    done, total = progress(plan, arms)
    port = None if slot is None else port_base + slot
    policy = arm_policy(plan, arm, port)
    say(f"arm {arm.index + 1}/{len(arms)}: {arm.policy} seed {arm.seed} ({arm.dir}) | overall {done}/{total} "
        "evaluations" + (f" | server port {port}" if port else "")
        + (f" | output in {arm.dir / 'compare-arm.log'}" if quiet else ""))
    cmd = arm_command(plan, arm, policy)
    if not quiet:
        return subprocess.Popen(cmd)
    with open(arm.dir / "compare-arm.log", "a") as log:  # the child keeps its own copy of the fd
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _wait_any(procs: list[subprocess.Popen], timeout: float) -> list[subprocess.Popen]:
    """The processes that have exited, waiting up to `timeout` seconds for one to."""
    deadline = time.monotonic() + timeout
    while True:
        done = [p for p in procs if p.poll() is not None]
        if done or time.monotonic() >= deadline:
            return done
        time.sleep(0.1)


def _stop(running: dict) -> str:
    """Interrupted: Ctrl-C reached the arms too (one process group) and each stops cleanly on its
    own. A second signal from us would cut their shutdown short, so we only wait for them."""
    for proc, _ in running.values():
        while True:
            try:
                proc.wait()
                break
            except KeyboardInterrupt:
                continue
    return "interrupted"


def _overall(plan: Plan, arms: list[Arm], running: dict) -> str:
    done, total = progress(plan, arms)
    now = ", ".join(f"{a.name} {arm_state(a).evaluations}/{plan.budget}" for a in running)
    return f"overall {done}/{total} evaluations" + (f" | running: {now}" if now else "")


# ---- held-out measurement ----------------------------------------------------------------------------
def measure_heldout(plan: Plan, arms: list[Arm], say=print) -> None:
    """Choose the held-out parents once per budget, then measure every arm's final policy on them."""
    from evolve.rl import heldout

    problem = load_problem(plan.problem, plan.sets)
    folder = plan.dir / "heldout"
    folder.mkdir(exist_ok=True)
    parents = _parents(plan, arms, problem, folder)
    settings = heldout.Settings(plan.heldout["samples"], heldout.digest(parents))
    say(f"held-out: {len(parents)} parent(s) ({sum(p['held_out'] for p in parents)} held out), "
        f"{settings.samples} answers each, per arm")
    frozen: dict[str, Arm] = {}  # a frozen policy's first arm: the one whose pool is measured
    for arm in arms:
        info = {"name": arm.name, "seed": arm.seed, "evaluations": arm_state(arm).evaluations}
        if not arm.trains and arm.policy in frozen:
            heldout.share_pool(folder / f"{frozen[arm.policy].name}.json", folder / f"{arm.name}.json", info)
            say(f"held-out {arm.index + 1}/{len(arms)}: {arm.name} has {frozen[arm.policy].name}'s pool "
                "(the same frozen policy asked with the same request seeds answers the same)")
            continue
        if not arm.trains:
            frozen[arm.policy] = arm
        spec = RunDir(arm.dir).spec()
        published = heldout.versions(spec["db_url"], spec["run_name"])
        jobs = [(folder / f"{arm.name}@v{v['version']}.json", v) for v in _earlier(plan, published)] + \
            [(folder / f"{arm.name}.json", published[-1])]
        say(f"held-out {arm.index + 1}/{len(arms)}: {arm.name}, policy "
            + ", ".join(f"v{v['version']}" for _, v in jobs) + f" ({published[-1]['model']})")
        policy = load_policy(arm_policy(plan, arm))
        heldout.measure_arm([(out, {**info, "version": v}) for out, v in jobs], problem, policy, parents,
                            settings, say)


def _earlier(plan: Plan, published: list[dict]) -> list[dict]:
    """The versions measured besides the last, with --heldout-versions. Not v0, the base model:
    a training arm's own baseline is the frozen arm with its m."""
    if not plan.heldout.get("all_versions"):
        return []
    up_to = plan.heldout.get("up_to") or published[-1]["version"]
    return [v for v in published[:-1] if 0 < v["version"] <= up_to]


def _parents(plan: Plan, arms: list[Arm], problem, folder: Path) -> list[dict]:
    from evolve.rl import heldout

    path = folder / "parents.json"
    others = plan.heldout.get("from", [])
    wanted = {"budget": plan.budget, "count": plan.heldout["parents"], "from": others}
    urls = {a: RunDir(a.dir).database_url() for a in arms}
    trained = [urls[a] for a in arms if a.trains]
    if path.exists():
        stored = json.loads(path.read_text())
        # kept when seeds are added, unless an added training arm stored one of them (no longer held out)
        if stored["made_for"] == wanted and not heldout.stored_by(stored["parents"], trained):
            return stored["parents"]
    sources = [(a.name, urls[a]) for a in arms if not a.trains] + [_other_run(d, problem) for d in others]
    parents = heldout.choose_parents(problem, sources, trained, plan.heldout["parents"])
    if len(parents) < plan.heldout["parents"]:
        raise CompareError(
            f"held-out: {len(parents)} parent(s) where {plan.heldout['parents']} are needed: the elites of "
            f"{'the frozen arms' if any(not a.trains for a in arms) else 'no frozen arm (none here)'}"
            f"{' and of --heldout-from' if others else ''} that no training arm stored. Add a frozen arm, raise "
            "--budget, or pass --heldout-from RUN_DIR (a finished run of the same problem), then "
            f"`evolve compare --resume {plan.dir}`")
    path.write_text(json.dumps({"made_for": wanted, "parents": parents}, indent=1) + "\n")
    return parents


def _other_run(run_dir: str, problem) -> tuple[str, str]:
    """(name, db url) of a --heldout-from run, checked to be a run of the same problem."""
    from evolve.rl import heldout

    run = RunDir(Path(run_dir))
    if not run.exists():
        raise CompareError(f"--heldout-from {run_dir}: not a run directory (no {RUN_FILE})")
    url = run.database_url()
    if (name := heldout.run_problem_name(url)) != problem.name:
        raise CompareError(f"--heldout-from {run_dir}: a run of problem {name!r}, not {problem.name!r}")
    return f"from:{Path(run_dir).name}", url


# ---- the command ----------------------------------------------------------------------------------
def compare(args, view=None) -> int:
    """`evolve compare`: run (or resume) every arm, measure held-out, write the report."""
    previous = signal.signal(signal.SIGTERM, _interrupt)  # cleans up (servers, arms) as Ctrl-C does
    try:
        return _compare(args, view)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _compare(args, view) -> int:
    from evolve.compare.report import write_report

    seeds = parse_seeds(getattr(args, "seeds", None))
    if args.resume:
        plan = Plan.load(args.resume)
        extra = [str(Path(d).resolve()) for d in getattr(args, "heldout_from", None) or []]
        held = {**plan.heldout, "from": sorted(set(plan.heldout.get("from", [])) | set(extra))}
        if (asked := getattr(args, "heldout_versions", None)) is not None:  # may be asked for once the arms are done
            held.update(_versions(asked))
        plan = amend(plan, args.budget, held, seeds)
    else:
        if args.problem is None or not args.policies or args.budget is None:
            raise CompareError("give PROBLEM, --policies and --budget (or --resume DIR)")
        plan = start_or_resume(new_plan(args, seeds), seeds)
    arms = plan.arms()
    say = _say
    say(f"comparison {plan.dir}: {len(arms)} arms ({', '.join(p['name'] for p in plan.policies)} x seeds "
        f"{plan.seeds}), {plan.budget} evaluations each")
    if not args.report_only:
        outcome = run_arms(plan, arms, args.parallel, view, args.port_base, say)
        if outcome == "done" and not plan.heldout.get("skip"):
            outcome = _heldout_phase(plan, arms, say)
        if outcome != "done":
            say(f"comparison {outcome}. Continue with `evolve compare --resume {plan.dir}`")
            return 130 if outcome == "interrupted" else 1
    report = write_report(plan, arms, plan.dir / "report")
    say(f"report: {report}")
    return 0


def _heldout_phase(plan: Plan, arms: list[Arm], say) -> str:
    from evolve.rl.hook import HookError
    from evolve.rl.publish import PublishError
    from evolve.serving.adapters import AdapterError
    from evolve.serving.models import ModelError
    from evolve.serving.server import ServerError

    try:
        measure_heldout(plan, arms, say)
    except KeyboardInterrupt:
        return "interrupted"
    except (ServerError, HookError, PublishError, AdapterError, ModelError) as exc:  # what a user can fix: one message, no traceback
        say(f"held-out measurement failed: {exc}")
        return "failed: held-out measurement"
    return "done"


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _say(message: str) -> None:
    print(f"[compare {time.strftime('%H:%M:%S')}] {message}", flush=True)


def main(args, view=None) -> int:
    """`view`: the live view's class, where the terminal can show one (the CLI decides)."""
    try:
        return compare(args, view)
    except CompareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

