"""Every upgrade option measured on one validation set, the way the plan job sees it.

Inputs are embeddings, not models: the validation set's items and queries by OLD (as the
gallery stores and serves them) and by NEW (natively), and the K-item sample's pairs (the
stored OLD vectors and NEW's embeddings of the same sources). From them:

- **routes**: the query-side adapters (procrustes, affine, residual MLP, each alone and
  SLERP-mixed with OLD's own query, ``fit_routes``), and any route given as its routed
  queries (an XBT version of the candidate);
- **migrations**: today's (the route serves until every item is re-embedded) and, with
  the gallery-side transform fitted OLD -> NEW on the same sample, a progressive one per
  backfill order (learned, random): the side as it stands at each fraction (transformed
  items, the first ``f`` of the order re-embedded) serves from the first fraction from
  which it beats the route beyond the error in both directions (``simulate.switch_fraction``:
  a one-sided paired test at 5%, the validation items bootstrapped).

Each option keeps its per-query top-1 hits (at the end, and for a migration at each
fraction of ``GRID``), so the shares, their bootstrap errors and the paired errors of
differences (``Scorer``) come from one draw of the validation items for every option.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from training.errors import ConfigError
from training.upgrades.transform.simulate import (
    DIRECTIONS,
    Items,
    Queries,
    UnitDraws,
    curve,
    switch_fraction,
    top1_hits,
)

GRID = tuple(sorted({round(0.05 * k, 2) for k in range(21)} | {0.01}))
ADAPTERS = ("procrustes", "affine", "residual-mlp")
SLERP_T = 0.5  # weight of OLD's own query in the "+slerp" routes (as bench upgrade)
BOOT = 1000
OBJECTIVES = ("lower", "mean", "t2i", "i2t")
CHUNK = 512  # queries scored at once
MIGRATION_ORDERS = ("learned", "random")  # the progressive migrations a plan simulates


@dataclass
class Embedded:
    """The validation set embedded: per kind the items' vectors by OLD (``item_old``, as the
    gallery stores them) and by NEW (``item_new``); per query kind the queries by OLD and
    NEW; per direction the relevance [Q, N] of the queries to the items; per direction
    the unit each query's error is drawn by (``units``: [Q] ids, a t2i query's the item its
    caption belongs to, an i2t query's its own item; None: each query its own unit)."""

    item_old: Mapping[str, np.ndarray]
    item_new: Mapping[str, np.ndarray]
    query_old: Mapping[str, np.ndarray]
    query_new: Mapping[str, np.ndarray]
    relevant: Mapping[str, np.ndarray]
    units: Mapping[str, np.ndarray] | None = None

    def hits(self, queries: Mapping[str, np.ndarray], items: Mapping[str, np.ndarray],
             ) -> dict[str, np.ndarray]:
        """Direction -> bool [Q]: is each query's top-1 item relevant."""
        out = {}
        for direction, (qk, ik) in DIRECTIONS.items():
            q, rel = queries[qk], self.relevant[direction]
            out[direction] = np.concatenate([
                top1_hits(q[start:start + CHUNK] @ items[ik].T, rel[start:start + CHUNK])
                for start in range(0, len(q), CHUNK)])
        return out


@dataclass
class RouteFit:
    """One query-side adapter: per modality a map NEW -> OLD, optionally SLERP-mixed."""

    name: str
    method: str
    slerp_t: float
    maps: dict[str, Any]
    fit_seconds: float

    @torch.no_grad()
    def queries(self, emb: Embedded) -> dict[str, np.ndarray]:
        """Per query kind, NEW's validation queries routed into OLD's space (a SLERP
        route: mixed with ``emb.query_old``, which must then be OLD's own native query in
        that space, not a route's: ``run_plan`` measures one only where it is)."""
        from training.upgrades.adapter.maps import slerp

        out = {}
        for kind, q in emb.query_new.items():
            routed = torch.nn.functional.normalize(self.maps[kind](torch.from_numpy(q)), dim=-1)
            if self.slerp_t:
                routed = slerp(routed, torch.from_numpy(emb.query_old[kind]), self.slerp_t)
            out[kind] = routed.numpy().astype(np.float32)
        return out

    def config(self, seed: int) -> dict[str, Any]:
        """The ``adapter`` job's config that fits this route again."""
        return {"method": self.method, "slerp_t": self.slerp_t, "seed": seed}


def fit_routes(old: Mapping[str, np.ndarray], new: Mapping[str, np.ndarray],
               seed: int = 0) -> list[RouteFit]:
    """Every adapter route fitted on the sample's pairs (``old``/``new``: kind -> [K, D])."""
    from training.upgrades.adapter import AdapterFitConfig
    from training.upgrades.adapter.fit import fit_maps

    x = {k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in new.items() if len(v)}
    y = {k: torch.from_numpy(np.asarray(v, np.float32)) for k, v in old.items() if len(v)}
    routes = []
    for method in ADAPTERS:
        start = time.perf_counter()
        maps = fit_maps(x, y, AdapterFitConfig(method=method, seed=seed))
        seconds = time.perf_counter() - start
        for t in (0.0, SLERP_T):
            name = f"route:{method}{'+slerp' if t else ''}"
            routes.append(RouteFit(name, method, t, {k: m.eval() for k, m in maps.items()},
                                   seconds))
    return routes


@dataclass
class Option:
    """One way to the new model, measured (or, with ``measured`` False, only costed)."""

    name: str
    kind: str  # "route" (adapter or XBT: the gate decides) or "migration"
    label: str
    compute_seconds: float  # before it serves the gain (a migration: its whole backfill)
    compute_fraction: float  # of a full backfill of the gallery by NEW on this host
    hits: dict[str, np.ndarray] | None = None  # direction -> [Q] top-1, when it is done
    added_latency_ms: dict[str, float] | None = None  # per query kind, over OLD's own query
    storage: dict[str, int] = field(default_factory=dict)  # bytes: gallery, model
    apply: dict[str, Any] | None = None  # what applying it starts; None: cannot be applied
    measured: bool = True
    note: str = ""
    # a migration: served hits at each fraction of the backfill, the switch, the overhead
    served: dict[float, dict[str, np.ndarray]] | None = None
    switch_at: float | None = None
    side: dict[float, dict[str, np.ndarray]] | None = None  # the target side as it stands
    overhead_fraction: float = 0.0  # compute before its backfill starts (sample, fit, map)
    # what serves during that overhead: what served before the migration (the serving
    # route's hits on the same items); the migration's own side does not exist yet
    before: dict[str, np.ndarray] | None = None
    # the measure its shares are of, when not the plan's: a migration is simulated on the
    # validation set as a gallery of whole items, its own baseline (same query draws)
    scorer: Scorer | None = None
    # a migration served by a fused ranking (rerank@k): its hits with both sides kept
    # after the backfill (phase kept), and whether the native side alone (``hits``, what
    # the switch serves) is below them beyond the error: then the switch waits for the
    # operator, who chooses between the two
    kept: dict[str, np.ndarray] | None = None
    native_below_kept: bool = False


def migration_options(emb: Embedded, routed: Mapping[str, np.ndarray],
                      transformed: Mapping[str, np.ndarray] | None,
                      orders: Mapping[str, Any], max_negative_flip: float | None,
                      grid: Sequence[float] = GRID,
                      ) -> dict[str, tuple[dict[float, dict[str, np.ndarray]], float | None,
                                           dict[float, dict[str, np.ndarray]] | None]]:
    """Name -> (served hits at each fraction of ``grid``, switch fraction, the target side's
    hits as it stands at each fraction) for today's migration (``migrate``: the route until
    the end; no side) and, with ``transformed`` items, a progressive migration per order
    (``migrate:transform+<order>``; an order: item rows, or per kind its own rows)."""
    items = Items(emb.item_old, emb.item_new, transformed or emb.item_new)
    queries = Queries(emb.query_new, routed, emb.query_old, emb.relevant)
    hits = curve(items, queries, orders if transformed else {}, grid, hybrid=False)
    out: dict[str, Any] = {"migrate": (
        {f: hits["new->new"] if f >= 1.0 else hits["routed"] for f in grid}, 1.0, None)}
    if transformed is None:
        return out
    for order in orders:
        switch = switch_fraction(hits, order, grid, max_negative_flip, units=emb.units)
        side = {f: hits[f"side {order} {f:g}"] for f in grid}
        out[f"migrate:transform+{order}"] = (
            {f: side[f] if switch is not None and f >= switch else hits["routed"]
             for f in grid}, switch, side)
    return out


def backfill_orders(names: Mapping[str, Sequence[str]], scores: Mapping[str, np.ndarray],
                    seed: int, first: Sequence[int] | np.ndarray = (),
                    orders: Sequence[str] = MIGRATION_ORDERS) -> dict[str, Any]:
    """Order name -> the backfill's rows. Items whose kinds share their names (a gallery of
    items each with an image and a caption) are re-embedded whole, as a migration does: one
    order over the items, by the summed predicted error of their kinds. Otherwise (the
    validation set: images and all their captions) each kind has its own order. ``first``:
    rows a migration re-embeds before any order (the sample NEW embedded to fit the
    transform, when it is part of the measured items)."""
    from training.upgrades.transform.order import order_items

    kinds = list(names)
    paired = all(list(names[k]) == list(names[kinds[0]]) for k in kinds)
    groups = {"items": kinds} if paired else {k: [k] for k in kinds}
    out: dict[str, Any] = {o: {} for o in orders}
    for group in groups.values():
        key = list(names[group[0]])
        total = np.sum([np.asarray(scores[k], np.float64) for k in group], axis=0)
        done = np.zeros(len(key), bool)
        done[np.asarray(first, np.int64)] = True
        rest = np.flatnonzero(~done)
        for o in orders:
            picked = order_items(o, [key[i] for i in rest], total[rest], seed=seed)
            rows = [int(i) for i in first] + [int(rest[p]) for p in picked]
            out[o].update({k: rows for k in group})
    return out


class Scorer:
    """Shares of the gain with bootstrap errors, paired over one draw of the validation
    set for every option: the share of option A and of option B in draw r come from the
    same resampled queries, so the error of their difference is what tells them apart.

    What is resampled is the unit (``units``: direction -> [Q] unit id of each query, e.g.
    a caption's item and an image's own item; ``Embedded.units``): a draw takes items with
    every query they own, in both directions at once (``UnitDraws.joint``). None: each
    query its own unit, each direction drawn alone (the plain bootstrap over queries)."""

    def __init__(self, old_hits: Mapping[str, np.ndarray], new_hits: Mapping[str, np.ndarray],
                 objective: str = "lower", boot: int = BOOT, seed: int = 0,
                 units: Mapping[str, np.ndarray] | None = None) -> None:
        if objective not in OBJECTIVES:
            raise ConfigError(f"objective must be one of {OBJECTIVES}, got {objective!r}")
        self.objective = objective
        self.resample = _resampled(old_hits, units, boot, seed)
        self._baseline(old_hits, new_hits)

    def _baseline(self, old_hits: Mapping[str, np.ndarray],
                  new_hits: Mapping[str, np.ndarray]) -> None:
        """The gain's zero (``old_hits``) and one (``new_hits``), and their draws."""
        self.old, self.new = old_hits, new_hits
        self.old_draws = {d: self._means(old_hits[d], d) for d in old_hits}
        self.gain = {d: float(new_hits[d].mean() - old_hits[d].mean()) for d in old_hits}
        self.gain_draws = {d: self._means(new_hits[d], d) - self.old_draws[d] for d in old_hits}

    def rebased(self, old_hits: Mapping[str, np.ndarray],
                new_hits: Mapping[str, np.ndarray]) -> Scorer:
        """The same bootstrap draws of the same queries, shares against another baseline
        (the same queries against other items), so options scored by either stay paired."""
        out = copy.copy(self)
        out._baseline(old_hits, new_hits)
        return out

    def _means(self, hits: np.ndarray, direction: str) -> np.ndarray:
        """[boot] the mean of ``hits`` [Q] in each bootstrap draw of the units."""
        return self.resample[direction].means(direction, hits)

    def share(self, hits: Mapping[str, np.ndarray], direction: str) -> float | None:
        gain = self.gain[direction]
        if gain <= 0:
            return None
        return float((hits[direction].mean() - self.old[direction].mean()) / gain)

    def draws(self, hits: Mapping[str, np.ndarray], direction: str) -> np.ndarray:
        """[boot] the share in each bootstrap draw (NaN where the draw has no gain)."""
        gains = self.gain_draws[direction]
        lift = self._means(hits[direction], direction) - self.old_draws[direction]
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(gains > 0, lift / gains, np.nan)

    def shares(self, hits: Mapping[str, np.ndarray]) -> dict[str, dict[str, float | None]]:
        out = {}
        for d in hits:
            value, draws = self.share(hits, d), self.draws(hits, d)
            out[d] = {"share": value, "se": _std(draws) if value is not None else None}
        return out

    def score(self, hits: Mapping[str, np.ndarray]) -> tuple[float, np.ndarray]:
        """(the objective's value, its [boot] draws): the lower of the two directions' shares
        (default), their mean, or one direction's."""
        point = {d: self.share(hits, d) for d in DIRECTIONS}
        draws = {d: self.draws(hits, d) for d in DIRECTIONS}
        if any(v is None for v in point.values()):
            raise ConfigError("the new model is no better than the old one on the validation "
                              "set in some direction: there is no gain to share")
        if self.objective in DIRECTIONS:
            return float(point[self.objective]), draws[self.objective]  # type: ignore[arg-type]
        combine = np.minimum if self.objective == "lower" else (lambda a, b: (a + b) / 2)
        values = [float(v) for v in point.values()]  # type: ignore[arg-type]
        value = min(values) if self.objective == "lower" else sum(values) / 2
        return value, combine(draws["t2i"], draws["i2t"])

    def area(self, served: Mapping[float, Mapping[str, np.ndarray]]) -> tuple[float, np.ndarray]:
        """The objective averaged over the backfill (trapezoid over its fractions): the
        gain a migration delivers while it runs, with its draws."""
        fractions = sorted(served)
        scored = [self.score(served[f]) for f in fractions]
        xs = np.asarray(fractions)
        value = float(np.trapezoid([s[0] for s in scored], xs))
        draws = np.trapezoid(np.stack([s[1] for s in scored]), xs, axis=0)
        return value, draws


def _resampled(hits: Mapping[str, np.ndarray], units: Mapping[str, np.ndarray] | None,
               boot: int, seed: int) -> dict[str, UnitDraws]:
    """Direction -> the draws its queries are scored on: one joint draw of the units for
    every direction, or (no units) each direction's queries drawn alone, in turn from one
    generator (the plain bootstrap)."""
    if units is not None:
        missing = [d for d in hits if d not in units]
        if missing:
            raise ConfigError(f"units are given for {sorted(units)}, not for {missing}")
        joint = UnitDraws.joint({d: units[d] for d in hits}, boot, seed)
        return {d: joint for d in hits}
    rng = np.random.default_rng(seed)
    return {d: UnitDraws.of(None, len(h), d, boot, rng) for d, h in hits.items()}


def _std(draws: np.ndarray) -> float | None:
    ok = draws[np.isfinite(draws)]
    return float(ok.std(ddof=1)) if len(ok) > 1 else None

