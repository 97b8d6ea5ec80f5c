"""Answer one query against one gallery, on the version that serves it when the query
arrives (captured once, so a swap mid-request cannot mix versions).

``hybrid`` (while a migration keeps two sides): the query is embedded into both sides'
spaces (NEW natively for the target side, through the route for the source side) and
each item is scored by both, ``score = cos(query, serving side) + cos(query', other
side)``, over the union of each side's ``HYBRID_POOL * top_k`` best (the score an item
lacks on one side is computed from its stored vector there). An item one side does not
hold yet (not re-embedded yet, without a transform) is scored there by what that side is
expected to give it: the least-squares line from the other side's score to this side's,
fitted on this query's candidates that both sides scored (slope 1 through the means with
fewer than three of them or no spread; the other side's score itself with none). So an
item ranks as if both sides held it, neither behind nor ahead of the re-embedded ones
(the side's lowest score would put every item not yet re-embedded behind re-embedded ones
of equal merit; the other side's score as it is would favour the side whose cosines run
higher). Two forwards (or one forward and a map, for an adapter route), two searches
and a vector read per query: ``bench frontier`` measures the gain, ``bench hybrid`` the
added latency.

How a search that names neither ``hybrid`` nor ``rerank`` is served follows the gallery's
migration: ``rerank`` when it is served by rerank on read, ``hybrid`` when the operator
kept both sides with that mode (phase ``kept``, ``service.jobkinds.migrate.keep``);
``rerank: false`` asks for the route's order in either case."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.runtime.embedder import Embedder
from service.runtime.gateway import Gateway
from service.state.config import Settings
from service.state.errors import Conflict, InvalidInput
from service.state.gallery.store import Hit, Where
from service.usecases.media import decode_image_async
from service.usecases.rerank import rerank, rerank_side


@dataclass(frozen=True)
class Query:
    text: str | None = None
    image: bytes | None = None
    kind: str = "image"  # which items to return
    top_k: int = 10
    where: Where | None = None  # payload filter
    hybrid: bool = False  # score by both sides of an open migration (module docstring)
    # rank the route's top candidates by the new model (service/usecases/rerank.py):
    # None: as the gallery's migration serves; False: the route's order; True: rerank
    rerank: bool | None = None
    rerank_k: int | None = None  # None: the migration's k, else the server's rerank_k
    # (grown to top_k, both bounded by the server's rerank_k_max: ``rerank_count``)


@dataclass(frozen=True)
class Answer:
    gallery: str
    version: str  # the version that embedded the query
    route: str
    space: str
    kind: str
    hits: list[Hit]
    reranked: dict[str, Any] | None = None  # what a rerank did (``Reranked.to_json``)


HYBRID_POOL = 4  # each side's candidates per hit asked for


async def search(gateway: Gateway, gallery: str, query: Query) -> Answer:
    check_query(query, gateway.settings.top_k_max, gateway.settings.rerank_k_max)
    serving = gateway.runtime.serving(gallery)
    embedder = serving.ready()  # 409 when the version has no route into the gallery's space
    if query.hybrid or (query.rerank is None and serving.fuses
                        and serving.migration == "backfilling"):
        if query.rerank:
            raise InvalidInput("give hybrid or rerank, not both")
        answer = await hybrid_search(gateway, serving, embedder, query)
    elif query.rerank or (query.rerank is None and serving.reranks
                          and serving.migration == "backfilling"):
        answer, candidates = await rerank_search(gateway, serving, embedder, query)
        count_candidates(gateway, gallery, candidates)
        return answer
    else:
        vector = await embed_query(embedder, query, gateway.settings)
        hits = await gateway.searches.search(serving.collection, vector, query.kind,
                                             query.top_k, query.where)
        answer = Answer(gallery, embedder.version, embedder.route, embedder.space, query.kind,
                        hits)
    count_candidates(gateway, gallery, answer.hits)
    return answer


def count_candidates(gateway: Gateway, gallery: str, hits: list[Hit]) -> None:
    """What users retrieve (``service.state.candidates``): the search's served
    candidates counted in memory; the counts are saved off the event loop when due."""
    counts = gateway.candidates
    counts.record(gallery, (h.id for h in hits))
    if counts.due():
        asyncio.get_running_loop().run_in_executor(None, counts.save)


def check_query(query: Query, top_k_max: int, rerank_k_max: int | None = None) -> None:
    if (query.text is None) == (query.image is None):
        raise InvalidInput("give exactly one of a text or an image query")
    if query.text is not None and not query.text.strip():
        raise InvalidInput("the query text is empty")
    if not 1 <= query.top_k <= top_k_max:
        raise InvalidInput(f"top_k must be between 1 and {top_k_max}, got {query.top_k}")
    if rerank_k_max is not None and query.rerank_k is not None \
            and not 1 <= query.rerank_k <= rerank_k_max:
        raise InvalidInput(f"rerank_k must be between 1 and rerank_k_max ({rerank_k_max}), "
                           f"got {query.rerank_k}")


async def embed_query(embedder: Embedder, query: Query, settings: Settings) -> np.ndarray:
    """[D] query embedding in the gallery's space."""
    if query.text is not None:
        return await embedder.embed_text(query.text)
    assert query.image is not None
    image = await decode_image_async(query.image, settings, embedder.image_side)
    pixels = await asyncio.to_thread(embedder.pixels, image)
    return await embedder.embed_pixels(pixels)


async def both_queries(gateway: Gateway, embedders: tuple[Embedder, Embedder],
                       query: Query) -> list[np.ndarray]:
    """The query embedded by each of two embedders (an image decoded once; one forward
    where the second is the first's own towers, ``Embedder.shares_towers``)."""
    image = None
    if query.image is not None:
        image = await decode_image_async(query.image, gateway.settings,
                                         embedders[0].image_side)
    if embedders[0].shares_towers(embedders[1]):
        if query.text is not None:
            return list(await embedders[0].embed_text_both(query.text))
        pixels = await asyncio.to_thread(embedders[0].pixels, image)
        return list(await embedders[0].embed_pixels_both(pixels))
    vectors = []
    for e in embedders:
        if query.text is not None:
            vectors.append(await e.embed_text(query.text))
        else:
            pixels = await asyncio.to_thread(e.pixels, image)
            vectors.append(await e.embed_pixels(pixels))
    return vectors


async def rerank_search(gateway: Gateway, serving: Any, embedder: Embedder,
                        query: Query) -> tuple[Answer, list[Hit]]:
    """The route's top ``k`` candidates (``rerank_count``) ranked by the new model
    (``rerank``), followed by the rest of the route's ``top_k`` in the route's order (where
    ``top_k`` is over ``k``); the answer's ``top_k`` best, and what the rerank read,
    embedded and left in place. Also the route's top ``k`` (the served candidates)."""
    other = rerank_side(serving)
    k = rerank_count(query, serving.rerank_k, gateway.settings)
    started = time.perf_counter()
    vectors = await both_queries(gateway, (embedder, other.embedder), query)
    embedded = time.perf_counter()
    candidates = await gateway.searches.search(serving.collection, vectors[0], query.kind,
                                               max(k, query.top_k), query.where)
    searched = time.perf_counter()
    hits, report = await rerank(gateway, serving, candidates[:k], vectors[1], query.kind, k)
    report.stages_ms.update(query=(embedded - started) * 1e3,
                            candidates=(searched - embedded) * 1e3)
    return Answer(serving.gallery, embedder.version, "rerank", serving.space, query.kind,
                  (hits + candidates[k:])[:query.top_k], report.to_json()), candidates[:k]


def rerank_count(query: Query, migration_k: int | None, settings: Settings) -> int:
    """How many of the route's candidates a search has the new model rank: the query's
    ``rerank_k`` (422 below its ``top_k``; over ``rerank_k_max``, ``check_query``), else
    the migration's or the server's ``rerank_k`` grown to ``top_k`` and cut to
    ``rerank_k_max``: a search that does not name its ``rerank_k`` is never refused for
    it (past ``rerank_k_max``, the rest of its ``top_k`` is the route's order)."""
    if query.rerank_k is not None:
        if query.rerank_k < query.top_k:
            raise InvalidInput(f"rerank_k ({query.rerank_k}) must be at least top_k "
                               f"({query.top_k})")
        return min(query.rerank_k, settings.rerank_k_max)
    k = migration_k or settings.rerank_k
    return min(max(k, query.top_k), settings.rerank_k_max)


async def hybrid_search(gateway: Gateway, serving: Any, embedder: Embedder,
                        query: Query) -> Answer:
    """Both sides of an open migration score every candidate (module docstring)."""
    if not serving.others:
        raise Conflict(f"gallery '{serving.gallery}' has no migration: hybrid scoring needs "
                       f"two sides")
    other = serving.others[0]
    vectors = await both_queries(gateway, (embedder, other.embedder), query)
    pool = min(query.top_k * HYBRID_POOL, max(query.top_k, gateway.settings.top_k_max))
    collections = (serving.collection, other.collection)
    found = [await gateway.searches.search(c, v, query.kind, pool, query.where)
             for c, v in zip(collections, vectors, strict=True)]
    hits = await asyncio.to_thread(_fuse, gateway, collections, vectors, found, query)
    return Answer(serving.gallery, embedder.version, "hybrid", serving.space, query.kind, hits)


def _fuse(gateway: Gateway, collections: tuple[str, str], vectors: list[np.ndarray],
          found: list[list[Hit]], query: Query) -> list[Hit]:
    """The union of both sides' candidates, each scored on both sides (a side that lacks
    the item: ``_imputed``), best first."""
    scores: list[dict[str, float]] = [{h.id: h.score for h in side} for side in found]
    ids = list(dict.fromkeys(h.id for side in found for h in side))
    for n, (collection, vector) in enumerate(zip(collections, vectors, strict=True)):
        lacking = [i for i in ids if i not in scores[n]]
        if lacking:
            stored = gateway.store.vectors(collection, lacking)
            for item, kinds in stored.items():
                if query.kind in kinds:
                    scores[n][item] = float(kinds[query.kind] @ vector)
    full = _imputed(scores)
    fused = {i: full[0][i] + full[1][i] for i in ids}
    best = sorted(ids, key=lambda i: -fused[i])[:query.top_k]
    found_by = _found_by(found)
    return [Hit(i, fused[i], found_by[i].payload, found_by[i].version, found_by[i].space)
            for i in best]


def _found_by(found: list[list[Hit]]) -> dict[str, Hit]:
    """Each item's hit as the first side that found it reports it: the serving side's
    version, space and payload wherever the serving side found the item."""
    first: dict[str, Hit] = {}
    for side in found:
        for hit in side:
            first.setdefault(hit.id, hit)
    return first


def _imputed(scores: list[dict[str, float]]) -> list[dict[str, float]]:
    """Both sides' scores of every candidate (item id -> score, one dict per side): where a
    side lacks an item, the score the side is expected to give it, read off the line
    fitted from the other side's scores to this side's over the items both scored."""
    both = [i for i in scores[0] if i in scores[1]]
    full = [dict(side) for side in scores]
    for n in (0, 1):
        present, side = scores[1 - n], scores[n]
        missing = [i for i in present if i not in side]
        if missing:
            slope, intercept = _line([present[i] for i in both], [side[i] for i in both])
            full[n].update({i: intercept + slope * present[i] for i in missing})
    return full


def _line(x: list[float], y: list[float]) -> tuple[float, float]:
    """(slope, intercept) of ``y ~ x`` by least squares; with fewer than three pairs or no
    spread in ``x``, slope 1 through the means; with no pair, ``y = x``."""
    if not x:
        return 1.0, 0.0
    xs, ys = np.asarray(x, np.float64), np.asarray(y, np.float64)
    if len(xs) < 3 or np.ptp(xs) < 1e-9:
        return 1.0, float(ys.mean() - xs.mean())
    slope, intercept = np.polyfit(xs, ys, 1)
    return float(slope), float(intercept)
