"""A migration's curve on a set of items, without writing anything: what each way of
serving would answer at each fraction of the backfill, and whether one way beats another
beyond the error.

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
items' texts).

**Errors are over units, not queries.** The queries of one item are not independent (an
image's five captions hit or miss together), so every standard error here is a cluster
bootstrap (``UnitDraws``): each draw takes as many units as there are, with replacement,
and every query of each drawn unit. ``units`` gives each query's unit id (a t2i query: the
item its caption belongs to; an i2t query: its own image's item); None makes each query
its own unit (the plain bootstrap over queries).

**The test.** One way beats another (``beats``) when a one-sided paired test at level
``alpha`` (5% by default) says so: its R@1 lead exceeds ``z(1 - alpha)`` times the
bootstrap standard error of the difference, both ways scored on the same draws of units.
Whether a side falls below the route (``falls_below``, what a switched gallery reads to
switch back, at levels far below 5%) is tested against the lead's error as it would be
if the two were equally good (``null_lead``: each unit's difference as likely taken with
either sign, the clustered McNemar test), which, unlike the bootstrap's error around the
observed lead, holds a small level on a few hundred units.

**Distractors.** A validation set is far smaller than a gallery: a transformed vector has
far fewer items to lose its top hit to. ``join`` adds distractor items (e.g. a sample of
the gallery's own stored vectors, with their transforms and NEW's vectors of them) after
the validation items, ``pad_relevance`` marks them irrelevant to every query, and
``joined_order`` re-embeds the same share of both at every fraction.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

import numpy as np

from training.errors import ConfigError

DIRECTIONS = {"t2i": ("text", "image"), "i2t": ("image", "text")}  # (query kind, item kind)
FRACTIONS = (0.0, 0.01, 0.05, 0.10, 0.25, 0.50, 1.0)
ALPHA = 0.05  # one-sided level of every "beats beyond the error" decision
BOOT = 1000  # bootstrap draws
DRAW_BLOCK = 64  # draws generated at once (bounds the [block, U] index array)

Hits = Mapping[str, Mapping[str, np.ndarray]]  # key -> direction -> [Q] bool top-1


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


def recall(hits: Hits, key: str, direction: str) -> float:
    return float(hits[key][direction].mean())


# ------------------------------------------------------------------ errors over units
def unit_columns(units: np.ndarray | None, n: int) -> np.ndarray:
    """[n] each query's unit as a column 0..U-1 (U: the distinct units); None: each query
    its own unit."""
    if units is None:
        return np.arange(n)
    units = np.asarray(units)
    if units.shape != (n,):
        raise ConfigError(f"units must give one unit per query: {n} queries, got shape "
                          f"{units.shape}")
    return np.unique(units, return_inverse=True)[1].reshape(-1)


class UnitDraws:
    """A cluster bootstrap: ``boot`` draws, each of U units with replacement (U: how many
    there are), taking every query of each drawn unit as often as the unit is drawn.

    ``counts`` [boot, U] holds how often each unit is in each draw, so a draw's mean of
    per-query values is ``(counts @ per-unit sums) / (counts @ per-unit sizes)``: one
    matrix product scores every draw of a statistic. With one query per unit this is the
    plain bootstrap over queries, on the same random draws as ``rng.integers(0, Q, (boot,
    Q))``."""

    def __init__(self, columns: Mapping[str, np.ndarray], units: int, boot: int,
                 rng: np.random.Generator) -> None:
        self.columns = dict(columns)  # direction -> [Q] unit column of each query
        self.counts = np.empty((boot, units), np.float32)
        for start in range(0, boot, DRAW_BLOCK):
            rows = min(DRAW_BLOCK, boot - start)
            idx = rng.integers(0, units, (rows, units))
            flat = (idx + units * np.arange(rows)[:, None]).ravel()
            self.counts[start:start + rows] = np.bincount(
                flat, minlength=rows * units).reshape(rows, units)
        # float32 sums of small integers stay exact below 2**24 queries
        self.sizes = {d: self.counts @ self._per_unit(d, np.ones(len(c), np.float32))
                      for d, c in self.columns.items()}

    @classmethod
    def of(cls, units: np.ndarray | None, n: int, direction: str, boot: int = BOOT,
           seed: int | np.random.Generator = 0) -> UnitDraws:
        """One direction's ``n`` queries grouped by ``units`` (None: one unit each)."""
        columns = unit_columns(units, n)
        count = int(columns.max()) + 1 if n else 0
        return cls({direction: columns}, count, boot, np.random.default_rng(seed))

    @classmethod
    def joint(cls, units: Mapping[str, np.ndarray], boot: int = BOOT,
              seed: int | np.random.Generator = 0) -> UnitDraws:
        """Every direction's queries grouped by units from one set of ids (an item: its
        image's i2t query and its captions' t2i queries), drawn once for all directions:
        a draw takes an item with all its queries in every direction."""
        names = list(units)
        flat = np.concatenate([np.asarray(units[d]).reshape(-1) for d in names])
        _, inverse = np.unique(flat, return_inverse=True)
        cuts = np.cumsum([len(units[d]) for d in names])[:-1]
        columns = dict(zip(names, np.split(inverse.reshape(-1), cuts), strict=True))
        count = int(inverse.max()) + 1 if len(inverse) else 0
        return cls(columns, count, boot, np.random.default_rng(seed))

    def _per_unit(self, direction: str, values: np.ndarray) -> np.ndarray:
        return np.bincount(self.columns[direction], weights=values,
                           minlength=self.counts.shape[1]).astype(np.float32)

    def means(self, direction: str, values: np.ndarray) -> np.ndarray:
        """[boot] the mean of per-query ``values`` [Q] in each draw (NaN for a draw that
        holds none of this direction's queries)."""
        values = np.asarray(values, np.float32)
        if values.shape != self.columns[direction].shape:
            raise ConfigError(f"{direction}: {len(self.columns[direction])} queries have "
                              f"units, got {values.shape[0]} values")
        total = (self.counts @ self._per_unit(direction, values)).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            return total / self.sizes[direction]


def z_bound(alpha: float) -> float:
    """How many standard errors a lead must exceed for a one-sided test at ``alpha``."""
    if not 0 < alpha < 1:
        raise ConfigError(f"alpha must be in (0, 1), got {alpha}")
    return NormalDist().inv_cdf(1 - alpha)


def one_sided(lead: float, se: float, alpha: float = ALPHA) -> bool:
    """Whether ``lead`` (a paired difference, B minus A) says B beats A at level ``alpha``:
    ``lead > z(1 - alpha) * se`` with ``se`` the bootstrap standard error of the
    difference (the normal approximation; a zero error needs a positive lead)."""
    return bool(lead > 0 and lead > z_bound(alpha) * se)


def _std(draws: np.ndarray) -> float | None:
    ok = draws[np.isfinite(draws)]
    return float(ok.std(ddof=1)) if len(ok) > 1 else None


def _draws_for(hits: Hits, key: str, direction: str,
               units: Mapping[str, np.ndarray] | None, boot: int, seed: int) -> UnitDraws:
    """The draws of ``direction``'s queries (as many as ``key`` has hits for)."""
    n = len(hits[key][direction])
    return UnitDraws.of(None if units is None else units.get(direction), n, direction, boot,
                        seed)


def share(hits: Hits, key: str, direction: str, boot: int = BOOT, seed: int = 0,
          units: np.ndarray | None = None, draws: UnitDraws | None = None,
          ) -> dict[str, float | None]:
    """The share of the gain at R@1, ``(key - old->old) / (new->new - old->old)``, and its
    standard error from ``boot`` bootstrap draws of the units (``units``: [Q] unit id of
    each query, None: each query its own; ``draws``: prebuilt draws of this direction,
    which then replace ``boot``, ``seed`` and ``units``). Paired: one draw of the units
    for the three. None where NEW is no better on these queries."""
    a, o, b = (np.asarray(hits[k][direction], np.float64) for k in (key, "old->old", "new->new"))
    gain = b.mean() - o.mean()
    if gain <= 0:
        return {"share": None, "se": None}
    draws = draws or UnitDraws.of(units, len(a), direction, boot, seed)
    base = draws.means(direction, o)
    gains = draws.means(direction, b) - base
    with np.errstate(divide="ignore", invalid="ignore"):
        shares = np.where(gains > 0, (draws.means(direction, a) - base) / gains, np.nan)
    return {"share": float((a.mean() - o.mean()) / gain), "se": _std(shares)}


def paired_lead(hits: Hits, key: str, against: str, direction: str,
                draws: UnitDraws) -> tuple[float, float]:
    """(R@1 of ``key`` minus R@1 of ``against``, the bootstrap standard error of that
    difference): both scored on the same draws of units."""
    diff = (np.asarray(hits[key][direction], np.float64)
            - np.asarray(hits[against][direction], np.float64))
    se = _std(draws.means(direction, diff))
    return float(diff.mean()), 0.0 if se is None else se


def beats(hits: Hits, key: str, against: str, direction: str,
          units: Mapping[str, np.ndarray] | None = None, alpha: float = ALPHA,
          boot: int = BOOT, seed: int = 0) -> bool:
    """Whether ``key`` beats ``against`` at R@1 in ``direction`` beyond the error: the
    one-sided paired test at ``alpha`` (``one_sided``), units bootstrapped (``units``:
    direction -> [Q] unit ids; None: each query its own unit)."""
    lead, se = paired_lead(hits, key, against, direction,
                           _draws_for(hits, key, direction, units, boot, seed))
    return one_sided(lead, se, alpha)


def null_lead(hits: Hits, key: str, against: str, direction: str,
              units: np.ndarray | None = None) -> tuple[float, float]:
    """(R@1 of ``key`` minus R@1 of ``against``, the standard error of that difference if
    the two were equally good): with ``D_u`` the sum of unit ``u``'s per-query differences
    (``units``: [Q] unit ids, None: each query its own unit) and ``Q`` the queries, the
    error is ``sqrt(sum D_u^2) / Q``, the spread of the lead when each unit's difference
    is as likely taken with either sign (the clustered McNemar test's; with one query per
    unit, McNemar's own). The bootstrap's error is the spread around the observed lead,
    ``sqrt(sum (D_u - lead n_u)^2) / Q``: it shrinks as the lead grows, by about
    ``sqrt(1 - z^2 / U)`` at the bound, which at a level of 0.05 / 40 on 100 to 300
    single-query units makes the test reject 1.2 to 1.4 times as often as its level."""
    diff = (np.asarray(hits[key][direction], np.float64)
            - np.asarray(hits[against][direction], np.float64))
    if not len(diff):
        return 0.0, 0.0
    per_unit = np.bincount(unit_columns(units, len(diff)), weights=diff)
    return float(diff.mean()), float(np.sqrt(np.square(per_unit).sum()) / len(diff))


def falls_below(hits: Hits, key: str, against: str = "routed",
                directions: Sequence[str] | None = None,
                units: Mapping[str, np.ndarray] | None = None,
                alpha: float = ALPHA) -> bool:
    """Whether ``key`` (a side that serves) is below ``against`` (the route) beyond the
    error in any of ``directions`` (None: every direction ``key`` has): ``against``'s
    lead exceeds ``z(1 - alpha)`` times its error if the two were equally good
    (``null_lead``, units as given: direction -> [Q] unit ids; None: each query its own
    unit) in that direction. What a switched gallery reads to switch back, at the level
    its looks share (``service.jobkinds.migrate.check.look_level``: far below 5%, e.g.
    0.05 / 40). Nothing is resampled, so a small ``alpha`` needs no draws: it only moves
    the bound (2.02 -> 3.02 errors); the error is the sign-flip spread computed for the
    units given, and the lead, a sum of independent units' differences, is close to
    normal out to such bounds (``tests/test_switch_back_rate.py`` measures it)."""
    return any(one_sided(*null_lead(hits, against, key, d,
                                    None if units is None else units.get(d)), alpha)
               for d in _directions(hits, key, directions))


def _directions(hits: Hits, key: str, directions: Sequence[str] | None) -> list[str]:
    have = list(hits[key])
    if directions is None:
        return have
    missing = [d for d in directions if d not in have]
    if missing:
        raise ConfigError(f"{key} has no hits for {missing}; it has {have}")
    return list(directions)


def negative_flip(hits: Hits, key: str, against: str, direction: str) -> float:
    """Queries ``against`` answered right and ``key`` does not, over all queries."""
    before, after = hits[against][direction], hits[key][direction]
    return float((before & ~after).mean())


def switch_fraction(hits: Hits, order: str, fractions: Sequence[float],
                    max_negative_flip: float | None = None, prefix: str = "side",
                    directions: Sequence[str] | None = None,
                    units: Mapping[str, np.ndarray] | None = None, alpha: float = ALPHA,
                    against: str = "routed", boot: int = BOOT, seed: int = 0,
                    ) -> float | None:
    """Where a progressive migration switches: the first fraction from which the side
    under ``order`` (key ``"<prefix> <order> <f>"``) beats ``against`` (the route that
    serves) beyond the error (``beats``: one-sided paired test at ``alpha``, units
    bootstrapped) in every direction of ``directions`` (None: every direction the side
    has), and with ``max_negative_flip`` loses no more queries against it than that, at
    that fraction and at every later one measured. None: not before the end.

    Why no correction for testing many fractions: a switch serves a side that is truly no
    better at some later fraction only if the test rejected at the last such fraction, so
    the chance of that is at most ``alpha`` (per direction it is not better in)."""
    if not fractions:
        return None
    first = f"{prefix} {order} {fractions[0]:g}"
    draws = {d: _draws_for(hits, first, d, units, boot, seed)
             for d in _directions(hits, first, directions)}

    def wins(f: float) -> bool:
        key = f"{prefix} {order} {f:g}"
        for d, drawn in draws.items():
            if not one_sided(*paired_lead(hits, key, against, d, drawn), alpha):
                return False
            if max_negative_flip is not None and negative_flip(
                    hits, key, against, d) > max_negative_flip:
                return False
        return True

    found = None
    for f in sorted(fractions, reverse=True):
        if not wins(f):
            break
        found = f
    return found


# ------------------------------------------------------------------ distractors
def join(items: Items, distractors: Items) -> Items:
    """The items followed by the distractors: per kind, rows ``0..N-1`` are the items and
    ``N..N+K-1`` the distractors, in each state (OLD, NEW, transformed). A distractor is
    an item no query is relevant to (``pad_relevance``) that competes for every query's
    top hit as a gallery's other items do; its state at each fraction follows
    ``joined_order``."""
    if set(items.old) != set(distractors.old):
        raise ConfigError(f"the distractors have kinds {sorted(distractors.old)}, the items "
                          f"{sorted(items.old)}")

    def cat(a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: np.concatenate([a[k], b[k]]).astype(np.float32) for k in items.old}
    return Items(cat(items.old, distractors.old), cat(items.new, distractors.new),
                 cat(items.transformed, distractors.transformed))


def pad_relevance(relevant: Mapping[str, Any], distractors: int) -> dict[str, np.ndarray]:
    """Each direction's relevance [Q, N] (an array, or anything sliced by query rows)
    followed by ``distractors`` columns of False: no query counts a distractor as a hit.
    Why False: the gallery's items carry no labels for the validation queries, so a
    distractor the query would find right counts as a miss, for every way alike."""
    out = {}
    for d, rel in relevant.items():
        rows = np.asarray(rel[slice(None)], bool)
        out[d] = np.concatenate([rows, np.zeros((len(rows), distractors), bool)], axis=1)
    return out


def joined_order(order: Sequence[int], distractor_order: Sequence[int]) -> list[int]:
    """The backfill order over ``join``'s rows that re-embeds the same share of the items
    and of the distractors: ``order`` (every item row, ``0..N-1``) and ``distractor_order``
    (every distractor, ``0..K-1``, placed at rows ``N + k``) interleaved by rank, so that
    at fraction ``f`` (the first ``round(f * (N + K))`` rows, ``done_mask``) about
    ``f * N`` items and ``f * K`` distractors are re-embedded (each within one row), each in
    its own order. Per-kind orders: call it per kind."""
    n, k = len(order), len(distractor_order)
    for name, rows, size in (("order", order, n), ("distractor_order", distractor_order, k)):
        if sorted(int(r) for r in rows) != list(range(size)):
            raise ConfigError(f"{name} must list every one of its {size} rows once")
    keyed = [((r + 0.5) / n, 0, int(row)) for r, row in enumerate(order)]
    keyed += [((r + 0.5) / k, 1, n + int(row)) for r, row in enumerate(distractor_order)]
    return [row for _, _, row in sorted(keyed)]


def summary(hits: Hits, units: Mapping[str, np.ndarray] | None = None) -> dict[str, Any]:
    """R@1 and share (with its error over units) per direction for every key, JSON-ready."""
    draws: dict[str, UnitDraws] = {}
    out: dict[str, Any] = {}
    for key in hits:
        out[key] = {}
        for d in hits[key]:
            if d not in draws:
                draws[d] = _draws_for(hits, key, d, units, BOOT, 0)
            out[key][d] = {"R@1": recall(hits, key, d), **share(hits, key, d, draws=draws[d])}
    return out
