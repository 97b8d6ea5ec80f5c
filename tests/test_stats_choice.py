"""The plan's choice rule by simulation (``training.upgrades.plan.decide``): a dearer option
that gains no more than a cheaper one is picked at most 5% of the time, alone or in a
chain, on the final score and on the gain while a migration runs; a real lead of about
three standard errors is picked most of the time.

Each simulated plan is a validation set of items (one image, five captions whose hits
share the item's difficulty), scored by the plan's own ``Scorer`` (a bootstrap over the
items) and decided by ``recommend``. Options of equal true gain hit each query with the
same probability and agree on most queries (as two routes of one model do)."""

from __future__ import annotations

import numpy as np

from training.upgrades.plan.decide import Constraints, Scored, recommend
from training.upgrades.plan.measure import Scorer

ITEMS, CAPTIONS = 200, 5
PLANS = 250  # per case: a 5% rate is then measured to about +/- 1.4%
AGREE = 0.7  # share of queries on which an option repeats a common outcome


class World:
    """One simulated validation set: per direction each query's hit probability, the
    items' units, and OLD's and NEW's hits (the gain's zero and one)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng
        p = rng.beta(2, 2, ITEMS) * 0.6 + 0.2  # each item's difficulty
        self.prob = {"t2i": np.repeat(p, CAPTIONS), "i2t": p}
        self.units = {"t2i": np.repeat(np.arange(ITEMS), CAPTIONS), "i2t": np.arange(ITEMS)}
        self.common = self.hits(0.0)
        self.scorer = Scorer(self.hits(-0.2), self.hits(0.2), units=self.units,
                             seed=int(rng.integers(1 << 30)))

    def hits(self, lift: float, agree: float = 0.0) -> dict[str, np.ndarray]:
        """Per direction [Q] hits at the items' probability + ``lift``; with ``agree``,
        that share of queries repeats the common outcome (lifted too: a real lead holds on
        every query)."""
        out = {}
        for d, p in self.prob.items():
            q = np.clip(p + lift, 0, 1)
            fresh = self.rng.random(len(p)) < q
            common = self.common[d] | (self.rng.random(len(p)) < lift) if agree else fresh
            out[d] = np.where(self.rng.random(len(p)) < agree, common, fresh)
        return out

    def route(self, name: str, cost: float, lift: float = 0.0) -> Scored:
        score, draws = self.scorer.score(self.hits(lift, AGREE))
        return Scored(name, cost, cost, 0.0, 0.0, True, score, draws)

    def migration(self, name: str, cost: float, lift: float = 0.0) -> Scored:
        """A migration: it ends at NEW's hits (the same for every migration); on the way
        (half the backfill) its own hits, ``lift`` above the others'."""
        served = {0.0: self.scorer.old, 0.5: self.hits(lift, AGREE), 1.0: self.scorer.new}
        score, draws = self.scorer.score(self.scorer.new)
        area, area_draws = self.scorer.area(served)
        return Scored(name, cost, cost, 0.0, 0.0, True, score, draws, area, area_draws)


def picks(make: callable, plans: int = PLANS, seed: int = 0) -> tuple[list[str], list[list]]:
    """(the option each simulated plan recommends, the options of each plan)."""
    rng = np.random.default_rng(seed)
    chosen, options = [], []
    for _ in range(plans):
        opts = make(World(rng))
        chosen.append(recommend(opts, Constraints())["option"])
        options.append(opts)
    return chosen, options


def test_a_dearer_route_of_equal_gain_is_picked_at_most_5_percent_of_the_time() -> None:
    """Two, three and four routes of the same true gain, cheapest first: any pick other
    than the cheapest is a false pick (measured: 1.2%, 1.6%, 1.6%; the "lower" objective
    makes the test conservative). The rule this replaced (a lead beyond one error) picked
    one 9.2%, 23.6% and 27.2% of the time on these same plans."""
    rates = {}
    for n in (2, 3, 4):
        chosen, _ = picks(lambda w, n=n: [w.route(f"r{k}", 0.01 * (k + 1)) for k in range(n)],
                          seed=n)
        rates[n] = float(np.mean([c != "r0" for c in chosen]))
    assert max(rates.values()) <= 0.05, rates


def test_a_dearer_route_with_a_real_lead_of_about_three_errors_is_picked() -> None:
    """One dearer route truly better, by about three standard errors of the difference
    (measured: 2.9 on average here): picked in about 89% of plans alone (a one-sided test
    at 5% passes 90% of leads of 2.9 errors), and still most of the time at the end of a
    chain of four (measured 76%: each test is then at 5%/3)."""
    chosen, options = picks(lambda w: [w.route("cheap", 0.01), w.route("dear", 0.02, 0.12)])
    z = [(o[1].score - o[0].score) / np.nanstd(o[1].draws - o[0].draws) for o in options]
    assert 2.3 < np.mean(z) < 3.3
    assert np.mean([c == "dear" for c in chosen]) >= 0.8
    chosen, _ = picks(lambda w: [w.route(f"r{k}", 0.01 * (k + 1), 0.12 * (k == 3))
                                 for k in range(4)], seed=1)
    assert np.mean([c == "r3" for c in chosen]) >= 0.65


def test_migrations_that_deliver_the_same_while_they_run_keep_the_cheapest() -> None:
    """Three migrations ending at NEW's gain (equal by construction) whose curves are
    equal in truth: the tie-break by the gain while they run picks a dearer one at most
    5% of the time (measured: 0.8%; the rule this replaced: 18.8%); one truly ahead
    half-way by about three errors of the area's difference (measured 2.9) is picked
    most of the time (measured 71%: the chain runs four tests, each at 5%/4)."""
    def chain(w: World, lead: float = 0.0) -> list[Scored]:
        return [w.migration("migrate", 1.0), w.migration("transform+learned", 1.01, lead),
                w.migration("transform+random", 1.02)]
    chosen, _ = picks(chain, seed=5)
    assert np.mean([c != "migrate" for c in chosen]) <= 0.05
    chosen, _ = picks(lambda w: chain(w, 0.12), plans=100, seed=6)
    assert np.mean([c == "transform+learned" for c in chosen]) >= 0.6


def test_the_rule_and_each_reason_state_the_test() -> None:
    w = World(np.random.default_rng(9))
    decision = recommend([w.route("cheap", 0.01), w.route("dear", 0.02)], Constraints())
    assert "5%" in decision["rule"] and decision["alpha"] == 0.05
    assert "one-sided test at 5%" in decision["rejected"]["dear"]
    assert "1 test at 5.00% each" in decision["rejected"]["dear"]
