"""Benchmark: does the search find, and does evolution beat its parts and plain sampling?

Runs arms x seeds of `evolve run`, each from a cold start (server start-up included) for a
fixed wall time, one after another (two cores cannot run two searches fairly), then writes a
table and a PNG of best headline against wall time:

    python tests/benchmarks/search.py problems/circle_packing.yaml --minutes 30 --seeds 0 1 2
    python tests/benchmarks/search.py problems/circle_packing.yaml --arms evolve --minutes 60
    python tests/benchmarks/search.py --report runs/bench-circle_packing   # tables again
    python tests/benchmarks/search.py problems/circle_packing.yaml --arms evolve --seeds 11 12 \
        --held-out 11 12      # seeds no default was chosen on, reported apart
    python tests/benchmarks/search.py problems/circle_packing_ring.yaml --seeds 0   # a foreign seed
    python tests/benchmarks/tuner.py problems/circle_packing_ring.yaml --arms cma --minutes 30 \
        --seeds 0 --out runs/cma-ring    # plain CMA-ES for the same wall time, then beside the search:
    python tests/benchmarks/search.py --report runs/bench-circle_packing_ring --cma runs/cma-ring

Arms (the same problem, model, prompt and seed; only the operators differ):
  evolve       the default: LLM mutations + in-the-loop tuning, the turns following the yield
  evolve_fixed the same with a fixed share of the time for tuning (tuning.adaptive off)
  evolve_knobs / evolve_noknobs   half / none of the LLM calls ask for a knob (tuning.knobs)
  evolve_norepair   no re-asks of broken answers (search.repair.attempts=0)
  evolve_noplateau  no cap on tuning's share on its plateau (search.tuning.plateau_share=1)
  evolve_archive / tuning_archive   tuning turns take the archive's pick, not each island's best
  evolve_pause the LLM's turn ends on time, its server paused with the answers in flight
               (search.tuning.pause_llm), not drained
  llm_only     tuning off
  tuning_only  no LLM: tuning of the archive's programs for the whole budget
  sampling     independent best-of-N: every call mutates the seed, no archive, no tuning

An arm's run directory is kept (OUT/ARM-sSEED): run the same command again and finished
runs are skipped, interrupted ones resumed. Figures per run: best headline at the wall time
(the best program by objective, as `evolve status` shows it), valid-answer rate,
improving-children rate per operator, identical-to-parent rate, evaluations/min, tokens/s
while generating against the server's peak for the same prompt and n (--peak), and which
operator found the improvements.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from overhead import (
    union_length,  # a sibling script: run this one as tests/benchmarks/search.py
)
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from evolve.config import load_problem
from evolve.mutation.literals import changes_structure
from evolve.rundir import RunDir
from evolve.store.database import connect
from evolve.store.schema import Completion, Evaluation, LLMCall, Program, Tuning, Turn
from evolve.store.schema import Session as RunSession

ARMS = {
    "evolve": [],
    "evolve_fixed": ["search.tuning.adaptive=false"],  # an ablation: the turns keep their shares
    "evolve_knobs": ["search.tuning.knobs=0.5"],  # half the calls ask for a new number to tune
    "evolve_noknobs": ["search.tuning.knobs=0"],
    "evolve_norepair": ["search.repair.attempts=0"],  # broken answers are not re-asked
    "evolve_noplateau": ["search.tuning.plateau_share=1.0"],  # tuning's record holds on its plateau
    "evolve_archive": ["search.tuning.background_pick=archive"],  # tuning turns take the archive's pick
    "evolve_pause": ["search.tuning.pause_llm=true"],  # the LLM's turn ends on time, its server paused
    "llm_only": ["search.tuning.enabled=false"],
    "tuning_only": ["search.llm=false", "search.tuning.enabled=true"],
    "tuning_archive": ["search.llm=false", "search.tuning.enabled=true", "search.tuning.background_pick=archive"],
    "sampling": ["search.parents=seed", "search.tuning.enabled=false"],
}
BAR_ARMS = ["evolve", "llm_only", "tuning_only", "sampling"]  # what evolution must beat (the default)


def run_arm(problem: Path, arm: str, seed: int, minutes: float, out: Path, policy: str | None,
            extra: list[str]) -> Path:
    run_dir = out / f"{arm}-s{seed}"
    meta = run_dir / "bench.json"
    if meta.exists() and json.loads(meta.read_text()).get("done"):
        return run_dir
    sets = [x for s in ARMS[arm] + extra for x in ("--set", s)]
    cmd = [sys.executable, "-m", "evolve.cli", "run", str(problem), "--seed", str(seed),
           "--wall-time", str(minutes * 60), "--max-evaluations", "1000000", "--run-dir", str(run_dir),
           "--no-dashboard", *sets, *(["--policy", policy] if policy else [])]
    launches = json.loads(meta.read_text())["launches"] if meta.exists() else []
    launches.append(time.time())  # wall time is counted from here: server start-up included
    run_dir.mkdir(parents=True, exist_ok=True)
    meta.write_text(json.dumps({"command": cmd, "launches": launches, "done": False}))
    print(f"[bench] {arm} seed {seed}: {' '.join(cmd)}", flush=True)
    with open(run_dir / "bench.log", "a") as log:
        rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT)
    meta.write_text(json.dumps({"command": cmd, "launches": launches, "done": rc == 0, "rc": rc}))
    if rc != 0:  # the other arms would fail the same way (no Docker, no model): say why and stop
        tail = (run_dir / "bench.log").read_text().splitlines()[-3:]
        sys.exit(f"[bench] {arm} seed {seed} failed (exit {rc}); rerun the same command to resume. "
                 f"{run_dir / 'bench.log'} ends:\n" + "\n".join(tail))
    return run_dir


def active_clock(launches: list[float], sessions: list[tuple]) -> callable:
    """Seconds of the run's own time at a moment: from each launch (server start-up included)
    to the end of the session it opened; the gap before a resume does not count."""
    intervals = []
    for launch in launches:
        ends = [end for start, end in sessions if start >= launch]
        intervals.append((launch, ends[0] if ends else launch))
    return lambda t: sum(max(0.0, min(t, end) - start) for start, end in intervals)


def measure(run_dir: Path, minutes: float) -> dict:
    """The figures of one run, cut at `minutes` of its own time (from its launch, server
    start-up included; a resumed run's sessions add up, the time between them does not)."""
    meta = json.loads((run_dir / "bench.json").read_text())
    spec = RunDir(run_dir).spec()
    with Session(connect(spec["db_url"])) as s:
        rows = s.execute(select(Program.id, Program.origin, Program.status, Program.objective,
                                Program.headline, Program.outcome, Program.duplicate_of,
                                Evaluation.started_at + Evaluation.elapsed_s)
                         .join(Evaluation, Evaluation.program_id == Program.id)
                         .order_by(Evaluation.id)).all()
        tunings = s.execute(select(Tuning.trials, Tuning.started_at + Tuning.elapsed_s)).all()
        tuning_turns = [(at - seconds, at) for at, seconds in s.execute(select(Turn.at, Turn.tuning_s))]
        answers = s.scalar(select(func.count(Program.id)).where(Program.origin == "mutation"))
        applied = s.scalar(select(func.count(Program.id)).where(
            Program.origin == "mutation", Program.status != "mutation_failed"))
        calls = s.execute(select(LLMCall.id, LLMCall.parent_id, LLMCall.n, LLMCall.started_at, LLMCall.latency_s,
                                 LLMCall.completion_tokens).where(LLMCall.error.is_(None))).all()
        status_of = dict(s.execute(select(Program.id, Program.status)).all())
        answers_of = s.execute(select(Completion.call_id, Program.outcome, Program.status)
                               .join(Completion, Completion.id == Program.completion_id)
                               .where(Program.origin.in_(("mutation", "repair")))).all()
        sessions = s.execute(select(RunSession.started_at, RunSession.ended_at).order_by(RunSession.id)).all()
        lineage = {pid: (parent, origin, code) for pid, parent, origin, code in
                   s.execute(select(Program.id, Program.parent_id, Program.origin, Program.code))}
        repairs = s.execute(select(Program.parent_id, Program.status).where(Program.origin == "repair")).all()
    # a session killed without ending: it lasted until its last evaluation
    bounds = [start for start, _ in sessions][1:] + [float("inf")]
    last = [max([e for *_, e in rows if start <= e < bound] or [start])
            for (start, _), bound in zip(sessions, bounds)]
    clock = active_clock(meta["launches"], [(start, end or last[i]) for i, (start, end) in enumerate(sessions)])
    horizon = minutes * 60
    best, curve, found_by = None, [], {"seed": 0, "mutation": 0, "repair": 0, "tuned": 0}
    # the budget's unit (evolve/store/counts.py): an LLM child 1, a tuning its trials, child or not
    evaluations = sum(n for n, end in tunings if clock(end) <= horizon)
    per_op = {op: {"evaluated": 0, "better": 0, "same": 0} for op in ("mutation", "repair", "tuned")}
    for pid, origin, status, objective, headline, outcome, dup, end in rows:
        if clock(end) > horizon:
            continue
        evaluations += origin in ("mutation", "repair")
        if origin in per_op:
            per_op[origin]["evaluated"] += 1
            per_op[origin]["better"] += outcome == "better"
            per_op[origin]["same"] += outcome == "same"
        if status == "ok" and (best is None or objective > best[0]):
            if best is not None and origin in found_by:
                found_by[origin] += 1
            best = (objective, headline, pid, origin)
            curve.append((clock(end) / 60, headline, objective))
    calls = [c for c in calls if clock(c.started_at + (c.latency_s or 0)) <= horizon]
    # a call in flight, less the tuning turns (with `pause_llm` the server is paused in them)
    in_flight = [(c.started_at, c.started_at + c.latency_s) for c in calls]
    generating = union_length(in_flight + tuning_turns) - union_length(tuning_turns)
    tokens = sum(c.completion_tokens or 0 for c in calls)
    spent = llm_time(calls, status_of, answers_of)
    first = curve[0][0] if curve else None
    seed_headline = curve[0][1] if curve else None
    improved = next((t for t, h, o in curve[1:]), None)
    return {
        "run_dir": str(run_dir), "command": " ".join(meta["command"]),
        "best_headline": best[1] if best else None, "best_objective": best[0] if best else None,
        "best_origin": best[3] if best else None, "seed_headline": seed_headline,
        "first_eval_min": first, "first_improvement_min": improved, "curve": curve,
        "evaluations": evaluations, "evals_per_min": evaluations / minutes,
        "answers": answers, "valid_answer_rate": applied / answers if answers else None,
        "operators": per_op, "improvements_by": found_by,
        "tokens": tokens, "tokens_per_s_generating": tokens / generating if generating else None,
        "llm_busy_share": generating / (minutes * 60),  # a call in flight, of the wall time
        "answers_per_min": sum(c.n for c in calls) / minutes,  # issue 60's bar: answered by the horizon
        "best_llm_ancestors": llm_ancestors(lineage, best[2]) if best else 0,
        # broken answers re-asked, and those with a working repair (search.repair)
        "reasked": len({parent for parent, _ in repairs}),
        "mended": len({parent for parent, status in repairs if status == "ok"}),
        "llm_time": spent,
    }


def llm_time(calls: list, status_of: dict, answers_of: list) -> dict:
    """What the LLM's calls cost and bought, new calls apart from re-asks of broken answers (a
    re-ask's parent is the broken answer): calls, answers, completion tokens (the server's work,
    shared by the calls in flight), call-seconds, answers that ran, improving answers."""
    by_call: dict[int, list] = {}
    for call_id, outcome, answer_status in answers_of:
        by_call.setdefault(call_id, []).append((outcome, answer_status))
    spent = {kind: {"calls": 0, "answers": 0, "tokens": 0, "seconds": 0.0, "ran_ok": 0, "better": 0}
             for kind in ("new", "reask")}
    for c in calls:
        kind = spent["reask" if status_of.get(c.parent_id) in ("error", "invalid") else "new"]
        kids = by_call.get(c.id, [])
        kind["calls"] += 1
        kind["answers"] += c.n
        kind["tokens"] += c.completion_tokens or 0
        kind["seconds"] += c.latency_s or 0.0
        kind["ran_ok"] += sum(st == "ok" for _, st in kids)
        kind["better"] += sum(o == "better" for o, _ in kids)
    return spent


def llm_time_table(results: dict) -> str:
    """Where each run's LLM time went: new calls against re-asks, and what each bought per 1,000
    completion tokens (what the server spends; two calls in flight share its seconds)."""
    lines = ["| arm | seed | kind | calls | answers | completion tokens | call-seconds | answers that ran | "
             "improving | improving per 1k tokens |", "|" + "---|" * 10]
    for (arm, seed), r in sorted(results.items()):
        for kind, t in r.get("llm_time", {}).items():
            per_k = f"{1000 * t['better'] / t['tokens']:.2f}" if t["tokens"] else "-"
            lines.append(f"| {arm} | {seed} | {kind} | {t['calls']} | {t['answers']} | {t['tokens']:,} | "
                         f"{t['seconds']:,.0f} | {t['ran_ok']} | {t['better']} | {per_k} |")
    return "\n".join(lines)


def llm_ancestors(lineage: dict, pid: int) -> int:
    """LLM children in a program's ancestry (itself included) that changed their parent's
    structure: the LLM's share in a best found by tuning."""
    count = 0
    while pid is not None:
        parent, origin, code = lineage[pid]
        if origin in ("mutation", "repair") and parent is not None and lineage[parent][2] is not None \
                and changes_structure(lineage[parent][2], code):
            count += 1
        pid = parent
    return count


def rate(d: dict, key: str) -> str:
    return f"{d[key]}/{d['evaluated']} ({d[key] / d['evaluated']:.1%})" if d["evaluated"] else "-"


def table(results: dict, minutes: float, headline: str, held_out: set[int] | None = None) -> str:
    """One row per run; `held_out`: the run seeds no default was chosen on (marked, and their
    medians given apart from the others')."""
    lines = [f"| arm | seed | best {headline} at {minutes:g} min | found by | first improvement (min) | "
             "evals/min | valid answers | improving LLM | improving repairs | improving tuned | "
             "same as parent (LLM) | tok/s generating | answers/min | LLM busy | LLM shapes in the best's lineage | "
             "broken answers mended |", "|" + "---|" * 16]
    mark = (lambda seed: f"{seed} (held out)" if seed in held_out else str(seed)) if held_out else str
    for (arm, seed), r in sorted(results.items()):
        ops = r["operators"]
        ops.setdefault("repair", {"evaluated": 0, "better": 0, "same": 0})  # a report of an older run
        fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
        lines.append(
            f"| {arm} | {mark(seed)} | {fmt(r['best_headline'], '.4f')} | {r['best_origin'] or '-'} | "
            f"{fmt(r['first_improvement_min'], '.1f')} | {r['evals_per_min']:.1f} | "
            f"{fmt(r['valid_answer_rate'], '.1%')} | {rate(ops['mutation'], 'better')} | "
            f"{rate(ops['repair'], 'better')} | {rate(ops['tuned'], 'better')} | {rate(ops['mutation'], 'same')} | "
            f"{fmt(r['tokens_per_s_generating'], '.0f')} | {fmt(r.get('answers_per_min'), '.1f')} | "
            f"{fmt(r.get('llm_busy_share'), '.0%')} | {r.get('best_llm_ancestors', '-')} | "
            f"{r.get('mended', 0)}/{r.get('reasked', 0)} |")
    medians: dict[tuple[str, str], list[float]] = {}
    for (arm, seed), r in results.items():
        group = ("held-out" if seed in held_out else "tuning") if held_out else ""
        medians.setdefault((arm, group), []).append(r["best_headline"] or 0.0)
    lines.append("")
    for (arm, group), v in sorted(medians.items()):
        seeds = f"{len(v)} {group + ' ' if group else ''}seed(s)"
        lines.append(f"- median best {headline} of `{arm}` over {seeds}: {sorted(v)[len(v) // 2]:.4f}"
                     f" (each: {', '.join(f'{x:.4f}' for x in sorted(v))})")
    return "\n".join(lines)


def cma_curves(path: Path, problem: str) -> dict:
    """Plain CMA-ES's runs of `problem` in tuner.py's results (--minutes): (arm, seed) -> its
    curve as measure() gives one, from the start at minute 0 (it has no server to start)."""
    name = load_problem(problem).name
    curves = {}
    for key, r in json.loads((path / "results.json").read_text()).items():
        program, arm, seed = key.split("|")
        if program == name and arm == "cma" and "rises" in r:  # runs before 'rises' kept no curve
            start = [(0.0, r["start"][1], r["start"][0])]
            curves[("cma", int(seed))] = start + [(s / 60, h, o) for _, s, o, h in r["rises"]]
    return curves


def over_time(curves: dict, minutes: float, headline: str) -> str:
    """The best objective every 5 minutes per run (its headline at the end): what bar 2 compares."""
    marks = [m for m in range(5, int(minutes) + 1, 5)] or [minutes]
    lines = [f"| arm | seed | best objective after {' / '.join(f'{m:g}' for m in marks)} min "
             f"({headline} at {minutes:g}) |", "|---|---|---|"]
    for (arm, seed), curve in sorted(curves.items()):
        at = [max([p for p in curve if p[0] <= m], key=lambda p: p[2], default=None) for m in marks]
        cells = " / ".join("-" if p is None else f"{p[2]:.4f}" for p in at)
        end = "-" if at[-1] is None else f"{at[-1][1]:.4f}"
        lines.append(f"| {arm} | {seed} | {cells} ({end}) |")
    return "\n".join(lines)


def plot(curves: dict, minutes: float, headline: str, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    colours = {arm: f"C{i}" for i, arm in enumerate(ARMS)} | {"cma": "black"}  # tab10 wraps after 10
    for (arm, seed), curve in sorted(curves.items()):
        xs = [t for t, _, _ in curve] + [minutes]
        ys = [h for _, h, _ in curve]
        if ys:
            ax.step(xs, ys + ys[-1:], where="post", color=colours.get(arm), alpha=0.8,
                    label=arm if seed == min(s for a, s in curves if a == arm) else None)
    ax.set_xlabel("wall time since launch (min, server start-up included)")
    ax.set_ylabel(f"best {headline} (best program by objective)")
    ax.set_xlim(0, minutes)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


async def peak_tokens_per_s(run_dir: Path, n_calls: int) -> float | None:
    """The embedded server's own rate for one of the run's prompts, with the run's n and number of
    calls in flight and nothing else on the machine: the 100 % that the run is measured against."""
    from contextlib import ExitStack

    from evolve.config import load_policy
    from evolve.serving.client import PolicyClient
    from evolve.serving.server import start_policy_server

    spec = RunDir(run_dir).spec()
    with Session(connect(spec["db_url"])) as s:
        call = s.scalars(select(LLMCall).where(LLMCall.error.is_(None)).order_by(LLMCall.id.desc())).first()
    if call is None:
        return None
    policy = load_policy(spec["policy"])
    with ExitStack() as stack:
        base_url, model, _ = start_policy_server(policy, run_dir / "peak", 0, stack)
        client = PolicyClient(policy, base_url, model)
        messages = json.loads(call.prompt)
        await client.sample(messages, call.n)  # warm the prefix cache, as in a run
        started = time.time()
        samples = await asyncio.gather(*(client.sample(messages, call.n) for _ in range(n_calls)))
        await client.close()
        return sum(x.completion_tokens for x in samples) / (time.time() - started)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("problem", nargs="?", type=Path)
    ap.add_argument("--arms", nargs="+", default=BAR_ARMS, choices=list(ARMS))
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--policy", help="a policy YAML (default: the problem's `policy`, else policies/frozen.yaml)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a problem override for every arm, after the arm's own (see `evolve run --set`)")
    ap.add_argument("--out", type=Path, help="default: runs/bench-PROBLEM")
    ap.add_argument("--report", type=Path, help="only write the tables of an existing OUT")
    ap.add_argument("--peak", action="store_true", help="also measure the server's peak tokens/s")
    ap.add_argument("--cma", type=Path, metavar="DIR", help="plain CMA-ES's runs of the same problem for the "
                    "same wall time (tuner.py --arms cma --minutes M --out DIR), drawn and tabled beside")
    ap.add_argument("--held-out", nargs="+", type=int, default=[], metavar="SEED",
                    help="the run seeds picked after the defaults were frozen: marked, their medians apart")
    args = ap.parse_args()
    out = args.report or args.out or Path("runs") / f"bench-{args.problem.stem}"
    out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        for seed in args.seeds:
            for arm in args.arms:
                run_arm(args.problem, arm, seed, args.minutes, out, args.policy, args.set)
    results = {}
    for meta in sorted(out.glob("*-s*/bench.json")):
        arm, seed = meta.parent.name.rsplit("-s", 1)
        results[(arm, int(seed))] = measure(meta.parent, args.minutes)
    spec = RunDir(next(iter(out.glob("*-s*/bench.json"))).parent).stored()
    headline = load_problem(spec["problem"], spec.get("set")).headline
    text = table(results, args.minutes, headline, set(args.held_out))
    curves = {key: r["curve"] for key, r in results.items()}
    if args.cma:
        curves |= cma_curves(args.cma, spec["problem"])
    text += "\n\n" + over_time(curves, args.minutes, headline)
    text += "\n\nWhere the LLM's time went:\n\n" + llm_time_table(results)
    if args.peak:
        llm_runs = [k for k in results if k[0] != "tuning_only"]
        if llm_runs:
            peak = asyncio.run(peak_tokens_per_s(out / f"{llm_runs[0][0]}-s{llm_runs[0][1]}", 2))
            text += f"\n- the server's peak for the same prompt, n and 2 calls in flight: {peak:.0f} tok/s"
    (out / "results.json").write_text(json.dumps({f"{a}-s{s}": r for (a, s), r in results.items()}, indent=1))
    (out / "report.md").write_text(text + "\n")
    plot(curves, args.minutes, headline, out / "best_vs_time.png")
    print(text)
    print(f"[bench] {out / 'report.md'}, {out / 'best_vs_time.png'}")


if __name__ == "__main__":
    main()
