"""The tuning operator: CMA-ES on a program's float literals (tuning.py), its best trial stored
as a `tuned` child.

A step tunes one program: an LLM child offered to it first (the ones worth tuning), otherwise
the archive's pick of the next island in turn. With turns (scheduler.py) offered children wait
for tuning's turn, which takes them first: a tuning (300 trials) run beside the server in the
LLM's turn would take the cores from it. Each tuning's CMA-ES state is kept with the code it
ended on (its best, or its start where nothing beat it), so the next tuning of that code goes on
where it stopped. The code, not the program row: every island starts from its own copy of the
seed and migrants are copies, and states kept per row split one descent into independent ones
(on the spiral seed, the first 4,200 trials on its code went to four descents of ~1,000 that
each found nothing; docs/benchmarks/generalization.md). Kept in memory: a resume tunes the
archive's programs afresh.
"""
from __future__ import annotations

import time
from collections import OrderedDict, deque

from evolve.config import Tuning as TuningConfig
from evolve.mutation import pipeline
from evolve.mutation.literals import adds_knob, changes_structure
from evolve.rundir import Stop
from evolve.search.operator import Engine, Step
from evolve.search.tuning import Trial, TuningState
from evolve.store.schema import Program, Tuning

# CMA-ES states kept at most (the least recently ended dropped): a few kB each.
KEPT_STATES = 256


class Tuner:
    name = "tuning"
    origin = "tuned"

    def __init__(self, engine: Engine, config: TuningConfig, queued: bool, generations: bool):
        self.engine, self.config = engine, config
        self.queued = queued  # offered children wait for the next step instead of a task of their own
        self.generations = generations  # the only operator: each tuning counts a generation of its island
        self.waiting: deque[Program] = deque()
        self.rounds = 0
        self.states: OrderedDict[str, TuningState] = OrderedDict()  # code_hash -> the tuning that ended there

    async def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def offer(self, child: Program, island_best: bool) -> None:
        if not self._wants(child, island_best):
            return
        if self.queued:
            self.waiting.append(child)
        else:
            self.engine.tasks.spawn(self.tune(child))

    def _wants(self, child: Program, island_best: bool) -> bool:
        """LLM children worth tuning: each new best of its island, each that changes the code's
        shape (a new structure needs its own numbers before it pays off; with its parent's
        outputs, a knob added at its neutral value) and a share of the others (changes of
        numbers only: the tuner explores those anyway). Never a copy of a stored program."""
        t, engine = self.config, self.engine
        if not t.enabled or child.status != "ok" or child.duplicate_of is not None or child.code is None:
            return False
        parent = engine.db.get(child.parent_id).code if child.parent_id is not None else None
        if child.outcome == "same":  # the parent's outputs: worth tuning only as a new knob
            return t.structural and parent is not None and adds_knob(parent, child.code)
        return ((t.new_best and island_best) or (t.structural and parent is not None and changes_structure(
            parent, child.code)) or engine.rng.random() < t.share)

    async def step(self) -> Step:
        """Tune the next waiting child, else a program of the next island in turn (_background)."""
        if self.waiting:
            return await self.tune(self.waiting.popleft())
        db = self.engine.db
        island = self.rounds % len(db.archive.islands)
        self.rounds += 1
        step = await self.tune(self._background(island))
        if self.generations and step.trials:
            db.advance(island)
        return step

    def _background(self, island: int) -> Program:
        """What a turn tunes on this island when no child waits (`tuning.background_pick`): the
        archive's pick, or the island's best, whose descent then goes on."""
        db = self.engine.db
        if self.config.background_pick == "best":
            best = db.archive.best(island)
            return db.seed(island) if best is None else db.get(best[1])
        return db.ask(island, self.engine.rng).parent

    async def tune(self, parent: Program) -> Step:
        """Tune one program's literals; the best trial, where it beats the parent, is stored as
        a `tuned` child, and the tuning as a row either way. Spends 0 trials where there is
        nothing to tune, or no budget."""
        t, engine = self.config, self.engine
        if parent.code is None or parent.objective is None:  # not an evaluated program
            return Step(0)
        started = time.time()
        tuning = self._tuning(parent)
        tuned = await tuning.run(self._trial, t.trials)
        row = Tuning(run_id=engine.db.run_id, parent_id=parent.id, trials=tuned.trials,
                     parameters=tuned.parameters, start_objective=parent.objective,
                     best_objective=tuned.best.objective if tuned.best else None, started_at=started,
                     elapsed_s=time.time() - started)
        if tuned.best is None or tuned.best.result is None:
            if tuned.trials:  # its trials were spent all the same: the row counts them
                self._keep(parent, tuning)
                engine.db.add(row)
                engine.emit("tuned", f"tuned #{parent.id}: {tuned.parameters} literals, {tuned.trials} trials, "
                            f"none above {parent.objective:.4f}", parent=parent.id, program=None,
                            trials=tuned.trials, parameters=tuned.parameters, objective=None, outcome=None)
            return Step(tuned.trials)
        child = Program(island=parent.island, parent_id=parent.id, origin=self.origin,
                        generation=parent.generation + 1, code=tuned.best.code, status="pending")
        engine.store(child, tuned.best.result, started, row)
        if child.id is not None and child.objective == tuning.objective:
            self._keep(child, tuning)
        engine.emit("tuned", f"tuned #{parent.id} -> #{child.id}: {tuned.parameters} literals, "
                    f"{tuned.trials} trials, objective {parent.objective:.4f} -> {child.objective:.4f}",
                    parent=parent.id, program=child.id, trials=tuned.trials, parameters=tuned.parameters,
                    objective=child.objective, outcome=child.outcome)
        engine.progress()
        return Step(tuned.trials, child.objective)

    def _tuning(self, parent: Program) -> TuningState:
        """The tuning that ended on this program's code, to go on with; else a fresh one."""
        t, engine = self.config, self.engine
        assert parent.code is not None and parent.objective is not None
        kept = self.states.pop(parent.code_hash or "", None)
        if kept is not None and kept.objective == parent.objective:
            return kept
        seed = pipeline.request_seed(engine.seed, parent.id, engine.db.tunings_of(parent.id))
        return TuningState(parent.code, parent.objective, t.sigma, seed, t.max_literals, engine.rng,
                      t.stall_trials or None)

    def _keep(self, program: Program, tuning: TuningState) -> None:
        """Keep the state under the program's code (its hash, as the store identifies code)."""
        if not self.config.resume or tuning.exhausted or program.code_hash is None:
            return
        self.states[program.code_hash] = tuning
        while len(self.states) > KEPT_STATES:
            self.states.popitem(last=False)

    async def _trial(self, code: str) -> Trial | None:
        if self.engine.ledger.left() not in (None, Stop.LLM_CALLS):
            return None  # out of time, or the target is met: a tuning stops mid-way
        ran = await self.engine.claimed_run(code)
        return None if ran is None else Trial(code, ran[0].objective, ran[0], ran[0].status == "ok")
