"""Rerank on read, simulated on embeddings (the plan's ``rerank@k`` options and
``bench frontier``'s rows; the gateway's own is ``service.usecases.rerank``).

A reranked search takes the serving route's top ``k`` items on the OLD side (the route's
query against the stored OLD vectors) and ranks those ``k`` by NEW's score (NEW's own
query against the items' NEW vectors: read where the new side holds them, else embedded
on the read). Every candidate gets its NEW vector (the gateway keeps a candidate it could
not embed in its route place; the simulation has every source), so a search's answer does
not depend on how far the backfill has gone: the share is the same from the first query.

``fused``: the candidates ranked by NEW's score plus the route's (both cosines), the
option the issue asks to offer "if the evidence favours it" (the frontier reports both).

The fill: every search embeds the candidates it did not find, so after a stream of
queries the new side holds the union of their candidate sets (``fill_curve``: the share
of searches that embedded nothing, fully warm, against the share of the gallery filled).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

DIRECTIONS = {"t2i": ("text", "image"), "i2t": ("image", "text")}  # (query kind, item kind)
KS = (5, 10, 20, 50)
CHUNK = 512


def candidates(routed: np.ndarray, items_old: np.ndarray, k: int,
               chunk: int = CHUNK) -> np.ndarray:
    """[Q, k] the route's top ``k`` items of each query, best first (``routed``: [Q, D]
    the route's queries in OLD's space; ``items_old``: [N, D] the stored OLD vectors)."""
    k = min(k, len(items_old))
    out = np.empty((len(routed), k), np.int64)
    for start in range(0, len(routed), chunk):
        scores = routed[start:start + chunk] @ items_old.T
        top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        order = np.argsort(-np.take_along_axis(scores, top, 1), axis=1, kind="stable")
        out[start:start + chunk] = np.take_along_axis(top, order, 1)
    return out


def reranked_hits(cands: np.ndarray, query_new: np.ndarray, items_new: np.ndarray,
                  relevant: Any, routed: np.ndarray | None = None,
                  items_old: np.ndarray | None = None, chunk: int = CHUNK) -> np.ndarray:
    """[Q] bool: is the top-1 of each query's candidates (``cands``, [Q, k]) by NEW's score
    relevant. ``relevant``: [Q, N] (an array, or anything sliced by query rows to one).
    With ``routed`` and ``items_old``: the fused score (NEW's plus the route's)."""
    out = np.empty(len(cands), bool)
    for start in range(0, len(cands), chunk):
        c = cands[start:start + chunk]
        score = np.einsum("qd,qkd->qk", query_new[start:start + chunk], items_new[c])
        if routed is not None and items_old is not None:
            score = score + np.einsum("qd,qkd->qk", routed[start:start + chunk], items_old[c])
        best = c[np.arange(len(c)), score.argmax(1)]
        rel = np.asarray(relevant[start:start + chunk])
        out[start:start + chunk] = rel[np.arange(len(c)), best]
    return out


def every_k(cands: np.ndarray, query_new: np.ndarray, items_new: np.ndarray, relevant: Any,
            ks: Sequence[int], routed: np.ndarray, items_old: np.ndarray, fused_k: int,
            chunk: int = CHUNK) -> dict[str, np.ndarray]:
    """For each k of ``ks`` (``cands``: [Q, max k] best first) at once, reading each block
    of ``relevant`` once: ``rerank@k`` and ``recall@k`` ([Q] bool, as ``reranked_hits``
    and ``recall_at``), and ``fused@<fused_k>``."""
    out = {f"{name}@{k}": np.empty(len(cands), bool) for k in ks
           for name in ("rerank", "recall")}
    out[f"fused@{fused_k}"] = np.empty(len(cands), bool)
    for start in range(0, len(cands), chunk):
        rows = slice(start, start + chunk)
        rel = np.asarray(relevant[rows])
        c = cands[rows]
        q = np.arange(len(c))
        new = np.einsum("qd,qkd->qk", query_new[rows], items_new[c])
        for k in ks:
            out[f"rerank@{k}"][rows] = rel[q, c[q, new[:, :k].argmax(1)]]
            out[f"recall@{k}"][rows] = np.take_along_axis(rel, c[:, :k], 1).any(1)
        fused = new[:, :fused_k] + np.einsum("qd,qkd->qk", routed[rows],
                                             items_old[c[:, :fused_k]])
        out[f"fused@{fused_k}"][rows] = rel[q, c[q, fused.argmax(1)]]
    return out


def recall_at(cands: np.ndarray, relevant: Any, chunk: int = CHUNK) -> np.ndarray:
    """[Q] bool: does the route's top ``k`` hold a relevant item (the ceiling of rerank@k)."""
    out = np.empty(len(cands), bool)
    for start in range(0, len(cands), chunk):
        c = cands[start:start + chunk]
        rel = np.asarray(relevant[start:start + chunk])
        out[start:start + chunk] = np.take_along_axis(rel, c, 1).any(1)
    return out


def filled_share(cands: Sequence[np.ndarray], n: int) -> float:
    """The share of the ``n`` items a read-through fill holds after every query of
    ``cands`` (per direction [Q, k] item rows) was searched once."""
    seen = np.zeros(n, bool)
    for c in cands:
        seen[np.asarray(c).ravel()] = True
    return float(seen.mean())


def zipf_stream(cands: dict[str, np.ndarray], owners: dict[str, np.ndarray], items: int,
                searches: int, s: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A skewed workload's searches: each picks a test item by popularity ``1 / rank^s``
    (a random ranking of the ``items`` test items), a direction at random (t2i or i2t),
    and one of that item's queries in that direction (``owners``: per direction [Q] the
    test item each query belongs to). Returns ([searches, k] candidate rows, [searches]
    the picked items)."""
    rng = np.random.default_rng(seed)
    rank = rng.permutation(items)  # rank[r] = the item at popularity rank r
    p = 1.0 / np.arange(1, items + 1) ** s
    picked = rank[rng.choice(items, size=searches, p=p / p.sum())]
    by_item = {d: _grouped(o, items) for d, o in owners.items()}
    directions = rng.choice(sorted(cands), size=searches)
    rows = np.empty((searches, next(iter(cands.values())).shape[1]), np.int64)
    for n, (item, d) in enumerate(zip(picked, directions, strict=True)):
        choices = by_item[d][item]
        if not len(choices):  # no query of this item in that direction: the other one
            d = next(x for x in cands if x != d)
            choices = by_item[d][item]
        rows[n] = cands[d][choices[rng.integers(len(choices))]]
    return rows, picked


def zipf_query_shares(owners: dict[str, np.ndarray], items: int, s: float,
                      seed: int = 0) -> dict[str, np.ndarray]:
    """Per direction [Q]: the share of ``zipf_stream``'s searches (same ``seed``: the same
    ranking) that each query gets, exactly (its item's popularity, half of it per
    direction, split evenly over the item's queries in that direction; all of it to the
    other direction where the item has none)."""
    rank = np.random.default_rng(seed).permutation(items)  # zipf_stream's first draw
    p = 1.0 / np.arange(1, items + 1) ** s
    popularity = np.empty(items)
    popularity[rank] = p / p.sum()
    counts = {d: np.bincount(o, minlength=items) for d, o in owners.items()}
    out = {}
    for d, o in owners.items():
        other = sum(counts[x] for x in owners if x != d)
        half = np.where(other[o] > 0, 0.5, 1.0)  # two directions: half, or all of it
        out[d] = popularity[o] * half / counts[d][o]
    return out


def best_fill_curve(cands: dict[str, np.ndarray], shares: dict[str, np.ndarray], n: int,
                    points: Sequence[float]) -> dict[str, Any]:
    """What a fill that knew the workload in advance could reach: the items of ``n`` are
    filled greedily, each time the missing candidates of the query that gives the most
    search share per item still missing (``shares``: per direction [Q], as
    ``zipf_query_shares``; ``cands``: per direction [Q, k]). Returns the share of searches
    fully warm (every candidate held) at each of ``points`` (shares of ``n`` filled) and
    the filled share at which it first reaches 80%. A greedy fill, not a proven optimum:
    the reference a read-through fill is measured against."""
    import heapq

    share = np.concatenate([shares[d] for d in cands])
    sets = [np.unique(row) for c in cands.values() for row in np.asarray(c)]
    missing = np.array([len(x) for x in sets])
    holders: list[list[int]] = [[] for _ in range(n)]
    for q, x in enumerate(sets):
        for i in x:
            holders[i].append(q)
    held = np.zeros(n, bool)
    heap = [(-share[q] / missing[q], q, missing[q]) for q in range(len(sets))]
    heapq.heapify(heap)
    warm, count, curve, at_80 = 0.0, 0, {}, None
    marks = sorted(points)
    while heap and (marks or at_80 is None):
        _, q, was = heapq.heappop(heap)
        if missing[q] != was or missing[q] == 0:
            continue  # a stale entry: a newer one (or none, once warm) holds q
        for i in sets[q][~held[sets[q]]]:
            held[i] = True
            count += 1
            for other in holders[i]:
                missing[other] -= 1
                if missing[other] == 0:
                    warm += share[other]
                else:
                    heapq.heappush(heap, (-share[other] / missing[other], other,
                                          missing[other]))
            while marks and count / n >= marks[0]:
                curve[marks.pop(0)] = round(float(warm), 4)
            if at_80 is None and warm >= 0.8:
                at_80 = round(count / n, 4)
    return {"curve": [{"filled": p, "warm": curve.get(p)} for p in points],
            "warm_80_at_filled": at_80}


def _grouped(owners: np.ndarray, items: int) -> list[np.ndarray]:
    order = np.argsort(owners, kind="stable")
    bounds = np.searchsorted(owners[order], np.arange(items + 1))
    return [order[bounds[i]:bounds[i + 1]] for i in range(items)]


def searched_first(searches: Sequence[Sequence[Any]],
                   weights: Sequence[float] | None = None) -> list[Any]:
    """The items of recorded searches (each one's served candidates; ``weights``: how
    often each was seen, 1 each by default; the same set of candidates seen again adds up)
    in the order that makes the most of them fully warm soonest: a search that was seen
    ``c`` times and still lacks ``m`` of its candidates is worth ``c / m``; the candidates
    of the worthiest are taken, the others' worth updated, until every searched item is
    taken (greedy, as ``best_fill_curve`` with the searches' own counts for the workload's
    shares). A search seen often, or nearly held already, comes first: an item only a rare
    search needs comes last."""
    import heapq

    sets: dict[tuple[Any, ...], float] = {}
    for n, s in enumerate(searches):
        key = tuple(sorted(set(s)))
        if key:
            sets[key] = sets.get(key, 0.0) + (1.0 if weights is None else float(weights[n]))
    queries = list(sets)
    count = [sets[q] for q in queries]
    missing = [len(q) for q in queries]
    holders: dict[Any, list[int]] = {}
    for n, q in enumerate(queries):
        for i in q:
            holders.setdefault(i, []).append(n)
    taken: dict[Any, None] = {}
    heap = [(-count[n] / missing[n], n, missing[n]) for n in range(len(queries))]
    heapq.heapify(heap)
    while heap:
        _, n, was = heapq.heappop(heap)
        if missing[n] != was or missing[n] == 0:
            continue  # stale: a newer entry (or none, once warm) holds it
        for i in queries[n]:
            if i in taken:
                continue
            taken[i] = None
            for other in holders[i]:
                missing[other] -= 1
                if missing[other]:
                    heapq.heappush(heap, (-count[other] / missing[other], other,
                                          missing[other]))
    return list(taken)


def candidate_order(rows: np.ndarray, n: int) -> np.ndarray:
    """The backfill order ``candidates`` over items ``0..n-1`` (a gallery's items in their
    default order) learned from searches (``rows``: [S, k] served candidates) as the
    gateway keeps them (``service.state.candidates``: each distinct set of candidates with
    how often it was served, and each item's count) and ``planning.by_candidates`` orders
    them: ``searched_first`` over the sets, then any other counted item by its count,
    then every other item in the default order."""
    rows = np.asarray(rows)
    sets: dict[tuple[int, ...], float] = {}
    for r in rows:
        key = tuple(np.unique(r).tolist())
        sets[key] = sets.get(key, 0.0) + 1.0
    return order_of_sets(sets, n, np.bincount(rows.ravel().astype(np.int64), minlength=n))


def order_of_sets(sets: Mapping[tuple[int, ...], float], n: int,
                  counts: np.ndarray | None = None) -> np.ndarray:
    """``candidate_order`` from the sets themselves (each distinct set of candidates, items
    ``0..n-1``, with how often it was served): ``searched_first`` over them, then the other
    items by ``counts`` (none: in the default order)."""
    first = np.asarray(searched_first(list(sets), list(sets.values())), np.int64)
    seen = np.zeros(n, bool)
    seen[first] = True
    rest = np.flatnonzero(~seen)
    if counts is not None:
        rest = rest[np.argsort(-counts[rest], kind="stable")]
    return np.concatenate([first, rest])


def fill_curve(stream: np.ndarray, n: int, window: int = 1000,
               points: Sequence[float] = (0.01, 0.02, 0.05, 0.10, 0.15, 0.20, 0.25, 0.30,
                                          0.40, 0.50),
               backfill: np.ndarray | None = None, per_search: float = 0.0,
               exact: tuple[np.ndarray, np.ndarray] | None = None) -> dict[str, Any]:
    """Searches in order (``stream``: [S, k] candidate rows), each embedding the candidates
    the new side does not hold yet: per search whether it was fully warm (embedded
    nothing) and the share of the ``n`` items filled after it. Returns the warm share
    over the last ``window`` searches at each ``points`` share filled (None: not reached),
    the filled share at which that rolling warm share first reaches 80%, and totals.
    With ``backfill`` (items in a backfill's order) the backfill goes on beside the reads:
    before each search it re-embeds ``per_search`` more items of that order (fractions
    carry over), skipping what the reads filled. With ``exact`` ([Q, k] every query's
    candidates, [Q] each query's share of the searches: ``zipf_query_shares``) also the
    workload's share of searches that would be fully warm at each point, exactly (no
    window: as ``best_fill_curve`` measures; checked at every 0.1% filled), and the
    filled share at which it first reaches 80%."""
    held = np.zeros(n, bool)
    probe = _ExactWarm(held, *exact, points) if exact is not None else None
    warm = np.zeros(len(stream), bool)
    filled = np.zeros(len(stream))
    count, due, step = 0, 0.0, 0
    order = np.asarray(backfill if backfill is not None else [], np.int64)
    for i, c in enumerate(stream):
        due += per_search
        while due >= 1 and step < len(order):  # the backfill's share of this moment
            item = order[step]
            step += 1
            if not held[item]:
                held[item] = True
                count += 1
                due -= 1
        new = c[~held[c]]
        warm[i] = len(new) == 0
        if len(new):
            new = np.unique(new)
            held[new] = True
            count += len(new)
        filled[i] = count / n
        if probe is not None:
            probe.check(count / n)
    csum = np.concatenate([[0], np.cumsum(warm)])
    idx = np.arange(1, len(stream) + 1)
    rolling = (csum[idx] - csum[np.maximum(0, idx - window)]) / np.minimum(idx, window)
    full = idx >= window  # a whole window behind it
    curve = []
    for p in points:
        reached = np.flatnonzero(filled >= p)
        at = int(reached[0]) if len(reached) else None
        curve.append({"filled": p, "search": at,
                      "warm": None if at is None or not full[at] else round(
                          float(rolling[at]), 4)})
    hit = np.flatnonzero(full & (rolling >= 0.8))
    return {"searches": len(stream), "window": window, "curve": curve,
            "warm_80_at_filled": round(float(filled[hit[0]]), 4) if len(hit) else None,
            "warm_80_at_search": int(hit[0]) if len(hit) else None,
            "final_filled": round(float(filled[-1]), 4),
            "final_warm": round(float(rolling[-1]), 4),
            "warm_overall": round(float(warm.mean()), 4),
            **({"exact": probe.result()} if probe is not None else {})}


class _ExactWarm:
    """``fill_curve``'s exact measure: the share of the workload's searches whose
    candidates are all held, computed when the filled share has grown by ``STEP`` since
    the last check or passed one of ``points``."""

    STEP = 0.001

    def __init__(self, held: np.ndarray, rows: np.ndarray, share: np.ndarray,
                 points: Sequence[float]) -> None:
        self.held, self.rows, self.share = held, np.asarray(rows), np.asarray(share)
        self.points, self.marks, self.curve = list(points), sorted(points), {}
        self.last, self.at_80 = -1.0, None

    def check(self, filled: float) -> None:
        crossed = bool(self.marks) and filled >= self.marks[0]
        if filled - self.last < self.STEP and not crossed:
            return
        self.last = filled
        warm = float(self.share[self.held[self.rows].all(axis=1)].sum())
        while self.marks and filled >= self.marks[0]:
            self.curve[self.marks.pop(0)] = round(warm, 4)
        if self.at_80 is None and warm >= 0.8:
            self.at_80 = round(filled, 4)

    def result(self) -> dict[str, Any]:
        return {"curve": [{"filled": p, "warm": self.curve.get(p)} for p in self.points],
                "warm_80_at_filled": self.at_80}


PACES = (1.0, 4.0)  # a backfill that alone re-embeds the gallery over 1 or 4 times the searches
LEARN_SHARE = 0.5  # of a gallery's recorded searches, the second half is measured
SET_LEFT = 1e-6  # a set's count left after the measured searches are taken out: none


def workload_curves(searches: Sequence[Sequence[str]], n: int, k: int | None = None,
                    window: int | None = None,
                    sets: Mapping[tuple[str, ...], float] | None = None) -> dict[str, Any] | None:
    """On a gallery's own recorded searches (``service.state.candidates``: each one's
    served candidate ids, oldest first; ``n`` items in the gallery): the second half is
    served by rerank on read with the read-through fill alone, or with a backfill in the
    candidate order beside it at each of ``PACES`` (``fill_curve``). The order is learned
    from what was served before the second half: with ``sets`` (the gallery's decayed
    count of each distinct set of candidates served, every search's, the second half's
    included), those sets less the second half's searches, each taken as 1 (its decayed
    weight is at most 1, so nothing the second half served is left in; a set it served
    less often than that is dropped), as the migration learns from every search served
    before it (``planning.by_candidates``); without, the first half of ``searches``. Each
    item id takes a place in the default (id) order among the ``n`` by its rank among
    the ids the searches and sets name, spread evenly: they do not name the items never
    retrieved. Candidate lists are cut to ``k`` (a rerank's k) when given. None with
    fewer than 20 searches. Returns each way's filled share at 80% fully warm and its
    curve, and whether the candidate order reaches it no later than the read-through
    alone at every pace."""
    kept = [list(dict.fromkeys(s)) for s in searches]
    kept = [s for s in kept if s]
    rows = [s[:k] if k else s for s in kept]
    if len(rows) < 20:
        return None
    learn = int(len(rows) * LEARN_SHARE)
    before: dict[tuple[str, ...], float] = {}
    if sets:
        before = dict(sets)
        for s in kept[learn:]:  # the measured searches teach nothing
            key = tuple(sorted(s))
            if key in before:
                before[key] -= 1.0
        before = {key: c for key, c in before.items() if c > SET_LEFT}
    named = sorted({i for r in rows for i in r} | {i for key in before for i in key})
    n = max(n, len(named))
    place = {i: int(j * n / len(named)) for j, i in enumerate(named)}  # evenly in id order
    width = max(len(r) for r in rows)
    grid = np.array([[place[i] for i in r] + [place[r[-1]]] * (width - len(r)) for r in rows])
    window = window or max(10, (len(rows) - learn) // 10)
    later = grid[learn:]
    alone = fill_curve(later, n, window=window)
    order = (order_of_sets({tuple(place[i] for i in key): c for key, c in before.items()}, n)
             if before else candidate_order(grid[:learn], n))
    paced = []
    for pace in PACES:
        per = n / (pace * len(later))
        c = fill_curve(later, n, window=window, backfill=order, per_search=per)
        paced.append({"pace": pace, "per_search": round(per, 3),
                      "warm_80_at_filled": c["warm_80_at_filled"], "curve": c["curve"]})

    def no_later(x: float | None) -> bool:
        a = alone["warm_80_at_filled"]
        return x is not None and (a is None or x <= a)

    return {"searches": len(rows), "learned_from": learn, "items": n, "window": window,
            "learned_sets": len(before) if before else None,
            "read_through": {"warm_80_at_filled": alone["warm_80_at_filled"],
                             "curve": alone["curve"]},
            "candidates": paced,
            "candidates_no_later": all(no_later(c["warm_80_at_filled"]) for c in paced)}
