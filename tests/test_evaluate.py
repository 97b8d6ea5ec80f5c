"""Tests of training.evaluate against plain brute-force references and hand-computed cases."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from training import evaluate
from training.errors import ConfigError, DataError
from training.evaluate import (
    average_final,
    backward_transfer,
    compatibility_matrix,
    forgetting,
    format_matrix,
    map_at_k,
    recall_at_k,
    retrieval_metrics,
)

# ----------------------------------------------------------------- brute-force reference


def ref_ranking(row: np.ndarray) -> list[int]:
    """Full sort of one query's gallery: score descending, then lower index first."""
    return sorted(range(len(row)), key=lambda j: (-float(row[j]), j))


def ref_recall(sim: np.ndarray, rel: np.ndarray, k: int) -> float:
    hits = 0
    for q in range(sim.shape[0]):
        top = ref_ranking(sim[q])[:k]
        hits += any(rel[q][j] for j in top)
    return hits / sim.shape[0]


def ref_map(sim: np.ndarray, rel: np.ndarray, k: int) -> float:
    """CTP eq. 11: precision at each hit in the top k, divided by the hits in the top k."""
    total_ap = 0.0
    for q in range(sim.shape[0]):
        found, total = 0, 0.0
        for rank, j in enumerate(ref_ranking(sim[q])[:k], start=1):
            if rel[q][j]:
                found += 1
                total += found / rank
        total_ap += total / found if found else 0.0
    return total_ap / sim.shape[0]


def random_case(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Scores with many ties (few distinct values) and several relevant items per query."""
    rng = np.random.default_rng(seed)
    n_q, n_g = int(rng.integers(1, 30)), int(rng.integers(1, 25))
    sim = rng.integers(0, 4, size=(n_q, n_g)).astype(np.float32)
    rel = rng.random((n_q, n_g)) < rng.uniform(0.05, 0.5)
    return sim, rel


KS = (1, 2, 5, 10, 30)  # 30 exceeds every random gallery: clamped to G

# ----------------------------------------------------------------- recall / mAP vs reference


@pytest.mark.parametrize("seed", range(25))
def test_recall_matches_brute_force(seed: int) -> None:
    sim, rel = random_case(seed)
    got = recall_at_k(sim, rel, KS)
    assert list(got) == list(KS)
    for k in KS:
        assert got[k] == pytest.approx(ref_recall(sim, rel, k)), k


@pytest.mark.parametrize("seed", range(25))
def test_map_matches_brute_force(seed: int) -> None:
    sim, rel = random_case(seed)
    for k in (1, 3, 10, 30):
        assert map_at_k(sim, rel, k) == pytest.approx(ref_map(sim, rel, k)), k


@pytest.mark.parametrize("seed", range(5))
def test_chunked_ranking_matches_brute_force(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # A tiny chunk budget forces one or two queries per chunk.
    monkeypatch.setattr(evaluate, "_CHUNK_ELEMENTS", 7)
    sim, rel = random_case(100 + seed)
    for k in (1, 5):
        assert recall_at_k(sim, rel, (k,))[k] == pytest.approx(ref_recall(sim, rel, k))
        assert map_at_k(sim, rel, k) == pytest.approx(ref_map(sim, rel, k))


def test_recall_on_5000_by_1000_matches_reference() -> None:
    rng = np.random.default_rng(0)
    sim = rng.standard_normal((5000, 1000)).astype(np.float32)
    rel = np.zeros_like(sim, dtype=bool)
    rel[np.arange(5000), rng.integers(0, 1000, 5000)] = True
    got = recall_at_k(sim, rel)
    sub = slice(0, 200)  # spot-check against the reference on a subset
    assert recall_at_k(sim[sub], rel[sub], (10,))[10] == pytest.approx(
        ref_recall(sim[sub], rel[sub], 10)
    )
    assert 0.0 <= got[1] <= got[5] <= got[10] <= 1.0


# ----------------------------------------------------------------- hand-computed cases


def test_recall_hand_computed_ties_and_no_relevant() -> None:
    sim = np.array(
        [
            [0.9, 0.1, 0.5],  # relevant 0 ranked first: hit at 1
            [0.2, 0.8, 0.9],  # relevant 1 ranked second: hit at 2
            [0.3, 0.3, 0.1],  # relevant 1 ties with 0, lower index 0 wins: hit at 2
            [0.5, 0.4, 0.3],  # no relevant item: always a miss
        ]
    )
    rel = np.array([[1, 0, 0], [0, 1, 0], [0, 1, 0], [0, 0, 0]], dtype=bool)
    assert recall_at_k(sim, rel, (1, 2, 5)) == {1: 0.25, 2: 0.75, 5: 0.75}


def test_map_hand_computed_uses_hits_in_top_k_as_normaliser() -> None:
    sim = np.tile(np.arange(7, 0, -1, dtype=float), (2, 1))  # ranking = index order
    rel = np.array([[1, 0, 1, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0, 1]], dtype=bool)
    # query 0: hits at ranks 1 and 3 -> (1 + 2/3) / 2 hits in the top 5 = 5/6
    # (dividing by all 3 relevant items would give 5/9); query 1: none in top 5 -> 0
    assert map_at_k(sim, rel, 5) == pytest.approx(5 / 12)
    # top 7: query 0 adds rank 6 (3/6), query 1 a hit at rank 7 (1/7) with m_q = 1
    assert map_at_k(sim, rel, 7) == pytest.approx(((1 + 2 / 3 + 1 / 2) / 3 + 1 / 7) / 2)


def test_map_tie_broken_by_lower_index() -> None:
    sim = np.zeros((1, 2))
    assert map_at_k(sim, np.array([[False, True]]), 1) == 0.0
    assert map_at_k(sim, np.array([[True, False]]), 1) == 1.0


def test_accepts_torch_tensors() -> None:
    sim, rel = random_case(3)
    assert recall_at_k(torch.from_numpy(sim), torch.from_numpy(rel), KS) == recall_at_k(
        sim, rel, KS
    )
    assert map_at_k(torch.from_numpy(sim), torch.from_numpy(rel), 5) == map_at_k(sim, rel, 5)


# ----------------------------------------------------------------- retrieval_metrics


def test_retrieval_metrics_hand_computed() -> None:
    eye = np.eye(3, dtype=np.float32)
    images = eye
    texts = np.stack([eye[0], eye[0], eye[2]])  # caption 1 looks like image 0
    rel = np.eye(3, dtype=bool)
    out = retrieval_metrics(images, texts, rel)
    # t2i: caption 1 ranks image 0 first -> R@1 = 2/3
    # i2t: image 1 scores all captions 0, tie -> caption 0 first -> R@1 = 2/3
    assert out["t2i"]["R@1"] == pytest.approx(2 / 3)
    assert out["i2t"]["R@1"] == pytest.approx(2 / 3)
    for d in ("t2i", "i2t"):
        assert out[d]["R@5"] == 1.0 and out[d]["R@10"] == 1.0
    assert out["rm"] == pytest.approx(8 / 9)
    assert out["t2i"]["mAP@10"] == pytest.approx((1 + 1 / 2 + 1) / 3)
    assert out["i2t"]["mAP@10"] == pytest.approx((1 + 1 / 2 + 1) / 3)


def test_retrieval_metrics_matches_reference_both_directions() -> None:
    rng = np.random.default_rng(7)
    images = rng.standard_normal((12, 4)).astype(np.float32)
    texts = rng.standard_normal((20, 4)).astype(np.float32)
    images /= np.linalg.norm(images, axis=1, keepdims=True)
    texts /= np.linalg.norm(texts, axis=1, keepdims=True)
    rel = rng.random((20, 12)) < 0.2
    out = retrieval_metrics(torch.from_numpy(images), torch.from_numpy(texts), rel, (1, 5), 3)
    sim_t2i, sim_i2t = texts @ images.T, images @ texts.T
    recalls = []
    for k in (1, 5):
        assert out["t2i"][f"R@{k}"] == pytest.approx(ref_recall(sim_t2i, rel, k))
        assert out["i2t"][f"R@{k}"] == pytest.approx(ref_recall(sim_i2t, rel.T, k))
        recalls += [out["t2i"][f"R@{k}"], out["i2t"][f"R@{k}"]]
    assert out["t2i"]["mAP@3"] == pytest.approx(ref_map(sim_t2i, rel, 3))
    assert out["i2t"]["mAP@3"] == pytest.approx(ref_map(sim_i2t, rel.T, 3))
    assert set(out["t2i"]) == {"R@1", "R@5", "mAP@3"}
    assert out["rm"] == pytest.approx(np.mean(recalls))


# ----------------------------------------------------------------- compatibility matrix


def two_models() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray]:
    eye = np.eye(3, dtype=np.float32)
    shifted = eye[[1, 2, 0]]  # model B embeds item n as e_{(n+1) % 3}
    return {"A": eye, "B": shifted}, {"A": eye, "B": shifted}, np.eye(3, dtype=bool)


def test_compatibility_diagonal_equals_retrieval_metrics() -> None:
    rng = np.random.default_rng(1)
    images = {m: rng.standard_normal((6, 5)).astype(np.float32) for m in ("old", "new")}
    texts = {m: rng.standard_normal((9, 5)).astype(np.float32) for m in ("old", "new")}
    rel = rng.random((9, 6)) < 0.3
    out = compatibility_matrix(images, texts, rel)
    assert out["models"] == ["old", "new"]
    for m in ("old", "new"):
        assert out["cells"][m][m] == retrieval_metrics(images[m], texts[m], rel)
    assert out["cells"]["old"]["new"] != out["cells"]["old"]["old"]


def test_compatibility_off_diagonal_hand_computed() -> None:
    images, texts, rel = two_models()
    out = compatibility_matrix(images, texts, rel, ks=(1, 2))
    ab, ba = out["cells"]["A"]["B"], out["cells"]["B"]["A"]
    # A text m = e_m vs B image n = e_{n+1}: image m-1 first, then index order.
    # top 2: text0 [2, 0] hit, text1 [0, 1] hit, text2 [1, 0] miss
    assert ab["t2i"]["R@1"] == 0.0 and ab["t2i"]["R@2"] == pytest.approx(2 / 3)
    assert ab["i2t"]["R@1"] == 0.0 and ab["i2t"]["R@2"] == pytest.approx(2 / 3)
    assert ab["rm"] == pytest.approx(1 / 3)
    # full rankings [2,0,1], [0,1,2], [1,0,2]: relevant at ranks 2, 2, 3
    assert ab["t2i"]["mAP@10"] == pytest.approx((1 / 2 + 1 / 2 + 1 / 3) / 3)
    # B text m = e_{m+1} vs A image n = e_n: top 2 text0 [1, 0] hit, text1 [2, 0], text2 [0, 1]
    assert ba["t2i"]["R@2"] == pytest.approx(1 / 3)
    assert out["cells"]["A"]["A"]["rm"] == 1.0
    json.dumps(out)  # JSON-serialisable as returned


def test_compatibility_dim_mismatch_names_models_and_dims() -> None:
    images, texts, rel = two_models()
    images["C"] = np.eye(3, 2, dtype=np.float32)
    texts["C"] = np.eye(3, 2, dtype=np.float32)
    with pytest.raises(DataError, match=r"'A'.*dim 3.*'C'.*dim 2"):
        compatibility_matrix(images, texts, rel)


def test_compatibility_rejects_different_model_sets() -> None:
    images, texts, rel = two_models()
    del texts["B"]
    with pytest.raises(DataError, match="different models"):
        compatibility_matrix(images, texts, rel)


def test_format_matrix_rows_are_query_columns_gallery() -> None:
    images, texts, rel = two_models()
    out = compatibility_matrix(images, texts, rel, ks=(1, 2))
    lines = format_matrix(out, "R@2").splitlines()
    assert "R@2" in lines[0]
    assert lines[1].split()[-2:] == ["A", "B"]
    assert lines[2].split() == ["A", "100.0/100.0", "66.7/66.7"]
    assert lines[3].split() == ["B", "33.3/33.3", "100.0/100.0"]
    with pytest.raises(ConfigError, match="R@7"):
        format_matrix(out, "R@7")
    with pytest.raises(DataError):
        format_matrix({"cells": {}}, "R@1")


# ----------------------------------------------------------------- continual metrics

ACC = [
    [0.50, 0.90, 0.20],  # a[0][1] = 0.9 is zero-shot, before domain 1 was trained
    [0.55, 0.60, 0.10],
    [0.30, 0.50, 0.70],
]


def test_continual_hand_computed() -> None:
    assert average_final(ACC) == pytest.approx((0.3 + 0.5 + 0.7) / 3)
    # BWT: ((0.30 - 0.50) + (0.50 - 0.60)) / 2
    assert backward_transfer(ACC) == pytest.approx(-0.15)
    # forgetting: j=0 max(0.50, 0.55) - 0.30; j=1 max over i in [1, 1] = 0.60 - 0.50
    # (taking the zero-shot a[0][1] = 0.9 would give 0.4 for j=1)
    assert forgetting(ACC) == pytest.approx((0.25 + 0.10) / 2)


def test_continual_improvement_is_negative_forgetting_and_nan_above_diagonal() -> None:
    acc = [[0.4, math.nan], [0.6, 0.8]]
    assert backward_transfer(acc) == pytest.approx(0.2)
    assert forgetting(acc) == pytest.approx(-0.2)
    assert average_final(torch.tensor(acc)) == pytest.approx(0.7)


def test_continual_single_phase() -> None:
    assert average_final([[0.7]]) == pytest.approx(0.7)
    assert backward_transfer([[0.7]]) == 0.0
    assert forgetting([[0.7]]) == 0.0


@pytest.mark.parametrize(
    "acc",
    [[[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]], [[0.1, 0.2], [0.3]], [], [[0.1, 0.2], [math.nan, 0.3]]],
    ids=["non-square", "ragged", "empty", "nan-below-diagonal"],
)
@pytest.mark.parametrize("fn", [average_final, backward_transfer, forgetting])
def test_continual_rejects_bad_matrices(acc: list, fn) -> None:
    with pytest.raises(DataError):
        fn(acc)


# ----------------------------------------------------------------- input errors


@pytest.mark.parametrize(
    ("sim", "rel", "match"),
    [
        (np.zeros((2, 3)), np.zeros((3, 2), dtype=bool), "shape"),
        (np.zeros((0, 3)), np.zeros((0, 3), dtype=bool), "empty"),
        (np.zeros(3), np.zeros(3, dtype=bool), "2-D"),
        (np.array([[0.1, np.nan]]), np.zeros((1, 2), dtype=bool), "NaN"),
        (np.zeros((1, 2)), np.array([[0.5, 1.0]]), "boolean"),
    ],
    ids=["shape-mismatch", "empty", "1-d", "nan", "non-bool"],
)
def test_recall_and_map_reject_bad_data(sim: np.ndarray, rel: np.ndarray, match: str) -> None:
    with pytest.raises(DataError, match=match):
        recall_at_k(sim, rel)
    with pytest.raises(DataError, match=match):
        map_at_k(sim, rel, 5)


def test_bad_cut_offs_are_config_errors() -> None:
    sim, rel = np.zeros((1, 2)), np.ones((1, 2), dtype=bool)
    with pytest.raises(ConfigError, match="ks is empty"):
        recall_at_k(sim, rel, ())
    with pytest.raises(ConfigError, match="positive integer"):
        recall_at_k(sim, rel, (0, 1))
    with pytest.raises(ConfigError, match="positive integer"):
        map_at_k(sim, rel, 0)


def test_retrieval_metrics_rejects_bad_inputs() -> None:
    images, texts = np.eye(3, dtype=np.float32), np.eye(3, dtype=np.float32)
    with pytest.raises(DataError, match="dims differ"):
        retrieval_metrics(images, texts[:, :2], np.eye(3, dtype=bool))
    with pytest.raises(DataError, match="relevance has shape"):
        retrieval_metrics(images, texts[:2], np.eye(3, dtype=bool))
    with pytest.raises(DataError, match="text_emb"):
        retrieval_metrics(images, np.zeros((0, 3), dtype=np.float32), np.zeros((0, 3), bool))
