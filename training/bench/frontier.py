"""``nobackfill bench frontier``: how much of NEW's gain a migration brings, and when.

On ``bench base``'s models and a gallery of ``--gallery`` items (the first ``--test``
are a test draw whose first 1,000 are the standard test set; the rest are more items of
the world), every way of getting from the OLD gallery to NEW's space is measured at
fractions of the backfill (the share of items re-embedded by NEW): R@1 both directions
of the text queries of the test items against every item's image, and of the test
items' images against every item's caption (one per item, as a gallery stores), as a
share of the gain ``(x - old->old) / (new->new - old->old)`` with its bootstrap standard
error over the test items (each with its captions and its image: a cluster bootstrap,
``simulate.UnitDraws``), at every 5% of the backfill and at 1%.

Ways (``training.upgrades.transform.simulate``):
- ``today``: routed until the switch at 100% (the query route is Procrustes fitted on the
  sample, SLERP-mixed with OLD's own query, t = 0.5)
- ``transform+<order>``: the K-item sample is embedded by NEW (its items are the first
  re-embedded), every other item's stored vectors are transformed (``--method``), and
  the backfill re-embeds in ``id``, ``random`` or ``learned`` order
- ``progressive``: the learned order's side served from the switch, the route before.
  The switch is decided as a migration decides it (``validation_switch``): on a separate
  validation draw of the world plus the gallery's K-item sample as distractors (their
  stored OLD vectors transformed, NEW's vectors of them, the same share of both
  re-embedded in the learned order at every 5%), against today's route (fitted on the
  sample), the first fraction from which the side beats the route beyond the error (a
  one-sided paired test at 5%, the validation items bootstrapped) in both directions at
  that fraction and every later one. Its check (``progressive_below``): at every fraction
  of the test draw where it serves the side, the route does not beat the side by the same
  test, in either direction, on either seed
- ``hybrid+<order>``: each item scored by both sides, fused (the gateway's ``hybrid``
  search), under the learned and the random order
- ``rerank@<k>`` (k = 5, 10, 20, 50): the route's top k on the OLD side ranked by NEW
  (``training.upgrades.rerank``): every candidate's NEW vector is read or embedded on the
  read, so it serves the same from the first query to the switch; ``fused@20``: ranked
  by NEW's score plus the route's. With each k: the route's recall@k, and the share of the
  gallery a read-through fill holds after the draw's queries. With ``--zipf S``: a skewed
  workload (popularity 1/rank^S over the test items, both directions), the share of
  searches that embed nothing (fully warm) against the share of the gallery filled

The compute of each point is a fraction of a full backfill (NEW embedding every item's
image and caption, timed here): the items re-embedded, plus the transform's fit and
application. Two seeds (``--seeds``) give two independent draws; the mean's error is
their errors combined. Writes ``frontier.json`` and ``frontier.png`` under ``--out``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from training.console import report_command

TEST_SEED = 10_000  # bench base's: the first 1,000 test items are the standard test set
ITEM_SEED = 40_000
SAMPLE_SEED = 41_000
VALIDATION_SEED = 42_000  # the validation draw: neither the test items nor the gallery's
SLERP_T = 0.5
ORDERS = ("id", "random", "learned")
KINDS = ("image", "text")
STEPS = tuple(round(0.05 * k, 2) for k in range(21))  # every 5% of the backfill
FRACTIONS = tuple(sorted({0.01, *STEPS}))
TARGETS = {"transform_t2i": 0.3, "transform_i2t": 0.5, "at_10": 0.5, "at_50": 0.8,
           "transform_compute": 0.02, "se": 0.05, "rerank": 1.0, "warm": 0.8,
           "warm_filled": 0.25, "warm_candidates": 0.32}
RERANK_TARGET_K = 20  # rerank@20 >= 1.0 of the gain from the first query (issue 39)
ZIPF_SEARCHES = 20_000  # the skewed workload's searches during the migration, measured
ZIPF_LEARN = 100_000  # the searches before it, which the gateway counts (about a day of
# traffic at 1.2 searches/s: the counts' half-life): they teach the candidate order
ZIPF_PER_SEARCH = (64.0, 16.0, 4.0, 1.0)  # the backfill's items re-embedded per search
# (how fast it runs beside the reads: at bench migrate's 1,200 items/s, 64 is a search
# every 53 ms, 1 is 1,200 searches/s)
FUSED = "fused@20"


@dataclass
class Embedded:
    """One draw: per item, OLD's and NEW's image and caption vectors; per test query,
    OLD's and NEW's caption vectors; attributes for relevance; NEW's timing."""

    vectors: dict[str, np.ndarray]  # "old_image", "new_image", "old_text", "new_text" [N, D]
    queries: dict[str, np.ndarray]  # "old_text", "new_text" [Q, D]; images: the test rows
    item_attributes: list[dict[str, str]]
    query_attributes: list[dict[str, str]]
    caption_attributes: list[dict[str, str]]  # of each item's stored caption
    new_seconds: float  # NEW embedding every item (image + caption): a full backfill
    query_owners: np.ndarray  # [Q] the item (row) whose caption each text query is

    def units(self, test: int) -> dict[str, np.ndarray]:
        """Direction -> [Q] the item each query belongs to (the bootstrap's unit): a text
        query its caption's item, an image query (the first ``test`` items) its own."""
        return {"t2i": self.query_owners, "i2t": np.arange(test)}


def _items(seed: int, n: int, test: int, prefix: str = "") -> list[Any]:
    from training.bench.base_models import BaseBench
    from training.data import generate_items

    domains = BaseBench().domains
    items = generate_items(test, seed=TEST_SEED + 101 * seed, domains=domains,
                           languages=("en",), id_prefix=f"{prefix}test-")
    if n > test:
        items += generate_items(n - test, seed=ITEM_SEED + 101 * seed, domains=domains,
                                languages=("en",), id_prefix=f"{prefix}item-")
    return items


def validation_items(seed: int, n: int) -> list[Any]:
    """The validation draw: ``n`` items of the world of its own seed. Not the test items:
    an item is a function of its index and seed, so the test draw's seed would give the
    standard test set again."""
    from training.bench.base_models import BaseBench
    from training.data import generate_items

    return generate_items(n, seed=VALIDATION_SEED + 101 * seed, domains=BaseBench().domains,
                          languages=("en",), id_prefix="val-")


def embed_draw(old: Any, new: Any, items: list[Any], test: int, chunk: int = 2000) -> Embedded:
    """Render and embed every item with both models, a chunk at a time."""
    from training.data import PairDataset
    from training.versions import load_encoder

    enc = {"old": load_encoder(old), "new": load_encoder(new)}
    parts: dict[str, list[np.ndarray]] = {}
    new_seconds = 0.0
    for start in range(0, len(items), chunk):
        data = PairDataset.from_synth(items[start:start + chunk])
        images = [data.load_image(i) for i in range(len(data))]
        captions = [r.captions["en"][0] for r in data.records]
        for name, e in enc.items():
            t = time.perf_counter()
            parts.setdefault(f"{name}_image", []).append(e.encode_images(images))
            parts.setdefault(f"{name}_text", []).append(e.encode_texts(captions))
            if name == "new":
                new_seconds += time.perf_counter() - t
    vectors = {k: np.concatenate(v) for k, v in parts.items()}
    test_data = PairDataset.from_synth(items[:test])
    texts, owners = test_data.captions("en")
    mentions, _ = test_data.attribute_sets("en")
    queries = {f"{name}_text": e.encode_texts(texts) for name, e in enc.items()}
    return Embedded(vectors, queries, [dict(i.attributes) for i in items], mentions,
                    [dict(i.caption_attributes[0]) for i in items], new_seconds,
                    np.asarray(owners, np.int64))


class LazyRelevance:
    """[Q, N] bool relevance computed a block of queries at a time (25,000 x 50,000 would
    be 1.25 GB at once)."""

    def __init__(self, mentions: list[dict[str, str]], images: list[dict[str, str]],
                 transpose: bool = False) -> None:
        self.mentions, self.images, self.transpose = mentions, images, transpose

    def __getitem__(self, rows: slice) -> np.ndarray:
        from training.data.dataset import attribute_relevance

        if self.transpose:  # image queries against captions: [Q images, N captions]
            return attribute_relevance(self.mentions, self.images[rows]).T
        return attribute_relevance(self.mentions[rows], self.images)


def fit_route(sample_idx: np.ndarray, e: Embedded) -> dict[str, Any]:
    """Today's route, fitted on the gallery's sample: per kind the Procrustes map NEW ->
    OLD of the sample's pairs ([D_new, D_old])."""
    import torch

    from training.upgrades.adapter.maps import procrustes

    return {kind: procrustes(torch.from_numpy(e.vectors[f"new_{kind}"][sample_idx]),
                             torch.from_numpy(e.vectors[f"old_{kind}"][sample_idx]))
            for kind in KINDS}


def route_queries(maps: dict[str, Any], e: Embedded, test: int) -> dict[str, np.ndarray]:
    """A draw's queries (its captions; its first ``test`` items' images) carried into OLD's
    space by the route's ``maps``, SLERP-mixed with OLD's own query (t = 0.5)."""
    import torch

    from training.upgrades.adapter.maps import slerp

    out = {}
    for kind in KINDS:
        q_new = e.queries["new_text"] if kind == "text" else e.vectors["new_image"][:test]
        q_old = e.queries["old_text"] if kind == "text" else e.vectors["old_image"][:test]
        mapped = torch.nn.functional.normalize(torch.from_numpy(q_new) @ maps[kind], dim=-1)
        out[kind] = slerp(mapped, torch.from_numpy(q_old), SLERP_T).numpy()
    return out


def simulated(e: Embedded, routed: dict[str, np.ndarray], transformed: dict[str, np.ndarray],
              test: int) -> tuple[Any, Any]:
    """The draw as ``simulate.curve`` reads it: every item (OLD, NEW, transformed) and the
    first ``test`` items' queries (captions against the images; images against the
    items' stored captions)."""
    from training.upgrades.transform.simulate import Items, Queries

    items = Items({k: e.vectors[f"old_{k}"] for k in KINDS},
                  {k: e.vectors[f"new_{k}"] for k in KINDS}, transformed)
    queries = Queries(
        new={"text": e.queries["new_text"], "image": e.vectors["new_image"][:test]},
        routed=routed,
        old={"text": e.queries["old_text"], "image": e.vectors["old_image"][:test]},
        relevant={"t2i": LazyRelevance(e.query_attributes, e.item_attributes),
                  "i2t": LazyRelevance(e.caption_attributes, e.item_attributes[:test],
                                       transpose=True)})
    return items, queries


def transform_orders(t: Any, e: Embedded, sample_idx: np.ndarray, transformed: dict,
                     seed: int, names: list[str]) -> tuple[dict[str, list[int]], np.ndarray]:
    """Each order over the items, the sample first (NEW embedded it to fit the map); the
    predicted error of every item (the learned order's key). The id order sorts the items
    by a hash of their names: a gallery's ids say nothing of which items are queried
    (sorting the names themselves would put the test items, ``test-...``, last)."""
    from training.upgrades.transform.order import order_items

    n = len(e.vectors["old_image"])
    scores = sum(t.predicted_error(k, e.vectors[f"old_{k}"], transformed[k]) for k in t.kinds)
    in_sample = np.zeros(n, bool)
    in_sample[sample_idx] = True
    rest = np.flatnonzero(~in_sample)
    ids = [hashlib.sha1(names[i].encode()).hexdigest() for i in rest]
    orders = {}
    for name in ORDERS:
        picked = order_items(name, ids, scores[rest], seed=seed)
        orders[name] = [int(i) for i in sample_idx] + [int(rest[p]) for p in picked]
    return orders, scores


def drawn(old: Any, new: Any, args: argparse.Namespace, seed: int,
          ) -> tuple[list[Any], Embedded, float]:
    """One draw's items, embedded by OLD and NEW, and the seconds that took."""
    start = time.perf_counter()
    items = _items(seed, args.gallery, args.test)
    return items, embed_draw(old, new, items, args.test), time.perf_counter() - start


def sample_rows(n: int, k: int, seed: int) -> np.ndarray:
    """The rows of the draw's K-item sample (sorted): the items NEW embeds to fit the
    transform and the route, re-embedded first."""
    return np.sort(np.random.default_rng(SAMPLE_SEED + seed).permutation(n)[:k])


@dataclass
class Sample:
    """The gallery's K-item sample as a migration holds it: its rows, every item's stored
    vectors transformed, and the learned order's key of each item (its predicted error)."""

    e: Embedded
    rows: np.ndarray
    transformed: dict[str, np.ndarray]  # every item of the draw, not only the sample's
    scores: np.ndarray
    names: list[str]

    def items(self) -> Any:
        """The sample's items as distractors: their OLD vectors, NEW's, their transforms."""
        from training.upgrades.transform.simulate import Items

        def rows(prefix: str) -> dict[str, np.ndarray]:
            return {k: self.e.vectors[f"{prefix}_{k}"][self.rows] for k in KINDS}
        return Items(rows("old"), rows("new"), {k: self.transformed[k][self.rows] for k in KINDS})

    def order(self) -> list[int]:
        """The sample's items in the learned order (most wrong first), as the gallery's."""
        from training.upgrades.transform.order import order_items

        return order_items("learned", [self.names[i] for i in self.rows], self.scores[self.rows])


def fit_draw(e: Embedded, sample_idx: np.ndarray, args: argparse.Namespace,
             seed: int) -> tuple[Any, dict[str, np.ndarray], dict[str, float]]:
    """(the transform fitted on the sample's pairs, every item's stored vectors mapped by
    it, the seconds of the fit and of the mapping)."""
    from training.upgrades.transform import TransformConfig, fit_transform

    cfg = TransformConfig.from_dict({"method": args.method, "ensemble": args.ensemble,
                                     "seed": seed})
    t0 = time.perf_counter()
    t = fit_transform({k: e.vectors[f"old_{k}"][sample_idx] for k in KINDS},
                      {k: e.vectors[f"new_{k}"][sample_idx] for k in KINDS}, cfg)
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    transformed = {k: t.apply(k, e.vectors[f"old_{k}"]) for k in KINDS}
    return t, transformed, {"transform_fit": round(fit_s, 2),
                            "transform_apply": round(time.perf_counter() - t0, 3)}


def measure_draw(old: Any, new: Any, args: argparse.Namespace, seed: int,
                 out: Path, draw: tuple[list[Any], Embedded, float] | None = None,
                 ) -> dict[str, Any]:
    """Every way measured on one draw (``draw``: ``drawn``'s, when the caller has it)."""
    from training.upgrades.transform.order import errors, spearman
    from training.upgrades.transform.simulate import curve

    items, e, embed_s = draw or drawn(old, new, args, seed)
    n = len(items)
    sample_idx = sample_rows(n, args.sample, seed)
    t, transformed, seconds = fit_draw(e, sample_idx, args, seed)
    names = [it.id for it in items]
    orders, scores = transform_orders(t, e, sample_idx, transformed, seed, names)
    true_err = sum(errors(transformed[k], e.vectors[f"new_{k}"]) for k in KINDS)
    rest = np.setdiff1d(np.arange(n), sample_idx)
    route = fit_route(sample_idx, e)
    routed = route_queries(route, e, args.test)
    gallery, queries = simulated(e, routed, transformed, args.test)
    fractions = sorted({max(f, args.sample / n) for f in FRACTIONS})  # the sample goes first
    t0 = time.perf_counter()
    hits = curve(gallery, queries, orders, fractions)
    seconds["curve"] = round(time.perf_counter() - t0, 1)
    t0 = time.perf_counter()
    rerank = rerank_draw(e, routed, queries.relevant, hits, getattr(args, "zipf", None),
                         seed)
    seconds["rerank"] = round(time.perf_counter() - t0, 1)
    validation = validation_switch(old, new, args, seed, t, route,
                                   Sample(e, sample_idx, transformed, scores, names))
    return {"seed": seed, "gallery": n, "test_items": args.test, "sample": args.sample,
            "t2i_queries": len(e.queries["new_text"]), "i2t_queries": args.test,
            "transform": {"method": args.method, "ensemble": args.ensemble, **t.metrics},
            "order_spearman": round(spearman(scores[rest], true_err[rest]), 4),
            "seconds": {"embed_draw": round(embed_s, 1),
                        "new_full_backfill": round(e.new_seconds, 2), **seconds},
            "fractions": fractions, "switch_fraction": validation.pop("switch_fraction"),
            "validation": validation, "query_owners": e.query_owners.tolist(),
            "rerank": rerank, "hits": _packed(hits)}


def rerank_draw(e: Embedded, routed: dict[str, np.ndarray], relevant: dict[str, Any],
                hits: dict[str, dict[str, np.ndarray]], zipf: float | None,
                seed: int) -> dict[str, Any]:
    """Rerank on read on one draw: adds each ``rerank@k`` (and ``fused@20``) to ``hits``;
    returns per k the route's recall@k and the share of the gallery the fill holds after
    every query of the draw, and with ``zipf`` the skewed workload's warm-search curve."""
    from training.upgrades.rerank import (
        DIRECTIONS,
        KS,
        candidates,
        every_k,
        filled_share,
    )

    test = len(routed["image"])
    new_q = {"text": e.queries["new_text"], "image": e.vectors["new_image"][:test]}
    cands = {d: candidates(routed[qk], e.vectors[f"old_{ik}"], max(KS))
             for d, (qk, ik) in DIRECTIONS.items()}
    n = len(e.vectors["old_image"])
    fused_k = int(FUSED.split("@")[1])
    measured = {d: every_k(cands[d], new_q[qk], e.vectors[f"new_{ik}"], relevant[d], KS,
                           routed[qk], e.vectors[f"old_{ik}"], fused_k)
                for d, (qk, ik) in DIRECTIONS.items()}
    out: dict[str, Any] = {"k": {}}
    for k in KS:
        hits[f"rerank@{k}"] = {d: measured[d][f"rerank@{k}"] for d in DIRECTIONS}
        out["k"][str(k)] = {
            "route_recall": {d: round(float(measured[d][f"recall@{k}"].mean()), 4)
                             for d in DIRECTIONS},
            "filled_after_queries": round(filled_share([c[:, :k] for c in cands.values()], n),
                                          4)}
    hits[FUSED] = {d: measured[d][FUSED] for d in DIRECTIONS}
    if zipf is not None:
        owners = {"t2i": e.query_owners, "i2t": np.arange(test)}
        top = {d: c[:, :RERANK_TARGET_K] for d, c in cands.items()}
        out["zipf"] = zipf_curves(top, owners, test, n, zipf, seed)
    return out


def zipf_curves(top: dict[str, np.ndarray], owners: dict[str, np.ndarray], test: int,
                n: int, s: float, seed: int) -> dict[str, Any]:
    """The skewed workload (popularity ``1/rank^s``) on one draw: ``ZIPF_LEARN`` searches
    served before the migration, which the gateway counts (nothing filled), then
    ``ZIPF_SEARCHES`` during it, served by rerank on read with the read-through fill
    (``fill_curve``: the warm share over the last 1,000 searches, and the workload's exact
    warm share, the reference's measure). The same measured searches with the backfill in
    the candidate order the counted ones teach (``candidate_order``) beside the reads, at
    each rate of ``ZIPF_PER_SEARCH``; and the reference, a fill that knew every query's
    share in advance (``best_fill_curve``)."""
    from training.upgrades.rerank import (
        best_fill_curve,
        candidate_order,
        fill_curve,
        zipf_query_shares,
        zipf_stream,
    )

    stream, _ = zipf_stream(top, owners, test, ZIPF_LEARN + ZIPF_SEARCHES, s, seed)
    learned, measured = stream[:ZIPF_LEARN], stream[ZIPF_LEARN:]
    shares = zipf_query_shares(owners, test, s, seed)
    exact = (np.concatenate([top[d] for d in top]), np.concatenate([shares[d] for d in top]))
    curve = fill_curve(measured, n, exact=exact)
    best = best_fill_curve(top, shares, n, [p["filled"] for p in curve["curve"]])
    order = candidate_order(learned, n)
    ordered = [{"per_search": per, **fill_curve(measured, n, backfill=order, per_search=per,
                                                exact=exact)} for per in ZIPF_PER_SEARCH]
    return {"s": s, "k": top[next(iter(top))].shape[1], "learned_from": ZIPF_LEARN, **curve,
            "best_fill": best, "candidates": ordered}


def validation_switch(old: Any, new: Any, args: argparse.Namespace, seed: int, t: Any,
                      route: dict[str, Any], sample: Sample) -> dict[str, Any]:
    """Where a progressive migration switches, decided as the migration decides it: the
    validation draw's items (captions as queries) plus the gallery's sample as distractors
    (relevant to no query), their stored vectors transformed, then re-embedded in the
    learned order (the same share of both at every 5%, ``joined_order``); against today's
    route (fitted on the gallery's sample); the first fraction from which the side beats
    the route beyond the error in both directions, there and at every later 5%
    (``switch_fraction``: one-sided paired test at 5%, the validation items
    bootstrapped). With each fraction's lead of the side over the route and its error."""
    from training.upgrades.transform.order import order_items
    from training.upgrades.transform.simulate import (
        curve,
        join,
        joined_order,
        pad_relevance,
        switch_fraction,
    )

    items = validation_items(seed, args.validation)
    n = len(items)
    v = embed_draw(old, new, items, n)
    transformed = {k: t.apply(k, v.vectors[f"old_{k}"]) for k in KINDS}
    scores = sum(t.predicted_error(k, v.vectors[f"old_{k}"], transformed[k]) for k in t.kinds)
    own, queries = simulated(v, route_queries(route, v, n), transformed, n)
    queries.relevant = pad_relevance(queries.relevant, len(sample.rows))
    order = joined_order(order_items("learned", [it.id for it in items], scores),
                         sample.order())
    hits = curve(join(own, sample.items()), queries, {"learned": order}, STEPS, hybrid=False)
    units = v.units(n)
    return {"switch_fraction": switch_fraction(hits, "learned", STEPS, units=units),
            "items": n, "distractors": len(sample.rows),
            "points": leads(hits, [f"side learned {f:g}" for f in STEPS], units)}


def leads(hits: dict[str, dict[str, np.ndarray]], keys: list[str],
          units: dict[str, np.ndarray]) -> list[dict[str, Any]]:
    """Per key, per direction: R@1 of the key minus the route's and the error of that
    difference (the items bootstrapped), and whether it beats or falls below the route
    by the one-sided test at 5%."""
    from training.upgrades.transform.simulate import UnitDraws, one_sided, paired_lead

    draws = {d: UnitDraws.of(u, len(u), d) for d, u in units.items()}
    out = []
    for key in keys:
        point: dict[str, Any] = {"key": key}
        for d, drawn in draws.items():
            lead, se = paired_lead(hits, key, "routed", d, drawn)
            point[d] = {"lead": round(lead, 4), "se": round(se, 4),
                        "beats": one_sided(lead, se), "below": one_sided(-lead, se)}
        out.append(point)
    return out


def _packed(hits: dict[str, dict[str, np.ndarray]]) -> dict[str, dict[str, str]]:
    """Hits as hex bit strings (the JSON keeps every query's outcome for re-analysis)."""
    return {k: {d: np.packbits(v).tobytes().hex() + f":{len(v)}" for d, v in per.items()}
            for k, per in hits.items()}


def _unpacked(packed: dict[str, dict[str, str]]) -> dict[str, dict[str, np.ndarray]]:
    out = {}
    for k, per in packed.items():
        out[k] = {}
        for d, text in per.items():
            hexed, count = text.split(":")
            out[k][d] = np.unpackbits(np.frombuffer(bytes.fromhex(hexed), np.uint8))[
                :int(count)].astype(bool)
    return out


def draw_units(draw: dict[str, Any]) -> dict[str, np.ndarray]:
    """Direction -> [Q] the test item each query of a measured draw belongs to."""
    return {"t2i": np.asarray(draw["query_owners"], np.int64),
            "i2t": np.arange(draw["i2t_queries"])}


def strategy_rows(draw: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Per way: its points (fraction of the backfill, compute, share and error per
    direction, the error over the test items)."""
    from training.upgrades.transform.simulate import UnitDraws, share

    hits = _unpacked(draw["hits"])
    secs = draw["seconds"]
    extra = (secs["transform_fit"] + secs["transform_apply"]) / secs["new_full_backfill"]
    fractions = draw["fractions"]
    switch = draw["switch_fraction"]
    draws = {d: UnitDraws.of(u, len(u), d) for d, u in draw_units(draw).items()}

    def point(f: float, key: str, compute: float) -> dict[str, Any]:
        return {"fraction": f, "compute": compute,
                **{d: share(hits, key, d, draws=draws[d]) for d in ("t2i", "i2t")}}

    rows: dict[str, list[dict[str, Any]]] = {"today": []}
    for f in [0.0, *fractions]:
        rows["today"].append(point(f, "new->new" if f >= 1 else "routed", f))
    for name in ORDERS:
        rows[f"transform+{name}"] = [point(f, f"side {name} {f:g}", f + extra) for f in fractions]
    rows["progressive"] = [point(f, progressive_key(f, switch), f + extra) for f in fractions]
    for name in ("learned", "random"):
        rows[f"hybrid+{name}"] = [point(f, f"hybrid {name} {f:g}", f + extra) for f in fractions]
    for key in (k for k in hits if k.startswith(("rerank@", "fused@"))):
        # served from the first query; the switch at 100% serves NEW natively
        rows[key] = [point(f, "new->new" if f >= 1 else key, f) for f in [0.0, *fractions]]
    return rows


def progressive_key(f: float, switch: float | None) -> str:
    """What the progressive migration serves at ``f``: the learned side from the switch;
    at the end of the backfill (a migration that never switched progressively switches
    there, past its gate) the side, every item re-embedded."""
    return f"side learned {f:g}" if (switch is not None and f >= switch) or f >= 1 \
        else "routed"


def progressive_below(draw: dict[str, Any]) -> list[dict[str, Any]]:
    """The fractions of a measured draw where the progressive migration serves a side the
    route beats beyond the error (one-sided paired test at 5%, the test items
    bootstrapped), each with its lead and error per direction; empty: never below."""
    switch = draw["switch_fraction"]
    keys = [progressive_key(f, switch) for f in draw["fractions"]]
    served = [k for k in keys if k != "routed"]
    points = leads(_unpacked(draw["hits"]), served, draw_units(draw))
    return [p for p in points if any(p[d]["below"] for d in ("t2i", "i2t"))]


def combined(draws: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The mean over draws of each point's share; its error: the draws' errors combined."""
    per = [strategy_rows(d) for d in draws]
    out: dict[str, list[dict[str, Any]]] = {}
    for name, points in per[0].items():
        out[name] = []
        for i, p in enumerate(points):
            q = {"fraction": p["fraction"],
                 "compute": float(np.mean([r[name][i]["compute"] for r in per]))}
            for d in ("t2i", "i2t"):
                values = [r[name][i][d] for r in per]
                if any(v["share"] is None for v in values):
                    q[d] = {"share": None, "se": None}
                    continue
                q[d] = {"share": float(np.mean([v["share"] for v in values])),
                        "se": float(np.sqrt(sum(v["se"] ** 2 for v in values)) / len(values))}
            out[name].append(q)
    return out


def check_targets(rows: dict[str, list[dict[str, Any]]], draws: list[dict]) -> dict[str, bool]:
    def at(name: str, f: float) -> dict[str, Any]:
        return min(rows[name], key=lambda p: abs(p["fraction"] - f))

    first = rows["transform+learned"][0]
    best = max((f"transform+{o}" for o in ORDERS), key=lambda n: min(
        at(n, 0.10)["t2i"]["share"], at(n, 0.10)["i2t"]["share"]))
    out = {
        f"transform alone: compute {first['compute']:.4f} <= 0.02":
            first["compute"] <= TARGETS["transform_compute"],
        "transform alone: t2i share >= 0.3": first["t2i"]["share"] >= TARGETS["transform_t2i"],
        "transform alone: i2t share >= 0.5": first["i2t"]["share"] >= TARGETS["transform_i2t"]}
    for f, goal in ((0.10, TARGETS["at_10"]), (0.50, TARGETS["at_50"])):
        p = at(best, f)
        out[f"{best} at {f:.0%}: both shares >= {goal}"] = min(
            p["t2i"]["share"], p["i2t"]["share"]) >= goal
    p = at(best, 1.0)
    out[f"{best} at 100%: share 1.0"] = abs(p["t2i"]["share"] - 1) < 1e-9 and abs(
        p["i2t"]["share"] - 1) < 1e-9
    out["progressive: never below the route beyond the error, at every fraction, on every "
        "draw (one-sided paired test at 5%, the test items bootstrapped)"] = not any(
            progressive_below(d) for d in draws)
    out["every share's error <= 0.05 (mean of the draws)"] = all(
        p[d]["se"] is not None and p[d]["se"] <= TARGETS["se"]
        for points in rows.values() for p in points for d in ("t2i", "i2t"))
    name = f"rerank@{RERANK_TARGET_K}"
    if name in rows:
        served = [p for p in rows[name] if p["fraction"] < 1]
        out[f"{name} >= {TARGETS['rerank']} of the gain in both directions from the first "
            f"query (every point before the switch), error <= {TARGETS['se']}"] = all(
                p[d]["share"] >= TARGETS["rerank"] and p[d]["se"] <= TARGETS["se"]
                for p in served for d in ("t2i", "i2t"))
    zipfs = [d["rerank"]["zipf"] for d in draws if "zipf" in d.get("rerank", {})]
    if zipfs:
        out[f"zipf: >= {TARGETS['warm']:.0%} of searches fully warm once at most "
            f"{TARGETS['warm_filled']:.0%} of the gallery is embedded (every draw)"] = all(
                z["warm_80_at_filled"] is not None
                and z["warm_80_at_filled"] <= TARGETS["warm_filled"] for z in zipfs)
        for per in ZIPF_PER_SEARCH:
            at = [c["exact"]["warm_80_at_filled"] for z in zipfs
                  for c in z.get("candidates") or [] if c["per_search"] == per]
            if at:
                out[f"zipf: read-through + candidate order >= {TARGETS['warm']:.0%} of "
                    f"searches fully warm at most {TARGETS['warm_candidates']:.0%} of the "
                    f"gallery filled, backfill {per:g} items per search (every draw)"] = all(
                        a is not None and a <= TARGETS["warm_candidates"] for a in at)
    return out


# One colour and one marker per line, both distinct up to 12 lines (Okabe-Ito's eight and
# four of Tol's muted scheme: told apart by most colour-blind readers, and by the marker).
COLOURS = ("#000000", "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9",
           "#882255", "#999933", "#332288", "#888888", "#44AA99")
MARKERS = ("s", "o", "^", "v", "D", "P", "X", "<", ">", "p", "h", "*")


def line_styles(names: list[str]) -> dict[str, tuple[str, str]]:
    """Each line's (colour, marker): line ``i`` takes colour ``i mod C`` and marker
    ``(i + i div C) mod M``, so the first 12 differ in both and the pairs stay distinct up to
    C x M lines."""
    c, m = len(COLOURS), len(MARKERS)
    return {name: (COLOURS[i % c], MARKERS[(i + i // c) % m]) for i, name in enumerate(names)}


def _spaced(xs: list[float], gap: float = 0.12) -> list[bool]:
    """Which points get a marker and an error bar on a log axis: the first, the last, and
    each at least ``gap`` decades right of the last one marked (every 5% of the backfill
    crowds the right end)."""
    shown, last = [], -np.inf
    for n, x in enumerate(xs):
        mark = n == len(xs) - 1 or np.log10(x) - last >= gap
        if mark:
            last = np.log10(x)
        shown.append(bool(mark))
    return shown


def plot(rows: dict[str, list[dict[str, Any]]], path: Path,
         title: str) -> dict[str, tuple[str, str]]:
    """The share of NEW's gain per way against the fraction of the backfill, one panel per
    direction, the legend below them (sized to be read at about 800 px wide). Returns each
    line's (colour, marker) as drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import to_hex

    styles = line_styles(list(rows))
    fig, axes = plt.subplots(1, 2, figsize=(8, 6.2), sharey=True, layout="constrained")
    drawn: dict[str, tuple[str, str]] = {}
    for ax, d, label in zip(axes, ("t2i", "i2t"), ("text -> image", "image -> text")):
        for name, points in rows.items():
            xs = [max(p["fraction"], 0.002) for p in points]
            ys = [p[d]["share"] for p in points]
            es = [p[d]["se"] or 0 for p in points]
            colour, marker = styles[name]
            shown = _spaced(xs)
            line = ax.errorbar(xs, ys, yerr=es, color=colour, marker=marker, ms=5.5,
                               mec="white", mew=0.5, lw=1.4, elinewidth=0.8, capsize=2,
                               markevery=shown, errorevery=shown, label=name,
                               drawstyle="steps-post" if name == "today" else "default")
            drawn[name] = (to_hex(line.lines[0].get_color()), line.lines[0].get_marker())
        ax.set_xscale("log")
        ax.set_xticks([0.002, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0])
        ax.set_xticklabels(["0", "1%", "5%", "10%", "25%", "50%", "100%"], fontsize=10)
        ax.tick_params(axis="y", labelsize=10)
        ax.axhline(1.0, color="grey", lw=0.6, ls=":")
        ax.axhline(0.0, color="grey", lw=0.6, ls=":")
        ax.set_title(label, fontsize=12)
        ax.grid(axis="y", color="#e5e5e5", lw=0.5)
        ax.set_xlabel("share of the gallery re-embedded", fontsize=11)
    axes[0].set_ylabel("share of NEW's R@1 gain (± 1 s.e.)", fontsize=11)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=4, fontsize=11,
               frameon=False, handlelength=2.2, columnspacing=1.4)
    fig.suptitle(title, fontsize=11)
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return drawn


def run(args: argparse.Namespace) -> dict[str, Any]:
    from training.bench.xbt import open_base

    out = Path(args.out)
    draws = []
    if getattr(args, "from_draws", False):  # the table again from the kept draws
        draws = [json.loads((out / f"draw-{seed}.json").read_text()) for seed in args.seeds]
    else:
        old, new = open_base(Path(args.base), out)
        out.mkdir(parents=True)
        start = time.perf_counter()
        for n, seed in enumerate(args.seeds):
            print(f"bench frontier: [{n + 1}/{len(args.seeds)}] [+{time.perf_counter() - start:.1f}"
                  f" s] seed {seed}: a {args.gallery:,}-item gallery embedded by OLD and NEW, "
                  f"every way measured" + (f", zipf {args.zipf}" if args.zipf else ""),
                  file=sys.stderr, flush=True)
            draw = measure_draw(old, new, args, seed, out)
            (out / f"draw-{seed}.json").write_text(json.dumps(draw))
            draws.append(draw)
    return summarised(args, draws, out)


def summarised(args: argparse.Namespace, draws: list[dict[str, Any]],
               out: Path) -> dict[str, Any]:
    """The table, the targets and the plot of measured draws."""
    rows = combined(draws)
    result = {"seeds": list(args.seeds), "gallery": args.gallery, "test_items": args.test,
              "sample": args.sample, "method": args.method, "ensemble": args.ensemble,
              "per_draw": [{k: v for k, v in d.items() if k not in ("hits", "query_owners")}
                           | {"rows": strategy_rows(d), "progressive_below": progressive_below(d)}
                           for d in draws],
              "rows": rows, "targets": check_targets(rows, draws)}
    plot(rows, out / "frontier.png", f"bench frontier: {args.gallery:,}-item gallery, "
         f"{args.sample:,}-item sample, seeds {', '.join(map(str, args.seeds))}")
    (out / "frontier.json").write_text(json.dumps(result, indent=2))
    result["plot"] = str(out / "frontier.png")
    return result


def _cell(p: dict[str, Any], d: str) -> str:
    v = p[d]
    return "   n/a    " if v["share"] is None else f"{v['share']:5.2f}±{v['se']:.2f}"


def _validation_lines(d: dict[str, Any]) -> list[str]:
    """The switch's evidence on one seed, and where the progressive side fell below."""
    v = d["validation"]
    cells = [f"{p['key'].rsplit(' ', 1)[-1]}: " + " / ".join(
        f"{p[x]['lead']:+.3f}±{p[x]['se']:.3f}{'*' if p[x]['beats'] else ''}"
        for x in ("t2i", "i2t")) for p in v["points"]]
    below = [f"{p['key'].rsplit(' ', 1)[-1]}" for p in d["progressive_below"]]
    return [f"  validation ({v['items']:,} items + {v['distractors']:,} distractors): side minus "
            f"route R@1 t2i / i2t (* beats it, one-sided 5%): " + "; ".join(cells),
            f"  progressive below the route beyond the error at: {', '.join(below) or 'none'}"]


def _rerank_lines(r: dict[str, Any]) -> list[str]:
    """One draw's rerank figures: the route's recall@k and the fill after its queries; the
    skewed workload's curve."""
    if not r:
        return []
    lines = ["  rerank: " + "; ".join(
        f"k {k}: route recall t2i {v['route_recall']['t2i']:.3f} / i2t "
        f"{v['route_recall']['i2t']:.3f}, filled after the queries {v['filled_after_queries']:.1%}"
        for k, v in r["k"].items())]
    z = r.get("zipf")
    if z:
        lines.append(f"  zipf {z['s']} (k {z['k']}, {z['searches']:,} searches, warm share over "
                     f"the last {z['window']:,}): at gallery filled {_cells(z['curve'])}; 80% "
                     f"warm reached at {z['warm_80_at_filled']} filled; end: "
                     f"{z['final_filled']:.1%} filled, {z['final_warm']:.0%} warm")
        if z.get("best_fill"):
            lines.append(f"  zipf {z['s']}, a fill that knew the workload (greedy, expected "
                         f"warm share): at gallery filled {_cells(z['best_fill']['curve'])}; "
                         f"80% warm at {z['best_fill']['warm_80_at_filled']} filled")
        if z.get("exact"):
            lines.append(f"  zipf {z['s']}, read-through alone, the workload's exact warm "
                         f"share: at gallery filled {_cells(z['exact']['curve'])}; 80% warm "
                         f"at {z['exact']['warm_80_at_filled']} filled")
        for c in z.get("candidates") or []:
            lines.append(f"  zipf {z['s']}, read-through + candidate order learned from "
                         f"{z.get('learned_from', 0):,} counted searches, backfill "
                         f"{c['per_search']:g} items per search (exact warm share): at "
                         f"gallery filled {_cells(c['exact']['curve'])}; 80% warm at "
                         f"{c['exact']['warm_80_at_filled']} filled")
    return lines


def _cells(curve: list[dict[str, Any]]) -> str:
    return ", ".join(f"{p['filled']:.0%}: " + ("-" if p["warm"] is None else f"{p['warm']:.0%}")
                     for p in curve)


def render(result: dict[str, Any]) -> str:
    lines = []
    for d in result["per_draw"]:
        t = d["transform"]
        lines.append(f"seed {d['seed']}: gallery {d['gallery']:,} items, test {d['test_items']:,} "
                     f"items ({d['t2i_queries']:,} t2i / {d['i2t_queries']:,} i2t queries), "
                     f"sample {d['sample']:,}; transform {t['method']} x{t['ensemble']} "
                     f"held-out cosine {t['holdout_cosine']}; learned order spearman "
                     f"{d['order_spearman']}; switch at {d['switch_fraction']}; seconds {d['seconds']}")
        lines += _validation_lines(d)
        lines += _rerank_lines(d.get("rerank") or {})
    rows = result["rows"]
    lines.append(f"mean of seeds {result['seeds']}: share of the gain t2i / i2t (± s.e.) at each "
                 f"fraction of the backfill; compute as a fraction of a full backfill")
    for name, points in rows.items():
        lines.append(f"{name}")
        for p in points:
            lines.append(f"  {p['fraction']:7.2%}  compute {p['compute']:7.4f}  t2i {_cell(p, 't2i')}"
                         f"  i2t {_cell(p, 'i2t')}")
    lines += [f"target {k}: {'met' if v else 'MISSED'}" for k, v in result["targets"].items()]
    lines.append(f"plot: {result['plot']}")
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction, name: str) -> None:
    p = sub.add_parser(name, help="share of NEW's gain against the fraction of the backfill: "
                                  "today's migration, a gallery-side transform with each "
                                  "backfill order, the progressive switch, the hybrid")
    p.add_argument("--base", default="runs/bench-base", help="holds old/ and new/ artifacts")
    p.add_argument("--out", default="runs/bench-frontier")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--gallery", type=int, default=50_000, help="items in the gallery")
    p.add_argument("--test", type=int, default=5_000, help="test items (part of the gallery)")
    p.add_argument("--sample", type=int, default=900, help="K: items NEW embeds to fit the "
                                                           "transform")
    p.add_argument("--validation", type=int, default=1_000, help="validation items (the "
                                                                 "progressive switch)")
    p.add_argument("--method", default="residual-mlp", help="the transform's map")
    p.add_argument("--ensemble", type=int, default=1)
    p.add_argument("--zipf", type=float, default=None, metavar="S",
                   help="also a skewed workload: popularity 1/rank^S over the test items, "
                        f"{ZIPF_SEARCHES:,} searches: fully warm searches against the share "
                        "of the gallery filled by reads")
    p.add_argument("--from-draws", action="store_true", help="no measuring: the table, "
                   "targets and plot again from the draw-<seed>.json files kept in --out")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=report_command(run, render))
