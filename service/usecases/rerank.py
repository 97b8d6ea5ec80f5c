"""Rerank on read (DESIGN.md step 8): while a gallery migrates, a search can be answered
by the new model's ranking of the route's candidates.

1. The serving route's top ``k`` candidates (what the search would answer today).
2. Each candidate's NEW vector: read from the new side where it holds one that NEW
   embedded from the item as it is now (same etag as the source side; a transformed
   vector does not count), else embedded now by NEW from the item's kept source (every
   kind the item has, through the gateway's dynamic batching and the image decode
   budget) and written to the new side (the read-through fill, ``FILL``).
3. The ``k`` ranked by NEW's score of NEW's own query (with ``rerank_score: fused``, plus
   the route's score of the candidate), under one rule for every candidate
   without a NEW vector (its source cannot be read, it was deleted meanwhile, or its
   embedding did not finish within ``rerank_budget_ms``, or it was past the search's
   embedding limit, ``rerank_embed_max_per_request``): **it keeps its place in the
   route's order**, and the candidates NEW scored fill the other places in NEW's order.
   No candidate is ever dropped, and past the budget the answer is the route's order
   with the finished ones reranked among themselves.

An item is embedded at most once at a time in a process (single flight, keyed by the new
side and the item): a second search that needs it waits for the first one's embedding.
A search starts at most ``rerank_embed_max_per_request`` embeddings (its best-placed
candidates the new side lacks; joining a running one is free): the others are not
queued (a later search may embed them), and ``nobackfill_rerank_embeds_refused`` counts
them, so one search cannot queue more work than that however large its ``k``.
The candidates a search must embed go together (``_fill``): their sources read (each
directory resolved once), decoded and preprocessed as one stack (``Embedder.pixels_many``)
on one thread, or on a thread per core once they hold more than ``SPLIT_PIXELS`` pixels
or ``SPLIT_BYTES`` bytes (photographs far larger than the model's input; each thread then
reads its own as it goes, so a group never holds every file at once), then submitted as
one group: the dynamic batcher makes one batch of them (not one per arrival) and starts
it without waiting for company. A search
uses a vector as soon as it is embedded; its write follows. An embedding that
outlives its search's budget still finishes and is written, so the next search reads it.
The fills that finish together are written as one batch (``_written``: one lock, one
upsert) through the gallery's one writer with the backfill's etag rule (only if the
source still has the etag that was read: a deleted or rewritten item never comes back
with a stale vector) and never over a vector NEW already embedded; each point it writes
says so (``made.via: "read"``), and the migration job's record of filled items
(``FilledByReads``) gets its id, so the backfill skips it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from PIL import Image

from service.jobkinds.migrate.record import folder as migration_folder
from service.runtime.embedder import Embedder
from service.runtime.gateway import Gateway
from service.state.errors import Conflict, InvalidInput, ServiceError
from service.state.gallery.store import KINDS, Hit, Stored
from service.state.jobs.shards import record_filled
from service.state.paths import Roots
from service.usecases.media import DecodeBudget, DecodePlan, plan_decode
from service.vectors.backfill import origin_of
from service.vectors.sources import SourceStore, origin_bytes
from service.vectors.writer import Batch, DirectWriter

log = logging.getLogger(__name__)
FILL = "fill"  # the writer's mode for a read-through fill
FILL_LINGER_S = 0.005  # a batched fill write waits this long for the fills finishing with it
# a search's candidate images are decoded on one thread up to this many pixels (decoding
# and model-sized: 15 images of 64 px took 3.5 ms on one thread and 3.9 ms split over two
# on a 2-core host, the threads taking turns at the interpreter lock); past it, on a
# thread per core (15 photographs of 800 x 600 for a 224-px model: 75-79 ms on two
# threads, 133-135 ms on one)
SPLIT_PIXELS = 500_000
SPLIT_BYTES = 4 * 2**20  # nor more bytes than this read ahead on the one thread
Vectors = dict[str, np.ndarray]


@dataclass
class _Flight:
    """One item's embedding into the new side: ``embedded[kind]`` resolves with NEW's vector
    of that kind (None: its source cannot be read) as soon as it is made, the kind its
    search ranks by first; ``task`` then writes the item once it has every kind."""

    embedded: dict[str, asyncio.Future[np.ndarray | None]]
    task: asyncio.Task[None]
    # what the group's embedding spent, per stage (shared by the group's flights):
    # decode_ms (read, decode and preprocess the images), forward_ms (NEW's forwards)
    spent: dict[str, float] = field(default_factory=dict)

    def of(self, kind: str) -> asyncio.Future[np.ndarray | None]:
        """The future of ``kind`` (one resolved with None where the item lacks that kind)."""
        if kind not in self.embedded:
            none: asyncio.Future[np.ndarray | None] = asyncio.get_running_loop().create_future()
            none.set_result(None)
            return none
        return self.embedded[kind]


_INFLIGHT: dict[tuple[str, str], _Flight] = {}
_PENDING: dict[str, list[tuple[Stored, Vectors, asyncio.Future[bool]]]] = {}


@dataclass
class Reranked:
    """What a reranked search did, as its answer reports it."""

    k: int
    read: int = 0  # NEW vectors read from the new side
    embedded: int = 0  # embedded now (by this search or one it waited on)
    kept: list[str] = field(default_factory=list)  # kept their route place: no NEW vector
    budget_ms: float = 0.0
    over_budget: int = 0  # of ``kept``: still embedding when the budget ran out
    embeds_refused: int = 0  # of ``kept``: not embedded, past the search's embedding limit
    # where the search's time went (ms): query (its embeddings), candidates (the route's
    # search), read (the new side's vectors), wait (for the embeddings it needed), and of
    # the embeddings it waited on: decode (images read, decoded, preprocessed), forward
    stages_ms: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"k": self.k, "read": self.read, "embedded": self.embedded,
                "kept_route_place": self.kept, "over_budget": self.over_budget,
                "embeds_refused": self.embeds_refused, "budget_ms": self.budget_ms,
                "stages_ms": {k: round(v, 3) for k, v in self.stages_ms.items()}}


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
        _read, gateway, serving.collection, other.collection, candidates, kind)
    report.stages_ms["read"] = (time.perf_counter() - started) * 1e3
    new = {item: vectors[item][kind] for item in ids if kind in vectors.get(item, {})}
    report.read = len(new)
    flights, report.embeds_refused = _flights(
        gateway, serving, other, kind,
        [source[item] for item in ids if item not in new and item in source],
        gateway.settings.rerank_embed_max_per_request)
    if report.embeds_refused:
        gateway.metrics.rerank_embeds_refused.inc(report.embeds_refused)
    if flights:
        waited = time.perf_counter()
        left = max(0.0, budget / 1e3 - (waited - started))
        wanted = {item: flight.of(kind) for item, flight in flights.items()}
        done, _ = await asyncio.wait(set(wanted.values()), timeout=left)
        report.stages_ms["wait"] = (time.perf_counter() - waited) * 1e3
        for stage in ("decode", "forward"):  # the slowest group it waited on
            report.stages_ms[stage] = max(f.spent.get(f"{stage}_ms", 0.0)
                                          for f in flights.values())
        for item, got in wanted.items():
            if got in done and got.exception() is None and got.result() is not None:
                new[item] = got.result()  # type: ignore[assignment]
                report.embedded += 1
            elif got not in done:
                report.over_budget += 1
    report.kept = [i for i in ids if i not in new]
    scores = {i: float(v @ query_new) for i, v in new.items()}
    if gateway.settings.rerank_score == "fused":  # plus the route's own cosine
        route = {h.id: h.score for h in candidates}
        scores = {i: s + route[i] for i, s in scores.items()}
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


def _read(gateway: Gateway, source: str, target: str, candidates: list[Hit], kind: str,
          ) -> tuple[dict[str, Stored], dict[str, dict[str, np.ndarray]]]:
    """The candidates on the source side (etags, origins: as the search read them, a read
    of that side only for a hit without its record), and the new ``kind`` vectors of those
    the new side holds current (one read, of that kind's vectors only)."""
    ids = [h.id for h in candidates]
    stored_source = {h.id: h.stored for h in candidates if h.stored is not None}
    if len(stored_source) < len(ids):
        stored_source.update(gateway.store.stored(
            source, [i for i in ids if i not in stored_source]))
    on_target = gateway.store.stored_vectors(target, ids, (kind,))
    return stored_source, {i: vectors for i, (stored, vectors) in on_target.items()
                           if _current(stored_source.get(i), stored)}


def _current(source: Stored | None, target: Stored | None) -> bool:
    """The new side holds NEW's own embedding of the item as the source has it now."""
    return (source is not None and target is not None and target.etag == source.etag
            and (target.made or {}).get("by", "embed") == "embed")


def _flights(gateway: Gateway, serving: Any, other: Any, kind: str, items: list[Stored],
             most: int) -> tuple[dict[str, _Flight], int]:
    """Each item's one embedding into the new side in this process (single flight): a
    running one is joined; the others start together, as one group (``_fill``), ``kind``
    (what the search ranks by) first, at most ``most`` of them (the first of ``items``,
    the route's best placed): the rest get no flight. A flight ends once what it
    embedded is written. Returns the flights and how many items got none (refused)."""
    flights: dict[str, _Flight] = {}
    group: list[Stored] = []
    refused = 0
    for stored in items:
        running = _INFLIGHT.get((other.collection, stored.id))
        if running is not None and not running.task.done():
            flights[stored.id] = running
        elif len(group) < most:
            group.append(stored)
        else:
            refused += 1
    if not group:
        return flights, refused
    loop = asyncio.get_running_loop()
    embedded: dict[str, dict[str, asyncio.Future[np.ndarray | None]]] = {
        s.id: {k: loop.create_future() for k in KINDS if k in s.kinds} for s in group}
    order = (kind, *(k for k in KINDS if k != kind))
    spent: dict[str, float] = {}
    task = loop.create_task(_fill(gateway, serving, other, group, embedded, order, spent))
    for s in group:
        key = (other.collection, s.id)
        flight = _INFLIGHT[key] = flights[s.id] = _Flight(embedded[s.id], task, spent)
        task.add_done_callback(functools.partial(_forget, key, flight))
    return flights, refused


def _forget(key: tuple[str, str], flight: _Flight, _task: Any = None) -> None:
    if _INFLIGHT.get(key) is flight:
        del _INFLIGHT[key]
    for future in flight.embedded.values():
        if not future.done():  # the task failed before it embedded: nothing to use
            future.set_result(None)
    if not flight.task.cancelled() and flight.task.exception() is not None:
        exc = flight.task.exception()
        log.warning("read-through fill of %s failed: %s", key[1], exc, exc_info=exc)


async def _fill(gateway: Gateway, serving: Any, other: Any, group: list[Stored],
                embedded: dict[str, dict[str, asyncio.Future[np.ndarray | None]]],
                order: tuple[str, ...], spent: dict[str, float]) -> None:
    """NEW's vectors of every kind each item of ``group`` has, from its kept sources, one
    kind at a time in ``order`` (``embedded[id][kind]`` gets each as soon as it is made, or
    None when its source cannot be read); then the items with every kind are written to
    the new side (etag rule, never over NEW's own vector) and recorded in the migration
    migration's ``FilledByReads`` (its backfill skips them)."""
    origins = {s.id: origin_of(s.kinds, s.origin, s.payload) for s in group}
    made: dict[str, Vectors] = {s.id: {} for s in group}
    for kind in order:
        needs = [s.id for s in group if kind in embedded[s.id]]
        found = await _embedded(gateway, other.embedder, kind,
                                {i: origins[i].get(kind) for i in needs},
                                spent if kind == order[0] else {})
        for item in needs:
            vector = found.get(item)
            embedded[item][kind].set_result(vector)
            if vector is not None:
                made[item][kind] = vector
    await asyncio.gather(*(_written(gateway, serving, other, s, made[s.id]) for s in group
                           if made[s.id] and len(made[s.id]) == len(embedded[s.id])))


async def _embedded(gateway: Gateway, embedder: Embedder, kind: str,
                    sources: dict[str, Any], spent: dict[str, float]) -> dict[str, np.ndarray]:
    """NEW's ``kind`` vector of each item whose source (an image's location, a caption)
    can be read and embedded; every forward submitted in one turn: one batch. ``spent``
    gets the time of each stage (decode_ms, forward_ms)."""
    items = [i for i, source in sources.items() if source]
    started = time.perf_counter()
    if kind == "image":
        pixels = await _pixels(gateway, embedder, [str(sources[i]) for i in items])
        ready: list[tuple[str, Any]] = [(i, p) for i, p in zip(items, pixels) if p is not None]
        embed = embedder.embed_pixels_group
    else:
        ready = [(i, str(sources[i])) for i in items]
        embed = embedder.embed_text_group  # type: ignore[assignment]
    spent["decode_ms"] = (time.perf_counter() - started) * 1e3
    if not ready:
        return {}
    try:
        found = await embed([x for _, x in ready])
    except (OSError, ValueError, InvalidInput):  # the group's forward failed: none of
        return {}  # its items has a vector, each keeps its route place
    finally:
        spent["forward_ms"] = (time.perf_counter() - started) * 1e3 - spent["decode_ms"]
    return {i: np.asarray(v, np.float32) for (i, _), v in zip(ready, found, strict=True)}


async def _written(gateway: Gateway, serving: Any, other: Any, stored: Stored,
                   vectors: Vectors) -> bool:
    """Write one fill with the others finishing within ``FILL_LINGER_S`` (one batch, its
    written ids recorded once for the backfill); True when it was written (False: deleted
    or rewritten since it was read, or NEW's own vector is there already)."""
    loop = asyncio.get_running_loop()
    written: asyncio.Future[bool] = loop.create_future()
    pending = _PENDING.setdefault(other.collection, [])
    pending.append((stored, vectors, written))
    if len(pending) == 1:  # the first of a batch flushes it
        await asyncio.sleep(FILL_LINGER_S)
        batch = _PENDING.pop(other.collection, [])
        try:
            ids = await asyncio.to_thread(_write_fills, gateway, serving, other, batch)
        except Exception as exc:  # noqa: BLE001 - every fill of the batch learns it
            for *_, f in batch:
                f.set_exception(exc)
        else:
            for s, _, f in batch:
                f.set_result(s.id in ids)
    return await written


def _write_fills(gateway: Gateway, serving: Any, other: Any,
                 batch: list[tuple[Stored, Vectors, asyncio.Future[bool]]]) -> set[str]:
    embedder: Embedder = other.embedder
    writer = DirectWriter.registered(gateway.store, gateway.settings, gateway.registry,
                                     serving.gallery)
    made = {"by": "embed", "version": embedder.version, "via": "read"}
    applied = writer.write(Batch(FILL, embedder.version,
                                 [{"id": s.id, "etag": s.etag} for s, _, _ in batch],
                                 {other.space: [v for _, v, _ in batch]}, made=made))
    if applied.ids and serving.migration_job:  # the backfill skips them
        record_filled(migration_folder(gateway.jobs, serving.migration_job), list(applied.ids))
    return set(applied.ids)


async def _pixels(gateway: Gateway, embedder: Embedder, uris: list[str],
                  ) -> list[torch.Tensor | None]:
    """The model inputs of ``uris`` (None where one cannot be read or decoded) under the
    process's decode budget: read and decoded on one thread while they hold at most
    ``SPLIT_PIXELS`` pixels and ``SPLIT_BYTES`` bytes (images near the model's size);
    past that, decoded on a thread per core, each reading its own as it goes."""
    if not uris:
        return []
    reader, items, pixels = await asyncio.to_thread(_read_ahead, gateway, embedder, uris)
    if pixels is not None:
        return pixels
    parts = max(1, min(len(items), os.cpu_count() or 1))
    done = await asyncio.gather(*(asyncio.to_thread(_decoded, reader, embedder,
                                                    items[n::parts])
                                  for n in range(parts)))
    out: list[torch.Tensor | None] = [None] * len(items)
    for n, chunk in enumerate(done):
        out[n::parts] = chunk
    return out


@dataclass
class _Reader:
    """Reads a group's sources and checks their headers (``plan_decode``): the settings,
    stores, roots and decode budget looked up once, each directory resolved once
    (``Roots.read``); shared by the threads that decode the group."""

    settings: Any
    side: int
    sources: SourceStore
    roots: Roots
    budget: DecodeBudget
    dirs: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, gateway: Gateway, embedder: Embedder) -> _Reader:
        settings = gateway.settings
        return cls(settings, embedder.image_side, SourceStore.of(settings),
                   Roots.of(settings), DecodeBudget.of(settings))

    def plan(self, uri: str) -> tuple[DecodePlan | None, int]:
        """The decode plan of ``uri`` (None: unreadable, not an image, too large) and the
        bytes it holds."""
        try:
            data = origin_bytes(uri, self.sources, self.roots, self.dirs)
            return plan_decode(data, self.settings.max_image_pixels,
                               self.settings.max_image_bytes, self.side), len(data)
        except (OSError, ValueError, ServiceError):
            return None, 0


def _read_ahead(gateway: Gateway, embedder: Embedder, uris: list[str],
                ) -> tuple[_Reader, list[DecodePlan | str | None],
                           list[torch.Tensor | None] | None]:
    """``uris`` read and planned in order until they hold more than ``SPLIT_PIXELS`` pixels
    or ``SPLIT_BYTES`` bytes: then (the reader, the plans so far and the uris not read
    yet, None) for the caller to split; else (the reader, the plans, their model
    inputs), decoded on this thread."""
    reader = _Reader.of(gateway, embedder)
    items: list[DecodePlan | str | None] = []
    held = size = 0
    for n, uri in enumerate(uris):
        plan, read = reader.plan(uri)
        items.append(plan)
        held, size = held + (plan.cost if plan is not None else 0), size + read
        if held > SPLIT_PIXELS or size > SPLIT_BYTES:
            return reader, [*items, *uris[n + 1:]], None
    return reader, items, _decoded(reader, embedder, items)


def _decoded(reader: _Reader, embedder: Embedder, items: list[DecodePlan | str | None],
             ) -> list[torch.Tensor | None]:
    """The model input of each item (a plan, or a uri read and planned just before it is
    decoded) under the process's decode budget; None for one that cannot be read or
    decoded or finds no room in the budget in time."""
    readable: list[bool] = []

    def decoded() -> Iterator[Image.Image]:
        for item in items:
            plan = reader.plan(item)[0] if isinstance(item, str) else item
            if plan is None:  # unreadable: the candidate keeps its place
                readable.append(False)
                continue
            try:
                image = plan.run_under(reader.budget)
            except (OSError, ValueError, ServiceError):  # undecodable, or no room in the
                readable.append(False)  # budget: the candidate keeps its place
                continue
            readable.append(True)
            yield image

    pixels = iter(embedder.pixels_many(decoded()))
    return [next(pixels) if ok else None for ok in readable]
