"""A migration's curve on a set of items, without writing anything: what each way of
serving would answer at each fraction of the backfill.

The items are a gallery side (or a validation set, evaluated the way the gallery's items
are): per modality their OLD vectors, NEW's own vectors and their transforms. At a
fraction ``f`` under an order, the first ``round(f * N)`` items of the order carry NEW's
vectors, the others their transforms: the target side as it stands. Per query, top-1 hit
or not, for:

- ``old->old``   OLD's own query against the OLD side (the gain's zero)
- ``new->new``   NEW's query against NEW's vectors of every item (the gain's one)
- ``routed``     the routed query (into OLD's space) against the OLD side: what serves
                 until a migration switches
- ``side``       NEW's query against the target side at ``f`` under each order
- ``hybrid``     each item scored by both: ``cos(NEW query, target side) + cos(routed
                 query, OLD side)`` (exactly what the gateway can compute for the union of
                 both sides' top candidates)

Directions: ``t2i`` (text queries, the items' images), ``i2t`` (image queries, the
items' texts). Shares of the gain carry a bootstrap standard error over the queries.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

DIRECTIONS = {"t2i": ("text", "image"), "i2t": ("image", "text")}  # (query kind, item kind)
FRACTIONS = (0.0, 0.01, 0.05, 0.10, 0.25, 0.50, 1.0)


@dataclass
class Items:
    """Kind -> [N, D] rows of the same N items (one row per item for each kind)."""

    old: Mapping[str, np.ndarray]
    new: Mapping[str, np.ndarray]
    transformed: Mapping[str, np.ndarray]

    def __len__(self) -> int:
        return len(next(iter(self.old.values())))


@dataclass
class Queries:
    """Per query kind: NEW's own query, the routed one (into OLD's space) and OLD's own;
    per direction, relevance [Q, N] against the items."""

    new: Mapping[str, np.ndarray]
    routed: Mapping[str, np.ndarray]
    old: Mapping[str, np.ndarray]
    relevant: Mapping[str, np.ndarray]


def done_mask(order: Sequence[int], n: int, fraction: float) -> np.ndarray:
    """[N] bool: the items re-embedded once ``fraction`` of the backfill is done."""
    mask = np.zeros(n, bool)
    mask[np.asarray(order[:round(fraction * n)], np.int64)] = True
    return mask


def curve(items: Items, queries: Queries, orders: Mapping[str, Sequence[int]],
          fractions: Sequence[float] = FRACTIONS, hybrid: bool = True,
          chunk: int = 256) -> dict[str, dict[str, np.ndarray]]:
    """Key -> direction -> [Q] bool top-1 hits. Keys: ``old->old``, ``new->new``,
    ``routed``, and per order and fraction ``side <order> <f>`` and ``hybrid <order> <f>``.
    An order is a list of item rows, or per kind its own list (a gallery whose images and
    texts are separate items, each kind backfilled in its own order)."""
    masks = {(name, f, kind): done_mask(order[kind] if isinstance(order, Mapping) else order,
                                        len(items.old[kind]), f)
             for name, order in orders.items() for f in fractions for kind in items.old}
    out: dict[str, dict[str, list[np.ndarray]]] = {}

    def add(key: str, direction: str, hits: np.ndarray) -> None:
        out.setdefault(key, {}).setdefault(direction, []).append(hits)

    for direction, (qk, ik) in DIRECTIONS.items():
        if qk not in queries.new or ik not in items.old:
            continue
        relevant = queries.relevant[direction]
        for start in range(0, len(queries.new[qk]), chunk):
            rows = slice(start, start + chunk)
            rel = relevant[rows]
            s_old = queries.old[qk][rows] @ items.old[ik].T
            s_routed = queries.routed[qk][rows] @ items.old[ik].T
            s_new = queries.new[qk][rows] @ items.new[ik].T
            s_trans = queries.new[qk][rows] @ items.transformed[ik].T
            add("old->old", direction, top1_hits(s_old, rel))
            add("routed", direction, top1_hits(s_routed, rel))
            add("new->new", direction, top1_hits(s_new, rel))
            for (name, f, kind), mask in masks.items():
                if kind != ik:
                    continue
                side = np.where(mask[None, :], s_new, s_trans)
                add(f"side {name} {f:g}", direction, top1_hits(side, rel))
                if hybrid:
                    add(f"hybrid {name} {f:g}", direction, top1_hits(side + s_routed, rel))
    return {key: {d: np.concatenate(parts) for d, parts in per.items()}
            for key, per in out.items()}


def top1_hits(scores: np.ndarray, relevant: np.ndarray) -> np.ndarray:
    """[Q] bool: is each row's best-scored item relevant (scores, relevant: [Q, N])."""
    return relevant[np.arange(len(scores)), scores.argmax(1)]


def recall(hits: Mapping[str, dict[str, np.ndarray]], key: str, direction: str) -> float:
    return float(hits[key][direction].mean())


def share(hits: Mapping[str, dict[str, np.ndarray]], key: str, direction: str,
          boot: int = 1000, seed: int = 0) -> dict[str, float | None]:
    """The share of the gain at R@1, ``(key - old->old) / (new->new - old->old)``, and its
    standard error from ``boot`` bootstrap draws of the queries (paired: one draw of the
    queries for the three); None where NEW is no better on these queries."""
    a = hits[key][direction].astype(np.float64)
    o = hits["old->old"][direction].astype(np.float64)
    b = hits["new->new"][direction].astype(np.float64)
    gain = b.mean() - o.mean()
    if gain <= 0:
        return {"share": None, "se": None}
    value = (a.mean() - o.mean()) / gain
    idx = np.random.default_rng(seed).integers(0, len(a), (boot, len(a)))
    gains = b[idx].mean(1) - o[idx].mean(1)
    ok = gains > 0
    draws = (a[idx].mean(1)[ok] - o[idx].mean(1)[ok]) / gains[ok]
    return {"share": float(value), "se": float(draws.std(ddof=1)) if ok.sum() > 1 else None}


def negative_flip(hits: Mapping[str, dict[str, np.ndarray]], key: str, against: str,
                  direction: str) -> float:
    """Queries ``against`` answered right and ``key`` does not, over all queries."""
    before, after = hits[against][direction], hits[key][direction]
    return float((before & ~after).mean())


def switch_fraction(hits: Mapping[str, dict[str, np.ndarray]], order: str,
                    fractions: Sequence[float], max_negative_flip: float | None = None,
                    prefix: str = "side") -> float | None:
    """The first fraction from which the side under ``order`` beats the routed old side
    (R@1 strictly higher in both directions, and with ``max_negative_flip``, no more
    queries lost against it than that) at that fraction and every later one measured:
    where a progressive migration switches. None: not before the end."""
    def beats(f: float) -> bool:
        key = f"{prefix} {order} {f:g}"
        for d in hits[key]:
            if recall(hits, key, d) <= recall(hits, "routed", d):
                return False
            if max_negative_flip is not None and negative_flip(
                    hits, key, "routed", d) > max_negative_flip:
                return False
        return True

    found = None
    for f in sorted(fractions, reverse=True):
        if not beats(f):
            break
        found = f
    return found


def summary(hits: Mapping[str, dict[str, np.ndarray]], fractions: Sequence[float],
            orders: Sequence[str]) -> dict[str, Any]:
    """R@1 and share (with its error) per direction for every key, in a JSON-ready dict."""
    out: dict[str, Any] = {}
    for key in hits:
        out[key] = {d: {"R@1": recall(hits, key, d), **share(hits, key, d)} for d in hits[key]}
    return out
