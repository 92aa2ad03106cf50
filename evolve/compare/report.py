"""The report of `evolve compare`: every number read from the arms' databases (read-only) and
held-out pools, aggregated per policy over seeds, drawn as PNGs, summed up in report.md.

Files in the report folder:
- report.md: settings, one verdict per pair of policies, tables per policy and per arm, the plots;
- best_vs_evaluations.png, final_best.png, heldout.png, diversity.png, archive.png, cost.png
  (evolve/compare/plots.py);
- figures.json: the data of every figure (and every arm's metrics), so nothing is only a picture.

Definitions (what the numbers mean):
- best: the best program by objective (ties: the older), as `evolve best` shows it; its curve is
  the best after e evaluated candidates (the budget's unit), e = 0 being the seed program;
- valid mutation rate: mutation answers that applied to their parent / all answers;
- coverage: distinct MAP-Elites cells filled on any island / cells of one grid; QD-score: the sum
  over those cells of the best elite objective. (Union over islands, because migration copies an
  island's best into the next one: per-island sums would count one program several times. The
  per-island values are in figures.json too.)
- diversity: per LLM call (group), the mean pairwise L1 distance between the reward vectors of
  its new valid answers, beside the share of its answers that are new and valid (failed answers,
  copies and answers with their parent's outputs are all alike, so counting them as vectors
  would make failing or copying look diverse);
- held-out reward per answer (every arm): the mean over answers of E_w[w.r], w ~ Dirichlet(1);
  held-out set reward (arms of m > 1 only): VPO's own quantity, per completion E_w[max over its
  m answers of w.r] (1,000 fixed draws), averaged over whole completions. The two are reported
  apart: a set of 3 is worth more than one answer by construction;
- held-out best@k / pass@k: evolve/rl/heldout.py and evolve/compare/stats.py.
"""
from __future__ import annotations

import json
import math
from hashlib import sha256
from itertools import combinations
from pathlib import Path

import numpy as np
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from evolve.compare import plots as compare_plots
from evolve.compare import stats
from evolve.config import load_policy, load_problem
from evolve.rl.heldout import new_valid
from evolve.rl.rollouts import complete_groups
from evolve.rundir import RunDir
from evolve.store.connection import readonly_engine
from evolve.store.counts import evaluations_done
from evolve.store.database import EVALUATED, rollout_rows, session_seconds
from evolve.store.schema import (
    Cell,
    Evaluation,
    LLMCall,
    PolicyVersion,
    Program,
    Run,
    TrainingStep,
)
from evolve.store.schema import Session as RunSession

SMOOTH = 8  # groups in the diversity plot's moving average


# ---- one arm, from its database ----------------------------------------------------------------------
def read_arm(arm, problem) -> dict:
    """Every per-arm number of the report, read-only from the arm's run database."""
    spec = RunDir(arm.dir).spec()
    engine = readonly_engine(spec["db_url"])
    try:
        with Session(engine) as s:
            run_id = s.scalar(select(Run.id).where(Run.name == spec["run_name"]))
            if run_id is None:
                raise ValueError(f"{arm.dir}: its database holds no run named {spec['run_name']!r}")
            metrics = {"arm": arm.name, "policy": arm.policy, "seed": arm.seed, "trains": arm.trains,
                       **_curve(s, run_id), **_best(s, run_id), **_children(s, run_id), **_calls(s, run_id),
                       **_sessions(s, run_id), **_training(s, run_id), **_archive(s, run_id, problem)}
            metrics["diversity"] = _diversity(s, run_id, problem)
    finally:
        engine.dispose()
    return metrics


def _curve(s: Session, run_id: int) -> dict:
    """Best objective (and its headline) after each evaluated candidate; index 0 is the seed."""
    rows = s.execute(select(Program.id, Program.origin, Program.status, Program.objective, Program.headline)
                     .join(Evaluation, Evaluation.program_id == Program.id)
                     .where(Program.run_id == run_id).order_by(Evaluation.id)).all()
    best, objective, headline = None, [], []
    for row in rows:
        if row.status == "ok" and (best is None or (row.objective, -row.id) > (best.objective, -best.id)):
            best = row
        if row.origin == "mutation":
            objective.append(best.objective if best else None)
            headline.append(best.headline if best else None)
        elif not objective:  # the seed: the curve starts here
            objective.append(best.objective if best else None)
            headline.append(best.headline if best else None)
    return {"curve_objective": objective, "curve_headline": headline}


def _best(s: Session, run_id: int) -> dict:
    best = s.scalars(select(Program).where(Program.run_id == run_id, Program.status == "ok")
                     .order_by(Program.objective.desc(), Program.id).limit(1)).first()
    seed = s.scalars(select(Program).where(Program.run_id == run_id, Program.origin == "seed")
                     .order_by(Program.id).limit(1)).first()
    return {"best_id": best.id if best else None, "best_objective": best.objective if best else None,
            "best_headline": best.headline if best else None,
            "seed_objective": seed.objective if seed else None}


def _children(s: Session, run_id: int) -> dict:
    by_status = dict(s.execute(select(Program.status, func.count(Program.id)).where(
        Program.run_id == run_id, Program.origin == "mutation").group_by(Program.status)).all())
    evaluated = s.scalar(select(func.count(Program.id)).where(
        Program.run_id == run_id, Program.origin == "mutation", Program.status.in_(EVALUATED),
        Program.duplicate_of.is_(None))) or 0
    ok = s.scalar(select(func.count(Program.id)).where(
        Program.run_id == run_id, Program.origin == "mutation", Program.status == "ok",
        Program.duplicate_of.is_(None))) or 0
    answers = sum(by_status.values())
    applied = answers - by_status.get("mutation_failed", 0)
    return {"evaluations": evaluations_done(s, run_id), "answers": answers, "applied": applied,
            "children": by_status, "valid_mutation_rate": applied / answers if answers else None,
            "ok_rate": ok / evaluated if evaluated else None}


def _calls(s: Session, run_id: int) -> dict:
    counted = LLMCall.error.is_distinct_from("cancelled")
    calls, completion, prompt = s.execute(select(
        func.count(LLMCall.id), func.coalesce(func.sum(LLMCall.completion_tokens), 0),
        func.coalesce(func.sum(LLMCall.prompt_tokens), 0)).where(LLMCall.run_id == run_id, counted)).one()
    errors = s.scalar(select(func.count(LLMCall.id)).where(LLMCall.run_id == run_id, LLMCall.error.is_not(None),
                                                            counted))
    return {"llm_calls": calls, "llm_errors": errors, "completion_tokens": int(completion or 0),
            "prompt_tokens": int(prompt or 0)}


def _sessions(s: Session, run_id: int) -> dict:
    rows = s.scalars(select(RunSession).where(RunSession.run_id == run_id).order_by(RunSession.id)).all()
    wall = sum(map(session_seconds, rows))
    return {"sessions": len(rows), "wall_s": wall, "stop_reason": rows[-1].stop_reason if rows else None}


def _training(s: Session, run_id: int) -> dict:
    """Training steps made and published. A step the guard or the served check refused changed
    nothing the search used, so it is no update: the versions and `step_evaluations` count
    published steps only (seed 0 of HumanEval/141 read "6 steps" where one of them was refused)."""
    steps, published, train_s, load_s = s.execute(select(
        func.count(TrainingStep.id), func.count(TrainingStep.id).filter(TrainingStep.published.is_(True)),
        func.coalesce(func.sum(TrainingStep.train_s), 0.0),
        func.coalesce(func.sum(TrainingStep.load_s), 0.0)).where(TrainingStep.run_id == run_id)).one()
    version = s.scalar(select(func.max(PolicyVersion.version)).where(PolicyVersion.run_id == run_id))
    train_s, load_s = float(train_s or 0.0), float(load_s or 0.0)  # (coalesced: never None)
    return {"training_steps": steps, "published_steps": published, "train_s": train_s, "load_s": load_s,
            "training_s": train_s + load_s, "policy_version": version,
            "step_evaluations": _step_evaluations(s, run_id)}


def _step_evaluations(s: Session, run_id: int) -> list[int]:
    """For each published training step (an update), the evaluated children (the curve's index)
    finished by its end. Reading the curve there gives each arm's best at an equal number of updates."""
    done = sorted(s.scalars(select(Evaluation.started_at + Evaluation.elapsed_s)
                            .join(Program, Evaluation.program_id == Program.id)
                            .where(Program.run_id == run_id, Program.origin == "mutation")).all())
    ends = s.scalars(select(TrainingStep.started_at + TrainingStep.train_s + func.coalesce(TrainingStep.load_s, 0.0))
                     .where(TrainingStep.run_id == run_id, TrainingStep.published.is_(True))
                     .order_by(TrainingStep.id)).all()
    return [int(np.searchsorted(done, end, side="right")) for end in ends]


def _archive(s: Session, run_id: int, problem) -> dict:
    rows = s.execute(select(Cell.island, Cell.cell, Cell.objective).where(Cell.run_id == run_id)).all()
    best_per_cell: dict[str, float] = {}
    for _, cell, objective in rows:
        best_per_cell[cell] = max(objective, best_per_cell.get(cell, -math.inf))
    bins = [d.bins for d in problem.descriptors]
    return {"cells_filled": len(best_per_cell),
            "coverage": stats.coverage(len(best_per_cell), bins),
            "qd_score": stats.qd_score(list(best_per_cell.values())),
            "coverage_per_island": stats.coverage(len(rows), bins, problem.search.islands),
            "qd_score_per_island": stats.qd_score([r.objective for r in rows])}


def _diversity(s: Session, run_id: int, problem) -> list[dict]:
    """Per group: the diversity of its new valid answers, and the share of its answers that are
    new and valid. Failed answers are all alike, and so are copies and answers with their parent's
    outputs (zero reward rows): counting them would make failing or copying look diverse."""
    components = [c.name for c in problem.components]
    out = []
    for i, group in enumerate(complete_groups(rollout_rows(s, run_id), components)):
        valid = [r.answers[r.new] for r in group.rollouts if len(r.answers)]
        answers = sum(len(r.answers) for r in group.rollouts)
        vectors = np.vstack(valid or [np.zeros((0, len(components)))])
        out.append({"group": i, "call_id": group.call_id, "version": group.policy_version,
                    "diversity": stats.diversity(vectors.tolist()), "valid_rate": len(vectors) / answers if answers else None})
    return out


# ---- one arm's held-out pools ------------------------------------------------------------------------
def _complete_pools(path: Path, parents: list[dict]) -> dict | None:
    """An arm's held-out record if it has a pool for every parent of this parent set, else None."""
    from evolve.rl.heldout import digest

    if not path.exists() or not parents:
        return None
    record = json.loads(path.read_text())
    if record.get("parents_digest") != digest(parents) or any(p["key"] not in record["parents"] for p in parents):
        return None
    return record


def read_heldout(path: Path, parents: list[dict], k_max: int) -> dict | None:
    """best@k, pass@k (k = 1..k_max) and pool diversity, averaged over the parents; None if the
    pools are missing, partial, or were measured on another parent set."""
    if (record := _complete_pools(path, parents)) is None:
        return None
    per_parent = {}
    m = record.get("answers_per_completion", 1)
    for p in parents:
        answers = record["parents"][p["key"]]["answers"]
        values = [a["objective"] for a in answers]
        n, c = len(values), sum(a["beats_parent"] for a in answers)
        ks = range(1, min(k_max, n) + 1)
        valid = [a for a in answers if new_valid(a)]
        per_parent[p["key"]] = {
            "n": n, "beats_parent": c, "valid": len(valid), "valid_rate": len(valid) / n if n else None,
            "best_at_k": [stats.best_at_k(values, k) for k in ks],
            "pass_at_k": [stats.pass_at_k(n, c, k) for k in ks],
            "diversity": stats.diversity([a["vector"] for a in valid]),
            "answer_reward": stats.set_quality([a["vector"] for a in answers], 1),
            "set_reward": stats.set_quality([a["vector"] for a in answers], m) if m > 1 else None,
            "tokens": record["parents"][p["key"]]["tokens"]}
    k = min(len(v["best_at_k"]) for v in per_parent.values())
    mean = lambda key: [float(np.mean([v[key][i] for v in per_parent.values()])) for i in range(k)]  # noqa: E731
    diversities = [v["diversity"] for v in per_parent.values() if v["diversity"] is not None]
    return {"policy_version": record["policy_version"], "k": list(range(1, k + 1)),
            "best_at_k": mean("best_at_k"), "pass_at_k": mean("pass_at_k"),
            "diversity": float(np.mean(diversities)) if diversities else None,
            "valid_rate": _mean([v["valid_rate"] for v in per_parent.values()]),
            "answer_reward": _mean([v["answer_reward"] for v in per_parent.values()]),
            "set_reward": _mean([v["set_reward"] for v in per_parent.values()]),
            "tokens": sum(v["tokens"] for v in per_parent.values()), "parents": per_parent}


# ---- per policy, over seeds ----------------------------------------------------------------------------
def by_policy(arms_metrics: list[dict], policies: list[str]) -> dict[str, list[dict]]:
    return {p: [m for m in arms_metrics if m["policy"] == p] for p in policies}


def band(series: list[list[float | None]], length: int | None = None) -> dict:
    """Median, min and max over seeds at each index (a seed that stopped early is left out there)."""
    length = length or max((len(x) for x in series), default=0)
    grid = np.full((len(series), length), np.nan)
    for i, x in enumerate(series):
        values = np.array([np.nan if v is None else v for v in x[:length]], dtype=float)
        grid[i, :len(values)] = values
    seen = ~np.all(np.isnan(grid), axis=0) if len(series) else np.zeros(length, bool)
    pick = lambda f: [float(f(grid[:, j][~np.isnan(grid[:, j])])) if seen[j] else None  # noqa: E731
                      for j in range(length)]
    return {"x": list(range(length)), "median": pick(np.median), "min": pick(np.min), "max": pick(np.max)}


def summary(values: list[float | None]) -> dict:
    """Per-seed values with their mean, median and a 95% bootstrap CI of the mean."""
    x = [v for v in values if v is not None]
    if not x:
        return {"values": values, "mean": None, "median": None, "ci95": None}
    low, high = stats.bootstrap_ci(x, np.mean)
    return {"values": values, "mean": float(np.mean(x)), "median": float(np.median(x)), "ci95": [low, high]}


def rolling(values: list[float | None], window: int = SMOOTH) -> list[float | None]:
    out, kept = [], []
    for v in values:
        if v is not None:
            kept.append(v)
        recent = kept[-window:]
        out.append(float(np.mean(recent)) if recent else None)
    return out


def figures(names: list[str], budget: int, arms_metrics: list[dict], heldout: dict[str, dict | None]) -> dict:
    """The data of every figure, per policy over its seeds."""
    groups = by_policy(arms_metrics, names)
    length = budget + 1
    fig: dict[str, dict] = {"best_vs_evaluations": {}, "final_best": {}, "heldout": {}, "diversity": {},
                            "archive": {}, "cost": {}}
    for name, ms in groups.items():
        fig["best_vs_evaluations"][name] = {
            "objective": band([m["curve_objective"] for m in ms], length),
            "headline": band([m["curve_headline"] for m in ms], length),
            "seeds": [m["seed"] for m in ms]}
        fig["final_best"][name] = {"objective": summary([m["best_objective"] for m in ms]),
                                   "headline": summary([m["best_headline"] for m in ms]),
                                   "seeds": [m["seed"] for m in ms]}
        fig["diversity"][name] = {"per_group": band([[g["diversity"] for g in m["diversity"]] for m in ms]),
                                  "smoothed": band([rolling([g["diversity"] for g in m["diversity"]]) for m in ms]),
                                  "mean": summary([_mean([g["diversity"] for g in m["diversity"]]) for m in ms])}
        fig["archive"][name] = {k: summary([m[k] for m in ms]) for k in
                                ("coverage", "qd_score", "coverage_per_island", "qd_score_per_island",
                                 "cells_filled")}
        fig["cost"][name] = {k: summary([m[k] for m in ms]) for k in
                             ("valid_mutation_rate", "ok_rate", "completion_tokens", "llm_calls", "wall_s",
                              "training_s", "training_steps", "evaluations")}
        pools = [pool for m in ms if (pool := heldout.get(m["arm"])) is not None]
        if pools and len(pools) == len(ms):
            k = min(len(p["k"]) for p in pools)
            fig["heldout"][name] = {"k": list(range(1, k + 1)),
                                    "best_at_k": band([p["best_at_k"][:k] for p in pools]),
                                    "pass_at_k": band([p["pass_at_k"][:k] for p in pools]),
                                    "best_at_k_max": summary([p["best_at_k"][k - 1] for p in pools]),
                                    "pass_at_k_max": summary([p["pass_at_k"][k - 1] for p in pools]),
                                    "diversity": summary([p["diversity"] for p in pools]),
                                    "valid_rate": summary([p.get("valid_rate") for p in pools]),
                                    "answer_reward": summary([p.get("answer_reward") for p in pools]),
                                    "set_reward": summary([p.get("set_reward") for p in pools])}
    fig["equal_updates"] = equal_updates(arms_metrics)
    return fig


def equal_updates(arms_metrics: list[dict]) -> dict:
    """The training arms compared after the same number of updates U (published steps; the fewest any of them made):
    each arm's best objective once its U-th step was done, and the evaluations that took. At an
    equal evaluation budget (the final best) an arm that trains more often has had more updates."""
    arms = [m for m in arms_metrics if m["trains"]]
    trains = {m["policy"] for m in arms}
    updates = min((len(m["step_evaluations"]) for m in arms), default=0)
    out: dict = {"updates": updates, "policies": {}}
    if not updates:
        return out
    for name, ms in by_policy(arms, sorted(trains)).items():
        at = [m["step_evaluations"][updates - 1] for m in ms]
        best = [m["curve_objective"][min(i, len(m["curve_objective"]) - 1)] for m, i in zip(ms, at)]
        out["policies"][name] = {"objective": summary(best), "evaluations": summary(at),
                                 "seeds": [m["seed"] for m in ms]}
    pols = out["policies"]
    out["verdicts"] = [stats.verdict(a, pols[a]["objective"]["values"], b, pols[b]["objective"]["values"],
                                     what=f"best objective after {updates} updates",
                                     paired=pols[a]["seeds"] == pols[b]["seeds"]).text
                       for a, b in combinations(pols, 2)]
    return out


def _mean(values: list[float | None]) -> float | None:
    x = [v for v in values if v is not None]
    return float(np.mean(x)) if x else None


def verdicts(fig: dict, names: list[str]) -> dict[str, list[str]]:
    """One line per pair of policies: on the final best objective, and on held-out best@k_max."""
    out: dict[str, list[str]] = {"final best objective": [], "held-out best@k_max": []}
    for a, b in combinations(names, 2):
        # the arms of a comparison run the same seeds (and request seeds): paired by seed
        paired = fig["final_best"][a]["seeds"] == fig["final_best"][b]["seeds"]
        fa, fb = fig["final_best"][a]["objective"]["values"], fig["final_best"][b]["objective"]["values"]
        if fa and fb and None not in fa + fb:
            out["final best objective"].append(stats.verdict(a, fa, b, fb, paired=paired).text)
        if a in fig["heldout"] and b in fig["heldout"]:  # (a pool for every seed of each, in seed order)
            ha, hb = fig["heldout"][a]["best_at_k_max"]["values"], fig["heldout"][b]["best_at_k_max"]["values"]
            k = len(fig["heldout"][a]["k"])
            out["held-out best@k_max"].append(stats.verdict(a, ha, b, hb, what=f"held-out best@{k}",
                                                            paired=paired).text)
    return out


def baselines(policies: list) -> list[str]:
    """A line per training policy naming its own baseline: the frozen arm asking for as many
    answers per response (m). VPO changes m and the reward at once; only its m-matched frozen
    arm tells which of the two helped."""
    lines = []
    for p in (p for p in policies if p.train is not None):
        same_m = [q.name for q in policies if q.train is None and q.answers == p.answers]
        lines.append(f"{p.name} (m={p.answers}): its baseline is {same_m[0]} (frozen, m={p.answers})" if same_m
                     else f"{p.name} (m={p.answers}): no frozen arm with m={p.answers} in this comparison; "
                          f"add one (e.g. policies/frozen_m3.yaml for m=3) to tell training from m")
    return lines


def _frozen_by_m(policies: list) -> dict[int, str]:
    """Each m's baseline: the first frozen policy asking for m answers per response."""
    frozen: dict[int, str] = {}
    for p in policies:
        if p.train is None:
            frozen.setdefault(p.answers, p.name)
    return frozen


def version_quality(plan, policies: list, parents: list[dict]) -> list[dict]:
    """Per training arm and policy version measured on the held-out parents (heldout/ARM@vN.json,
    and ARM.json for its last): its valid and improving answers against its baseline's, the
    frozen arm with the same m and seed (the base model, v0)."""
    folder = plan.dir / "heldout"
    frozen = _frozen_by_m(policies)
    rows = []
    for p in (p for p in policies if p.train is not None):
        for seed in plan.seeds:
            arm, base_arm = f"{p.name}-s{seed}", f"{frozen[p.answers]}-s{seed}" if p.answers in frozen else None
            base = _pool_counts(folder / f"{base_arm}.json", parents) if base_arm else None
            if base is not None:  # the row every version is read against
                rows.append({"arm": arm, "base": base_arm, **base,
                             **{what: _rate(base, None, what) for what in ("valid", "improving")}})
            earlier = sorted(folder.glob(f"{arm}@v*.json"), key=lambda f: int(f.stem.rsplit("@v", 1)[1]))
            for path in [*earlier, folder / f"{arm}.json"]:
                if (counts := _pool_counts(path, parents)) is not None:
                    rows.append({"arm": arm, **counts,
                                 **{what: _rate(counts, base, what) for what in ("valid", "improving")}})
    return rows


def slowdowns(plan, policies: list, arms: dict[str, dict]) -> dict[str, dict]:
    """Per training arm: evaluations per minute of search wall time (training included), against
    its baseline's (the frozen arm with the same m and seed). The bar: at most 1.5x slower."""
    frozen = _frozen_by_m(policies)
    out = {}
    for p in (p for p in policies if p.train is not None and p.answers in frozen):
        for seed in plan.seeds:
            arm, base = arms.get(f"{p.name}-s{seed}"), arms.get(f"{frozen[p.answers]}-s{seed}")
            if arm and base and arm["wall_s"] and base["wall_s"]:
                rate, base_rate = (60 * m["evaluations"] / m["wall_s"] for m in (arm, base))
                out[arm["arm"]] = {"base": base["arm"], "evals_per_min": rate, "base_evals_per_min": base_rate,
                                   "slowdown": base_rate / rate if rate else None}
    return out


def pooled_versions(rows: list[dict], arms: dict[str, dict]) -> list[dict]:
    """Per training policy and version number measured on every seed: its held-out parents of all
    seeds pooled against the base's, still paired by parent (each seed's parents against its own
    base pool). Three seeds of 8 parents are 24 pairs; one seed's 8 detect only large changes
    (tests/benchmarks/power.py). Empty for one seed, or rows without per-parent counts."""
    per_policy: dict[str, dict[str, list[dict]]] = {}
    bases = {r["arm"]: r for r in rows if "base" in r}
    for r in rows:
        if "base" not in r and r["arm"] in bases and r.get("per_parent") and bases[r["arm"]].get("per_parent"):
            per_policy.setdefault(arms[r["arm"]]["policy"], {}).setdefault(r["version"], []).append(r)
    out = []
    for policy, versions in per_policy.items():
        seeds = {arm for arm, m in arms.items() if m["policy"] == policy}
        if len(seeds) < 2:
            continue
        for version, rs in sorted(versions.items()):
            if {r["arm"] for r in rs} != seeds:
                continue  # not measured on every seed: nothing to pool
            row: dict = {"policy": policy, "version": version, "seeds": len(rs)}
            for what in ("valid", "improving"):
                mine = [r["per_parent"] for r in rs]
                base = [bases[r["arm"]]["per_parent"] for r in rs]
                k, n = _joined(mine, f"{what}_n"), _joined(mine, "answers")
                bk, bn = _joined(base, f"{what}_n"), _joined(base, "answers")
                d, pv, ci = stats.paired_rate_difference(k, n, bk, bn)
                row[what] = {"rate": sum(k) / max(sum(n), 1), "base_rate": sum(bk) / max(sum(bn), 1),
                             "diff": d, "p": pv, "diff_ci95": ci, "parents": len(k),
                             "vs_base": "level" if pv >= stats.ALPHA else "above" if d > 0 else "below"}
            out.append(row)
    return out


def _joined(per_parent: list[dict], key: str) -> list[int]:
    return [v for x in per_parent for v in x[key]]


def learning_bar(rows: list[dict], versions: int = 4) -> dict[str, dict]:
    """Per training arm, the bar a mutator that learns must meet (issue 21): over its first
    `versions` published versions neither rate is ever below the base model's (by the 95% interval
    of the difference), and at the last of them at least one is above. None until all are measured."""
    out: dict[str, dict] = {}
    for arm in dict.fromkeys(r["arm"] for r in rows):
        measured = [r for r in rows if r["arm"] == arm and r["version"] > 0 and r["valid"]["vs_base"]][:versions]
        if len(measured) < versions:
            out[arm] = {"met": None, "measured": [r["version"] for r in measured]}
            continue
        never_below = all(r[w]["vs_base"] != "below" for r in measured for w in ("valid", "improving"))
        above = any(measured[-1][w]["vs_base"] == "above" for w in ("valid", "improving"))
        out[arm] = {"met": never_below and above, "never_below": never_below, "above_at_last": above,
                    "measured": [r["version"] for r in measured]}
    return out


def _pool_counts(path: Path, parents: list[dict]) -> dict | None:
    """Answers, valid answers and answers that beat their parent in a complete held-out pool."""
    if (record := _complete_pools(path, parents)) is None:
        return None
    pools = [record["parents"][p["key"]]["answers"] for p in parents]
    per_parent = {"keys": [p["key"] for p in parents], "answers": [len(a) for a in pools],
                  "valid_n": [sum(new_valid(x) for x in a) for a in pools],
                  "improving_n": [sum(x["beats_parent"] for x in a) for a in pools]}
    return {"version": record["policy_version"], "answers": sum(per_parent["answers"]),
            "valid_n": sum(per_parent["valid_n"]), "improving_n": sum(per_parent["improving_n"]),
            "per_parent": per_parent}


def _rate(counts: dict, base: dict | None, what: str) -> dict:
    """A rate with its Wilson interval, and where it stands against the baseline's. Both answered
    the same held-out parents with the same request seeds, so the two are paired by parent: below
    or above when the sign-flip test of the per-parent differences gives p < 0.05 (the test says
    "paired by parent"); rows without per-parent counts (older reports) keep Newcombe's interval."""
    k, n = counts[f"{what}_n"], counts["answers"]
    out = {"rate": k / max(n, 1), "ci95": stats.wilson(k, n), "vs_base": None, "diff_ci95": None}
    if base is None:
        return out
    mine, theirs = counts.get("per_parent"), base.get("per_parent")
    if mine and theirs and mine["keys"] == theirs["keys"]:
        d, p, ci = stats.paired_rate_difference(mine[f"{what}_n"], mine["answers"], theirs[f"{what}_n"],
                                                theirs["answers"])
        out.update(diff=d, p=p, diff_ci95=ci, test="paired by parent",
                   vs_base="level" if p >= stats.ALPHA else "above" if d > 0 else "below")
        return out
    lo, hi = stats.rate_difference_ci(k, n, base[f"{what}_n"], base["answers"])
    out.update(diff_ci95=(lo, hi), test="Newcombe", vs_base="below" if hi < 0 else "above" if lo > 0 else "level")
    return out


# ---- the report -------------------------------------------------------------------------------------
# What a report is made from: everything measured, per arm. figures.json keeps all of it, so
# reports of the same comparison's seeds, run apart, can be merged into one (evolve/compare/merge.py).
MEASURED = ("arms", "heldout_arms", "baselines", "versions", "slowdown", "settings")


def write_report(plan, arms, out: Path) -> Path:
    """Read every arm, write figures.json, the PNGs and report.md into `out`; returns report.md."""
    problem = load_problem(plan.problem, plan.sets)
    present = [a for a in arms if RunDir(a.dir).exists() and _has_db(a)]
    metrics = {m["arm"]: m for m in (read_arm(a, problem) for a in present)}
    parents = _parents(plan)
    policies = [load_policy(p["path"]) for p in plan.policies]
    settings = {"problem": problem.name, "headline": problem.headline, "sets": plan.sets,
                "policies": [p["name"] for p in plan.policies],
                "policy_sha256": {p["name"]: sha256(Path(p["path"]).read_bytes()).hexdigest() for p in plan.policies},
                "seeds": plan.seeds, "budget": plan.budget, "max_llm_calls": plan.max_llm_calls,
                "heldout": plan.heldout,
                "parent_sets": [{"seeds": plan.seeds, "parents": [
                    {k: p[k] for k in ("key", "source", "objective", "headline", "held_out")} for p in parents]}],
                "sources": [{"dir": str(plan.dir), "seeds": plan.seeds}],
                "arms_missing": [a.name for a in arms if a not in present]}
    return render({"arms": metrics,
                   "heldout_arms": {a.name: read_heldout(plan.dir / "heldout" / f"{a.name}.json", parents,
                                                         plan.heldout["k_max"]) for a in present},
                   "baselines": baselines(policies), "versions": version_quality(plan, policies, parents),
                   "slowdown": slowdowns(plan, policies, metrics), "settings": settings}, out)


def render(measured: dict, out: Path) -> Path:
    """figures.json, the PNGs and report.md in `out` from what was measured (MEASURED): one
    comparison's, or several merged. Returns report.md."""
    settings = measured["settings"]
    names = settings["policies"]
    fig = figures(names, settings["budget"], list(measured["arms"].values()), measured["heldout_arms"])
    fig.update(measured)
    fig["verdicts"] = verdicts(fig, names)
    fig["learning_bar"] = learning_bar(fig["versions"])
    fig["versions_pooled"] = pooled_versions(fig["versions"], measured["arms"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "figures.json").write_text(json.dumps(fig, indent=1, default=_json) + "\n")
    plots = compare_plots.draw_all(fig, names, settings["headline"], out)
    path = out / "report.md"
    path.write_text(markdown(fig, plots))
    return path


def _has_db(arm) -> bool:
    url = RunDir(arm.dir).database_url()
    return not url.startswith("sqlite:///") or Path(url.removeprefix("sqlite:///")).exists()


def _parents(plan) -> list[dict]:
    path = plan.dir / "heldout" / "parents.json"
    return json.loads(path.read_text())["parents"] if path.exists() else []


def _json(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    return str(o)


# ---- markdown ---------------------------------------------------------------------------------------
def _f(v, digits: int = 4) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _ci(s: dict, digits: int = 4) -> str:
    if s["mean"] is None:
        return "-"
    return f"{s['mean']:.{digits}f} [{s['ci95'][0]:.{digits}f}, {s['ci95'][1]:.{digits}f}]"


def markdown(fig: dict, plots: list[Path]) -> str:
    s = fig["settings"]
    names, headline = s["policies"], s["headline"]
    lines = [f"# evolve compare: {s['problem']}", "",
             f"Policies {', '.join(names)}; seeds {s['seeds']}; budget {s['budget']} evaluated candidates per arm"
             + (f" (at most {s['max_llm_calls']} LLM calls)" if s["max_llm_calls"] else "") + ". "
             f"Headline: {headline}. " + _sources(s["sources"]), ""]
    if fig["settings"]["arms_missing"]:
        lines += [f"**Incomplete:** no run yet for {', '.join(fig['settings']['arms_missing'])}.", ""]
    lines += ["## Arms and their baselines", ""] + [f"- {line}" for line in fig.get("baselines", [])] + [
        "- (no training arm)" if not fig.get("baselines") else "", "## Verdicts", ""]
    for what, texts in fig["verdicts"].items():
        for text in texts:
            lines.append(f"- {text}")
    if not any(fig["verdicts"].values()):
        lines.append("- (one policy, or no finished arm: nothing to compare)")
    lines += ["", f"Significance: the arms ran the same seeds, so each verdict is a two-sided {stats.PAIRED_TEST_NAME} "
              "of the per-seed differences, p < 0.05 (with n seeds the smallest possible p is 2 / 2^n: 0.25 for "
              f"three, 0.0625 for five, six to get below 0.05); arms with other seeds get the {stats.TEST_NAME}. "
              "The CI is a percentile bootstrap of the mean paired difference (or the difference of medians). With a "
              "handful of seeds every bootstrap CI here is rough (and narrower than the truth): the p-value is the "
              "claim.", ""]
    lines += _policy_table(fig, names, headline) + [""] + _arm_table(fig, headline) + [""]
    lines += _equal_updates_section(fig) + [""] + _heldout_section(fig, names) + [""]
    lines += _versions_section(fig) + [""]
    lines += ["## Figures", ""] + [f"![{p.stem}]({p.name})" for p in plots] + [""]
    lines += ["## What the numbers are", "",
              "- Budget: evaluated candidates (failed mutations and duplicates are free), the same for every arm.",
              "- Best: the best program by objective, as `evolve best` shows it; its curve starts at the seed (0).",
              "- Coverage: distinct MAP-Elites cells filled on any island / cells of one grid; QD-score: the sum "
              "over those cells of the best elite objective (per-island values are in figures.json).",
              "- Diversity: per LLM call, the mean pairwise L1 distance between the reward vectors of its valid "
              "answers (the valid rate is reported beside it).",
              "- Search wall time: the runs' sessions (the policy server's start-up is not included). Training: "
              "the RL hook's training and adapter-loading time (its one-off model load is not included).",
              "- Every number comes from the arms' databases (read-only) and `heldout/*.json`; the data of every "
              "figure is in `figures.json`.", ""]
    return "\n".join(lines)


def _sources(sources: list[dict]) -> str:
    if len(sources) == 1:
        return f"Comparison directory: `{sources[0]['dir']}`."
    return "Merged from the reports of " + ", ".join(f"`{x['dir']}` (seeds {x['seeds']})" for x in sources) + "."


def _policy_table(fig: dict, names: list[str], headline: str) -> list[str]:
    extra = compare_plots.own_headline(headline)
    rows = ["## Per policy (mean and 95% bootstrap CI over seeds)", "",
            "| policy | seeds | final best objective | " + (f"final best {headline} | " if extra else "")
            + "coverage | QD-score | valid mutations | diversity (valid answers) | held-out valid | "
            "held-out best@k_max | held-out pass@k_max | held-out reward per answer | held-out set reward "
            "(whole completions, m > 1) |",
            "|---" * (12 + extra) + "|"]
    for n in names:
        fb, ar, co, dv = fig["final_best"][n], fig["archive"][n], fig["cost"][n], fig["diversity"][n]
        ho = fig["heldout"].get(n)
        rows.append(f"| {n} | {len(fb['seeds'])} | {_ci(fb['objective'])} | "
                    + (f"{_ci(fb['headline'], 6)} | " if extra else "")
                    + f"{_ci(ar['coverage'], 3)} | {_ci(ar['qd_score'], 3)} | {_ci(co['valid_mutation_rate'], 3)} | "
                    f"{_ci(dv['mean'], 4)} | {_ci(ho['valid_rate'], 3) if ho else '-'} | "
                    f"{_ci(ho['best_at_k_max']) if ho else '-'} | {_ci(ho['pass_at_k_max'], 3) if ho else '-'} | "
                    f"{_ci(ho['answer_reward'], 4) if ho else '-'} | {_ci(ho['set_reward'], 4) if ho else '-'} |")
    return rows


def _found_at(curve: list) -> int | str:
    """The evaluation at which the arm's best objective was first reached (0: the seed)."""
    values = [v for v in curve if v is not None]
    return curve.index(max(values)) if values else "-"


def _arm_table(fig: dict, headline: str) -> list[str]:
    extra = compare_plots.own_headline(headline)
    rows = ["## Per arm", "",
            "| arm | stopped | evaluations | best objective | " + (f"best {headline} | " if extra else "")
            + "found at evaluation | best program | valid mutations | LLM calls | completion tokens | "
            "search wall (s) | updates (published / trained steps) | training (s) | coverage | QD-score |",
            "|---" * (14 + extra) + "|"]
    for m in fig["arms"].values():
        valid = f"{m['applied']}/{m['answers']}"
        rows.append(f"| {m['arm']} | {m['stop_reason']} | {m['evaluations']} | {_f(m['best_objective'])} | "
                    + (f"{_f(m['best_headline'], 6)} | " if extra else "")
                    + f"{_found_at(m['curve_objective'])} | #{m['best_id']} | {valid} | {m['llm_calls']} | "
                    f"{m['completion_tokens']} | {m['wall_s']:.1f} | {m.get('published_steps', '?')} / {m['training_steps']} | "
                    f"{m['training_s']:.1f} | {m['coverage']:.3f} | {m['qd_score']:.3f} |")
    return rows


def _equal_updates_section(fig: dict) -> list[str]:
    eq = fig.get("equal_updates") or {}
    rows = ["## At equal updates", ""]
    if not eq.get("updates"):
        return rows + ["No training arm made a training step: nothing to compare at equal updates."]
    rows += [f"The tables above compare arms at an equal evaluation budget. Here each training arm is read "
             f"once its {eq['updates']}-th training step was done (the fewest steps any training arm made): "
             "the best objective it had then, and the evaluated children that took.", "",
             "| policy | seeds | best objective after the updates | evaluations by then |", "|---|---|---|---|"]
    for name, p in eq["policies"].items():
        rows.append(f"| {name} | {len(p['seeds'])} | {_ci(p['objective'])} | {_ci(p['evaluations'], 1)} |")
    return rows + [""] + [f"- {text}" for text in eq.get("verdicts", [])]


def _heldout_section(fig: dict, names: list[str]) -> list[str]:
    sets = [x for x in fig["settings"]["parent_sets"] if x["parents"]]
    h = fig["settings"]["heldout"]
    rows = ["## Held-out parents", ""]
    if h.get("skip"):
        return rows + ["Not measured (--skip-heldout)."]
    if not sets:
        return rows + ["Not measured yet."]
    rows += [f"Each arm's final policy answered {h['samples']} times per parent; best@k and pass@k for "
             f"k = 1..{h['k_max']} are exact estimates over that pool (k drawn without replacement), averaged "
             "over the parents. Failed answers score 0. Every arm's calls use the same request seeds, so a "
             "frozen policy's arms of other seeds share the pool of its first. "
             + ("Parents (same for every arm):" if len(sets) == 1 else
                "Seeds run apart drew their parents apart, from their own frozen arms; every arm of a seed "
                "answered the same parents:"), ""]
    for x in sets:
        rows += [] if len(sets) == 1 else [f"Seeds {x['seeds']}:", ""]
        for p in x["parents"]:
            kind = "held out (a frozen arm's elite no training arm stored)" if p["held_out"] \
                else "the seed program: NOT held out, every arm has seen it"
            rows.append(f"- `{p['key']}`: objective {_f(p['objective'])}, {kind}")
        rows += [""] if len(sets) > 1 else []
    missing = [n for n in names if n not in fig["heldout"]]
    if missing:
        rows += ["", f"No complete held-out pools for {', '.join(missing)} yet."]
    return rows


def _versions_section(fig: dict) -> list[str]:
    return _versions_table(fig.get("versions") or [], fig.get("learning_bar") or {}) + \
        _pooled_table(fig.get("versions_pooled") or []) + _speed_lines(fig.get("slowdown") or {})


def _pooled_table(rows: list[dict]) -> list[str]:
    if not rows:
        return []
    out = ["", "### Per version, seeds pooled", "",
           "Each version number measured on every seed: all seeds' held-out parents against each seed's own "
           "base pool, paired by parent (sign-flip permutation test of the per-parent rate differences; mean "
           "difference with its 95% bootstrap interval).", "",
           "| policy | version | seeds | parents | valid (base) | difference | p | vs base | improving (base) | "
           "difference | p | vs base |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = []
        for what in ("valid", "improving"):
            x = r[what]
            lo, hi = x["diff_ci95"]
            cells.append(f"{x['rate']:.1%} ({x['base_rate']:.1%}) | {x['diff']:+.1%} [{lo:+.1%}, {hi:+.1%}] | "
                         f"{x['p']:.3g} | {x['vs_base']}")
        out.append(f"| {r['policy']} | v{r['version']} | {r['seeds']} | {r['valid']['parents']} | "
                   + " | ".join(cells) + " |")
    return out


def _versions_table(rows: list[dict], bars: dict) -> list[str]:
    if not rows:
        return []
    out = ["## Held-out quality per policy version", "",
           "Each training arm's versions on the held-out parents (`--heldout-versions`; without it only the "
           "last), against its baseline: the frozen arm with the same m and seed, i.e. the base model. "
           "Rates with their 95% Wilson interval; below / above: a version and its base answered the same "
           "held-out parents with the same request seeds, so they are paired by parent, and the two-sided "
           "sign-flip permutation test of the per-parent rate differences gives p < 0.05 (with 8 parents the "
           "smallest possible p is 2 / 2^8 = 0.008); level otherwise. (Rows of older reports, without "
           "per-parent counts: the 95% interval of the difference, Newcombe, lies wholly below / above 0.)", "",
           "| arm | version | answers | valid | vs base | improving | vs base |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        v, i = r["valid"], r["improving"]
        version = f"base ({r['base']})" if "base" in r else f"v{r['version']}"
        out.append(f"| {r['arm']} | {version} | {r['answers']} | {percent(v)} | {v['vs_base'] or '-'} | "
                   f"{percent(i)} | {i['vs_base'] or '-'} |")
    out += ["", "The bar for a mutator that learns: over its first 4 versions neither rate is below the base "
            "model's, and at v4 at least one is above it."]
    for arm, bar in bars.items():
        done = ", ".join(f"v{v}" for v in bar["measured"]) or "none"
        out.append(f"- {arm}: " + ("not measured yet (versions measured: " + done + ")" if bar["met"] is None else
                                   f"{'met' if bar['met'] else 'not met'} ({done}: "
                                   f"{'never below' if bar['never_below'] else 'below the base at some version'}"
                                   f", {'above' if bar['above_at_last'] else 'not above'} at the last)"))
    return out


def percent(rate: dict) -> str:
    """`82.0 % [74, 88]`: a rate and its interval, each rounded once from the exact value (its
    counts'), so a table copied from the report never rounds a rounded number again (0.7448 ->
    0.745 -> 75 made a README row read [75, 88] for 105/128, whose interval is [74.5, 87.7])."""
    lo, hi = rate["ci95"]
    return f"{100 * rate['rate']:.1f} % [{100 * lo:.0f}, {100 * hi:.0f}]"


def _speed_lines(slowdown: dict) -> list[str]:
    """What learning costs in search speed: a training arm's evaluations per minute against its baseline's."""
    if not slowdown:
        return []
    out = ["", "## Search speed of the training arms", "",
           "Evaluations per minute of search wall time (training, the guard and server restarts included), "
           "against the baseline's; the bar: at most 1.5x slower.", ""]
    for arm, sp in slowdown.items():
        factor = f"{sp['slowdown']:.1f}x slower" if sp["slowdown"] else "no evaluations"
        out.append(f"- {arm}: {sp['evals_per_min']:.2f} against {sp['base']}'s {sp['base_evals_per_min']:.2f}: {factor}")
    return out
