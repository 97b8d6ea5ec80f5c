"""Retrieval and continual-learning metrics (METHODS.md, "Metrics").

Retrieval: Recall@K in both directions, their mean Rm, and mAP@K as defined in
the CTP paper (eq. 11). A hit is any relevant gallery item, not only the paired
one. Gallery items are ranked by score, descending; equal scores are broken by
the lower gallery index, so every metric here is deterministic.

Compatibility: every (query model, gallery model) pair evaluated, rows = query
model, columns = gallery model.

Flips: per-query top-1 outcomes and the negative/positive-flip rates of a model update
(Yan et al., 2021, positive-congruent training): the regressions a net R@1 gain can hide.

Continual: from the accuracy matrix ``a[i][j]`` (R@1 on domain j after phase i),
the average final score, backward transfer (BWT) and forgetting.

All arrays may be numpy arrays or torch tensors; results are plain Python floats
so they can be written to JSON as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from training.errors import ConfigError, DataError

# Score elements per query chunk: bounds the working memory of ranking to a few
# tens of MB whatever the number of queries.
_CHUNK_ELEMENTS = 1 << 22

DIRECTIONS = ("t2i", "i2t")


# --------------------------------------------------------------------------- inputs


def _as_numpy(x: Any, name: str) -> np.ndarray:
    """Return ``x`` as a numpy array; torch tensors are detached and moved to CPU."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        x = x.detach().cpu().numpy()
    try:
        return np.asarray(x)
    except ValueError as exc:  # ragged nested sequences
        raise DataError(f"{name} is not a rectangular array: {exc}") from exc


def _check_scores(sim: Any) -> np.ndarray:
    """Validate a [Q, G] score matrix: 2-D, non-empty, real and finite."""
    sim = _as_numpy(sim, "sim")
    if sim.ndim != 2:
        raise DataError(f"sim must be 2-D [queries, gallery], got shape {sim.shape}")
    if sim.shape[0] == 0 or sim.shape[1] == 0:
        raise DataError(f"sim is empty (shape {sim.shape}): need at least one query and item")
    if not np.issubdtype(sim.dtype, np.floating) and not np.issubdtype(sim.dtype, np.integer):
        raise DataError(f"sim must hold real numbers, got dtype {sim.dtype}")
    if not np.isfinite(sim).all():
        raise DataError("sim contains NaN or infinite scores; ranking would be undefined")
    return sim if np.issubdtype(sim.dtype, np.floating) else sim.astype(np.float64)


def _check_relevance(relevant: Any, shape: tuple[int, ...], name: str) -> np.ndarray:
    """Validate a boolean relevance matrix of the given shape (0/1 integers accepted)."""
    relevant = _as_numpy(relevant, name)
    if relevant.shape != shape:
        raise DataError(f"{name} has shape {relevant.shape}, expected {shape}")
    if relevant.dtype == bool:
        return relevant
    if np.issubdtype(relevant.dtype, np.integer) and np.isin(relevant, (0, 1)).all():
        return relevant.astype(bool)
    raise DataError(f"{name} must be boolean (or 0/1 integers), got dtype {relevant.dtype}")


def _check_ks(ks: Sequence[int]) -> tuple[int, ...]:
    """Validate cut-offs: a non-empty sequence of positive integers."""
    ks = tuple(ks)
    if not ks:
        raise ConfigError("ks is empty: give at least one cut-off K, e.g. (1, 5, 10)")
    for k in ks:
        _check_k(k, "ks")
    return ks


def _check_k(k: Any, name: str) -> int:
    """Validate a single cut-off K >= 1."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ConfigError(f"{name}: cut-off K must be a positive integer, got {k!r}")
    return int(k)


def _check_embeddings(emb: Any, name: str) -> np.ndarray:
    """Validate an [N, D] embedding matrix: 2-D, non-empty, finite."""
    emb = _as_numpy(emb, name)
    if emb.ndim != 2 or emb.shape[0] == 0 or emb.shape[1] == 0:
        raise DataError(f"{name} must be a non-empty 2-D [items, dim] array, got {emb.shape}")
    if not np.issubdtype(emb.dtype, np.floating) or not np.isfinite(emb).all():
        raise DataError(f"{name} must hold finite floats (dtype {emb.dtype})")
    return emb


# --------------------------------------------------------------------------- ranking


def _top_k(sim: np.ndarray, k: int) -> np.ndarray:
    """Indices [Q, k] of the k best gallery items per row, best first.

    Exact under the tie rule (higher score first, then lower index) in O(G) per
    row plus a sort of k items: the k-th largest score ``t`` comes from a
    partition, every item above ``t`` is kept, and the ties at ``t`` are filled
    in index order until there are exactly k.
    """
    n_gallery = sim.shape[1]
    t = np.partition(sim, n_gallery - k, axis=1)[:, n_gallery - k, None]  # [Q, 1]
    above = sim > t
    at = sim == t
    room = k - above.sum(axis=1, keepdims=True)  # ties at t still to take, >= 1
    keep = above | (at & (np.cumsum(at, axis=1) <= room))  # exactly k per row
    idx = np.nonzero(keep)[1].reshape(sim.shape[0], k)  # ascending index per row
    scores = np.take_along_axis(sim, idx, axis=1)
    order = np.argsort(-scores, axis=1, kind="stable")  # stable: lower index wins ties
    return np.take_along_axis(idx, order, axis=1)


def _query_slices(n_queries: int, n_gallery: int) -> list[slice]:
    """Query chunks holding about ``_CHUNK_ELEMENTS`` scores each."""
    step = max(1, _CHUNK_ELEMENTS // n_gallery)
    return [slice(start, start + step) for start in range(0, n_queries, step)]


def _ranked_hits(
    scores: Callable[[slice], np.ndarray], relevant: np.ndarray, k: int
) -> np.ndarray:
    """Bool [Q, k]: whether the item at rank r (0-based) of each query is relevant.

    ``scores(rows)`` returns the [q, G] scores of a chunk of queries, so a full
    [Q, G] matrix never has to exist at once. k is clamped to G.
    """
    n_queries, n_gallery = relevant.shape
    k = min(k, n_gallery)
    parts = []
    for rows in _query_slices(n_queries, n_gallery):
        idx = _top_k(scores(rows), k)
        parts.append(np.take_along_axis(relevant[rows], idx, axis=1))
    return np.concatenate(parts, axis=0)


def _ranked_hits_from_scores(sim: np.ndarray, relevant: np.ndarray, k: int) -> np.ndarray:
    """``_ranked_hits`` over a given [Q, G] score matrix."""
    return _ranked_hits(lambda rows: sim[rows], relevant, k)


def _ranked_hits_from_embeddings(
    query: np.ndarray, gallery: np.ndarray, relevant: np.ndarray, k: int
) -> np.ndarray:
    """``_ranked_hits`` with scores ``query @ gallery.T`` (dot product), one chunk at a time."""
    return _ranked_hits(lambda rows: query[rows] @ gallery.T, relevant, k)


def _recall_from_hits(hits: np.ndarray, ks: Sequence[int]) -> dict[int, float]:
    """Recall@K per K: fraction of queries with a relevant item in their top K."""
    # 0-based rank of the first hit; inf when none, so no K (even K > G) counts it
    first = np.where(hits.any(axis=1), hits.argmax(axis=1), np.inf)
    return {k: float(np.mean(first < k)) for k in ks}


def _map_from_hits(hits: np.ndarray, k: int) -> float:
    """mAP@K (CTP eq. 11) from the ranked relevance of the top-K items."""
    hits = hits[:, :k]
    ranks = np.arange(1, hits.shape[1] + 1)
    precision = np.cumsum(hits, axis=1) / ranks  # P_q(k) at the hit positions
    m_q = hits.sum(axis=1)  # relevant items retrieved in the top K
    total = (precision * hits).sum(axis=1)
    ap = np.divide(total, m_q, out=np.zeros(len(m_q)), where=m_q > 0)
    return float(ap.mean())


# --------------------------------------------------------------------------- retrieval


def recall_at_k(
    sim: np.ndarray, relevant: np.ndarray, ks: Sequence[int] = (1, 5, 10)
) -> dict[int, float]:
    """Recall@K (METHODS.md "Metrics"): fraction of queries with a relevant item in the top K.

    ``sim`` [Q, G] scores, higher is better; ``relevant`` bool [Q, G]. The top K
    is taken by score, ties broken by lower gallery index. A query with no
    relevant item counts as a miss. K larger than G is clamped to G.
    Returns ``{K: recall in [0, 1]}``.
    """
    sim = _check_scores(sim)
    relevant = _check_relevance(relevant, sim.shape, "relevant")
    ks = _check_ks(ks)
    return _recall_from_hits(_ranked_hits_from_scores(sim, relevant, max(ks)), ks)


def map_at_k(sim: np.ndarray, relevant: np.ndarray, k: int) -> float:
    """mAP@K as defined in the CTP paper, eq. 11.

    ``mAP@N = 1/Q sum_q 1/m_q sum_{k=1..N} P_q(k) delta_q(k)`` with
    ``P_q(k) = (R_q(k) + 1) / k``, where ``delta_q(k)`` is 1 when the rank-k item
    is relevant and ``R_q(k)`` counts the relevant items ranked before k, so
    ``P_q(k)`` is the precision at rank k at every hit. The normaliser ``m_q``
    is, as the paper states, the number of relevant items *retrieved in the top
    N* (not all relevant items in the gallery); a query with none there (or no
    relevant item at all) scores 0 and is still counted in Q. Ranking: score
    descending, ties by lower gallery index; N larger than G is clamped to G.
    """
    sim = _check_scores(sim)
    relevant = _check_relevance(relevant, sim.shape, "relevant")
    k = _check_k(k, "k")
    return _map_from_hits(_ranked_hits_from_scores(sim, relevant, k), k)


def _direction_metrics(
    query: np.ndarray, gallery: np.ndarray, relevant: np.ndarray, ks: tuple[int, ...], map_k: int
) -> dict[str, float]:
    """{"R@K": ..., "mAP@k": ...} for one retrieval direction."""
    hits = _ranked_hits_from_embeddings(query, gallery, relevant, max(*ks, map_k))
    out = {f"R@{k}": v for k, v in _recall_from_hits(hits, ks).items()}
    out[f"mAP@{map_k}"] = _map_from_hits(hits, map_k)
    return out


def _cell_metrics(
    q_text: np.ndarray, q_image: np.ndarray, g_image: np.ndarray, g_text: np.ndarray,
    relevance: np.ndarray, ks: tuple[int, ...], map_k: int,
) -> dict[str, Any]:
    """Both directions and Rm: the query side's texts/images against the gallery's images/texts."""
    t2i = _direction_metrics(q_text, g_image, relevance, ks, map_k)
    i2t = _direction_metrics(q_image, g_text, relevance.T, ks, map_k)
    recalls = [d[f"R@{k}"] for d in (t2i, i2t) for k in ks]
    return {"t2i": t2i, "i2t": i2t, "rm": float(np.mean(recalls))}


def retrieval_metrics(
    image_emb: np.ndarray,
    text_emb: np.ndarray,
    relevance: np.ndarray,
    ks: Sequence[int] = (1, 5, 10),
    map_k: int = 10,
) -> dict[str, Any]:
    """Recall@K both directions, their mean Rm, and mAP@map_k (METHODS.md "Metrics").

    ``image_emb`` [N, D] and ``text_emb`` [M, D] are L2-normalised, so the score
    is their dot product (cosine); ``relevance`` bool [M, N] says caption m is
    relevant to image n. Text->image ranks images for each caption; image->text
    ranks captions for each image with ``relevance.T``.
    Returns ``{"t2i": {"R@1", ..., "mAP@10"}, "i2t": {...}, "rm": mean of all recalls}``.
    """
    images = _check_embeddings(image_emb, "image_emb")
    texts = _check_embeddings(text_emb, "text_emb")
    if images.shape[1] != texts.shape[1]:
        raise DataError(
            f"embedding dims differ: image_emb has {images.shape[1]}, text_emb {texts.shape[1]}"
        )
    relevance = _check_relevance(relevance, (texts.shape[0], images.shape[0]), "relevance")
    ks, map_k = _check_ks(ks), _check_k(map_k, "map_k")
    return _cell_metrics(texts, images, images, texts, relevance, ks, map_k)


def cross_metrics(
    query_text: np.ndarray, query_image: np.ndarray, gallery_image: np.ndarray,
    gallery_text: np.ndarray, relevance: np.ndarray, ks: Sequence[int] = (1, 5, 10),
    map_k: int = 10,
) -> dict[str, Any]:
    """One compatibility cell: a query model's texts/images against a gallery model's
    images/texts, all in one space (same dim). ``relevance`` bool [M texts, N images]."""
    qt, qi, gi, gt, relevance = _check_cell(query_text, query_image, gallery_image,
                                            gallery_text, relevance)
    return _cell_metrics(qt, qi, gi, gt, relevance, _check_ks(ks), _check_k(map_k, "map_k"))


def _check_cell(
    query_text: Any, query_image: Any, gallery_image: Any, gallery_text: Any, relevance: Any,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Validated (query text, query image, gallery image, gallery text, relevance) of a cell."""
    qt, qi = _check_embeddings(query_text, "query_text"), _check_embeddings(query_image, "query_image")
    gi, gt = _check_embeddings(gallery_image, "gallery_image"), _check_embeddings(gallery_text, "gallery_text")
    _check_pair_dims("query", "gallery", qt, gi)
    _check_pair_dims("query", "gallery", qi, gt)
    relevance = _check_relevance(relevance, (qt.shape[0], gi.shape[0]), "relevance")
    return qt, qi, gi, gt, relevance


# --------------------------------------------------------------------------- flips


def top1_hits(sim: Any, relevant: Any) -> np.ndarray:
    """Bool [Q]: whether each query's top-1 gallery item is relevant.

    Ranked exactly as ``recall_at_k`` ranks (score descending, ties by lower gallery
    index), so ``top1_hits(sim, relevant).mean()`` is R@1. The per-query form is what
    flip rates need (see ``negative_flip_rate``).
    """
    sim = _check_scores(sim)
    relevant = _check_relevance(relevant, sim.shape, "relevant")
    return _ranked_hits_from_scores(sim, relevant, 1)[:, 0]


def cross_top1_hits(
    query_text: Any, query_image: Any, gallery_image: Any, gallery_text: Any, relevance: Any,
) -> dict[str, np.ndarray]:
    """Per-query top-1 hits of one compatibility cell (the cell ``cross_metrics`` measures):
    ``{"t2i": bool [M texts], "i2t": bool [N images]}``; each mean is that direction's R@1.
    Scores are dot products, ranked as in ``recall_at_k``; ``relevance`` bool [M, N]."""
    qt, qi, gi, gt, relevance = _check_cell(query_text, query_image, gallery_image,
                                            gallery_text, relevance)
    return {"t2i": _ranked_hits_from_embeddings(qt, gi, relevance, 1)[:, 0],
            "i2t": _ranked_hits_from_embeddings(qi, gt, relevance.T, 1)[:, 0]}


def _check_flip_pair(before: Any, after: Any) -> tuple[np.ndarray, np.ndarray]:
    """Validate two per-query top-1 outcomes: 1-D, non-empty, boolean, same length."""
    b = _as_numpy(before, "before_top1_ok")
    if b.ndim != 1 or b.shape[0] == 0:
        raise DataError(f"before_top1_ok must be a non-empty 1-D array, got shape {b.shape}")
    return (_check_relevance(b, b.shape, "before_top1_ok"),
            _check_relevance(after, b.shape, "after_top1_ok"))


def negative_flip_rate(before_top1_ok: Any, after_top1_ok: Any) -> float:
    """Negative-flip rate: the fraction of queries whose top-1 was relevant before an update
    and is not after it (Yan et al., 2021, "Positive-Congruent Training: Towards
    Regression-Free Model Updates"; the regressions that BCT-style compatibility training
    does not see, since a net recall gain can hide them).

    The denominator is *all* queries, as in Yan et al., not only those right before.
    Inputs: bool [Q] per-query top-1 outcomes (e.g. from ``top1_hits``), same queries.
    """
    before, after = _check_flip_pair(before_top1_ok, after_top1_ok)
    return float(np.mean(before & ~after))


def positive_flip_rate(before_top1_ok: Any, after_top1_ok: Any) -> float:
    """Positive-flip rate: the fraction of all queries whose top-1 was wrong before and is
    relevant after (the counterpart of ``negative_flip_rate``, same denominator), so
    ``R@1(after) - R@1(before) == positive - negative``."""
    before, after = _check_flip_pair(before_top1_ok, after_top1_ok)
    return float(np.mean(~before & after))


# --------------------------------------------------------------------------- compatibility


def _check_models(images: Mapping[str, Any], texts: Mapping[str, Any]) -> list[str]:
    """Model names, in the order of ``images``; both mappings must name the same models."""
    if not images:
        raise DataError("no models given: images and texts are empty")
    if set(images) != set(texts):
        raise DataError(
            f"images and texts name different models: {sorted(images)} vs {sorted(texts)}"
        )
    return list(images)


def _check_pair_dims(query: str, gallery: str, q_emb: np.ndarray, g_emb: np.ndarray) -> None:
    """A query model can only search a gallery model of the same embedding dim."""
    if q_emb.shape[1] != g_emb.shape[1]:
        raise DataError(
            f"query model {query!r} has dim {q_emb.shape[1]} but gallery model {gallery!r} "
            f"has dim {g_emb.shape[1]}: they cannot share an embedding space"
        )


def compatibility_matrix(
    images: Mapping[str, np.ndarray],
    texts: Mapping[str, np.ndarray],
    relevance: np.ndarray,
    ks: Sequence[int] = (1, 5, 10),
    map_k: int = 10,
) -> dict[str, Any]:
    """Cross-model retrieval for every (query model, gallery model) pair (METHODS.md "Metrics").

    ``images``/``texts`` map model name -> embeddings of the same eval set in the
    same order ([N, D] and [M, D]); ``relevance`` bool [M, N]. For query model q
    and gallery model g, text->image ranks ``images[g]`` for ``texts[q]`` and
    image->text ranks ``texts[g]`` for ``images[q]``. The diagonal is each
    model's own ``retrieval_metrics``.
    Returns ``{"models": [...], "cells": {q: {g: {"t2i", "i2t", "rm"}}}}``.
    """
    models = _check_models(images, texts)
    ks, map_k = _check_ks(ks), _check_k(map_k, "map_k")
    img = {m: _check_embeddings(images[m], f"images[{m!r}]") for m in models}
    txt = {m: _check_embeddings(texts[m], f"texts[{m!r}]") for m in models}
    n_img, n_txt = img[models[0]].shape[0], txt[models[0]].shape[0]
    for m in models:
        if img[m].shape[0] != n_img or txt[m].shape[0] != n_txt:
            raise DataError(f"model {m!r} embeds a different number of images or texts")
    relevance = _check_relevance(relevance, (n_txt, n_img), "relevance")
    cells: dict[str, dict[str, Any]] = {}
    for q in models:
        cells[q] = {}
        for g in models:
            _check_pair_dims(q, g, txt[q], img[g])
            _check_pair_dims(q, g, img[q], txt[g])
            cells[q][g] = _cell_metrics(txt[q], img[q], img[g], txt[g], relevance, ks, map_k)
    return {"models": models, "cells": cells}


def _cell_value(cell: Mapping[str, Any], direction: str, metric: str) -> float:
    """One metric of one direction of a cell; ConfigError when the metric is absent."""
    values = cell[direction]
    if metric not in values:
        raise ConfigError(f"metric {metric!r} not in the matrix; available: {sorted(values)}")
    return float(values[metric])


def _cell_text(cell: Mapping[str, Any] | None, metric: str) -> str:
    """"t2i/i2t" in percent; "-" where the query model has no route to the gallery's space."""
    if cell is None:
        return "-"
    return (f"{100 * _cell_value(cell, 't2i', metric):.1f}/"
            f"{100 * _cell_value(cell, 'i2t', metric):.1f}")


def format_matrix(matrix: dict[str, Any], metric: str = "R@1") -> str:
    """Text table of a ``compatibility_matrix`` result (METHODS.md "Metrics").

    Rows = query model, columns = gallery model; each cell is "t2i/i2t" of
    ``metric`` in percent with one decimal, e.g. ``"52.3/61.0"``.
    """
    try:
        models, cells = list(matrix["models"]), matrix["cells"]
        rows = [[_cell_text(cells[q][g], metric) for g in models] for q in models]
    except (KeyError, TypeError) as exc:
        raise DataError(f"not a compatibility matrix (missing {exc})") from exc
    header = ["query \\ gallery", *models]
    table = [header] + [[q, *row] for q, row in zip(models, rows)]
    widths = [max(len(r[c]) for r in table) for c in range(len(header))]
    lines = ["  ".join(s.ljust(w) for s, w in zip(r, widths)).rstrip() for r in table]
    return "\n".join([f"{metric} (%), cell = t2i/i2t", *lines])


# --------------------------------------------------------------------------- continual


def _check_accuracy(acc: Any) -> np.ndarray:
    """Validate a square T x T accuracy matrix; finite on and below the diagonal.

    Entries above the diagonal (a domain before it was trained) are never used
    and may be NaN when those evaluations were skipped.
    """
    a = _as_numpy(acc, "acc")
    if a.dtype == object or not (
        np.issubdtype(a.dtype, np.floating) or np.issubdtype(a.dtype, np.integer)
    ):
        raise DataError(f"acc must be a rectangular matrix of numbers, got dtype {a.dtype}")
    if a.ndim != 2 or a.shape[0] != a.shape[1] or a.shape[0] == 0:
        raise DataError(f"acc must be a non-empty square T x T matrix, got shape {a.shape}")
    a = a.astype(float)
    if not np.isfinite(np.tril(a)).all():
        raise DataError("acc has NaN or infinite entries on or below the diagonal")
    return a


def average_final(acc: Sequence[Sequence[float]]) -> float:
    """Average final score (METHODS.md "Metrics"): mean over all domains j of ``a[T][j]``.

    ``acc[i][j]`` is R@1 on domain j after phase i (phase i trains domain i);
    T is the last phase.
    """
    a = _check_accuracy(acc)
    return float(a[-1].mean())


def backward_transfer(acc: Sequence[Sequence[float]]) -> float:
    """BWT (METHODS.md "Metrics"): mean over j < T of ``a[T][j] - a[j][j]``.

    Negative when learning later domains hurt earlier ones. With a single phase
    there is no earlier domain and BWT is 0.0.
    """
    a = _check_accuracy(acc)
    last = a.shape[0] - 1
    if last == 0:
        return 0.0
    return float(np.mean(a[last, :last] - np.diag(a)[:last]))


def forgetting(acc: Sequence[Sequence[float]]) -> float:
    """Forgetting (METHODS.md "Metrics"): mean over j < T of ``max_i a[i][j] - a[T][j]``.

    The max runs over i in [j, T-1]: the phases after domain j was trained and
    before the last one (Chaudhry et al., 2018, restricted to phases where j had
    been learned). Rows i < j are excluded because they are zero-shot scores on a
    domain not yet trained, which is not knowledge that can be forgotten; the last
    phase is excluded as in Chaudhry et al., so a domain that improved gives a
    negative term. With a single phase forgetting is 0.0.
    """
    a = _check_accuracy(acc)
    last = a.shape[0] - 1
    if last == 0:
        return 0.0
    best = [a[j:last, j].max() for j in range(last)]
    return float(np.mean(np.asarray(best) - a[last, :last]))
