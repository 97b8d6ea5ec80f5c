"""``nobackfill bench store`` at a size CI affords: both embedded engines load, search
(exactly, at this size), rewrite at both durability levels, read, reopen, and survive
SIGKILLs at random points (and, on Edge, of a store move) with every acknowledged
operation there."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_store_measures_both_engines_and_its_crash_test_loses_nothing(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "training.cli", "bench", "store", "--points",
                          "2500", "--queries", "20", "--kills", "5", "--dim", "64", "--out",
                          str(tmp_path), "--json"], check=False, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert [(r["engine"], r["points"]) for r in result["rows"]] == [("edge", 2500),
                                                                      ("local", 2500)]
    for r in result["rows"]:
        assert r["recall_at_10"] == 1.0 and r["errors"] == 0  # exact at this size
        assert r["update_per_s"] > 0 and r["scroll_per_s"] > 0 and r["reopen_s"] >= 0
        rates = r["durability"]  # both levels measured; power flushes, process never
        assert rates["process"]["flushes"] == 0 and rates["power"]["batched_per_s"] > 0
        assert 0 <= r["recall_se"] < 0.05 and r["reopen_cache"] in ("cold", "warm")
    during = result["rows"][0]["during_index"]  # Edge: searches went on while it indexed
    assert during["searches"] >= 1 and during["index_s"] >= 0
    steps = during["steps"]  # where the swap's time went, each step timed
    assert steps["writes_replayed"] >= 0 and steps["child_s"] > 0 and steps["load_s"] > 0
    assert max(steps[k] for k in ("flush_s", "copy_s", "child_s", "load_s", "replay_s",
                                  "new_flush_s", "close_s")) <= steps["total_s"]
    assert 0 < result["rows"][0]["durability"]["power"]["flushes"] <= 10 + 1000
    for c in result["crash"]:  # every acknowledged operation found after every kill
        assert c["kills"] == 5 and c["acknowledged_ops"] > 0 and c["acknowledged_points"] > 0
        assert c["lost"] == 0 and c["back"] == 0 and c["alias"] == 0
    edge = result["crash"][0]  # the fifth kill is of a store move, redone to equal
    assert edge["moves"]["killed"] == 1 and edge["moves"]["redone_equal"] == 1
