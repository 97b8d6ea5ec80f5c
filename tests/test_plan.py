"""The plan's measure and choice (``training.upgrades.plan``), without a service: shares with
paired bootstrap errors, migrations simulated on the validation set, and a recommendation
that fits each constraint, never loses to the best fitting option beyond the error, and
keeps the cheaper option when the dearer one wins only by noise."""

from __future__ import annotations

import numpy as np
import pytest

from training.errors import ConfigError
from training.upgrades.plan.decide import Constraints, Scored, recommend
from training.upgrades.plan.measure import GRID, Embedded, Scorer, migration_options


def scored(name: str, score: float, cost: float, *, ms: float | None = 0.0,
           flip: float | None = 0.0, spread: float = 0.01, area: float | None = None,
           seed: int = 0, measured: bool = True) -> Scored:
    rng = np.random.default_rng(seed)
    draws = score + rng.normal(0, spread, 500)
    return Scored(name, cost, cost * 10, ms, flip, measured, score, draws,
                  area, None if area is None else area + rng.normal(0, spread, 500))


OPTIONS = [scored("cheap", 0.30, 0.02, ms=0.1, flip=0.01, seed=1),
           scored("fast-but-flips", 0.50, 0.03, ms=0.2, flip=0.08, seed=2),
           scored("slow-query", 0.60, 0.03, ms=9.0, flip=0.01, seed=3),
           scored("migrate", 1.00, 1.00, ms=1.0, flip=0.02, area=0.2, seed=4)]


def best_fitting(options: list[Scored], c: Constraints) -> Scored:
    return max((o for o in options if o.measured and not c.violations(o)),
               key=lambda o: o.score or -1)


@pytest.mark.parametrize("constraints,expected", [
    (Constraints(), "migrate"),
    (Constraints(budget=0.1), "slow-query"),
    (Constraints(budget_gpu_hours=0.5), "slow-query"),
    (Constraints(budget=0.1, max_added_latency_ms=1.0), "fast-but-flips"),
    (Constraints(budget=0.1, max_added_latency_ms=1.0, max_negative_flip=0.05), "cheap"),
    (Constraints(max_negative_flip=0.015), "slow-query"),
])
def test_the_recommendation_is_the_best_option_that_fits_each_constraint(
        constraints: Constraints, expected: str) -> None:
    decision = recommend(OPTIONS, constraints)
    assert decision["option"] == expected
    best = best_fitting(OPTIONS, constraints)
    chosen = next(o for o in OPTIONS if o.name == decision["option"])
    assert not constraints.violations(chosen)
    assert chosen.score >= best.score - 1e-12  # never worse than the best that fits
    for o in OPTIONS:  # every other option says why not
        if o.name != expected:
            assert decision["rejected"][o.name]


def test_a_constraint_that_nothing_meets_recommends_nothing_and_says_why() -> None:
    decision = recommend(OPTIONS, Constraints(budget=0.001))
    assert decision["option"] is None
    assert "no measured option fits" in decision["why"]
    assert all("> budget 0.001" in decision["rejected"][o.name] for o in OPTIONS)


def test_a_dearer_option_that_wins_only_by_noise_loses_to_the_cheaper_one() -> None:
    near = [scored("cheap", 0.40, 0.02, spread=0.05, seed=1),
            scored("dear", 0.43, 0.05, spread=0.05, seed=2)]
    decision = recommend(near, Constraints())
    assert decision["option"] == "cheap"
    assert "beyond the error" in decision["rejected"]["dear"]
    clear = [near[0], scored("dear", 0.70, 0.05, spread=0.05, seed=2)]
    assert recommend(clear, Constraints())["option"] == "dear"


def test_equal_final_gains_are_told_apart_by_the_gain_while_the_backfill_runs() -> None:
    plain = scored("migrate", 1.0, 1.0, spread=0.02, area=0.10, seed=1)
    early = scored("migrate:transform+learned", 1.0, 1.01, spread=0.02, area=0.45, seed=2)
    decision = recommend([plain, early], Constraints())
    assert decision["option"] == "migrate:transform+learned"
    assert "while it runs" in decision["rejected"]["migrate"]
    same = scored("migrate:transform+random", 1.0, 1.01, spread=0.02, area=0.11, seed=3)
    decision = recommend([plain, same], Constraints())
    assert decision["option"] == "migrate"
    assert "delivers no more while it runs" in decision["rejected"][same.name]


def test_estimated_options_are_never_recommended() -> None:
    xbt = Scored("xbt", 0.5, 5.0, None, None, measured=False)
    decision = recommend([xbt, *OPTIONS[:1]], Constraints())
    assert decision["option"] == "cheap"
    assert decision["rejected"]["xbt"].startswith("not measured")


@pytest.mark.parametrize("bad", [{"budget": -1}, {"max_negative_flip": 2.0},
                                 {"max_added_latency_ms": float("nan")}])
def test_bad_constraints_are_refused_by_name(bad: dict) -> None:
    with pytest.raises(ConfigError, match=next(iter(bad))):
        Constraints(**bad)


def _world(n: int = 300, dim: int = 16, seed: int = 0) -> Embedded:
    """Items whose NEW vectors find their queries and whose OLD vectors are noisier."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n, dim)).astype(np.float32)

    def unit(x: np.ndarray) -> np.ndarray:
        return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    new = unit(base + 0.3 * rng.normal(size=base.shape))
    old = unit(base + 1.2 * rng.normal(size=base.shape))
    q_new = unit(base + 0.3 * rng.normal(size=base.shape))
    q_old = unit(base + 1.2 * rng.normal(size=base.shape))
    eye = np.eye(n, dtype=bool)
    return Embedded({"image": old, "text": old}, {"image": new, "text": new},
                    {"text": q_old, "image": q_old}, {"text": q_new, "image": q_new},
                    {"t2i": eye, "i2t": eye})


def test_shares_carry_paired_bootstrap_errors_and_the_objective_is_the_lower_direction() -> None:
    emb = _world()
    old = emb.hits(emb.query_old, emb.item_old)
    new = emb.hits(emb.query_new, emb.item_new)
    scorer = Scorer(old, new)
    assert scorer.shares(new)["t2i"] == {"share": 1.0, "se": 0.0}
    assert scorer.shares(old)["i2t"]["share"] == 0.0
    half = {"t2i": np.where(np.arange(len(old["t2i"])) % 2 == 0, new["t2i"], old["t2i"]),
            "i2t": new["i2t"]}
    value, draws = scorer.score(half)
    assert value == pytest.approx(scorer.share(half, "t2i"))  # the lower of the two
    assert 0 < np.nanstd(draws) < 0.2 and draws.shape == (1000,)
    with pytest.raises(ConfigError, match="objective"):
        Scorer(old, new, objective="best")


def test_a_progressive_migration_serves_the_route_until_its_side_beats_it() -> None:
    emb = _world()
    n = len(emb.item_old["image"])
    routed = {"text": emb.query_old["text"], "image": emb.query_old["image"]}
    orders = {"random": list(np.random.default_rng(0).permutation(n))}
    # transformed vectors carry nothing: the side beats the route only part way through
    rng = np.random.default_rng(5)
    noise = rng.normal(size=emb.item_new["image"].shape).astype(np.float32)
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)
    migs = migration_options(emb, routed, {"image": noise, "text": noise}, orders, None)
    plain, _, no_side = migs["migrate"]
    served, switch, side = migs["migrate:transform+random"]
    assert no_side is None and all((side[f][d] == served[f][d]).all()
                                   for f in GRID if f >= switch for d in ("t2i", "i2t"))
    assert set(served) == set(GRID)
    assert all(plain[f] is not None for f in GRID)
    assert switch is not None and 0 < switch < 1
    route_hits = emb.hits(routed, emb.item_old)
    for f in GRID:
        if f < switch:
            assert all((served[f][d] == route_hits[d]).all() for d in ("t2i", "i2t"))
        else:  # once switched, never below the route
            assert all(served[f][d].mean() > route_hits[d].mean() for d in ("t2i", "i2t"))
    assert all(served[1.0][d].mean() == emb.hits(emb.query_new, emb.item_new)[d].mean()
               for d in ("t2i", "i2t"))


def test_a_gallery_of_whole_items_is_backfilled_in_one_order_its_sample_first() -> None:
    from training.upgrades.plan.measure import backfill_orders

    names = [f"item-{i}" for i in range(6)]
    scores = {"image": np.array([0.1, 0.9, 0.2, 0.8, 0.3, 0.0]),
              "text": np.array([0.0, 0.0, 0.9, 0.0, 0.0, 0.1])}
    orders = backfill_orders({"image": names, "text": names}, scores, seed=0, first=[3])
    learned = orders["learned"]
    # an item's image and caption are re-embedded together: one order for both kinds, by
    # the summed error (item 2: 1.1, item 1: 0.9, ...), after the sample's item 3
    assert learned["image"] == learned["text"] == [3, 2, 1, 4, 0, 5]
    random = orders["random"]
    assert random["image"] == random["text"] and random["image"][0] == 3
    assert sorted(random["image"]) == list(range(6))


def test_a_validation_set_of_images_and_captions_orders_each_kind_alone() -> None:
    from training.upgrades.plan.measure import backfill_orders

    images, captions = ["img-a", "img-b"], ["cap-0", "cap-1", "cap-2"]
    orders = backfill_orders({"image": images, "text": captions},
                             {"image": np.array([0.1, 0.5]), "text": np.array([0.3, 0.1, 0.9])},
                             seed=0)
    assert orders["learned"] == {"image": [1, 0], "text": [2, 0, 1]}


def test_a_migration_simulated_on_whole_items_is_scored_against_its_own_baseline() -> None:
    """The plan's migrations are simulated on the validation set as whole items (each image
    with its first caption), whose image->text baseline is not the routes' (every caption):
    a migration's shares, flips and area are of its own scorer, drawn on the same queries."""
    from training.upgrades.plan.build import Costs, make_plan
    from training.upgrades.plan.measure import Option

    rng = np.random.default_rng(3)
    q = {"t2i": 500, "i2t": 100}
    old = {d: rng.random(n) < 0.5 for d, n in q.items()}
    new = {d: rng.random(n) < 0.8 for d, n in q.items()}
    whole_old = {"t2i": old["t2i"], "i2t": rng.random(100) < 0.3}  # fewer captions to hit
    whole_new = {"t2i": new["t2i"], "i2t": rng.random(100) < 0.6}
    plan_scorer, whole = Scorer(old, new, seed=0), Scorer(whole_old, whole_new, seed=0)
    assert all(np.array_equal(plan_scorer.resample[d].counts, whole.resample[d].counts)
               for d in q)  # paired
    half = {d: np.where(np.arange(len(whole_new[d])) % 2 == 0, whole_new[d], whole_old[d])
            for d in q}
    served = {f: whole_new if f >= 1.0 else half for f in GRID}
    options = [Option("route:x", "route", "a route", 1.0, 0.01, hits=old),
               Option("migrate", "migration", "re-embed every item", 10.0, 1.0,
                      hits=whole_new, served=served, switch_at=1.0, scorer=whole)]
    plan = make_plan(options, plan_scorer, Costs(1000, 100, 1.0), Constraints(), old, new)
    row = next(r for r in plan["options"] if r["name"] == "migrate")
    assert row["share"]["i2t"]["share"] == pytest.approx(1.0)  # its own new->new: all of it
    before = row["curve"][0]["i2t"]["share"]
    assert before == pytest.approx(whole.share(half, "i2t"), abs=1e-4)
    assert before != pytest.approx(plan_scorer.share(half, "i2t"), abs=1e-2)
    worst = max(float((whole_old["i2t"] & ~h["i2t"]).mean()) for h in (half, whole_new))
    assert row["negative_flip"]["i2t"] == pytest.approx(worst, abs=1e-4)  # its old->old
