"""The archive alone, in memory: cells, elites, sampling ratios, inspirations, migration."""
from collections import Counter

import numpy as np
import pytest

from evolve.archive import Archive, cell_of
from evolve.config import Descriptor, Search

AXES = [Descriptor(name="a", low=0, high=1, bins=4), Descriptor(name="b", low=0, high=1, bins=4)]


def filled(islands=2, per_island=6, **search) -> Archive:
    """Programs 1.. with objectives 0..per_island-1 spread over cells of each island."""
    archive = Archive(Search(islands=islands, **search))
    pid = 0
    for island in range(islands):
        for i in range(per_island):
            pid += 1
            archive.place(pid, island, float(i), cell_of({"a": i / per_island, "b": island / 4}, AXES))
    return archive


def test_cell_binning_clips_to_edges():
    assert cell_of({"a": 0.0, "b": 0.99}, AXES) == "0,3"
    assert cell_of({"a": -5, "b": 7}, AXES) == "0,3"
    assert cell_of({"a": 0.5, "b": 0.25}, AXES) == "2,1"
    assert cell_of({"a": float("nan"), "b": 0}, AXES) is None
    assert cell_of({"b": 0}, AXES) is None


def test_a_cell_changes_hands_only_for_a_strictly_higher_objective():
    archive = Archive(Search(islands=1))
    assert archive.place(1, 0, 1.0, "0,0")
    assert not archive.place(2, 0, 1.0, "0,0")  # a tie keeps the incumbent
    assert not archive.place(3, 0, 0.5, "0,0")
    assert archive.place(4, 0, 1.5, "0,0")
    assert not archive.place(5, 0, 9.0, None)  # no cell: a member, never an elite
    assert archive.islands[0].elites == {"0,0": (4, 1.5)}
    assert archive.best(0) == (9.0, 5) and archive.islands[0].members == [1, 2, 3, 4, 5]


def test_sampling_follows_the_ratios_and_is_seeded():
    archive = filled(exploit_ratio=0.5, explore_ratio=0.3, migrate_ratio=0.2)
    rng = np.random.default_rng(1)
    picks = [archive.pick(0, rng) for _ in range(4000)]
    share = Counter(p.how for p in picks)
    assert share["exploit"] / 4000 == pytest.approx(0.5, abs=0.03)
    assert share["explore"] / 4000 == pytest.approx(0.3, abs=0.03)
    assert share["migrate"] / 4000 == pytest.approx(0.2, abs=0.03)
    assert all(p.parent > 6 for p in picks if p.how == "migrate")  # island 1's programs
    assert all(p.parent <= 6 for p in picks if p.how != "migrate")
    assert archive.pick(0, np.random.default_rng(7)) == archive.pick(0, np.random.default_rng(7))


def test_inspirations_are_the_top_and_diverse_elites_never_the_parent():
    archive = filled(islands=1, per_island=8, exploit_ratio=1, explore_ratio=0, migrate_ratio=0,
                     top_inspirations=2, diverse_inspirations=1)
    for seed in range(20):
        pick = archive.pick(0, np.random.default_rng(seed))
        assert pick.parent not in pick.inspirations
        assert len(pick.inspirations) == len(set(pick.inspirations)) == 3
        top = [pid for _, pid in archive.islands[0].top if pid != pick.parent][:2]
        assert pick.inspirations[:2] == top


def test_an_empty_island_falls_back_to_its_best_and_seed_mode_picks_no_id():
    archive = Archive(Search(islands=2, exploit_ratio=1, explore_ratio=0, migrate_ratio=0))
    archive.place(1, 0, 2.0, None)  # a member without a cell: no elites to exploit
    assert archive.pick(0, np.random.default_rng(0)).how == "exploit-fallback"
    assert archive.pick(0, np.random.default_rng(0)).parent == 1
    seeded = Archive(Search(islands=1, parents="seed"))
    assert seeded.pick(0, np.random.default_rng(0)).parent is None


def test_every_migration_every_generations_the_best_moves_around_the_ring():
    archive = filled(islands=3, migration_every=2)
    assert archive.advance(2) is None
    migration = archive.advance(2)
    assert migration is not None and migration.target == 0 and migration.source == archive.best(2)[1]
    assert archive.advance(2) is None and archive.islands[2].generation == 3
    assert Archive(Search(islands=1, migration_every=1)).advance(0) is None  # no ring of one
