"""Negative flips (Yan et al. 2021, positive-congruent training): the queries an update breaks.

The gate reports the negative-flip rate per direction in every report and, when
``max_negative_flip`` is set, bounds it with one check per direction.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from training.artifacts import Artifact, load_artifact, write_artifact
from training.compatibility import embed_dataset
from training.data import PairDataset, generate_items
from training.errors import ConfigError, DataError
from training.evaluate import (
    cross_metrics,
    cross_top1_hits,
    negative_flip_rate,
    positive_flip_rate,
    recall_at_k,
    top1_hits,
)
from training.gate import GateCriterion, run_gate

# ---------------------------------------------------------------- a case counted by hand
# 5 queries x 3 gallery items; several items may be relevant to one query.
RELEVANT = np.array([[1, 0, 1],   # q0: relevant top-1 before (item 0) and after (item 2)
                     [0, 1, 0],   # q1: relevant before, wrong after: a negative flip
                     [1, 0, 0],   # q2: wrong before, right after (a tie won by index 0)
                     [0, 0, 1],   # q3: wrong before (a three-way tie: item 0), wrong after
                     [0, 0, 0]],  # q4: nothing relevant: never a hit
                    dtype=bool)
BEFORE = np.array([[0.9, 0.1, 0.5],
                   [0.1, 0.9, 0.2],
                   [0.2, 0.8, 0.1],
                   [0.4, 0.4, 0.4],
                   [0.3, 0.2, 0.1]])
AFTER = np.array([[0.2, 0.3, 0.8],
                  [0.7, 0.6, 0.1],
                  [0.5, 0.5, 0.1],
                  [0.3, 0.9, 0.1],
                  [0.1, 0.2, 0.3]])


def brute_top1(sim: np.ndarray, relevant: np.ndarray) -> np.ndarray:
    """np.argmax takes the first of equal maxima: the lower index wins a tie, as in R@1."""
    return np.array([bool(relevant[q, int(np.argmax(sim[q]))]) for q in range(len(sim))])


def test_top1_hits_follow_r_at_1_and_its_tie_rule() -> None:
    before, after = top1_hits(BEFORE, RELEVANT), top1_hits(AFTER, RELEVANT)
    assert before.tolist() == [True, True, False, False, False]
    assert after.tolist() == [True, False, True, False, False]
    for sim in (BEFORE, AFTER):
        hits = top1_hits(sim, RELEVANT)
        assert hits.tolist() == brute_top1(sim, RELEVANT).tolist()
        assert hits.mean() == pytest.approx(recall_at_k(sim, RELEVANT, (1,))[1])


def test_flip_rates_match_a_hand_count() -> None:
    before, after = top1_hits(BEFORE, RELEVANT), top1_hits(AFTER, RELEVANT)
    negative = sum(b and not a for b, a in zip(before, after))
    positive = sum(a and not b for b, a in zip(before, after))
    assert (negative, positive) == (1, 1)  # q1 broke, q2 was fixed
    # The denominator is all queries (5), not the 2 that were right before.
    assert negative_flip_rate(before, after) == pytest.approx(1 / 5)
    assert positive_flip_rate(before, after) == pytest.approx(1 / 5)
    assert negative_flip_rate(before, before) == 0.0
    # R@1(after) - R@1(before) = positive - negative: a net gain can hide the flips.
    assert after.mean() - before.mean() == pytest.approx(
        positive_flip_rate(before, after) - negative_flip_rate(before, after))
    assert negative_flip_rate([1, 1, 0, 0], [0, 1, 1, 0]) == pytest.approx(0.25)  # 0/1 accepted


def test_flip_rates_reject_mismatched_or_empty_inputs() -> None:
    with pytest.raises(DataError, match="after_top1_ok has shape"):
        negative_flip_rate([True, False], [True])
    with pytest.raises(DataError, match="non-empty 1-D"):
        positive_flip_rate([], [])
    with pytest.raises(DataError, match="boolean"):
        negative_flip_rate([0.5, 1.0], [1.0, 0.0])


def test_cross_top1_hits_agree_with_cross_metrics_even_with_ties() -> None:
    rng = np.random.default_rng(0)
    # Coarse values make equal scores common, so the tie rule matters.
    q_text, q_image, g_image, g_text = (rng.integers(-1, 2, (n, 4)).astype(np.float32)
                                        for n in (30, 20, 20, 30))
    relevance = rng.random((30, 20)) < 0.15
    hits = cross_top1_hits(q_text, q_image, g_image, g_text, relevance)
    cell = cross_metrics(q_text, q_image, g_image, g_text, relevance)
    assert hits["t2i"].shape == (30,) and hits["i2t"].shape == (20,)
    for d in ("t2i", "i2t"):
        assert hits[d].mean() == pytest.approx(cell[d]["R@1"])
    assert hits["t2i"].tolist() == brute_top1(q_text @ g_image.T, relevance).tolist()
    assert hits["i2t"].tolist() == brute_top1(q_image @ g_text.T, relevance.T).tolist()


# ---------------------------------------------------------------- the gate
@pytest.fixture(scope="module")
def versions(micro_versions: dict[str, Path], tmp_path_factory) -> dict[str, Artifact]:
    """v1, its byte-identical twin (no flips possible) and v2 (space v1, other weights)."""
    v1 = load_artifact(micro_versions["v1"])
    twin = tmp_path_factory.mktemp("flip-twin") / "twin"
    manifest = {k: v for k, v in v1.manifest.items() if k not in ("files", "created_at")}
    write_artifact(twin, {**manifest, "version_id": "twin"}, {"model.safetensors": v1.tensors()})
    return {"v1": v1, "twin": load_artifact(twin), "v2": load_artifact(micro_versions["v2"])}


@pytest.fixture(scope="module")
def validation() -> PairDataset:
    return PairDataset.from_synth(generate_items(24, seed=11, languages=("en",)), image_size=32)


def flip_checks(report: dict) -> list[dict]:
    return [c for c in report["checks"] if c.get("metric") == "negative flip"]


def test_every_report_carries_the_flip_rates_and_no_check_by_default(versions,
                                                                     validation) -> None:
    report = run_gate(versions["twin"], versions["v1"], validation)
    assert report["negative_flip"] == {"t2i": 0.0, "i2t": 0.0}  # the same model flips nothing
    assert report["positive_flip"] == {"t2i": 0.0, "i2t": 0.0}
    assert report["max_negative_flip"] is None and report["criterion"]["max_negative_flip"] is None
    assert flip_checks(report) == [] and len(report["checks"]) == 2
    json.dumps(report)
    bilingual = PairDataset.from_synth(generate_items(24, seed=12, languages=("en", "de")),
                                       image_size=32)
    phase = GateCriterion(retention_limit=0.02, new_language="de")
    language = run_gate(versions["twin"], versions["v1"], bilingual, phase)
    assert set(language["negative_flip"]) == {"t2i", "i2t"} and flip_checks(language) == []


def test_the_reported_rate_is_the_brute_force_count(versions, validation) -> None:
    report = run_gate(versions["v2"], versions["v1"], validation)
    relevance = validation.relevance("en")
    own_img, own_txt = embed_dataset(versions["v1"], validation, "v1")
    new_img, new_txt = embed_dataset(versions["v2"], validation, "v1")
    before = {"t2i": brute_top1(own_txt @ own_img.T, relevance),
              "i2t": brute_top1(own_img @ own_txt.T, relevance.T)}
    after = {"t2i": brute_top1(new_txt @ own_img.T, relevance),
             "i2t": brute_top1(new_img @ own_txt.T, relevance.T)}
    for d in ("t2i", "i2t"):
        broken = sum(b and not a for b, a in zip(before[d], after[d]))
        fixed = sum(a and not b for b, a in zip(before[d], after[d]))
        assert report["negative_flip"][d] == pytest.approx(broken / len(before[d]))
        assert report["positive_flip"][d] == pytest.approx(fixed / len(before[d]))
    assert report["negative_flip"]["i2t"] > 0  # random weights: some queries break


def test_a_bound_below_the_rate_fails_the_gate_with_the_flip_check_named(versions,
                                                                        validation) -> None:
    measured = run_gate(versions["v2"], versions["v1"], validation)["negative_flip"]
    limit = measured["i2t"] / 2
    report = run_gate(versions["v2"], versions["v1"], validation,
                      GateCriterion(max_negative_flip=limit))
    assert report["passed"] is False and report["max_negative_flip"] == limit
    checks = {c["direction"]: c for c in flip_checks(report)}
    assert set(checks) == {"t2i", "i2t"}
    i2t = checks["i2t"]
    assert i2t["name"] == f"negative flip i2t <= {limit:g}" and i2t["passed"] is False
    assert i2t["subset"] == "all" and i2t["required"] == limit
    assert i2t["new_to_old"] == pytest.approx(measured["i2t"])
    assert checks["t2i"]["passed"] is (measured["t2i"] <= limit)
    loose = run_gate(versions["v2"], versions["v1"], validation,
                     GateCriterion(max_negative_flip=1.0))
    assert all(c["passed"] for c in flip_checks(loose)) and len(flip_checks(loose)) == 2


def test_the_bound_must_be_a_rate() -> None:
    for bad in (1.5, -0.1):
        with pytest.raises(ConfigError, match="max_negative_flip"):
            GateCriterion(max_negative_flip=bad)
    assert GateCriterion(max_negative_flip=0.0).max_negative_flip == 0.0


def test_operators_set_the_bound_as_a_process_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from pydantic import ValidationError

    from service.state.config import Settings

    monkeypatch.delenv("NOBACKFILL_GATE_MAX_NEGATIVE_FLIP", raising=False)
    assert Settings().gate_max_negative_flip is None
    assert Settings(gate_max_negative_flip=0.05).gate_max_negative_flip == 0.05
    with pytest.raises(ValidationError):
        Settings(gate_max_negative_flip=1.5)


def test_the_demo_gate_table_shows_negative_flips_with_their_bound() -> None:
    from service.stack.demo.report import gate_table

    check = {"subset": "all", "direction": "t2i", "new_to_old": 0.5, "old_to_old": 0.4,
             "required": 0.4, "passed": True}
    _, rows = gate_table({"checks": [check], "negative_flip": {"t2i": 0.05, "i2t": 0.0},
                          "max_negative_flip": None})
    assert ["negative flips", "t2i", "0.050", "-", "off", "-"] in rows
    flip_check = {**check, "metric": "negative flip", "new_to_old": 0.05, "required": 0.01,
                  "passed": False}
    _, rows = gate_table({"checks": [check, flip_check], "negative_flip": {"t2i": 0.05},
                          "max_negative_flip": 0.01})
    assert rows[-1] == ["negative flips", "t2i", "0.050", "-", "<= 0.010", "NO"]
    assert len(rows) == 2  # the flip check is shown once, as its own row
