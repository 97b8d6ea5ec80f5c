"""``bench plan``'s check against ``bench frontier``, on micro models: the plan's code and
frontier's measure the same draw, same sample, to the same shares (the numbers mean nothing
at this size; what is checked is that the two codes compute one measurement)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import numpy as np
import pytest


def test_the_plan_measures_bench_frontiers_draw_as_bench_frontier_does(
        micro_versions: dict[str, Path], tmp_path: Path) -> None:
    from training.bench.plan import AGREEMENT, frontier_agreement
    from training.bench.xbt import open_base

    base = tmp_path / "base"
    shutil.copytree(micro_versions["v1"], base / "old")
    shutil.copytree(micro_versions["v3"], base / "new")
    old, new = open_base(base, tmp_path / "out")
    args = argparse.Namespace(frontier_gallery=600, frontier_test=200, frontier_sample=80,
                              frontier_validation=120)
    result = frontier_agreement(old, new, 0, args, tmp_path / "out")
    options = {r["option"] for r in result["rows"]}
    assert options == {"route:procrustes+slerp", "migrate",
                       "migrate:transform+learned (side)", "migrate:transform+random (side)"}
    sides = [r for r in result["rows"] if r["option"].endswith("(side)")]
    # the side as it stands at each of frontier's fractions (the sample's share first)
    assert {r["fraction"] for r in sides} == set(result["fractions"])
    assert result["fractions"][0] == pytest.approx(80 / 600, abs=1e-3)
    for r in result["rows"]:
        for d in ("t2i", "i2t"):
            if r["bench"][d] is not None:
                assert r["difference"][d] == pytest.approx(abs(r["plan"][d] - r["bench"][d]))
    assert result["worst_difference"] <= AGREEMENT and result["met"]
    at_end = [r for r in sides if r["fraction"] == 1.0]
    assert all(r["plan"]["t2i"] == pytest.approx(1.0) for r in at_end)


def synthetic_draw(side_at_half: np.ndarray, switch: float | None = 0.25) -> dict:
    """A measured draw of 100 test items (five captions each, answered alike) whose route
    hits the even items; the learned side at 25% and 100% beats it; at 50% it hits
    ``side_at_half`` (per item)."""
    from training.bench.frontier import _packed

    items = np.arange(100)
    route = items % 2 == 0
    per_item = {"old->old": items % 3 == 0, "new->new": items < 90, "routed": route,
                "side learned 0.25": route | (items < 40), "side learned 0.5": side_at_half,
                "side learned 1": items < 90}
    for way in ("side id", "side random", "hybrid learned", "hybrid random"):  # the table's
        per_item.update({f"{way} {f:g}": per_item[f"side learned {f:g}"] for f in (0.25, 0.5, 1)})
    hits = {k: {"t2i": np.repeat(v, 5), "i2t": v} for k, v in per_item.items()}
    return {"hits": _packed(hits), "fractions": [0.25, 0.5, 1.0], "switch_fraction": switch,
            "query_owners": np.repeat(items, 5).tolist(), "i2t_queries": 100,
            "seconds": {"transform_fit": 1.0, "transform_apply": 0.0, "new_full_backfill": 10.0}}


def test_the_progressive_check_reads_every_fraction_and_the_error_over_items() -> None:
    """bench frontier's check: the progressive migration is below the route only where
    the route beats the side it serves by the one-sided test over the test items. A side
    four items behind (within the error) passes; one thirty behind fails, at the fraction
    where it is; before the switch the route itself serves."""
    from training.bench.frontier import check_targets, combined, progressive_below

    route = np.arange(100) % 2 == 0
    near = route.copy()
    near[np.flatnonzero(route)[:4]] = False  # four items lost, two won: two behind
    near[np.flatnonzero(~route)[:2]] = True
    far = route.copy()
    far[np.flatnonzero(route)[:30]] = False
    assert progressive_below(synthetic_draw(near)) == []
    below = progressive_below(synthetic_draw(far))
    assert [p["key"] for p in below] == ["side learned 0.5"]
    assert below[0]["t2i"]["lead"] == pytest.approx(-0.30) and below[0]["t2i"]["below"]
    assert progressive_below(synthetic_draw(far, switch=1.0)) == []  # the route served
    for side, met in ((near, True), (far, False)):
        draws = [synthetic_draw(side)]
        targets = check_targets(combined(draws), draws)
        check = next(k for k in targets if k.startswith("progressive: never below"))
        assert targets[check] is met
    # the error is over items: five captions per item answered alike are one observation
    rows = combined([synthetic_draw(near)])["progressive"]
    assert rows[1]["t2i"]["se"] > 1.5 * rows[1]["i2t"]["se"] / np.sqrt(5)


def test_the_validation_draw_is_not_the_test_set() -> None:
    from training.bench.frontier import _items, validation_items

    test = [i.attributes for i in _items(0, 20, 20)]
    validation = validation_items(0, 20)
    assert [i.attributes for i in validation] != test
    assert all(i.id.startswith("val-") for i in validation)
    assert [i.id for i in validation_items(1, 20)] == [i.id for i in validation]  # ids only
    assert [i.attributes for i in validation_items(1, 20)] != [i.attributes for i in validation]
