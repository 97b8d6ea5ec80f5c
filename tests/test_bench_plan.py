"""``bench plan``'s check against ``bench frontier``, on micro models: the plan's code and
frontier's measure the same draw, same sample, to the same shares (the numbers mean nothing
at this size; what is checked is that the two codes compute one measurement)."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

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
