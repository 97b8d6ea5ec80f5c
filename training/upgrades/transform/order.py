"""Backfill orders, by name, and the predictor the learned one ranks by.

- ``id``      the items in id order (what a migration did before it had a choice)
- ``random``  a seeded permutation
- ``learned`` most wrong first: per item, the transformed vectors' predicted error
              (``1 - cos(transformed, NEW's own vector)``, summed over the item's kinds),
              from what is stored, by an ``ErrorPredictor`` fitted on a held-out part of
              the sample (the items whose true error is known because NEW embedded them)

The predictor (``ErrorPredictor``: nearest held-out neighbours, or ridge regression on
the OLD vector and its transform) learns what FastFill learns as uncertainty, from the
stored features; the error it predicts is of the map fitted without the held-out items.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from training.errors import ConfigError
from training.upgrades.transform.config import ORDERS, PREDICTORS


def features(old: np.ndarray, transformed: np.ndarray) -> np.ndarray:
    """[N, D_old + D_new + 1]: the stored vector, its transform and a constant."""
    ones = np.ones((len(old), 1), np.float64)
    return np.concatenate([old.astype(np.float64), transformed.astype(np.float64), ones], 1)


def errors(transformed: np.ndarray, new: np.ndarray) -> np.ndarray:
    """[N] ``1 - cos`` of each transformed vector with NEW's own embedding of the item."""
    t = transformed / np.maximum(np.linalg.norm(transformed, axis=1, keepdims=True), 1e-12)
    n = new / np.maximum(np.linalg.norm(new, axis=1, keepdims=True), 1e-12)
    return 1.0 - (t * n).sum(1)


class ErrorPredictor:
    """Per kind, a predictor of a transformed vector's error from what is stored:

    - ``knn``: the mean error of the ``k`` held-out items nearest in OLD's space (cosine),
      weighted by similarity: no shape assumed, so a region of the space that NEW sees
      differently is found wherever it is
    - ``ridge``: ridge regression on the OLD vector and its transform (linear)
    """

    def __init__(self, method: str, state: Mapping[str, Mapping[str, np.ndarray]],
                 k: int = 16) -> None:
        if method not in PREDICTORS:
            raise ConfigError(f"order predictor must be one of {PREDICTORS}, got {method!r}")
        self.method, self.k = method, k
        self.state = {kind: {n: np.asarray(v) for n, v in parts.items()}
                      for kind, parts in state.items()}

    @classmethod
    def fit(cls, rows: Mapping[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
            method: str = "knn", ridge: float = 1.0, k: int = 16) -> ErrorPredictor:
        """``rows``: kind -> (old [H, D], transformed [H, D'], true error [H])."""
        state: dict[str, dict[str, np.ndarray]] = {}
        for kind, (old, transformed, err) in rows.items():
            if method == "knn":
                state[kind] = {"keys": _unit(old).astype(np.float32),
                               "values": np.asarray(err, np.float32)}
                continue
            f = features(old, transformed)
            gram = f.T @ f
            penalty = ridge * np.trace(gram) / len(gram)
            state[kind] = {"weights": np.linalg.solve(gram + penalty * np.eye(len(gram)),
                                                      f.T @ err)}
        return cls(method, state, k)

    def predict(self, kind: str, old: np.ndarray, transformed: np.ndarray,
                chunk: int = 4096) -> np.ndarray:
        if kind not in self.state:
            raise ConfigError(f"the order predictor was fitted without {kind} pairs")
        parts = self.state[kind]
        if self.method == "ridge":
            return features(old, transformed) @ parts["weights"]
        keys, values = parts["keys"], parts["values"].astype(np.float64)
        k = min(self.k, len(keys))
        out = np.empty(len(old), np.float64)
        q = _unit(np.asarray(old, np.float32))
        for start in range(0, len(q), chunk):
            sim = q[start:start + chunk] @ keys.T  # [c, H]
            near = np.argpartition(-sim, k - 1, axis=1)[:, :k]
            w = np.maximum(np.take_along_axis(sim, near, 1), 0.0) + 1e-6
            out[start:start + chunk] = (w * values[near]).sum(1) / w.sum(1)
        return out


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def order_items(name: str, ids: Sequence[str], scores: np.ndarray | None = None,
                seed: int = 0) -> list[int]:
    """Positions of ``ids`` in backfill order: ``id`` (sorted ids), ``random`` (seeded),
    ``learned`` (``scores`` [N] descending: most wrong first; ties by id)."""
    if name not in ORDERS:
        raise ConfigError(f"order must be one of {ORDERS}, got {name!r}")
    by_id = sorted(range(len(ids)), key=lambda n: ids[n])
    if name == "id":
        return by_id
    if name == "random":
        return [int(i) for i in np.random.default_rng(seed).permutation(len(ids))]
    if scores is None or len(scores) != len(ids):
        raise ConfigError("the learned order needs one predicted error per item")
    rank = np.empty(len(ids), np.int64)
    rank[by_id] = np.arange(len(ids))
    return [int(i) for i in np.lexsort((rank, -np.asarray(scores, np.float64)))]


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    """Rank correlation (no tie correction): how well a predicted error orders the truth."""
    if len(a) < 2:
        return float("nan")
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])
