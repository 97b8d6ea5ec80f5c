"""One plan, end to end, from models and data (the ``plan`` job and ``bench plan`` call it).

NEW embeds the K-item sample's sources (timed: NEW's rate on this host, which prices a full
backfill of the gallery), OLD (the version that serves the gallery, in its space) and NEW
embed the validation set; then every option is fitted on the sample and measured on the
validation set (``measure``), its query latency timed through the encoder that would
serve it (batch of one, median, over OLD's own query), and the choice made (``decide``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from training.artifacts import Artifact
from training.encoders import Encoder, ModelSpec, create_tokenizer
from training.upgrades.plan.build import Costs, make_plan
from training.upgrades.plan.decide import Constraints
from training.upgrades.plan.measure import (
    GRID,
    Embedded,
    Option,
    RouteFit,
    Scorer,
    backfill_orders,
    fit_routes,
    migration_options,
)
from training.upgrades.slerp import SlerpEncoder

LATENCY_QUERIES = 20
XBT_TRAIN_FACTOR = 3.0  # a training step's forward + backward, in forwards


def query_ms(encoder: Any, texts: Sequence[str], images: Sequence[Any],
             n: int = LATENCY_QUERIES) -> dict[str, float]:
    """Median ms of one text and one image query (batch of 1), after a warm-up."""
    out = {}
    for kind, inputs, encode in (("text", texts, encoder.encode_texts),
                                 ("image", images, encoder.encode_images)):
        encode(list(inputs[:1]))
        times = []
        for x in list(inputs[:n]):
            start = time.perf_counter()
            encode([x])
            times.append((time.perf_counter() - start) * 1e3)
        out[kind] = statistics.median(times)
    return out


def _minus(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    return {k: a[k] - b[k] for k in a}


def _bytes(modules: Sequence[torch.nn.Module]) -> int:
    seen: dict[int, int] = {}
    for m in modules:
        for p in m.parameters():
            seen[id(p)] = p.numel() * p.element_size()
    return sum(seen.values())


def run_plan(new: Artifact | ModelSpec, old: Artifact, space: str, sample: Any,
             validation: Any, gallery_items: int, constraints: Constraints,
             objective: str = "lower", seed: int = 0, xbt: Sequence[Artifact] = (),
             max_negative_flip: float | None = None, device: str | None = None,
             on_stage: Callable[[str], None] | None = None,
             stored: Artifact | None = None) -> dict[str, Any]:
    """The plan's record. ``sample``: an adapter ``Sample`` (sources and stored OLD
    vectors); ``validation``: a ``PairDataset``; ``old``: the version serving the gallery
    (its route into ``space`` embeds the baseline's queries: what users get now);
    ``stored``: the version that embedded the gallery's stored vectors, native to
    ``space`` (it embeds the validation items as the gallery stores them, and the routes
    and the transform are fitted on its vectors; None: ``old`` itself);
    ``xbt``: trained upgrade versions of the candidate with a route into ``space``."""
    from training.upgrades.adapter.fit import embed_sample
    from training.upgrades.inputs import new_model_of
    from training.versions import load_encoder

    stage = on_stage or (lambda s: None)
    started = time.perf_counter()
    spec, model, _ = new_model_of(new)
    tokenizer = create_tokenizer(spec)
    new_enc = Encoder(model, tokenizer, device)
    old_enc = load_encoder(old, space, device)  # the serving route: the baseline's queries
    stored_enc = old_enc if stored is None or stored.version_id == old.version_id else \
        load_encoder(stored, space, device)  # the gallery's vectors

    stage("embed the sample")
    t0 = time.perf_counter()
    sample_new = {k: v.numpy() for k, v in embed_sample(new_enc, sample).items()}
    sample_s = time.perf_counter() - t0
    sample_old = {k: np.asarray(v, np.float32) for k, v in
                  (("image", sample.image_old), ("text", sample.text_old)) if len(v)}
    k_items = max(len(sample.images), len(sample.texts))
    costs = Costs(gallery_items, k_items, sample_s)

    stage("embed the validation set")
    t0 = time.perf_counter()
    language = "en" if "en" in validation.languages() else validation.languages()[0]
    texts, _ = validation.captions(language)
    images = [validation.load_image(n) for n in range(len(validation))]
    rel = validation.relevance(language)  # [captions, images]
    # a gallery of the validation set's images and of all its captions (as bench upgrade
    # scores: image queries against every caption), each kind its own items
    old_images, new_images = stored_enc.encode_images(images), new_enc.encode_images(images)
    old_texts, new_texts = stored_enc.encode_texts(texts), new_enc.encode_texts(texts)
    serving_q = ({"text": old_texts, "image": old_images} if stored_enc is old_enc else
                 {"text": old_enc.encode_texts(texts), "image": old_enc.encode_images(images)})
    owners = np.asarray(validation.captions(language)[1], np.int64)
    units = {"t2i": owners, "i2t": np.arange(len(validation))}  # an image with its captions
    emb = Embedded(item_old={"image": old_images, "text": old_texts},
                   item_new={"image": new_images, "text": new_texts},
                   query_old=serving_q,
                   query_new={"text": new_texts, "image": new_images},
                   relevant={"t2i": rel, "i2t": rel.T}, units=units)
    validation_s = time.perf_counter() - t0
    old_hits = emb.hits(emb.query_old, emb.item_old)
    new_hits = emb.hits(emb.query_new, emb.item_new)
    scorer = Scorer(old_hits, new_hits, objective, seed=seed, units=units)
    # the migrations are simulated on the validation set as a gallery of whole items (each
    # image with its first caption, re-embedded together), as a migration simulates its own
    # curve and switch (``service.jobkinds.migrate.transform.validation_curve``); the
    # same queries and the same bootstrap draws of them, so options stay paired
    captioned = validation.stored_captions(language)  # item -> its stored caption
    first = np.asarray(list(captioned.values()), np.int64)
    whole = Embedded(item_old={"image": old_images, "text": old_texts[first]},
                     item_new={"image": new_images, "text": new_texts[first]},
                     query_old=emb.query_old, query_new=emb.query_new,
                     relevant={"t2i": rel, "i2t": rel[first].T}, units=units)
    whole_scorer = scorer.rebased(whole.hits(whole.query_old, whole.item_old),
                                  whole.hits(whole.query_new, whole.item_new))

    stage("fit the adapters")
    routes = fit_routes(sample_old, sample_new, seed)
    stage("time the queries")
    old_ms = query_ms(old_enc, texts, images)
    native_ms = query_ms(new_enc, texts, images)
    # SLERP mixes the route's query with OLD's own query in ``space``, as the adapter job
    # builds it (with the gallery's active version): only a version native to ``space``
    # has one. Served through a route, the gallery has no native OLD query to mix (the
    # serving route's query is not one): no "+slerp" option, the reason in its note.
    slerp_old = old_enc if old.space == space else None
    options = [_route_option(r, emb, costs, sample_s, seed,
                             Encoder(model, tokenizer, device, text_head=r.maps["text"],
                                     image_head=r.maps["image"]),
                             slerp_old, old_ms, texts, images, old, space) for r in routes]
    routed_of = {r.name: r.queries(whole) for r in routes  # what each route serves
                 if not r.slerp_t or slerp_old is not None}
    options += _xbt_options(xbt, emb, space, costs, old_ms, texts, images, device, spec,
                            routed_of)

    measured = [o for o in options if o.kind == "route" and o.measured and o.hits is not None]
    # the route that serves until a migration switches: the best measured one (by the
    # lower direction's R@1, which needs no gain to be defined)
    serving = max(measured, key=lambda o: min(float(h.mean()) for h in o.hits.values()))  # type: ignore[union-attr]
    stage("fit the transform and simulate the migrations")
    ids = [r.id for r in validation.records]
    names = {"image": ids, "text": [ids[o] for o in captioned]}  # an item without a
    # caption in this language: the kinds differ, and each is ordered alone
    ts = transform_migrations(whole, sample_old, sample_new, names,
                              routed_of[serving.name], seed, max_negative_flip)
    fitted, fit_s, migs = ts.fitted, ts.fit_seconds, ts.migrations
    before = ts.routed  # what serves while a migration's transform is fitted and mapped
    map_s = ts.map_seconds / max(1, ts.mapped_items) * gallery_items * len(fitted.kinds)
    dims = {k: v.shape[1] for k, v in emb.item_new.items()}
    side_bytes = gallery_items * sum(4 * d for d in dims.values())
    after_ms = {k: max(native_ms[k], old_ms[k] + (serving.added_latency_ms or {}).get(k, 0.0))
                for k in native_ms}
    for name, (served, switch, side) in migs.items():
        overhead = 0.0 if name == "migrate" else costs.fraction(fit_s + map_s)
        options.append(Option(
            name, "migration",
            (f"re-embed every item; {serving.name} serves until the switch at the end"
             if name == "migrate" else
             f"transform the stored vectors, backfill in {name.split('+')[-1]} order, "
             f"switch when the side beats {serving.name}"),
            compute_seconds=costs.backfill_seconds * (1 + overhead),
            compute_fraction=1.0 + overhead, hits=whole_scorer.new, scorer=whole_scorer,
            added_latency_ms=_minus(after_ms, old_ms),
            storage={"gallery_bytes": side_bytes, "model_bytes": 0},
            apply={"kind": "migrate", "route": serving.name,
                   "params": ({"transform": False} if name == "migrate" else
                              {"transform": True, "order": name.split("+")[-1],
                               "switch": "progressive", "sample": k_items, "seed": seed})},
            served=served, switch_at=switch, side=side, overhead_fraction=overhead,
            before=before))
    stage("simulate rerank on read")
    options += rerank_options(whole, routed_of[serving.name], whole_scorer, costs, new_enc,
                              texts, images, _minus(after_ms, old_ms), serving.name,
                              side_bytes)
    plan = make_plan(options, scorer, costs, constraints, old_hits, new_hits)
    plan.update({
        "sample": {"items": k_items, "pairs": {k: len(v) for k, v in sample_new.items()},
                   "seconds": round(sample_s, 3)},
        "validation": {"items": len(validation), "queries": {"t2i": len(texts),
                                                             "i2t": len(validation)},
                       "routes_against": {"t2i": "every image", "i2t": "every caption"},
                       "migrations_against": {"t2i": "every image", "i2t": "each image's "
                                              "first caption (whole items)"}},
        "query_ms": {"old": old_ms, "new": native_ms},
        "transform": {"method": fitted.config.method, "fit_seconds": round(fit_s, 3),
                      "map_seconds_estimate": round(map_s, 3), "metrics": fitted.metrics},
        "seconds": {"sample": round(sample_s, 3), "validation": round(validation_s, 3),
                    "adapters": round(sum({r.method: r.fit_seconds for r in routes}.values()), 3),
                    "transform": round(fit_s, 3),
                    "total": round(time.perf_counter() - started, 3)},
        "grid": list(GRID)})
    return plan


def rerank_options(whole: Embedded, routed: Mapping[str, np.ndarray], scorer: Scorer,
                   costs: Costs, new_enc: Encoder, texts: Sequence[str], images: Sequence[Any],
                   after_ms: dict[str, float], route: str, side_bytes: int) -> list[Option]:
    """``rerank@k`` for k in ``KS``: a migration (every item re-embedded, the switch at the
    end) whose searches are served meanwhile by the route's top k ranked by NEW
    (``training.upgrades.rerank``), the same from the first query. Its added latency per
    query: the migration's query (``after_ms``) plus NEW embedding k candidates at batch k
    (a cold search: images for a text query, captions for an image query); a warm search
    reads them instead (``bench rerank`` measures both through the gateway). Its compute
    is the backfill's: the items a read embeds are written and the backfill skips them."""
    from training.upgrades.rerank import DIRECTIONS, KS, candidates, reranked_hits
    from training.upgrades.transform.simulate import falls_below

    out = []
    for k in KS:
        hits = {d: reranked_hits(candidates(routed[qk], whole.item_old[ik], k),
                                 whole.query_new[qk], whole.item_new[ik], whole.relevant[d])
                for d, (qk, ik) in DIRECTIONS.items()}
        # its end: the native side alone (what a switch serves) against both sides kept
        # with this ranking (phase kept); below beyond the error -> the switch waits
        below = falls_below({"native": scorer.new, "kept": hits}, "native", "kept",
                            list(DIRECTIONS), whole.units)
        cold = {"text": _batch_ms(new_enc.encode_images, images, k),  # a text query's
                "image": _batch_ms(new_enc.encode_texts, texts, k)}   # candidates
        served = {f: hits for f in GRID if f < 1}
        served[1.0] = scorer.new
        out.append(Option(
            f"rerank@{k}", "migration",
            f"re-embed every item; meanwhile each search is {route}'s top {k} ranked by the "
            f"new model (their vectors embedded on the read and kept); switch at the end",
            compute_seconds=costs.backfill_seconds, compute_fraction=1.0, hits=scorer.new,
            scorer=scorer, added_latency_ms={q: after_ms[q] + cold[q] for q in after_ms},
            storage={"gallery_bytes": side_bytes, "model_bytes": 0},
            apply={"kind": "migrate", "route": route,
                   "params": {"transform": False, "serving": "rerank", "rerank_k": k}},
            served=served, switch_at=1.0, kept=hits, native_below_kept=bool(below),
            note=(f"a cold search embeds up to {k} candidates: text query +{cold['text']:.1f} "
                  f"ms, image query +{cold['image']:.1f} ms on this host; a warm one reads "
                  f"them (bench rerank); compute per cold search {k} item embeddings, "
                  f"{k * costs.item_seconds * 1e3:.1f} ms of NEW at the backfill's rate")))
    return out


def _batch_ms(encode: Callable[[list[Any]], Any], inputs: Sequence[Any], k: int,
              repeats: int = 3) -> float:
    """Median ms of NEW embedding ``k`` inputs (cycled when fewer) at batch ``k``."""
    batch = [inputs[n % len(inputs)] for n in range(k)]
    encode(batch[:1])
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        encode(batch)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


@dataclass
class TransformSide:
    """The gallery-side transform fitted on the sample and the progressive migrations it
    makes, simulated on the measured items (``migration_options``)."""

    fitted: Any
    fit_seconds: float
    map_seconds: float  # mapping the measured items and predicting their errors
    mapped_items: int
    migrations: dict[str, Any]

    @property
    def routed(self) -> dict[str, np.ndarray]:
        """The route's hits on the measured items: what serves before any migration
        switches (today's migration serves it until its end)."""
        served = self.migrations["migrate"][0]
        return served[min(served)]


def transform_migrations(emb: Embedded, sample_old: Mapping[str, np.ndarray],
                         sample_new: Mapping[str, np.ndarray],
                         names: Mapping[str, Sequence[str]], routed: Mapping[str, np.ndarray],
                         seed: int, max_negative_flip: float | None,
                         first: Sequence[int] | np.ndarray = (), grid: Sequence[float] = GRID,
                         ) -> TransformSide:
    """Fit the transform OLD -> NEW on the sample's pairs, map the measured items' stored
    vectors, order the backfill by their predicted errors (``backfill_orders``: ``names``
    per kind; ``first``: rows re-embedded before any order) and simulate today's migration
    and a progressive one per order, ``routed`` serving until the switch."""
    from training.upgrades.transform import TransformConfig, fit_transform

    t0 = time.perf_counter()
    fitted = fit_transform(sample_old, sample_new, TransformConfig(seed=seed))
    fit_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    transformed = {k: fitted.apply(k, emb.item_old[k]) for k in fitted.kinds}
    scores = {k: fitted.predicted_error(k, emb.item_old[k], transformed[k])
              for k in fitted.kinds}
    map_s = time.perf_counter() - t0
    mapped = sum(len(v) for v in transformed.values())
    for k in emb.item_new:
        transformed.setdefault(k, np.zeros_like(emb.item_new[k]))
        scores.setdefault(k, np.zeros(len(emb.item_new[k])))
    orders = backfill_orders(names, scores, seed, first)
    migs = migration_options(emb, routed, transformed, orders, max_negative_flip, grid)
    return TransformSide(fitted, fit_s, map_s, mapped, migs)


def _route_option(r: RouteFit, emb: Embedded, costs: Costs, sample_s: float, seed: int,
                  encoder: Encoder, slerp_old: Encoder | None, old_ms: dict[str, float],
                  texts: Sequence[str], images: Sequence[Any], old: Artifact,
                  space: str) -> Option:
    """A fitted adapter route measured: ``encoder`` is the new model with its maps (what
    the route serves), mixed with ``slerp_old`` (OLD native to ``space``) for a SLERP
    route; without it a SLERP route is listed, not measured, not applicable."""
    label = f"{r.method} adapter{' + SLERP with the old query' if r.slerp_t else ''}"
    seconds = sample_s + r.fit_seconds
    base = {"name": r.name, "kind": "route", "label": label, "compute_seconds": seconds,
            "compute_fraction": costs.fraction(seconds)}
    if r.slerp_t and slerp_old is None:
        return Option(**base, measured=False, note=(
            f"SLERP mixes the new model's routed query with the old model's own query in "
            f"space '{space}', and the gallery is served by '{old.version_id}' through a "
            f"route (its native space is '{old.space}'): there is no native old query to "
            f"mix"))
    served: Encoder | SlerpEncoder = encoder
    if r.slerp_t and slerp_old is not None:
        served = SlerpEncoder(encoder, slerp_old, r.slerp_t)
    mods = list(r.maps.values()) + ([slerp_old.model] if r.slerp_t and slerp_old else [])
    return Option(**base, hits=emb.hits(r.queries(emb), emb.item_old),
                  added_latency_ms=_minus(query_ms(served, texts, images), old_ms),
                  storage={"gallery_bytes": 0, "model_bytes": _bytes(mods)},
                  apply={"kind": "adapter", "config": r.config(seed)})


def _xbt_options(versions: Sequence[Artifact], emb: Embedded, space: str, costs: Costs,
                 old_ms: dict[str, float], texts: Sequence[str], images: Sequence[Any],
                 device: str | None, spec: ModelSpec,
                 routed_of: dict[str, Mapping[str, np.ndarray]]) -> list[Option]:
    """A trained XBT version of the candidate: measured like a route (its routed queries
    go into ``routed_of``: it may be the route that serves during a migration); none:
    its cost estimated from XBT's default steps at NEW's measured rate."""
    from training.upgrades.xbt.config import XbtConfig
    from training.versions import load_encoder

    out = []
    for art in versions:
        enc = load_encoder(art, space, device)
        routed = {"text": enc.encode_texts(texts), "image": enc.encode_images(images)}
        routed_of[f"xbt:{art.version_id}"] = routed
        metrics = art.manifest.get("metrics") or {}
        seconds = float(sum(v.get("seconds", 0.0) for v in metrics.values()
                            if isinstance(v, dict)))
        out.append(Option(
            f"xbt:{art.version_id}", "route",
            f"{art.manifest.get('method', 'xbt')} version {art.version_id} (trained)",
            compute_seconds=seconds, compute_fraction=costs.fraction(seconds),
            hits=emb.hits(routed, emb.item_old),
            added_latency_ms=_minus(query_ms(enc, texts, images), old_ms),
            storage={"gallery_bytes": 0, "model_bytes": 0},
            apply={"kind": "evaluate", "version": art.version_id},
            note="training seconds from its manifest"))
    if not out:
        cfg = XbtConfig()
        text_s = costs.item_seconds / 2  # an item is an image and a caption
        seconds = (cfg.pretrain_steps * cfg.pretrain_batch_size * text_s
                   + XBT_TRAIN_FACTOR * cfg.steps * cfg.batch_size * costs.item_seconds)
        out.append(Option(
            "xbt", "route", "XBT (text-only projector, then LoRA and soft prompts)",
            compute_seconds=seconds, compute_fraction=costs.fraction(seconds), measured=False,
            note=(f"no trained XBT version of {spec.describe()} is registered: estimated "
                  f"cost (stage 1: {cfg.pretrain_steps} x {cfg.pretrain_batch_size} captions "
                  f"at NEW's text rate; stage 2: {cfg.steps} x {cfg.batch_size} pairs at "
                  f"{XBT_TRAIN_FACTOR:g}x NEW's rate); run an xbt job to measure it")))
    return out
