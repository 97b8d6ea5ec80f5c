"""Rerank on read (DESIGN.md step 8): while a gallery migrates, a search can be answered
by the new model's ranking of the route's candidates.

1. The serving route's top ``k`` candidates (what the search would answer today).
2. Each candidate's NEW vector: read from the new side where it holds one that NEW
   embedded from the item as it is now (same etag as the source side; a transformed
   vector does not count), else embedded now by NEW from the item's kept source (every
   kind the item has, through the gateway's dynamic batching and the image decode
   budget) and written to the new side (the read-through fill, ``FILL``).
3. The ``k`` ranked by NEW's score of NEW's own query, under one rule for every candidate
   without a NEW vector (its source cannot be read, it was deleted meanwhile, or its
   embedding did not finish within ``rerank_budget_ms``): **it keeps its place in the
   route's order**, and the candidates NEW scored fill the other places in NEW's order.
   No candidate is ever dropped, and past the budget the answer is the route's order
   with the finished ones reranked among themselves.

An item is embedded at most once at a time in a process (single flight, keyed by the new
side and the item): a second search that needs it waits for the first one's embedding.
An embedding that outlives its search's budget still finishes and is written, so the
next search reads it. The fill is written through the gallery's one writer with the
backfill's etag rule (only if the source still has the etag that was read: a deleted or
rewritten item never comes back with a stale vector) and never over a vector NEW already
embedded; each point it writes says so (``made.via: "read"``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from service.runtime.embedder import Embedder
from service.runtime.gateway import Gateway
from service.state.errors import Conflict, InvalidInput
from service.state.gallery.store import KINDS, Hit, Stored
from service.state.jobs.shards import record_filled
from service.state.paths import Roots
from service.usecases.media import decode_image_async
from service.vectors.backfill import origin_of
from service.vectors.sources import CAS, SourceStore
from service.vectors.writer import Batch, DirectWriter

FILL = "fill"  # the writer's mode for a read-through fill
_INFLIGHT: dict[tuple[str, str], asyncio.Task[dict[str, np.ndarray] | None]] = {}


@dataclass
class Reranked:
    """What a reranked search did, as its answer reports it."""

    k: int
    read: int = 0  # NEW vectors read from the new side
    embedded: int = 0  # embedded now (by this search or one it waited on)
    kept: list[str] = field(default_factory=list)  # kept their route place: no NEW vector
    budget_ms: float = 0.0
    over_budget: int = 0  # of ``kept``: still embedding when the budget ran out

    def to_json(self) -> dict[str, Any]:
        return {"k": self.k, "read": self.read, "embedded": self.embedded,
                "kept_route_place": self.kept, "over_budget": self.over_budget,
                "budget_ms": self.budget_ms}


def rerank_side(serving: Any) -> Any:
    """The new side a rerank reads and fills: the other side of a migration whose new side
    does not serve yet; Conflict otherwise."""
    if serving.migration != "backfilling" or not serving.others:
        raise Conflict(f"gallery '{serving.gallery}' has no migration whose new side is "
                       f"still filling ({serving.migration or 'no migration'}): rerank "
                       f"needs one (after a switch the new model already serves)")
    return serving.others[0]


async def rerank(gateway: Gateway, serving: Any, candidates: list[Hit], query_new: np.ndarray,
                 kind: str, k: int) -> tuple[list[Hit], Reranked]:
    """``candidates`` (the route's, best first) ranked by NEW (module docstring)."""
    started = time.perf_counter()
    other = rerank_side(serving)
    budget = float(gateway.settings.rerank_budget_ms)
    report = Reranked(k, budget_ms=budget)
    ids = [h.id for h in candidates]
    source, vectors = await asyncio.to_thread(
        _read, gateway, serving.collection, other.collection, ids)
    new = {item: vectors[item][kind] for item in ids if kind in vectors.get(item, {})}
    report.read = len(new)
    flights = {item: _flight(gateway, serving, other, source[item]) for item in ids
               if item not in new and item in source}
    if flights:
        left = max(0.0, budget / 1e3 - (time.perf_counter() - started))
        done, _ = await asyncio.wait(set(flights.values()), timeout=left)
        for item, task in flights.items():
            if task in done and task.exception() is None and kind in (task.result() or {}):
                new[item] = task.result()[kind]  # type: ignore[index]
                report.embedded += 1
            elif task not in done:
                report.over_budget += 1
    report.kept = [i for i in ids if i not in new]
    scores = {i: float(v @ query_new) for i, v in new.items()}
    return ranked(candidates, scores, other.embedder.version, other.space), report


def ranked(candidates: list[Hit], scores: dict[str, float], version: str,
           space: str) -> list[Hit]:
    """The rule: a candidate without a NEW score keeps its place in the route's order; the
    others fill the remaining places by NEW's score, best first (their hits carry NEW's
    score, version and space)."""
    by_new = iter(sorted(scores, key=lambda i: -scores[i]))
    found = {h.id: h for h in candidates}
    out = []
    for hit in candidates:
        if hit.id not in scores:
            out.append(hit)
            continue
        item = next(by_new)
        out.append(Hit(item, scores[item], found[item].payload, version, space))
    return out


def _read(gateway: Gateway, source: str, target: str, ids: list[str],
          ) -> tuple[dict[str, Stored], dict[str, dict[str, np.ndarray]]]:
    """The candidates on the source side (etags, origins), and the new vectors of those
    the new side holds current."""
    stored_source = gateway.store.stored(source, ids)
    stored_target = gateway.store.stored(target, ids)
    have = [i for i in ids if _current(stored_source.get(i), stored_target.get(i))]
    return stored_source, gateway.store.vectors(target, have) if have else {}


def _current(source: Stored | None, target: Stored | None) -> bool:
    """The new side holds NEW's own embedding of the item as the source has it now."""
    return (source is not None and target is not None and target.etag == source.etag
            and (target.made or {}).get("by", "embed") == "embed")


def _flight(gateway: Gateway, serving: Any, other: Any, stored: Stored,
            ) -> asyncio.Task[dict[str, np.ndarray] | None]:
    """The one embedding of ``stored`` into the new side in this process (single flight):
    a running one is joined, else one is started; it ends by writing what it embedded."""
    key = (other.collection, stored.id)
    running = _INFLIGHT.get(key)
    if running is not None and not running.done():
        return running
    task = asyncio.get_running_loop().create_task(_fill(gateway, serving, other, stored))
    _INFLIGHT[key] = task
    task.add_done_callback(lambda t, key=key: _forget(key, t))
    return task


def _forget(key: tuple[str, str], task: asyncio.Task[Any]) -> None:
    if _INFLIGHT.get(key) is task:
        del _INFLIGHT[key]
    if not task.cancelled():
        task.exception()  # retrieved: an unreadable source is an answer, not a crash


async def _fill(gateway: Gateway, serving: Any, other: Any,
                stored: Stored) -> dict[str, np.ndarray] | None:
    """NEW's vectors of every kind the item has, from its kept source, written to the new
    side (etag rule, never over NEW's own vector) and recorded in the migration job's
    ``FilledByReads`` (its backfill skips the item); None when a source cannot be read."""
    embedder: Embedder = other.embedder
    origin = origin_of(stored.kinds, stored.origin, stored.payload)
    vectors: dict[str, np.ndarray] = {}
    for kind in (k for k in KINDS if k in stored.kinds):
        if not origin.get(kind):
            return None
        coroutine = (_embed_image(gateway, embedder, str(origin[kind])) if kind == "image"
                     else embedder.embed_text(str(origin[kind])))
        vector = await _readable(coroutine)
        if vector is None:
            return None
        vectors[kind] = np.asarray(vector, np.float32)
    if not vectors:
        return None
    writer = DirectWriter.registered(gateway.store, gateway.settings, gateway.registry,
                                     serving.gallery)
    made = {"by": "embed", "version": embedder.version, "via": "read"}
    batch = Batch(FILL, embedder.version, [{"id": stored.id, "etag": stored.etag}],
                  {other.space: [vectors]}, made=made)
    applied = await asyncio.to_thread(writer.write, batch)
    if applied.written and serving.migration_job:
        await asyncio.to_thread(record_filled, gateway.jobs.work_dir(serving.migration_job),
                                [stored.id])
    return vectors


async def _readable(coroutine: Coroutine[Any, Any, np.ndarray]) -> np.ndarray | None:
    try:
        return await coroutine
    except (OSError, ValueError, InvalidInput):  # unreadable or undecodable: kept in place
        return None


async def _embed_image(gateway: Gateway, embedder: Embedder, uri: str) -> np.ndarray:
    data = await asyncio.to_thread(_source_bytes, gateway, uri)
    image = await decode_image_async(data, gateway.settings, embedder.image_side)
    pixels = await asyncio.to_thread(embedder.pixels, image)
    return await embedder.embed_pixels(pixels)


def _source_bytes(gateway: Gateway, uri: str) -> bytes:
    if uri.startswith(CAS):
        return SourceStore.of(gateway.settings).bytes_of(uri)
    return Roots.of(gateway.settings).file(uri, "image source").read_bytes()

