"""Gallery storage in Qdrant. A gallery is an alias (its name) onto a collection with two
named vectors, ``image`` and ``text``; an item is one point holding the vectors it has.
Every point's payload records the item id, the version that embedded it, the space, how
its vectors were made (``made``: embedded by that version, or transformed from another
version's vectors by a migration's map), the item's origin (what a re-embedding reads:
its text, where its image is) and an etag that changes with every write (a backfill
writes an item only if it is still the one it read).

A migrating gallery has a second collection (its other side, ``create_side``); every
method takes a collection name, and a gallery's name (its alias) works as one.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
import warnings
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from service.state.errors import Conflict, Unavailable
from service.state.gallery.client import tune_local_writes
from service.state.gallery.edge import HNSW, INDEXED
from service.state.gallery.ids import point_id

KINDS = ("image", "text")
Scalar = str | int | bool
Where = Mapping[str, Scalar | Sequence[Scalar]]


@dataclass(frozen=True)
class Item:
    """A gallery item ready to store: caller id, one vector per kind it has, caller payload."""

    id: str
    vectors: Mapping[str, np.ndarray]  # kind -> [D], L2-normalised
    payload: Mapping[str, Any] | None = None
    origin: Mapping[str, Any] | None = None  # {"text": str, "image": uri}: what was embedded
    etag: str | None = None  # None: a new one (a fresh write)
    # How the vectors were made: {"by": "embed", "version"} (default) or {"by":
    # "transform", "version", "map", "from_version"} (a migration's gallery-side transform)
    made: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Stored:
    """One stored item without its vectors: what a backfill reads and copies."""

    id: str
    etag: str | None
    origin: dict[str, Any]
    payload: dict[str, Any]
    kinds: tuple[str, ...]
    version: str | None = None  # the version that embedded it
    made: dict[str, Any] | None = None  # how its vectors were made (``Item.made``)


@dataclass(frozen=True)
class Search:
    """One nearest-neighbour query: ``top_k`` items of ``kind`` that match ``where``."""

    vector: np.ndarray  # [D], L2-normalised
    kind: str
    top_k: int
    where: Where | None = None


@dataclass(frozen=True)
class Hit:
    id: str
    score: float
    payload: dict[str, Any]
    version: str  # the version that embedded this item
    space: str
    # the item's record as the search read it (etag, origin, kinds): a rerank needs no
    # second read of the side it searched; None where a hit was made otherwise
    stored: Stored | None = field(default=None, compare=False, repr=False)


class GalleryStore:
    def __init__(self, client: QdrantClient, serialise: bool,
                 search_ef: int | None = None) -> None:
        self.client = client
        # every search's HNSW ef (None: the engine's), sent the same way to every backend
        self._search = None if search_ef is None else models.SearchParams(hnsw_ef=search_ef)
        # Local mode mutates plain numpy arrays without locks: one call at a time.
        self._lock: threading.Lock | None = threading.Lock() if serialise else None

    @contextmanager
    def _call(self, gallery: str | None = None) -> Iterator[None]:
        """Serialise local calls and turn backend failures into typed errors."""
        lock: AbstractContextManager[Any] = self._lock or nullcontext()
        try:
            with lock:
                yield
        except (ResponseHandlingException, ConnectionError) as exc:
            raise Unavailable(f"Qdrant is unreachable: {exc}") from exc
        except (UnexpectedResponse, ValueError) as exc:
            if gallery and _missing_collection(str(exc)):
                raise Unavailable(f"gallery '{gallery}' has no collection in Qdrant") from exc
            raise

    def ping(self) -> None:
        with self._call():
            self.client.get_collections()

    def create(self, gallery: str, dim: int) -> None:
        """Create the gallery's collection and alias; a no-op when it exists with ``dim``."""
        existing = self.dim(gallery)
        if existing is not None:
            if existing != dim:
                raise Conflict(f"gallery '{gallery}' already has {existing}-d vectors, not {dim}")
            return
        collection = self.create_side(gallery, dim)
        alias = models.CreateAliasOperation(
            create_alias=models.CreateAlias(collection_name=collection, alias_name=gallery))
        with self._call():
            self.client.update_collection_aliases(change_aliases_operations=[alias])

    def create_side(self, gallery: str, dim: int) -> str:
        """A new, empty collection for ``gallery`` (no alias: ``create`` adds one); its
        name. Made the same way on every backend: two named vectors, the store's HNSW
        parameters, and a keyword index on every key the store filters and counts on
        (``INDEXED``). Local mode keeps the index calls but searches without them (it says
        so in a warning, silenced here: exact search is all it does)."""
        collection = f"{gallery}-{uuid.uuid4().hex[:8]}"
        # Vectors are L2-normalised, so dot product is the cosine (without per-query renorm).
        params = models.VectorParams(size=dim, distance=models.Distance.DOT)
        with self._call():
            self.client.create_collection(
                collection, vectors_config=dict.fromkeys(KINDS, params),
                hnsw_config=models.HnswConfigDiff(m=HNSW[0], ef_construct=HNSW[1]))
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", "Payload indexes have no effect")
                for key in INDEXED:  # on disk: mapped, not rebuilt at every load
                    self.client.create_payload_index(
                        collection, field_name=key, field_schema=models.KeywordIndexParams(
                            type=models.KeywordIndexType.KEYWORD, on_disk=True))
        return collection

    def collection_of(self, gallery: str) -> str | None:
        """The collection behind the gallery's alias (None if it has none)."""
        with self._call():
            return self._aliases().get(gallery)

    def point_alias(self, gallery: str, collection: str) -> None:
        """Move the gallery's alias onto ``collection`` (one aliases call, so a client of
        the alias sees one or the other)."""
        change = [models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=gallery)),
                  models.CreateAliasOperation(create_alias=models.CreateAlias(
                      collection_name=collection, alias_name=gallery))]
        with self._call():
            if gallery not in self._aliases():
                change = change[1:]
            self.client.update_collection_aliases(change_aliases_operations=change)

    def drop_collection(self, collection: str) -> bool:
        """Remove one collection (a retired side); False when it was gone already."""
        with self._call():
            if not self.client.collection_exists(collection):
                return False
            self.client.delete_collection(collection)
        return True

    def drop(self, gallery: str) -> bool:
        """Remove the gallery's collection, then its alias; False when there was nothing to
        remove. Each step is a no-op once done, so an interrupted delete is repeated."""
        with self._call():
            collection = self._aliases().get(gallery)
            if collection is None:
                return False
            self.client.delete_collection(collection)
            if gallery in self._aliases():  # a backend that keeps the alias of a dropped one
                self.client.update_collection_aliases(change_aliases_operations=[
                    models.DeleteAliasOperation(delete_alias=models.DeleteAlias(
                        alias_name=gallery))])
        return True

    def _aliases(self) -> dict[str, str]:
        return {a.alias_name: a.collection_name for a in self.client.get_aliases().aliases}

    def dim(self, gallery: str) -> int | None:
        """The vector width of the gallery's collection, or None if it has none."""
        with self._call():
            aliases = {a.alias_name: a.collection_name for a in self.client.get_aliases().aliases}
            if gallery not in aliases:
                return None
            vectors = self.client.get_collection(aliases[gallery]).config.params.vectors
        return int(vectors["image"].size)  # type: ignore[index]

    def width(self, collection: str) -> int:
        """The vector width of ``collection`` (a collection's name, not an alias)."""
        with self._call():
            vectors = self.client.get_collection(collection).config.params.vectors
        return int(vectors["image"].size)  # type: ignore[index]

    def upsert(self, gallery: str, items: Sequence[Item], version: str, space: str) -> None:
        points = [_point(item, version, space) for item in items]
        with self._call(gallery):
            tune_local_writes(self.client, gallery)
            self.client.upsert(gallery, points=points, wait=True)

    def delete(self, gallery: str, ids: Sequence[str]) -> None:
        selector = models.PointIdsList(points=[point_id(i) for i in ids])
        with self._call(gallery):
            tune_local_writes(self.client, gallery)
            self.client.delete(gallery, points_selector=selector, wait=True)

    def count(self, gallery: str) -> int:
        with self._call(gallery):
            return int(self.client.count(gallery, exact=True).count)

    def count_made(self, gallery: str, by: str) -> int:
        """The points whose vectors were made ``by`` "embed" or "transform" (``Item.made``;
        a point written before ``made`` existed was embedded)."""
        if by == "embed":
            return self.count(gallery) - self.count_made(gallery, "transform")
        return self.count_where(gallery, "made.by", by)

    def count_where(self, gallery: str, key: str, value: str) -> int:
        """The points whose payload ``key`` (a dotted path) is ``value``."""
        where = models.Filter(must=[models.FieldCondition(
            key=key, match=models.MatchValue(value=value))])
        with self._call(gallery):
            return int(self.client.count(gallery, count_filter=where, exact=True).count)

    def search(self, gallery: str, vector: np.ndarray, kind: str, top_k: int,
               where: Where | None = None) -> list[Hit]:
        """The ``top_k`` items of ``kind`` closest to ``vector`` [D] that match ``where``."""
        return self.search_many(gallery, [Search(vector, kind, top_k, where)])[0]

    def search_many(self, gallery: str, searches: Sequence[Search]) -> list[list[Hit]]:
        """Several searches of one gallery in one Qdrant call (one request to a server)."""
        requests = [models.QueryRequest(query=s.vector.tolist(), using=s.kind, limit=s.top_k,
                                        with_payload=True, filter=payload_filter(s.where),
                                        params=self._search)
                    for s in searches]
        with self._call(gallery):
            responses = self.client.query_batch_points(gallery, requests=requests)
        return [[_hit(p) for p in response.points] for response in responses]

    def fingerprint(self, gallery: str, ids: Collection[str] | None = None,
                    page: int = 1000) -> dict[str, dict[str, Any]]:
        """Per embedding version: how many items it embedded and a SHA-256 over their ids
        and vectors (float32 bytes, in id order); ``ids`` restricts it to those items.
        Equal fingerprints at two times mean no stored vector changed in between (e.g. no
        backfill ran)."""
        rows: dict[str, list[tuple[str, bytes]]] = {}
        offset = None
        while True:
            with self._call(gallery):
                points, offset = self.client.scroll(gallery, limit=page, offset=offset,
                                                    with_payload=True, with_vectors=True)
            for point in points:
                payload, vectors = point.payload or {}, point.vector or {}
                if ids is not None and str(payload.get("item_id")) not in ids:
                    continue
                blob = b"".join(np.asarray(vectors[k], dtype=np.float32).tobytes()  # type: ignore[index]
                                for k in sorted(vectors))  # type: ignore[arg-type]
                rows.setdefault(str(payload.get("version")), []).append(
                    (str(payload.get("item_id")), blob))
            if offset is None:
                break
        out = {}
        for version, items in sorted(rows.items()):
            digest = hashlib.sha256()
            for item_id, blob in sorted(items):
                digest.update(item_id.encode() + b"\0" + blob)
            out[version] = {"items": len(items), "sha256": digest.hexdigest()}
        return out

    def stored(self, collection: str, ids: Sequence[str] | None = None,
               page: int = 1000, fields: Sequence[str] | None = None) -> dict[str, Stored]:
        """Item id -> ``Stored`` (no vectors), of ``ids`` or of every item; with ``fields``
        (payload keys, ``item_id`` among them) only those are read, the rest left empty (a
        scan of every item converts a fraction of each payload)."""
        selector: bool | list[str] = True if fields is None else list(fields)
        with self._call(collection):
            if ids is not None:
                found = self.client.retrieve(collection, ids=[point_id(i) for i in ids],
                                             with_payload=selector, with_vectors=False)
                return {s.id: s for s in map(_stored, found)}
        out: dict[str, Stored] = {}
        offset = None
        while True:
            with self._call(collection):
                batch, offset = self.client.scroll(collection, limit=page, offset=offset,
                                                   with_payload=selector, with_vectors=False)
            out.update((s.id, s) for s in map(_stored, batch))
            if offset is None:
                return out

    def scan_vectors(self, collection: str, page: int = 1000,
                     ) -> Iterator[tuple[list[str], dict[str, dict[int, np.ndarray]]]]:
        """Every stored item's vectors, a page at a time: (item ids, kind -> {row in the
        page: [D]}) (a migration's transform reads the whole side once)."""
        offset = None
        while True:
            with self._call(collection):
                points, offset = self.client.scroll(collection, limit=page, offset=offset,
                                                    with_payload=["item_id"], with_vectors=True)
            ids = [str((p.payload or {}).get("item_id")) for p in points]
            vectors: dict[str, dict[int, np.ndarray]] = {k: {} for k in KINDS}
            for row, p in enumerate(points):
                for kind, v in (p.vector or {}).items():  # type: ignore[union-attr]
                    vectors[kind][row] = np.asarray(v, dtype=np.float32)
            yield ids, vectors
            if offset is None:
                return

    def points(self, gallery: str, page: int = 1000) -> list[tuple[str, dict[str, Any]]]:
        """(item id, caller payload) of every stored item, without vectors."""
        return [(item.id, item.payload) for item in self.stored(gallery, page=page).values()]

    def vectors(self, gallery: str, ids: Sequence[str]) -> dict[str, dict[str, np.ndarray]]:
        """Item id -> kind -> [D] stored vector, for the given items."""
        return {str((p.payload or {}).get("item_id")): _vectors_of(p)
                for p in self._with_vectors(gallery, ids)}

    def stored_vectors(self, collection: str, ids: Sequence[str],
                       kinds: Sequence[str] | None = None,
                       ) -> dict[str, tuple[Stored, dict[str, np.ndarray]]]:
        """Item id -> (``Stored``, kind -> [D] vector), of ``ids``, in one read; with
        ``kinds``, only those vectors are read (a rerank needs one of an item's two)."""
        return {(s := _stored(p)).id: (s, _vectors_of(p))
                for p in self._with_vectors(collection, ids, kinds)}

    def _with_vectors(self, collection: str, ids: Sequence[str],
                      kinds: Sequence[str] | None = None) -> list[Any]:
        with self._call(collection):
            return list(self.client.retrieve(
                collection, ids=[point_id(i) for i in ids], with_payload=True,
                with_vectors=True if kinds is None else list(kinds)))

    def close(self) -> None:
        self.client.close()


def _missing_collection(message: str) -> bool:
    """Local mode says "Collection x not found", a server "Not found: Collection `x`
    doesn't exist!"; a missing named vector ("Dense vector v is not found in the
    collection") is a different error."""
    text = message.lower()
    return ("collection" in text and ("not found" in text or "doesn't exist" in text)
            and "vector" not in text)


def payload_filter(where: Where | None) -> models.Filter | None:
    """Every condition must hold; a list value matches any of its elements."""
    if not where:
        return None
    conditions: list[models.Condition] = []
    for key, value in where.items():
        match: models.Match = (models.MatchAny(any=list(value))
                               if isinstance(value, (list, tuple))
                               else models.MatchValue(value=value))
        conditions.append(models.FieldCondition(key=f"payload.{key}", match=match))
    return models.Filter(must=conditions)


def _point(item: Item, version: str, space: str) -> models.PointStruct:
    payload = {"item_id": item.id, "version": version, "space": space,
               "kinds": sorted(item.vectors), "payload": dict(item.payload or {}),
               "origin": dict(item.origin or {}), "etag": item.etag or uuid.uuid4().hex,
               "made": dict(item.made or {"by": "embed", "version": version})}
    vectors = {kind: v.astype(np.float32).tolist() for kind, v in item.vectors.items()}
    return models.PointStruct(id=point_id(item.id), vector=vectors, payload=payload)


def _stored(point: models.Record) -> Stored:
    payload = point.payload or {}
    return Stored(str(payload.get("item_id")), payload.get("etag"),
                  dict(payload.get("origin") or {}), dict(payload.get("payload") or {}),
                  tuple(payload.get("kinds") or ()), payload.get("version"),
                  dict(payload.get("made") or {}) or None)


def _vectors_of(point: Any) -> dict[str, np.ndarray]:
    return {k: np.asarray(v, dtype=np.float32) for k, v in (point.vector or {}).items()}


def _hit(point: models.ScoredPoint) -> Hit:
    payload = point.payload or {}
    stored = _stored(point)
    return Hit(id=stored.id, score=float(point.score), payload=dict(stored.payload),
               version=str(payload.get("version")), space=str(payload.get("space")),
               stored=stored)
