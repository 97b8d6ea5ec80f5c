"""`nobackfill demo` end to end at toy size (--profile quick): the real gateway and embedded
worker processes, the jobs API, the gate, promotion, rollback to every version, the
report and its plots. The numbers of a toy run mean nothing; the wiring and the
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
    for n in range(1, 6):
        assert f"== step {n}/5: " in stdout
    assert stdout.count("answered by") >= 5 and "gate check" in stdout
    report = (out / "report.md").read_text()
    for heading in ("## Step 1: day 0", "## Step 2: continual phase", "## Step 3: language",
                    "## Step 4: XBT upgrade", "## Every version against the same gallery"):
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
