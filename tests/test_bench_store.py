"""``nobackfill bench store`` at a size CI affords: both embedded engines load, search
(exactly, at this size), rewrite, read, reopen and survive a SIGKILL mid-write with every
acknowledged write there."""

from __future__ import annotations

import json
import subprocess
import sys


def test_bench_store_measures_both_engines_and_its_crash_test_loses_nothing(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "training.cli", "bench", "store", "--points",
                          "2500", "--queries", "20", "--kills", "2", "--dim", "64", "--out",
                          str(tmp_path), "--json"], check=False, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert [(r["engine"], r["points"]) for r in result["rows"]] == [("edge", 2500),
                                                                      ("local", 2500)]
    for r in result["rows"]:
        assert r["recall_at_10"] == 1.0 and r["errors"] == 0  # exact at this size
        assert r["update_per_s"] > 0 and r["scroll_per_s"] > 0 and r["reopen_s"] >= 0
    during = result["rows"][0]["during_index"]  # Edge: searches went on while it indexed
    assert during["searches"] >= 1 and during["index_s"] >= 0
    for c in result["crash"]:
        assert c["kills"] == 2 and c["acknowledged_points"] > 0 and c["lost"] == 0
