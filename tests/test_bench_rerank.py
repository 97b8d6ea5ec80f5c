"""``nobackfill bench rerank --quick`` end to end: real gateway and worker processes, random
tiny models, a 600-item gallery mid-migration. Timings are not asserted (tiny models on a
shared machine); what must hold at any size is: no errors, the new side holds exactly the
candidates the reranked answers ranked by NEW (all written by reads, none by the paused
backfill), and a warm pass embeds nothing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.slow
def test_bench_rerank_quick(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "training.cli", "bench", "rerank", "--quick",
                           "--out", str(tmp_path / "out"), "--json"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, check=True)
    out = done.stdout
    result = json.loads(out[out.index("{"):])
    assert (tmp_path / "out" / "bench-rerank.json").is_file()
    assert result["device"] == "cpu"  # --device auto, and no CUDA here
    # one line per phase on stderr, numbered, with the seconds since the start
    phases = re.findall(r"^bench rerank: \[(\d+)/(\d+)\] \[\+[\d.]+ s\] (.+)$",
                        done.stderr.replace("\r", "\n"), re.MULTILINE)  # progress bars: \r
    assert [int(n) for n, _, _ in phases] == list(range(1, 11))
    assert {total for _, total, _ in phases} == {"10"}
    assert phases[0][2].startswith("setup: ") and phases[-1][2].startswith("checks: ")
    assert [w.split(":")[0] for _, _, w in phases if w.startswith("rerank@")] == [
        "rerank@10", "rerank@20"]
    assert result["budget_ms"] == 250.0
    plain = result["plain"]
    assert plain["errors"] == 0 and plain["requests"] == result["queries"]
    from service.bench.rerank import render

    table = render(result)
    assert table.count("| 20 | cold |") == 3 and "interleaved rounds" in table
    assert "reranked" not in plain and plain["qps"] > 0
    assert set(result["rerank"]) == {"10", "20"}
    for k, cell in result["rerank"].items():
        for name in ("cold", "warm", "warm_clients"):
            assert cell[name]["errors"] == 0, (k, name, cell[name]["first_error"])
            assert cell[name]["reranked"] == result["queries"], (k, name)
            assert cell[name]["budget_ms"] == 250.0
            assert cell[name]["p50_ms"] <= cell[name]["p99_ms"]
        assert cell["cold"]["embedded"] > 0
        assert cell["warm"]["embedded"] == cell["warm_clients"]["embedded"] == 0
        assert cell["warm"]["read_mean"] == int(k)  # every candidate read from the new side
        assert cell["warm"]["kept"] == 0
        # three rounds, each reranked search beside the same query's plain one, and where
        # a reranked search's time went: a cold one waits for its decode and forward, a
        # warm one reads every candidate and waits for nothing
        assert len(cell["rounds"]) == 3
        for r in cell["rounds"]:
            for name in ("cold", "warm"):
                x = r[name]
                assert x["ratio"] > 0 and x["plain_errors"] == 0
                assert x["ratio"] == pytest.approx(x["rerank_p50_ms"] / x["plain_p50_ms"],
                                                   rel=0.01)  # the p50s are rounded
                assert {"query", "candidates", "read"} <= set(x["stages_p50_ms"])
            assert "wait" not in r["warm"]["stages_p50_ms"]
        # a cold round whose searches embedded something waited for decode and forward
        # (with 4 queries a round, one may find its candidates filled by the ones before)
        assert any({"wait", "decode", "forward"} <= set(r["cold"]["stages_p50_ms"])
                   for r in cell["rounds"])
    fill = result["fill"]
    assert fill["new_side_items"] == fill["new_side_points"] == fill["ranked_by_new"] > 0
    assert fill["via_read"] == fill["by_embed"] == fill["new_side_items"]
    assert fill["filled_by_reads_view"] == fill["new_side_items"]
    assert not fill["filled_by_backfill_view"]
    assert fill["missing"] == fill["unexplained"] == 0
    after = result["migration"]["after"]
    assert after["state"] == "backfilling" and after["paused"] and after["done"] == 0
    assert result["rss_kib_after"]["VmRSS"] > 0
    met = {name: check["met"] for name, check in result["targets"].items()}
    assert met["0 errors"] and met["warm passes embed nothing"]
    assert met["new side == the distinct candidates ranked by NEW, all filled by reads"]
    # what keeping both sides costs: writes with one side and with both, bytes per point
    writes, cost = result["writes"], result["kept_cost"]
    for side in ("one_side", "both_sides"):
        assert writes[side]["items"] == 32 and writes[side]["errors"] == 0
        assert writes[side]["items_per_s"] > 0
    assert cost["write_rate_ratio"] == round(
        writes["both_sides"]["items_per_s"] / writes["one_side"]["items_per_s"], 3)
    assert cost["source"]["points"] == result["items"]  # the writes were deleted again
    assert cost["target"]["points"] == fill["new_side_points"]
    assert cost["source"]["disk_bytes"] > 0 and cost["target"]["disk_bytes"] > 0
    assert cost["source"]["bytes_per_point"] == round(cost["source"]["disk_bytes"]
                                                      / cost["source"]["points"])
