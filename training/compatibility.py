"""Compatibility of model versions: any query version against any gallery version.

A cell (q, g) embeds queries with q *through its route into g's space* and the
gallery with g natively, so upgraded versions (XBT) are measured as they will be
served. A cell is ``None`` when q has no route into g's space.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from training.artifacts import Artifact
from training.data import PairDataset
from training.evaluate import cross_metrics, cross_top1_hits
from training.versions import load_encoder

# (version id, space) -> (image [N, D], text [M, D]) embeddings of one dataset.
Embeddings = dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]


def embed_dataset(artifact: Artifact, dataset: PairDataset, space: str | None = None,
                  language: str = "en") -> tuple[np.ndarray, np.ndarray]:
    """(image [N, D], text [M, D]) embeddings of a dataset by a version into ``space``."""
    encoder = load_encoder(artifact, space)
    texts, _ = dataset.captions(language)
    images = [dataset.load_image(i) for i in range(len(dataset))]
    return encoder.encode_images(images), encoder.encode_texts(texts)


def compatibility_of_artifacts(artifacts: Sequence[Artifact], dataset: PairDataset,
                               language: str = "en",
                               cache: Embeddings | None = None) -> dict[str, Any]:
    """``{"models": [version ids], "spaces": {...}, "cells": {q: {g: cell | None}}}``.

    ``cache``, if given, is filled with (and reused for) the embeddings, one pass per
    (version, space), so a caller can measure more on them (``cell_top1_hits``)."""
    relevance = dataset.relevance(language)
    cache = {} if cache is None else cache

    def embedded(art: Artifact, space: str) -> tuple[np.ndarray, np.ndarray]:
        key = (art.version_id, space)
        if key not in cache:
            cache[key] = embed_dataset(art, dataset, space, language)
        return cache[key]

    cells: dict[str, dict[str, Any]] = {}
    for q in artifacts:
        cells[q.version_id] = {}
        for g in artifacts:
            if g.space not in q.routes:
                cells[q.version_id][g.version_id] = None
                continue
            q_img, q_txt = embedded(q, g.space)
            g_img, g_txt = embedded(g, g.space)
            cells[q.version_id][g.version_id] = cross_metrics(q_txt, q_img, g_img, g_txt, relevance)
    return {"models": [a.version_id for a in artifacts],
            "spaces": {a.version_id: a.space for a in artifacts}, "cells": cells}


def cell_top1_hits(cache: Embeddings, query: Artifact, gallery: Artifact,
                   relevance: np.ndarray) -> dict[str, np.ndarray]:
    """Per-query top-1 hits of the cell (query, gallery) from embeddings that
    ``compatibility_of_artifacts`` left in ``cache``: ``{"t2i": bool [M], "i2t": bool [N]}``
    (the inputs of flip rates, ``training.evaluate.negative_flip_rate``)."""
    q_img, q_txt = cache[(query.version_id, gallery.space)]
    g_img, g_txt = cache[(gallery.version_id, gallery.space)]
    return cross_top1_hits(q_txt, q_img, g_img, g_txt, relevance)


def reranked_top1_hits(route: tuple[np.ndarray, np.ndarray], old: tuple[np.ndarray, np.ndarray],
                       new: tuple[np.ndarray, np.ndarray], relevance: np.ndarray,
                       k: int) -> dict[str, np.ndarray]:
    """Per-query top-1 hits of rerank on read: the route's top ``k`` (the query through
    the route, against the gallery's old vectors) ranked by the new model natively (its
    query against each candidate's new vector), every candidate's new vector known (a
    side fully re-embedded). Each argument is (image [N, D], text [M, D]) embeddings;
    ``relevance`` bool [M texts, N images]; ``{"t2i": bool [M], "i2t": bool [N]}``."""
    def hits(q_route: np.ndarray, g_old: np.ndarray, q_new: np.ndarray, g_new: np.ndarray,
             rel: np.ndarray) -> np.ndarray:
        depth = max(1, min(k, g_old.shape[0]))
        scores = q_route @ g_old.T
        candidates = np.argsort(-scores, axis=1, kind="stable")[:, :depth]
        by_new = np.einsum("qd,qkd->qk", q_new, g_new[candidates])
        top = candidates[np.arange(len(candidates)), by_new.argmax(axis=1)]
        return rel[np.arange(len(top)), top]

    rel = np.asarray(relevance, bool)
    return {"t2i": hits(route[1], old[0], new[1], new[0], rel),
            "i2t": hits(route[0], old[1], new[0], new[1], rel.T)}


def hybrid_top1_hits(route: tuple[np.ndarray, np.ndarray], old: tuple[np.ndarray, np.ndarray],
                     new: tuple[np.ndarray, np.ndarray],
                     relevance: np.ndarray) -> dict[str, np.ndarray]:
    """Per-query top-1 hits of hybrid scoring with both sides whole: each item scored by
    the route's query against its old vector plus the new model's query against its new
    vector, the best sum first (``service.usecases.search.hybrid_search`` sums the same
    two scores over the union of each side's candidates). Arguments as
    ``reranked_top1_hits``."""
    def hits(q_route: np.ndarray, g_old: np.ndarray, q_new: np.ndarray, g_new: np.ndarray,
             rel: np.ndarray) -> np.ndarray:
        top = (q_route @ g_old.T + q_new @ g_new.T).argmax(axis=1)
        return rel[np.arange(len(top)), top]

    rel = np.asarray(relevance, bool)
    return {"t2i": hits(route[1], old[0], new[1], new[0], rel),
            "i2t": hits(route[0], old[1], new[0], new[1], rel.T)}
