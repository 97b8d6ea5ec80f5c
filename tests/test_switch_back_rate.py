"""The rate of a false switch back after a progressive switch
(``service.jobkinds.migrate.check``): simulated migrations, each looked at as the gateway
does (every 5% of the backfill after the switch, every served direction), decided by the
rule as built (``check.switches_back``).

The simulated migration: a validation set of ``UNITS`` images, each with ``CAPTIONS``
captions (t2i: one query per caption, the image is its unit; i2t: one query per image).
Each unit has a difficulty ``p ~ Beta(2, 2)`` (R@1 about 0.5, spread over units): the
route answers each of its queries right with probability ``p``, and so does the side
(the null: the side is exactly as good as the route) or with ``0.8 p`` (10 points of R@1
below). Between two looks the backfill re-embeds more items, so the side's answers move:
``CHANGED`` of its queries are answered anew at each look (the route's stay). The
gallery switched at 0, so there are 20 looks (0.05, 0.10, ..., 1.0): the most any
migration has.

The tolerance of a rate: a simulated rate estimates the true one with a binomial error
``sqrt(a (1 - a) / n)`` over ``n`` migrations; a rate within 3 of those errors above the
stated level (about 0.1% of the time by chance for a rule exactly at it) passes. 2,000
migrations make that 5% + 1.5%.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from service.jobkinds.migrate.check import (
    CHECK_EVERY,
    SWITCH_BACK_ALPHA,
    look_level,
    looks_at_most,
    switches_back,
)
from training.upgrades.transform.simulate import falls_below, null_lead, one_sided, z_bound

UNITS = 300
CAPTIONS = 5
CHANGED = 0.2  # share of the side's queries answered anew at each look
MIGRATIONS = 2000
SERVED = ("t2i", "i2t")
SWITCHED_AT = 0.0
LOOKS = tuple(round(CHECK_EVERY * k, 4) for k in range(1, 21))  # the looks after it


def tolerance(level: float, n: int) -> float:
    return 3 * math.sqrt(level * (1 - level) / n)


def unit_ids(direction: str, units: int) -> np.ndarray:
    return np.repeat(np.arange(units), CAPTIONS if direction == "t2i" else 1)


def simulate(migrations: int, seed: int, worse: float = 1.0, units: int = UNITS,
             changed: float = CHANGED, served: tuple[str, ...] = SERVED,
             ) -> dict[str, dict[str, np.ndarray]]:
    """Direction -> {"routed": [M, Q], "side": [M, L, Q]} bool top-1 hits of ``migrations``
    simulated migrations at each of the ``LOOKS`` (the side answers right with ``worse *
    p``)."""
    rng = np.random.default_rng(seed)
    out = {}
    for d in served:
        owner = unit_ids(d, units)
        p = rng.beta(2, 2, size=(migrations, units))[:, owner]  # [M, Q]
        routed = rng.random(p.shape) < p
        side = np.empty((migrations, len(LOOKS), len(owner)), bool)
        side[:, 0] = rng.random(p.shape) < worse * p
        for k in range(1, len(LOOKS)):
            anew = rng.random(p.shape) < changed
            side[:, k] = np.where(anew, rng.random(p.shape) < worse * p, side[:, k - 1])
        out[d] = {"routed": routed, "side": side}
    return out


def looks(sim: dict[str, dict[str, np.ndarray]], m: int):
    """(fraction, previous, hits) of each look of migration ``m``, in order."""
    previous = SWITCHED_AT
    for k, fraction in enumerate(LOOKS):
        yield fraction, previous, {
            "side": {d: v["side"][m, k] for d, v in sim.items()},
            "routed": {d: v["routed"][m] for d, v in sim.items()}}
        previous = fraction


def switched_back(sim: dict[str, dict[str, np.ndarray]], units: int = UNITS,
                  ) -> tuple[np.ndarray, np.ndarray, int]:
    """Per migration, whether the rule as built switched it back at some look and whether
    a test at 5% per look and direction would have (the rule before the shared budget);
    and how many of the single tests (every look, every direction, at the rule's levels)
    rejected."""
    served = list(sim)
    ids = {d: unit_ids(d, units) for d in served}
    migrations = len(next(iter(sim.values()))["routed"])
    rule, old = np.zeros(migrations, bool), np.zeros(migrations, bool)
    rejected = 0
    for m in range(migrations):
        for fraction, previous, hits in looks(sim, m):
            leads = [null_lead(hits, "routed", "side", d, ids[d]) for d in served]
            level = look_level(fraction, previous, SWITCHED_AT, len(served))
            rejected += sum(one_sided(*lead, level) for lead in leads)
            if not rule[m]:
                rule[m] = switches_back(hits, ids, served, fraction, previous, SWITCHED_AT)[0]
            old[m] = old[m] or any(one_sided(*lead, 0.05) for lead in leads)
    return rule, old, rejected


@pytest.fixture(scope="module")
def null() -> tuple[np.ndarray, np.ndarray, int]:
    return switched_back(simulate(MIGRATIONS, seed=1))


def test_the_looks_share_one_budget_whatever_their_spacing() -> None:
    """The levels of a migration's looks add up to the stated rate at most: evenly spaced
    (Bonferroni: 5% / 20 looks / 2 directions) or not (a look delayed takes more)."""
    even = [look_level(f, p, 0.0, 2) for f, p in zip(LOOKS, (0.0, *LOOKS[:-1]), strict=True)]
    assert even == pytest.approx([SWITCH_BACK_ALPHA / 20 / 2] * 20)
    assert looks_at_most(0.0) == 20 and looks_at_most(0.01) == 19 and looks_at_most(0.15) == 17
    rng = np.random.default_rng(0)
    for switched in (0.0, 0.01, 0.15, 0.6):
        at, previous, spent = switched, switched, 0.0
        while at < 1.0:
            at = round(min(1.0, at + CHECK_EVERY + rng.exponential(0.02)), 4)
            spent += look_level(at, previous, switched, 2) * 2
            previous = at
        assert spent == pytest.approx(SWITCH_BACK_ALPHA)
    with pytest.raises(ValueError, match="has not grown"):
        look_level(0.3, 0.3, 0.1)
    with pytest.raises(ValueError, match="no backfill left"):
        look_level(1.0, 1.0, 1.0)


def test_a_side_as_good_as_the_route_is_switched_back_at_most_at_the_stated_rate(
        null: tuple[np.ndarray, np.ndarray, int]) -> None:
    rule, _, rejected = null
    assert rule.mean() <= SWITCH_BACK_ALPHA + tolerance(SWITCH_BACK_ALPHA, MIGRATIONS)
    # Each single test holds its small level (0.125%): no draws estimate its tail. The
    # tests of one migration are correlated, so their count's spread is wider than a
    # binomial's: half the level again is the margin.
    tests = MIGRATIONS * len(LOOKS) * len(SERVED)
    assert rejected / tests <= 1.5 * SWITCH_BACK_ALPHA / len(LOOKS) / len(SERVED)


def test_the_rate_holds_on_a_small_validation_set_with_independent_looks() -> None:
    """The hardest case for the bound: 100 units (the normal approximation's tail is
    coarsest) and every answer of the side drawn anew at each look (no correlation
    between looks for the union bound to gain from)."""
    rule, _, _ = switched_back(simulate(1000, seed=2, units=100, changed=1.0), units=100)
    assert rule.mean() <= SWITCH_BACK_ALPHA + tolerance(SWITCH_BACK_ALPHA, 1000)


def test_a_test_at_five_percent_per_look_exceeds_the_rate(
        null: tuple[np.ndarray, np.ndarray, int]) -> None:
    """The rule before the shared budget, on the same migrations: far above 5%, beyond
    the binomial error (so the simulation can tell a rule that does not hold it)."""
    _, old, _ = null
    assert old.mean() > SWITCH_BACK_ALPHA + tolerance(SWITCH_BACK_ALPHA, MIGRATIONS)
    assert old.mean() > 4 * SWITCH_BACK_ALPHA


def test_a_side_ten_points_below_the_route_is_switched_back() -> None:
    """Power: the side's R@1 10 points below the route's (0.4 against 0.5) on 300
    images. A gallery serving both directions: practically always; one serving only
    image->text (300 single-query units, the least evidence): still most of the time."""
    both, _, _ = switched_back(simulate(400, seed=3, worse=0.8))
    assert both.mean() >= 0.95
    i2t, _, _ = switched_back(simulate(400, seed=4, worse=0.8, served=("i2t",)))
    assert i2t.mean() >= 0.75


def test_the_rule_decides_as_falls_below_at_its_level() -> None:
    """``switches_back`` is ``falls_below`` at ``look_level``; a direction counts alone."""
    sim = simulate(3, seed=5, worse=0.6)
    ids = {d: unit_ids(d, UNITS) for d in SERVED}
    for fraction, previous, hits in looks(sim, 0):
        below, level = switches_back(hits, ids, list(SERVED), fraction, previous, SWITCHED_AT)
        assert level == pytest.approx(SWITCH_BACK_ALPHA * CHECK_EVERY / 2)
        assert below == falls_below(hits, "side", "routed", SERVED, ids, alpha=level)
        lead, se = null_lead(hits, "routed", "side", "t2i", ids["t2i"])
        assert below == (lead > z_bound(level) * se or falls_below(
            hits, "side", "routed", ["i2t"], ids, alpha=level))


def test_a_check_records_its_level_its_look_and_how_many_looks_there_can_be(
        tmp_path) -> None:
    """``live_check`` on a migration's saved validation set and listing (the folder it is
    given) and a store's two sides: a side unrelated to the queries falls below a route
    that finds every item; the same vectors on both sides do not. Each check spends the
    budget from the previous one."""
    import json
    from types import SimpleNamespace

    from service.jobkinds.migrate.check import live_check
    from service.jobkinds.migrate.transform import LISTING, VALIDATION, Simulation
    from training.upgrades.transform.simulate import Items, Queries

    rng = np.random.default_rng(0)
    n, dim = 80, 16

    def unit(rows: int) -> np.ndarray:
        v = rng.normal(size=(rows, dim)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    class Store:  # every listed item holds the same vectors on both sides
        def __init__(self) -> None:
            self.stored = {f"g{i}": {"image": unit(1)[0], "text": unit(1)[0]}
                           for i in range(30)}

        def vectors(self, collection: str, ids: list[str]) -> dict:
            return {i: self.stored[i] for i in ids}

    def saved(folder, side_as_good: bool) -> None:
        folder.mkdir()
        old = {"image": unit(n), "text": unit(n)}
        other = {"image": unit(n), "text": unit(n)}
        route = {"text": old["image"].copy(), "image": old["text"].copy()}
        items = Items(old, old if side_as_good else other, old if side_as_good else other)
        sim = Simulation(items, Queries(route if side_as_good else {"text": unit(n),
                                                                     "image": unit(n)},
                                        route, route, {"t2i": np.eye(n, dtype=bool),
                                                       "i2t": np.eye(n, dtype=bool)}),
                         {"image": list(range(n)), "text": list(range(n))},
                         {"t2i": np.arange(n), "i2t": np.arange(n)}, n)
        sim.save(folder / VALIDATION, "random", ["t2i", "i2t"])
        (folder / LISTING).write_text(json.dumps([{"id": f"g{i}"} for i in range(30)]))

    store = Store()
    sides = SimpleNamespace(target=SimpleNamespace(collection="new"),
                            source=SimpleNamespace(collection="old"))
    record = SimpleNamespace(migration=sides)
    saved(tmp_path / "below", side_as_good=False)
    first = live_check(store, record, tmp_path / "below", 0.25, seed=0, switched_at=0.2)
    assert first is not None and first["below"] and first["distractors"] == 30
    assert first["R@1"]["t2i"]["routed"] > first["R@1"]["t2i"]["side"]
    assert (first["look"], first["looks_at_most"], first["overall_level"]) == (1, 16, 0.05)
    assert first["level"] == pytest.approx(0.05 * 0.05 / 0.8 / 2, abs=1e-7)
    assert "look 1 of at most 16" in first["why"]
    later = live_check(store, record, tmp_path / "below", 0.4, seed=0, switched_at=0.2,
                       checks=[first])
    assert later is not None and later["look"] == 2
    assert later["level"] == pytest.approx(0.05 * 0.15 / 0.8 / 2, abs=1e-7)
    assert later["spent"] == pytest.approx(0.05 * 0.2 / 0.8)
    with pytest.raises(ValueError, match="has not grown"):
        live_check(store, record, tmp_path / "below", 0.25, seed=0, switched_at=0.2,
                   checks=[first])
    saved(tmp_path / "good", side_as_good=True)
    good = live_check(store, record, tmp_path / "good", 0.25, seed=0, switched_at=0.2)
    assert good is not None and not good["below"]
    assert live_check(store, record, tmp_path / "none", 0.25, seed=0, switched_at=0.2) is None
