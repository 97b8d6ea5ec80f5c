"""Errors over items, not caption rows (issue 38, finding 6): every share's standard error is a
cluster bootstrap over units (``training.upgrades.transform.simulate.UnitDraws``), in the
simulation's ``share`` and in the plan's ``Scorer``. Five captions of one image that hit
or miss together are one observation, not five: their error is larger than the row
bootstrap's; with one query per unit the two are the same computation."""

from __future__ import annotations

import numpy as np
import pytest

from training.errors import ConfigError
from training.upgrades.plan.measure import Scorer
from training.upgrades.transform.simulate import UnitDraws, share

ITEMS, CAPTIONS = 300, 5


def correlated(seed: int = 0) -> tuple[dict[str, dict[str, np.ndarray]], np.ndarray]:
    """(hits of old->old, new->new and a way "x" with ``CAPTIONS`` identical caption
    queries per item, each caption's item)."""
    rng = np.random.default_rng(seed)
    per_item = {k: rng.random(ITEMS) < p for k, p in (("old->old", 0.3), ("new->new", 0.7),
                                                      ("x", 0.5))}
    hits = {k: {"t2i": np.repeat(v, CAPTIONS)} for k, v in per_item.items()}
    return hits, np.repeat(np.arange(ITEMS), CAPTIONS)


def test_the_error_over_items_is_larger_than_over_caption_rows() -> None:
    hits, owners = correlated()
    rows, items = share(hits, "x", "t2i"), share(hits, "x", "t2i", units=owners)
    assert rows["share"] == items["share"]  # the same point estimate
    # five identical copies of each outcome: the error over items is about sqrt(5) larger
    assert items["se"] / rows["se"] == pytest.approx(np.sqrt(CAPTIONS), rel=0.2)


def test_one_query_per_unit_is_the_plain_bootstrap_over_queries() -> None:
    hits, _ = correlated()
    n = ITEMS * CAPTIONS
    own = share(hits, "x", "t2i", units=np.arange(n) + 7)  # ids in query order, one each
    assert own == share(hits, "x", "t2i")
    # the plain bootstrap written out: resample the rows, recompute the share
    a, o, b = (hits[k]["t2i"].astype(float) for k in ("x", "old->old", "new->new"))
    idx = np.random.default_rng(0).integers(0, n, (1000, n))
    gains = b[idx].mean(1) - o[idx].mean(1)
    draws = (a[idx].mean(1) - o[idx].mean(1)) / gains
    assert own["se"] == pytest.approx(draws.std(ddof=1), rel=1e-6)


def test_a_draw_takes_whole_units_as_a_written_out_resample_does() -> None:
    """The matrix form against the definition: draw the units, take all their queries."""
    rng = np.random.default_rng(4)
    units = rng.integers(0, 40, 150)  # uneven units, some with no query
    values = rng.random(150)
    draws = UnitDraws.of(units, 150, "t2i", boot=20, seed=7)
    ids = np.unique(units)
    again = np.random.default_rng(7)
    for r, mean in enumerate(draws.means("t2i", values)):
        picked = ids[again.integers(0, len(ids), len(ids))]
        taken = np.concatenate([values[units == u] for u in picked])
        assert mean == pytest.approx(taken.mean(), rel=1e-5), r


def test_the_plan_scorer_draws_items_with_all_their_queries() -> None:
    """The plan's shares over items: larger errors than over rows on correlated captions;
    one joint draw of the items for both directions (an item's image query and its
    captions go together); without units the plain bootstrap of each direction."""
    hits, owners = correlated(1)
    images = {k: v["t2i"][::CAPTIONS] for k, v in hits.items()}  # one image query per item
    old = {"t2i": hits["old->old"]["t2i"], "i2t": images["old->old"]}
    new = {"t2i": hits["new->new"]["t2i"], "i2t": images["new->new"]}
    x = {"t2i": hits["x"]["t2i"], "i2t": images["x"]}
    units = {"t2i": owners, "i2t": np.arange(ITEMS)}
    by_rows, by_items = Scorer(old, new), Scorer(old, new, units=units)
    assert by_items.shares(x)["t2i"]["se"] > 1.8 * by_rows.shares(x)["t2i"]["se"]
    assert by_items.resample["t2i"] is by_items.resample["i2t"]
    # per draw, the t2i share (captions repeat their image's outcome) is the i2t share
    assert np.allclose(by_items.draws(x, "t2i"), by_items.draws(x, "i2t"), equal_nan=True)
    plain = share({"x": {"t2i": x["t2i"]}, "old->old": {"t2i": old["t2i"]},
                   "new->new": {"t2i": new["t2i"]}}, "x", "t2i")
    assert by_rows.shares(x)["t2i"]["se"] == pytest.approx(plain["se"], rel=1e-5)
    with pytest.raises(ConfigError, match="units are given for"):
        Scorer(old, new, units={"t2i": owners})
    with pytest.raises(ConfigError, match="one unit per query"):
        share(hits, "x", "t2i", units=owners[:10])
