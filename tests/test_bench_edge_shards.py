"""``nobackfill bench edge-shards`` at a size CI affords: parts built and indexed the
store's way, their loads and searches measured, Edge's hold on the interpreter lock
checked, the projection to a million points worked out from those figures."""

from __future__ import annotations

import json
import math
import subprocess
import sys

from service.bench.edge_shards import project


def test_the_projection_adds_the_parts_calls_unless_they_overlap() -> None:
    part = {"p50_ms": 0.45, "fetch_p50_ms": 0.2, "recall_at_10": 0.97}
    held = project(1_000_000, 80_000, part, [0.3, 0.28], at_once=False, cores=2)
    assert held["parts"] == 13 and held["search_ms"] == 6.05 and held["stall_ms"] == 300
    assert not held["search_met"] and held["stall_met"]
    free = project(1_000_000, 80_000, part, [0.3], at_once=True, cores=2)
    assert free["search_ms"] == 3.13 and free["search_met"]  # 13 calls over 2 cores
    low = project(1_000_000, 80_000, {**part, "recall_at_10": 0.94}, [0.3], True, 2)
    assert not low["search_met"]  # fast enough, but below the recall target
    one = project(1_000_000, 1_000_000, {**part, "p50_ms": 3.0}, [3.4], False, 2)
    assert one["parts"] == 1 and one["search_met"] and not one["stall_met"]
    slowest = project(1_000_000, 125_000, part, [0.44, 0.58, 0.45], False, 2)
    assert slowest["stall_ms"] == 580 and not slowest["stall_met"]  # the worst load counts


def test_bench_edge_shards_measures_parts_and_the_lock(tmp_path) -> None:
    out = subprocess.run([sys.executable, "-m", "training.cli", "bench", "edge-shards",
                          "--sizes", "1500,3000", "--queries", "20", "--repeats", "2",
                          "--quantization", "2000", "--dim", "32", "--out", str(tmp_path),
                          "--json"], check=False, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "[edge-shards] building an indexed part of 1,500 points" in out.stderr
    result = json.loads(out.stdout)
    assert [r["points"] for r in result["parts"]] == [1500, 3000]
    lock = result["lock"]
    assert lock["qps_1_thread_1_shard"] > 0 and lock["qps_2_threads_2_shards"] > 0
    assert lock["load_beside_search_s"] > 0 and lock["search_waited_max_ms"] > 0
    assert lock["parts_at_once"] == (lock["parallel_gain"] >= 1.5)
    assert lock["load_holds_lock"] == (
        lock["search_waited_max_ms"] >= 500 * lock["load_beside_search_s"])
    assert lock["cpu_per_s_1_thread"] > 0 and lock["cpu_per_s_2_threads"] > 0
    for row in result["parts"]:
        assert len(row["load_s"]) == 2 and all(s > 0 for s in row["load_s"])
        assert set(row["search"]) == {"16", "32", "64"}
        for ef, s in row["search"].items():
            assert s["recall_at_10"] == 1.0  # searched exactly at this size
            p = row["projection"][ef]
            assert p["parts"] == math.ceil(1_000_000 / row["points"])
            assert p["search_met"] == (p["search_ms"] <= 5.0 and s["recall_at_10"] >= 0.95)
            assert p["stall_ms"] == round(max(row["load_s"]) * 1e3) and s["fetch_p50_ms"] > 0
    quant = result["quantization"]
    assert quant["points"] == 2000 and set(quant) == {"points", "none", "int8"}
    assert quant["none"]["recall_at_10"] == 1.0 and len(quant["int8"]["load_s"]) == 3
    assert list(tmp_path.iterdir()) == []  # its parts and copies removed
