"""The archive: islands of MAP-Elites grids, parent and inspiration sampling, migration.

An in-memory object of ids and objectives, in the manner of FunSearch's programs database and
pyribs' archives: it decides, the store (evolve/store/database.py) persists what it decided and
rebuilds it on open. Kept apart so that sampling and placement are tested without a database and
stay O(1)-ish at 100k stored programs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from evolve.config import Descriptor, Search


def cell_of(descriptors: dict[str, float], axes: list[Descriptor]) -> str | None:
    """Uniform bins per axis; values outside [low, high] go to the edge bins."""
    idx = []
    for ax in axes:
        value = descriptors.get(ax.name)
        if value is None or not math.isfinite(value):
            return None
        pos = int((value - ax.low) / (ax.high - ax.low) * ax.bins)
        idx.append(min(max(pos, 0), ax.bins - 1))
    return ",".join(map(str, idx))


@dataclass
class Island:
    """What sampling needs of one island."""
    members: list[int] = field(default_factory=list)  # ok programs, for exploration
    elites: dict[str, tuple[int, float]] = field(default_factory=dict)  # cell -> (id, objective)
    top: list[tuple[float, int]] = field(default_factory=list)  # best few, descending
    generation: int = 0
    last_migration: int = 0

    TOP_KEEP = 16

    def add(self, pid: int, objective: float) -> None:
        self.members.append(pid)
        if len(self.top) < self.TOP_KEEP or objective > self.top[-1][0]:
            self.top.append((objective, pid))
            self.top.sort(key=lambda t: (-t[0], t[1]))
            del self.top[self.TOP_KEEP:]

    def offer(self, cell: str, pid: int, objective: float) -> bool:
        """A child takes a cell only with a strictly higher objective."""
        held = self.elites.get(cell)
        if held is not None and objective <= held[1]:
            return False
        self.elites[cell] = (pid, objective)
        return True

    def best(self) -> tuple[float, int] | None:
        return self.top[0] if self.top else None


@dataclass(frozen=True)
class Pick:
    """A parent and its inspirations, by id; `how` says which rule chose the parent."""
    island: int
    parent: int | None  # None: `parents: seed`, the island's seed (the store knows which row)
    inspirations: list[int]
    how: str  # exploit | explore | migrate (| -fallback) | seed


@dataclass(frozen=True)
class Migration:
    source: int  # the program that moves (a copy of it)
    target: int  # the island it moves to


class Archive:
    def __init__(self, search: Search):
        self.search = search
        self.islands = [Island() for _ in range(search.islands)]

    def place(self, pid: int, island: int, objective: float, cell: str | None) -> bool:
        """An ok program joins its island and competes for its cell; True if it took the cell."""
        idx = self.islands[island]
        idx.add(pid, objective)
        return cell is not None and idx.offer(cell, pid, objective)

    def best(self, island: int) -> tuple[float, int] | None:
        """(objective, id) of the island's best, or None while it has no ok program."""
        return self.islands[island].best()

    def pick(self, island: int, rng: np.random.Generator) -> Pick:
        """Parent by the YAML's exploit/explore/migrate ratios, plus top and diverse inspirations.

        With `parents: seed` every pick is the island's seed and nothing else: independent
        sampling, the baseline that evolution must beat."""
        idx = self.islands[island]
        s = self.search
        if s.parents == "seed":
            return Pick(island, None, [], "seed")
        r = rng.random()
        if r < s.exploit_ratio:
            how, pool = "exploit", [pid for pid, _ in idx.elites.values()]
        elif r < s.exploit_ratio + s.explore_ratio:
            how, pool = "explore", idx.members
        else:
            how = "migrate"
            pool = [pid for j, other in enumerate(self.islands) if j != island
                    for pid, _ in other.elites.values()]
        if not pool:  # e.g. a fresh island: fall back to its best
            how, pool = how + "-fallback", [pid for _, pid in idx.top[:1]]
        parent = pool[int(rng.integers(len(pool)))]
        return Pick(island, parent, self._inspirations(idx, parent, rng), how)

    def _inspirations(self, idx: Island, parent: int, rng: np.random.Generator) -> list[int]:
        top = [pid for _, pid in idx.top if pid != parent][: self.search.top_inspirations]
        others = [pid for pid, _ in idx.elites.values() if pid != parent and pid not in top]
        k = min(self.search.diverse_inspirations, len(others))
        diverse = [others[i] for i in rng.choice(len(others), size=k, replace=False)] if k else []
        return top + diverse

    def advance(self, island: int) -> Migration | None:
        """Count one generation on the island; every `migration_every` its best moves to the next
        island of the ring. Returns the migration to store, if any."""
        idx = self.islands[island]
        idx.generation += 1
        if len(self.islands) < 2 or idx.generation - idx.last_migration < self.search.migration_every:
            return None
        idx.last_migration = idx.generation
        best = idx.best()
        return None if best is None else Migration(best[1], (island + 1) % len(self.islands))
