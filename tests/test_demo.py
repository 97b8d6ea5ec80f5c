"""`nobackfill demo` end to end at toy size (--profile quick): the real gateway and embedded
worker processes, the jobs API, the gate, promotion, rollback to every version, a managed
migration into v2's native space and its rollback, the report and its plots. The numbers of a toy run mean nothing; the wiring and the
invariants (gallery never re-embedded, promoted exactly when the gate passed) do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("demo") / "run"
    done = subprocess.run([sys.executable, "-m", "training.cli", "demo", "--out", str(out),
                           "--profile", "quick", "--device", "cpu"], cwd=REPO,
                          capture_output=True, text=True, timeout=900, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, done.stdout


def test_the_demo_prints_a_table_per_step_and_writes_the_report(demo) -> None:
    out, stdout = demo
    for n in range(1, 7):
        assert f"== step {n}/6: " in stdout
    assert stdout.count("answered by") >= 6 and "gate check" in stdout
    report = (out / "report.md").read_text()
    for heading in ("## Step 1: day 0", "## Step 2: continual phase", "## Step 3: language",
                    "## Step 4: XBT upgrade", "## Every version against the same gallery",
                    "## Migration: managed migration of gallery 'demo'", "## Stored vectors"):
        assert heading in report
    images = [line.split("](")[1].rstrip(")") for line in report.splitlines()
              if line.startswith("![")]
    assert "recall.png" in images and "compat-all.png" in images and "compat-v2.png" in images
    for name in images:
        assert (out / name).read_bytes().startswith(PNG), name


def test_the_story_keeps_its_invariants(demo) -> None:
    out, _ = demo
    result = json.loads((out / "demo.json").read_text())
    steps = {s["key"]: s for s in result["steps"]}
    assert list(steps) == ["v1", "continual", "language", "upgrade"]
    for key in ("continual", "language", "upgrade"):
        step = steps[key]
        assert step["gate"]["checks"], key
        assert step["promoted"] == step["gate"]["passed"], key  # promoted iff the gate passed
    language_checks = {(c["subset"], c["direction"]) for c in steps["language"]["gate"]["checks"]}
    assert ("language de", "t2i") in language_checks
    # The gallery was never re-embedded: day 0's vectors are bit-identical at the end, and
    # every stored item was embedded by v1 or by the version that served when it arrived.
    fp = result["fingerprints"]
    assert fp["day 0"] == fp["end"] and set(fp["day 0"]) == {"v1"}
    first_serving = "v1.1" if steps["continual"]["promoted"] else "v1"
    assert fp["end, every item"][first_serving]["items"] >= 12  # the new-domain ingest
    assert set(fp["end, every item"]) == {"v1", first_serving}
    assert sum(f["items"] for f in fp["end, every item"].values()) == 60 + 12
    # Every version that served answered (as itself) against that same gallery.
    served = ["v1"] + [steps[k]["version"] for k in ("continual", "language", "upgrade")
                       if steps[k]["promoted"]]
    assert list(result["by_version"]) == served
    for version, m in result["by_version"].items():
        assert m["version"] == version and m["items"] == 72
        assert set(m["embedded_by"]) <= {"v1", first_serving}
    assert result["matrix"]["models"] == [*served, "new-base"]


def test_the_demo_refuses_a_used_output_directory(demo) -> None:
    out, _ = demo
    done = subprocess.run([sys.executable, "-m", "training.cli", "demo", "--out", str(out),
                           "--profile", "quick"], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 2 and "is not empty" in done.stderr
    assert (out / "report.md").is_file()  # the earlier run's output is untouched


def test_the_migration_step_measures_before_and_after_and_rolls_back(demo) -> None:
    """Step 6: when v2 was promoted (it serves through its route into v1's space), the
    gallery is migrated into v2's native space through the API; the same queries are
    measured routed, migrated and routed again after the migration rollback."""
    out, stdout = demo
    result = json.loads((out / "demo.json").read_text())
    m = result["migration"]
    upgrade = next(s for s in result["steps"] if s["key"] == "upgrade")
    if not upgrade["promoted"]:  # the toy run's gate decides; then there is no route to leave
        assert "nothing to migrate to" in m["skipped"] and m["job"] is None
        assert "skipped: 'v1" in stdout
        return
    assert m["skipped"] is None and m["version"] == "v2"
    assert m["source"]["space"] == "v1" and m["target"]["space"] not in ("v1", None)
    assert m["result"]["applied"] == 72 and not m["result"].get("unreadable")
    last = m["progress"][-1]
    assert last["done"] == last["total"] == 72
    assert m["progress"][0]["state"] == "backfilling"
    # The gate decides the switch (every item had a source to read, so nothing else can).
    assert m["switched"] == m["gate"]["passed"]
    assert {c["direction"] for c in m["gate"]["checks"]} == {"t2i", "i2t"}
    before = m["before"]
    assert (before["version"], before["space"]) == ("v2", "v1") and before["route"] != "native"
    assert set(before["embedded_by"]) <= {"v1", "v1.1"}
    if not m["switched"]:
        assert "NOT switched" in stdout and m["after"] is None and m["switch_refused"]
        return
    after, back = m["after"], m["rolled_back"]
    assert after["route"] == "native" and after["space"] == m["target"]["space"]
    assert after["items"] == 72 and set(after["embedded_by"]) == {"v2"}  # the new side
    # The rollback gives back the routed answers exactly: the old side was kept as it was.
    assert (back["route"], back["space"]) == (before["route"], "v1")
    assert back["recall"] == before["recall"] and back["embedded_by"] == before["embedded_by"]
    fp = result["fingerprints"]
    assert set(fp["migrated side"]) == {"v2"} and fp["migrated side"]["v2"]["items"] == 72
    assert fp["day 0"] == fp["end"]  # the serving side after the rollback: day 0's vectors
    # The before/after table, printed and in the report, with the migrated row's numbers.
    for text in (stdout, (out / "report.md").read_text()):
        assert "text queries before and after the migration" in text
        assert "migration gate PASSED -> switched" in text
        for label in ("before: routed", "after: migrated", "after rollback: routed"):
            assert label in text
    row = next(line for line in stdout.splitlines() if line.startswith("after: migrated"))
    cells = row.split()
    assert cells[2:5] == ["v2", "native", m["target"]["space"]]
    r1 = {g: f"{c['R@1']:.2f} ({c['R@5']:.2f})" for g, c in after["recall"].items()}
    assert all(value in row for value in r1.values())
