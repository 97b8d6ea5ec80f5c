"""``deploy/gpu-check.sh`` (``make bench-gpu``) with ``QUICK=1`` on this machine's CPU: every
part runs at its smallest under its time limit (a few training tests, bench migrate
--transform --reads and bench rerank on random tiny models, bench serve --quick), each
writes its exit and seconds, and ``nobackfill bench host-report`` prints the one table
(device, the encoder's and the backfill's items/s and their ratio, search idle and during
the migration, cold and warm rerank ratios). On a GPU host the same command runs the full
parts on CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_host_check_runs_every_part_and_prints_its_table(tmp_path: Path) -> None:
    out = tmp_path / "check"
    env = {**os.environ, "QUICK": "1", "OUT": str(out), "PY": sys.executable,
           "MIGRATE_S": "900", "RERANK_S": "900", "SERVE_S": "400", "TEST_S": "400"}
    done = subprocess.run(["bash", str(REPO / "deploy" / "gpu-check.sh")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=2700, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    for part in ("tests", "bench-migrate", "bench-rerank", "bench-serve"):
        code, seconds = (out / f"{part}.status").read_text().split()
        assert code == "0", (part, (out / f"{part}.err").read_text()[-2000:]
                             if (out / f"{part}.err").exists() else done.stdout[-2000:])
        assert float(seconds) > 0
    assert not (out / "bench-base.status").exists()  # QUICK: no bench base
    report = subprocess.run([sys.executable, "-m", "training.cli", "bench", "host-report",
                             str(out), "--json"], cwd=REPO, capture_output=True, text=True,
                            timeout=120, check=True).stdout
    r = json.loads(report[report.index("{"):])
    assert r["device"] == "cpu" and r["gpu"] is None
    assert r["parts"]["bench-base"]["exit"] is None
    m = r["migrate"]
    assert m["encoder_items_per_s"] > 0 and m["backfill_items_per_s"] > 0
    assert m["ratio"] == round(m["backfill_items_per_s"] / m["encoder_items_per_s"], 3)
    assert m["reads"] is True and m["during_p99_ms"] > 0 and m["idle_p50_ms"] > 0
    assert len(r["rerank"]["cold_20"]) == len(r["rerank"]["warm_20"]) == 3
    assert {"decode", "forward"} <= set(r["rerank"]["cold_stages_ms"])
    assert r["serve"]["text_p50_ms"] > 0
    table = (out / "table.md").read_text()
    assert table in done.stdout
    for row in ("| bench-base | not run |", "| backfill items/s", "| rerank@20 cold / plain",
                "during the migration (reranked)", "| GPU utilisation, mean / peak | - "):
        assert row in table, row
