"""The embedded engine: Qdrant Edge (``qdrant-edge-py``, Qdrant's own engine in-process)
behind the part of ``QdrantClient``'s interface that ``GalleryStore`` calls, so the store,
its etag rules and a migration's two sides run unchanged on it.

Edge has shards, not collections or aliases. Here a collection is one shard directory
(``ROOT/collections/NAME``) and a catalog file (``ROOT/catalog.json``: each collection's
vector widths, each alias's collection) stands in for Qdrant's collection and alias
metadata; it is rewritten whole (a temporary file, fsync, rename), so an alias move is
atomic on disk as on a server. A collection is in the catalog only once its shard exists,
and leaves it before its directory is removed; a directory left by an interrupted create
or drop is removed at the next open.

Edge indexes (HNSW) only when asked (``EdgeShard.optimize``); points not yet indexed are
searched exactly, so nothing written is ever missing from a search. ``optimize`` holds
Python's interpreter lock for its whole run (measured: 7.8 s for 20,000 x 512-d on 2
cores: no other thread of the process runs meanwhile), and Edge lets one process open a
shard, so the index is built off this process on a copy (``optimize``): writers wait
while the flushed shard is copied (searches go on), a child process at a lower CPU
priority loads the copy and indexes it, the writes made meanwhile (applied to the serving
shard as usual and kept in a journal) are replayed into it, and it replaces the serving
shard: the copy moves to a new generation directory (``ROOT/indexed/NAME/N``), is loaded
and brought up to date while the old shard still serves, the catalog is rewritten to name
it, and the collection's handle is switched under its lock. ``EdgeShard.load`` holds the
interpreter lock while it runs (every thread of the process waits), so a shard's parts are
mapped and not read at load (``COLD``): the indexed copy's files are read into the page
cache by ``warm`` as soon as the child is done, while writes and searches go on, and the
load then reads only what Edge keeps in memory (the same read runs at open). A crash at
any point leaves the catalog
naming either the old shard (with every acknowledged write: writers wait from the replay
to the switch) or the new one (with every write, replayed and flushed before the catalog
names it); at open the directories the catalog does not name are removed. The indexer
runs this once a collection has had ``quiet_s`` seconds without writes and
``index_after`` points changed since the last run (a bulk load, a backfill's end).

An index build's child process dies with its parent, by any signal (``PR_SET_PDEATHSIG``,
and it exits at once if its parent is already gone when it starts), and holds a lock on
its copy (``building/NAME-ID/.build.lock``) while it runs: an open removes only the copies
no live build holds, and every build copies into a directory of its own.

Indexing state survives a restart: on open, a collection whose unindexed vectors reach
``index_after`` points is due again (once ``quiet_s`` has passed), as if those points had
just been written.

Durability (``durability``): ``process`` (the default) acknowledges a write once Edge has
applied it and appended it to its write-ahead log in the page cache: it survives a kill of
the process (the log is replayed at the next load), not a power cut; ``power``
acknowledges a write only once the shard's write-ahead log is on disk (``fsync`` of its
files and folder, one for every write that waited meanwhile: a group commit). The log is
synced from Python, not with ``EdgeShard.flush``: that holds the interpreter lock through
its syncs (about 18 ms each here), so no other thread ran and no two writes ever shared
one. The catalog is synced at every change in both.

One process per directory (a lock file, like local mode's): a second opener gets a clear
error instead of two writers on one shard. A directory that ``nobackfill store move`` was
filling and did not finish (``MOVE_MARKER`` not done) is refused with the command that
redoes the move.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import qdrant_edge as edge
from qdrant_client import models

from service.state.errors import Unavailable
from service.state.registry.index import fsync_path

log = logging.getLogger(__name__)

# Points per call into a shard: Edge's calls give up the interpreter lock as they convert
# (a thread waiting for it takes it meanwhile), so one call over thousands of points ran
# for hundreds of ms beside a busy thread (measured: 805 ms for a retrieve of 2,048, 25 ms
# alone); larger batches are split. Calls share a shard (``_HandleLock``): a search does
# not wait for a write (3 searching threads beside one writing 256-point batches, no lock:
# p99 37 ms; taking turns, each search waits for a whole batch).
CALL_POINTS = 256
CATALOG = "catalog.json"
# Keyword indexes of every collection: what the store filters and counts on (the etag
# reads, the backfill's made.by, the migration view's made.via). A count on a key without
# one scans every point holding the interpreter lock (41 ms at 20,000 points, measured).
INDEXED = ("item_id", "made.by", "made.via")
BUILDING, INDEXED_DIR = "building", "indexed"  # ROOT/building/NAME: a copy being indexed;
# ROOT/indexed/NAME/N: the Nth indexed generation of NAME (the catalog's "paths" name the one
# that serves; a collection never indexed off the process serves from ROOT/collections/NAME)
RETIRED = "retired"  # where the swap of an earlier version put a replaced shard aside
BUILD_LOCK = ".build.lock"  # held by the child that indexes a copy, for its whole run
MOVE_MARKER = "move.json"  # written by ``store move``: under way, then done
DURABILITY = ("process", "power")
# The child process that indexes a copy (only Edge imported: it starts in a moment). It
# dies with the process that started it (PR_SET_PDEATHSIG = 1, SIGKILL = 9; Linux) and
# exits if that one is gone already; it holds its copy's lock while it runs.
INDEX_CHILD = ("import ctypes, fcntl, os, sys\n"
               "ctypes.CDLL(None, use_errno=True).prctl(1, 9, 0, 0, 0)\n"
               "if os.getppid() != int(sys.argv[2]):\n"
               "    sys.exit(3)\n"
               "held = open(os.path.join(sys.argv[1], '" + BUILD_LOCK + "'), 'a')\n"
               "fcntl.flock(held, fcntl.LOCK_EX)\n"
               "import qdrant_edge as e\n"
               "os.nice(10)\n"  # a lower priority than the searches it runs beside
               "s = e.EdgeShard.load(sys.argv[1])\n"
               "changed = s.optimize()\n"
               "s.flush()\n"
               "s.close()\n"
               "print(int(bool(changed)))\n")
# Where a new collection's vectors, HNSW graphs, payloads, id tracker and keyword indexes
# live: mapped from their files and not read at load. ``Cached`` (Edge's default) reads
# every page in at load (``madvise`` populate) while holding the interpreter lock: a load
# of 300,000 points 0.83-1.08 s, against 0.05-0.14 s mapped only (and 2.2 s at 1M, the
# slowest search during an index build). The store reads the files itself (``warm``).
COLD = edge.Memory.Cold
WARM_CHUNK = 1 << 20
HNSW = (16, 64)  # (m, ef_construct): measured by bench store (docs/benchmarks/store.md)
LOCK = ".lock"


class EngineBusy(RuntimeError):
    """Another process holds the directory."""


class IncompleteStore(Unavailable):
    """A directory ``store move`` did not finish."""


def write_json_durably(path: Path, data: Any) -> None:
    """``path`` rewritten whole: a temporary file, fsync, rename, fsync of the folder."""
    tmp = path.with_name(f"{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_path(path.parent)


def read_move_marker(root: Path) -> dict[str, Any] | None:
    """``store move``'s marker in ``root``, or None when it has none."""
    path = Path(root) / MOVE_MARKER
    if not path.exists():
        return None
    try:
        return dict(json.loads(path.read_text()))
    except (ValueError, TypeError):
        return {"state": "unreadable"}


def refuse_unfinished_move(root: Path) -> None:
    """Raise ``IncompleteStore`` when ``root`` holds a move that did not finish."""
    marker = read_move_marker(root)
    if marker is None or marker.get("state") == "done":
        return
    source = marker.get("source", "the local-mode directory")
    raise IncompleteStore(
        f"{root} holds an unfinished `nobackfill store move` from {source} (interrupted "
        f"before it was checked): it is not opened. Run `nobackfill store move --from "
        f"{source} --to {root}` again to redo the move (the source was only read), or "
        f"remove {root}")


def _build_locked(copy: Path) -> bool:
    """Whether a live build holds ``copy`` (its child has the copy's lock)."""
    lock = copy / BUILD_LOCK
    if not lock.exists():
        return False
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return True
        fcntl.flock(f, fcntl.LOCK_UN)
    return False


class _HandleLock:
    """Who may use a shard handle: calls share it (searches, reads and the one writer at
    once: Edge locks inside, measured safe and 2-3x kinder to a search's p99 beside a
    writer than taking turns), closing or replacing it waits for them all (and holds new
    ones off: it is never starved)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._users = 0
        self._closing = False

    @contextlib.contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._closing:
                self._cond.wait()
            self._users += 1
        try:
            yield
        finally:
            with self._cond:
                self._users -= 1
                if not self._users:
                    self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            while self._closing:
                self._cond.wait()
            self._closing = True
            while self._users:
                self._cond.wait()
        try:
            yield
        finally:
            with self._cond:
                self._closing = False
                self._cond.notify_all()


@dataclass
class _Point:
    """What ``GalleryStore`` reads of a record or a scored point."""

    id: str
    payload: dict[str, Any] | None
    vector: dict[str, list[float]] | None = None
    score: float = 0.0


@dataclass
class _Collection:
    shard: Any  # edge.EdgeShard
    sizes: dict[str, int]
    path: Path  # the shard's directory
    changed: int = 0  # points written since the last optimize
    last_write: float = 0.0
    lock: _HandleLock = field(default_factory=_HandleLock)  # the shard handle
    writes: threading.Lock = field(default_factory=threading.Lock)  # taken before ``lock``
    # by writers, and by an index build while it copies the shard and swaps it in
    journal: list[Any] | None = None  # the writes made while a copy is being indexed
    written: int = 0  # write calls applied (each numbered), and the last one on disk
    synced: int = 0
    sync: threading.Lock = field(default_factory=threading.Lock)  # one flush at a time


def _missing(name: str) -> ValueError:
    return ValueError(f"Collection {name} not found")


class EdgeClient:
    """Qdrant Edge shards under ``root`` with the calls ``GalleryStore`` makes of a
    ``QdrantClient`` (the same ``qdrant_client.models`` in; records with ``id``,
    ``payload``, ``vector``, ``score`` out)."""

    def __init__(self, root: str | Path, quiet_s: float = 5.0, index_after: int = 20_000,
                 indexer: bool = True, indexing_threshold_kb: int | None = None,
                 hnsw: tuple[int, int] | None = None, search_ef: int | None = None,
                 segments: int | None = None, durability: str = "process",
                 moving: bool = False) -> None:
        if durability not in DURABILITY:
            raise ValueError(f"durability must be one of {DURABILITY}, got {durability!r}")
        self.root = Path(root)
        if not moving:  # ``store move`` opens its own unfinished target
            refuse_unfinished_move(self.root)
        self.durability = durability
        self.syncs = 0  # flushes made to acknowledge writes (``power``)
        (self.root / "collections").mkdir(parents=True, exist_ok=True)
        self._lock_file = open(self.root / LOCK, "a+")  # noqa: SIM115 - held until close
        try:
            fcntl.flock(self._lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            self._lock_file.close()
            raise EngineBusy(f"the embedded Qdrant Edge store at {self.root} is open in "
                             f"another process (one process per directory)") from exc
        self.quiet_s, self.index_after = quiet_s, index_after
        # Segments smaller than this (Qdrant's default, 10,000 KB: about 5,000 512-d
        # vectors) are not indexed: searching them exactly is as fast.
        self.indexing_threshold_kb = indexing_threshold_kb
        # (m, ef_construct) of new collections: bench store's, half the build time of
        # Qdrant's (16, 100) at the same recall (1.000 at 100,000 points, 0.996 at 1M)
        self.hnsw, self._hnsw_given = hnsw or HNSW, hnsw is not None
        self.search_ef = search_ef  # a search's HNSW ef; None: Qdrant's (ef_construct)
        self.segments = segments  # segments a new collection's points spread over (None:
        # Qdrant's, one per CPU); more, smaller graphs: a better recall at a given ef
        self._meta = threading.Lock()  # the catalog and the open shards
        self._build = threading.Lock()  # one index build at a time
        self._child: subprocess.Popen[str] | None = None  # the build's process, if running
        # the last off-process build's steps, in seconds: where a swap's stall comes from
        self.last_build: dict[str, float] = {}
        catalog = self._read_catalog()
        self._aliases: dict[str, str] = dict(catalog.get("aliases", {}))
        self._open: dict[str, _Collection] = {}
        paths = catalog.get("paths", {})
        for name, sizes in catalog.get("collections", {}).items():
            path = self.root / paths[name] if name in paths else self._dir(name)
            retired = self.root / RETIRED / name
            if retired.exists() and not path.exists():  # an earlier version's crash mid-swap
                os.rename(retired, path)
            shard = edge.EdgeShard.load(str(path))
            warm(path)
            _indexed(shard)  # a collection made before an index was added gets it now
            # what was not indexed before the restart is due again (after ``quiet_s``)
            self._open[name] = _Collection(shard, dict(sizes), path,
                                           changed=_unindexed(shard, len(sizes)),
                                           last_write=time.monotonic())
        serving = {c.path for c in self._open.values()}
        # what the catalog does not name: an interrupted create or drop, a generation an
        # interrupted build made or one it replaced, an unfinished copy
        for stray in [*(self.root / "collections").iterdir(),
                      *(self.root / INDEXED_DIR).glob("*/*")]:
            if stray not in serving:
                shutil.rmtree(stray, ignore_errors=True)
        for folder in (self.root / INDEXED_DIR).glob("*"):
            if not any(folder.iterdir()):
                folder.rmdir()
        shutil.rmtree(self.root / RETIRED, ignore_errors=True)
        for copy in (self.root / BUILDING).glob("*"):  # never under a live build
            if _build_locked(copy):
                log.warning("%s is being indexed by a process still running: left", copy)
            else:
                shutil.rmtree(copy, ignore_errors=True)
        with contextlib.suppress(OSError):  # gone, or a live build's copy is in it
            (self.root / BUILDING).rmdir()
        self._closed = threading.Event()
        self._indexer = threading.Thread(target=self._index_loop, name="edge-indexer",
                                         daemon=True) if indexer else None
        if self._indexer:
            self._indexer.start()

    # -- catalog -------------------------------------------------------------------------

    def _dir(self, name: str) -> Path:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"collection name {name!r} is not a plain name")
        return self.root / "collections" / name

    def _read_catalog(self) -> dict[str, Any]:
        path = self.root / CATALOG
        if not path.exists():
            return {}
        return json.loads(path.read_text())

    def _write_catalog(self) -> None:
        write_json_durably(self.root / CATALOG, {
            "collections": {n: c.sizes for n, c in self._open.items()},
            "aliases": self._aliases,
            "paths": {n: c.path.relative_to(self.root).as_posix()
                      for n, c in self._open.items() if c.path != self._dir(n)}})

    def _collection(self, name: str) -> _Collection:
        with self._meta:
            found = self._open.get(self._aliases.get(name, name))
        if found is None:
            raise _missing(name)
        return found

    def shard_path(self, collection_name: str) -> Path:
        """The directory of the shard that serves ``collection_name`` (or the collection an
        alias names) now: it changes at every swap of an off-process index build."""
        return self._collection(collection_name).path

    # -- collections and aliases ---------------------------------------------------------

    def get_collections(self) -> Any:
        with self._meta:
            names = sorted(self._open)
        return models.CollectionsResponse(
            collections=[models.CollectionDescription(name=n) for n in names])

    def collection_exists(self, name: str) -> bool:
        with self._meta:
            return name in self._open

    def create_collection(self, name: str, vectors_config: dict[str, models.VectorParams],
                          hnsw_config: models.HnswConfigDiff | None = None) -> bool:
        """A new collection; ``hnsw_config``'s m and ef_construct, where given, are used
        unless the client was made with its own ``hnsw`` (``bench store``'s sweeps)."""
        sizes = {kind: int(p.size) for kind, p in vectors_config.items()}
        m, ef = self.hnsw
        if hnsw_config is not None and not self._hnsw_given:
            m, ef = hnsw_config.m or m, hnsw_config.ef_construct or ef
        # Every part of the shard mapped and not read at load (``COLD``); ``warm`` reads
        # the files into the page cache without the interpreter lock instead.
        config = edge.EdgeConfig(vectors={
            kind: edge.EdgeVectorParams(size=size, distance=edge.Distance.Dot, memory=COLD)
            for kind, size in sizes.items()},
            payload_memory=COLD, id_tracker_memory=COLD,
            optimizers=edge.EdgeOptimizersConfig(indexing_threshold=self.indexing_threshold_kb,
                                                 default_segment_number=self.segments),
            hnsw_config=edge.HnswIndexConfig(
                m=m, ef_construct=ef, full_scan_threshold=10_000, memory=COLD))
        with self._meta:
            if name in self._open:
                raise ValueError(f"Collection {name} already exists")
            path = self._dir(name)
            shutil.rmtree(path, ignore_errors=True)
            shutil.rmtree(self.root / INDEXED_DIR / name, ignore_errors=True)
            shard = edge.EdgeShard.create(str(path), config)
            _indexed(shard)
            self._open[name] = _Collection(shard, sizes, path)
            self._write_catalog()
        return True

    def delete_collection(self, name: str) -> bool:
        with self._meta:
            gone = self._open.pop(name, None)
            if gone is None:
                return False
            self._aliases = {a: c for a, c in self._aliases.items() if c != name}
            self._write_catalog()
        with gone.lock.exclusive():
            gone.shard.close()
        shutil.rmtree(gone.path, ignore_errors=True)
        shutil.rmtree(self.root / INDEXED_DIR / name, ignore_errors=True)
        return True

    def get_collection(self, name: str) -> Any:
        sizes = self._collection(name).sizes
        vectors = {kind: models.VectorParams(size=size, distance=models.Distance.DOT)
                   for kind, size in sizes.items()}
        return _Info(vectors)

    def get_aliases(self) -> Any:
        with self._meta:
            pairs = sorted(self._aliases.items())
        return models.CollectionsAliasesResponse(aliases=[
            models.AliasDescription(alias_name=a, collection_name=c) for a, c in pairs])

    def update_collection_aliases(self, change_aliases_operations: Sequence[Any]) -> bool:
        """Every operation applied, then one catalog write: readers see all or none."""
        with self._meta:
            aliases = dict(self._aliases)
            for op in change_aliases_operations:
                if isinstance(op, models.DeleteAliasOperation):
                    aliases.pop(op.delete_alias.alias_name, None)
                elif isinstance(op, models.CreateAliasOperation):
                    target = op.create_alias.collection_name
                    if target not in self._open:
                        raise _missing(target)
                    aliases[op.create_alias.alias_name] = target
                else:
                    raise TypeError(f"alias operation {type(op).__name__} is not supported")
            self._aliases = aliases
            self._write_catalog()
        return True

    # -- points ---------------------------------------------------------------------------

    def upsert(self, collection_name: str, points: Sequence[models.PointStruct],
               wait: bool = True) -> None:
        c = self._collection(collection_name)
        for start in range(0, len(points), CALL_POINTS):
            batch = [edge.Point(str(p.id), p.vector, p.payload)  # type: ignore[arg-type]
                     for p in points[start:start + CALL_POINTS]]
            last = self._write(c, edge.UpdateOperation.upsert_points(batch), len(batch))
        if points:
            self._durable(c, last)

    def delete(self, collection_name: str, points_selector: models.PointIdsList,
               wait: bool = True) -> None:
        c = self._collection(collection_name)
        ids = [str(i) for i in points_selector.points]
        for start in range(0, len(ids), CALL_POINTS):
            last = self._write(c, edge.UpdateOperation.delete_points(
                ids[start:start + CALL_POINTS]), 0)
        if ids:
            self._durable(c, last)

    def create_payload_index(self, collection_name: str, field_name: str,
                             field_schema: Any = None, **_: Any) -> bool:
        """A keyword index on ``field_name`` (the only kind the store asks for): kept
        in memory, or mapped from disk and read in at load with ``on_disk``."""
        params = isinstance(field_schema, models.KeywordIndexParams)
        if not params and field_schema not in (None, models.PayloadSchemaType.KEYWORD):
            raise ValueError(f"only keyword payload indexes are supported here, got "
                             f"{field_schema!r}")
        on_disk = params and bool(field_schema.on_disk)
        c = self._collection(collection_name)
        with c.writes, c.lock.shared():
            if field_name not in c.shard.info().payload_schema:
                c.shard.update(edge.UpdateOperation.create_field_index(
                    field_name, _keyword(on_disk)))
        return True

    @staticmethod
    def _write(c: _Collection, op: Any, points: int) -> int:
        """Apply ``op``; its number, for ``_durable``."""
        with c.writes, c.lock.shared():
            c.shard.update(op)
            if c.journal is not None:
                c.journal.append(op)
            c.changed += points
            c.last_write = time.monotonic()
            c.written += 1
            return c.written

    def _durable(self, c: _Collection, written: int) -> None:
        """Return once write number ``written`` is as durable as ``durability`` asks: at
        ``power``, its write-ahead log on disk. One sync covers every write applied before
        it started, so writers waiting meanwhile find theirs done (a group commit)."""
        if self.durability != "power":
            return
        with c.sync:
            if c.synced >= written:
                return
            with c.writes:
                upto, path = c.written, c.path
            _sync_log(path)
            c.synced = upto
            self.syncs += 1

    def count(self, collection_name: str, count_filter: models.Filter | None = None,
              exact: bool = True) -> Any:
        c = self._collection(collection_name)
        with c.lock.shared():
            n = c.shard.count(edge.CountRequest(exact=True, filter=_filter(count_filter)))
        return models.CountResult(count=int(n))

    def query_batch_points(self, collection_name: str,
                           requests: Sequence[models.QueryRequest]) -> list[Any]:
        c = self._collection(collection_name)
        batch = edge.QueryBatchRequest([edge.QueryRequest(
            limit=r.limit, query=edge.Query.Nearest(_dense(r.query), using=r.using),
            with_payload=bool(r.with_payload), filter=_filter(r.filter),
            params=self._params(r)) for r in requests])
        with c.lock.shared():
            found = c.shard.query_batch(batch)
        return [_Response([_Point(str(p.id), p.payload, None, float(p.score)) for p in points])
                for points in found]

    def _params(self, request: models.QueryRequest) -> Any:
        """The search's ef: the request's (``SearchParams.hnsw_ef``, as a server takes it),
        else this client's ``search_ef``, else Edge's own (None)."""
        given = request.params.hnsw_ef if request.params is not None else None
        ef = given if given is not None else self.search_ef
        return None if ef is None else edge.SearchParams(hnsw_ef=ef)

    def scroll(self, collection_name: str, limit: int = 10, offset: Any = None,
               with_payload: bool | Sequence[str] = True, with_vectors: bool = False,
               ) -> tuple[list[_Point], str | None]:
        c = self._collection(collection_name)
        request = edge.ScrollRequest(offset=None if offset is None else str(offset),
                                     limit=min(limit, CALL_POINTS),  # the rest: next page
                                     with_payload=_payload(with_payload),
                                     with_vector=bool(with_vectors))
        with c.lock.shared():
            records, after = c.shard.scroll(request)
        return ([_record(r) for r in records], None if after is None else str(after))

    def retrieve(self, collection_name: str, ids: Iterable[Any],
                 with_payload: bool | Sequence[str] = True,
                 with_vectors: bool | Sequence[str] = False) -> list[_Point]:
        c = self._collection(collection_name)
        keys = [str(i) for i in ids]
        found = []
        for start in range(0, len(keys), CALL_POINTS):
            with c.lock.shared():
                found += c.shard.retrieve(keys[start:start + CALL_POINTS],
                                          with_payload=_payload(with_payload),
                                          with_vector=with_vectors if isinstance(
                                              with_vectors, bool) else list(with_vectors))
        return [_record(r) for r in found]

    # -- indexing and lifetime -------------------------------------------------------------

    def optimize(self, collection_name: str, off_process: bool = True) -> bool:
        """Index what was written since the last run; True if anything was indexed.

        ``off_process`` (the default): built on a copy by a child process, then swapped in
        (the module's docstring); searches and writes go on meanwhile. Otherwise in this
        process, holding the interpreter lock throughout: for a tool no one searches
        through (``store move``)."""
        with self._meta:
            name = self._aliases.get(collection_name, collection_name)
        c = self._collection(name)
        if not off_process:
            with c.writes, c.lock.exclusive():
                c.changed = 0
                return bool(c.shard.optimize())
        with self._build:
            return self._build_off_process(name, c)

    def _build_off_process(self, name: str, c: _Collection) -> bool:
        copy = self.root / BUILDING / f"{name}-{uuid.uuid4().hex[:8]}"  # never reused
        generations = self.root / INDEXED_DIR / name
        done = [int(p.name) for p in generations.glob("*") if p.name.isdigit()]
        target = generations / str(max(done, default=0) + 1)
        shutil.rmtree(copy, ignore_errors=True)
        copy.parent.mkdir(exist_ok=True)
        began = time.monotonic()
        steps: dict[str, float] = {}
        with c.writes:  # no write while the shard is copied; searches go on
            with c.lock.shared():
                c.shard.flush()
            steps["flush_s"] = time.monotonic() - began
            shutil.copytree(c.path, copy)
            c.journal, c.changed = [], 0
            c.synced = c.written  # the flush above put every write on disk
        steps["copy_s"] = time.monotonic() - began - steps["flush_s"]
        try:
            if self._closed.is_set():
                raise InterruptedError("closing")
            self._child = subprocess.Popen(
                [sys.executable, "-c", INDEX_CHILD, str(copy), str(os.getpid())],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            out, err = self._child.communicate()
            if self._closed.is_set():
                raise InterruptedError("closing")
            if self._child.returncode != 0:
                raise RuntimeError(f"indexing {name} failed in its child process "
                                   f"(exit {self._child.returncode}): {err.strip()[-500:]}")
            indexed = out.strip().endswith("1")
            t = time.monotonic()
            steps["child_s"] = t - began - steps["flush_s"] - steps["copy_s"]
            warm(copy, self._closed)  # into the page cache (the child's close dropped it);
            steps["warm_s"] = time.monotonic() - t  # writes and searches go on meanwhile
            if self._closed.is_set():
                raise InterruptedError("closing")
            built = time.monotonic()
            with c.writes:  # writers wait from here to the switch; searches go on
                with self._meta:
                    if self._open.get(name) is not c:  # dropped meanwhile: nothing to swap
                        raise InterruptedError(f"{name} was dropped")
                journal, c.journal = c.journal or [], None
                target.parent.mkdir(parents=True, exist_ok=True)
                os.rename(copy, target)
                fresh = None
                try:
                    t = time.monotonic()
                    fresh = edge.EdgeShard.load(str(target))
                    steps["load_s"] = time.monotonic() - t
                    for op in journal:  # every write made meanwhile, before it serves
                        fresh.update(op)
                    steps["replay_s"] = time.monotonic() - t - steps["load_s"]
                    t = time.monotonic()
                    fresh.flush()
                    steps["new_flush_s"] = time.monotonic() - t
                    (target / BUILD_LOCK).unlink(missing_ok=True)
                    old_path = c.path
                    self._name_path(name, c, target)  # from here a reopen loads ``target``
                except BaseException:
                    if fresh is not None:
                        fresh.close()
                    shutil.rmtree(target, ignore_errors=True)
                    raise
                with c.lock.exclusive():  # searches in flight finish on the old one
                    old, c.shard = c.shard, fresh
            t = time.monotonic()
            old.close()
            steps["close_s"] = time.monotonic() - t
            shutil.rmtree(old_path, ignore_errors=True)
            steps["swap_s"] = time.monotonic() - built
            steps["total_s"] = time.monotonic() - began
            self.last_build = {"writes_replayed": len(journal),
                               **{k: round(v, 3) for k, v in steps.items()}}
            log.info("indexed %s off the process: %s", name, self.last_build)
            return indexed
        except BaseException:
            with c.writes:
                c.journal = None
            shutil.rmtree(copy, ignore_errors=True)
            raise
        finally:
            self._child = None

    def _name_path(self, name: str, c: _Collection, path: Path) -> None:
        """Make ``path`` ``name``'s shard directory, in the catalog on disk too; on a failed
        write it stays the old one (the catalog is rewritten naming it)."""
        with self._meta:
            if self._open.get(name) is not c:
                raise InterruptedError(f"{name} was dropped")
            before, c.path = c.path, path
            try:
                self._write_catalog()
            except BaseException:
                c.path = before
                try:
                    self._write_catalog()
                except OSError:
                    log.exception("the catalog of %s could not be rewritten", self.root)
                raise

    def indexed(self, collection_name: str) -> dict[str, int]:
        """``{"points", "indexed_vectors", "segments"}`` of one collection."""
        c = self._collection(collection_name)
        with c.lock.shared():
            info = c.shard.info()
        return {"points": int(info.points_count),
                "indexed_vectors": int(info.indexed_vectors_count),
                "segments": int(info.segments_count)}

    def _due(self) -> list[str]:
        now = time.monotonic()
        with self._meta:
            return [name for name, c in self._open.items()
                    if c.changed >= self.index_after and now - c.last_write >= self.quiet_s]

    def _index_loop(self) -> None:
        while not self._closed.wait(min(1.0, self.quiet_s)):
            for name in self._due():
                try:
                    self.optimize(name)
                except (ValueError, InterruptedError):  # dropped meanwhile, or closing
                    continue
                except Exception:  # the shard serves on unindexed; tried again when due
                    log.exception("indexing %s failed", name)
                    with self._meta:
                        c = self._open.get(name)
                    if c is not None:  # tried again a minute after the last write
                        c.changed = max(c.changed, self.index_after)
                        c.last_write = time.monotonic() + 60

    def flush(self) -> None:
        with self._meta:
            open_ = list(self._open.values())
        for c in open_:
            with c.lock.shared():
                c.shard.flush()

    def close(self) -> None:
        if self._closed.is_set():
            return
        self._closed.set()
        child = self._child
        if child is not None and child.poll() is None:
            child.kill()  # an index build is abandoned: its copy is removed
        if self._indexer is not None:
            self._indexer.join()
        with self._meta:
            for c in self._open.values():
                with c.lock.exclusive():
                    c.shard.close()
            self._open = {}
        fcntl.flock(self._lock_file, fcntl.LOCK_UN)
        self._lock_file.close()


@dataclass
class _Info:
    """``get_collection(...).config.params.vectors``."""

    vectors: dict[str, models.VectorParams]

    @property
    def config(self) -> Any:
        return self

    @property
    def params(self) -> Any:
        return self


@dataclass
class _Response:
    points: list[_Point]


def warm(shard_dir: Path, stop: threading.Event | None = None) -> int:
    """Read every file of a shard into the page cache; the bytes read. Its parts are mapped
    and not read at load (``COLD``: a load that read them held the interpreter lock through
    it, 2.2 s at 1,000,000 points), and a shard closed drops its files from the cache (the
    index build's child closes the copy it indexed), so without this the first searches
    read from disk, each holding the lock (p50 11.5 ms instead of 0.9 at 300,000 points).
    ``readinto`` lets other threads run while the kernel reads. Ends early once ``stop``
    is set (a close)."""
    read, buf = 0, bytearray(WARM_CHUNK)
    for f in sorted(p for p in shard_dir.rglob("*") if p.is_file()):
        with contextlib.suppress(FileNotFoundError), open(f, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                read += n
                if stop is not None and stop.is_set():
                    return read
    return read


def _sync_log(shard_dir: Path) -> None:
    """Put a shard's write-ahead log on disk: every file of ``wal/`` (Edge appends through
    a mapping; ``fsync`` writes back a file's dirty pages however they were dirtied), then
    the folder (a segment it created). ``os.fsync`` lets other threads run meanwhile."""
    wal = shard_dir / "wal"
    for f in sorted(wal.iterdir()):
        with contextlib.suppress(FileNotFoundError):  # a segment retired meanwhile
            fsync_path(f)
    fsync_path(wal)


def _unindexed(shard: Any, kinds: int) -> int:
    """About how many points of ``shard`` are not indexed (its vectors not in an HNSW
    graph, over the named vectors a point has)."""
    info = shard.info()
    return max(0, int(info.points_count) * kinds - int(info.indexed_vectors_count)) // max(
        kinds, 1)


def _keyword(on_disk: bool) -> Any:
    """Edge's keyword index: in memory, or (``on_disk``) mapped from its files (``COLD``,
    warmed by ``warm``): a map of 200,000 item ids read in at load took a third of the time
    it takes to rebuild in memory (a load of the shard 0.78 -> 0.47 s, measured), and the
    load holds the interpreter lock."""
    if not on_disk:
        return edge.PayloadSchemaType.Keyword
    return edge.KeywordIndexParams(memory=COLD)


def _indexed(shard: Any) -> None:
    """Create the keyword indexes of ``INDEXED`` the shard lacks (as the store makes
    them: ``GalleryStore.create_side``)."""
    have = set(shard.info().payload_schema)
    for key in INDEXED:
        if key not in have:
            shard.update(edge.UpdateOperation.create_field_index(key, _keyword(True)))


def _dense(query: Any) -> list[float]:
    if isinstance(query, np.ndarray):
        return query.astype(np.float32).tolist()
    if isinstance(query, list):
        return query
    raise ValueError(f"only a dense vector query is supported here, got {type(query).__name__}")


def _payload(selector: bool | Sequence[str]) -> Any:
    return selector if isinstance(selector, bool) else list(selector)


def _record(r: Any) -> _Point:
    return _Point(str(r.id), r.payload, r.vector if isinstance(r.vector, dict) else None)


def _filter(where: models.Filter | None) -> Any:
    """``payload_filter``'s filters (every condition a key matching a value or any of a
    list) in Edge's types."""
    if where is None:
        return None
    must = []
    for cond in where.must or []:  # type: ignore[union-attr]
        if not isinstance(cond, models.FieldCondition) or cond.match is None:
            raise TypeError(f"only field matches are supported here, got {cond!r}")
        if isinstance(cond.match, models.MatchAny):
            match: Any = edge.MatchAny(list(cond.match.any))
        elif isinstance(cond.match, models.MatchValue):
            match = edge.MatchValue(cond.match.value)
        else:
            raise TypeError(f"only value and any-of matches are supported, got {cond.match!r}")
        must.append(edge.FieldCondition(key=cond.key, match=match))
    if where.should or where.must_not:
        raise ValueError("only 'must' filters are supported here")
    return edge.Filter(must=must)
