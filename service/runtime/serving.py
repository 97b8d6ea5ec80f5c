"""Hot swap: which loaded version answers each gallery, behind one reference.

``refresh`` reads the registry, loads every version that is newly active (off the
event loop, completely, checksums verified), and only then replaces the snapshot
reference in one assignment. A request reads the reference once (``serving``) and
keeps that ``Serving`` to the end, so it finishes on the version it started with;
the old model is freed when its last request lets go.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field, replace

from service.runtime import heap
from service.runtime.embedder import Batching, Embedder
from service.runtime.metrics import Metrics
from service.runtime.threads import in_own_thread
from service.state.errors import (
    GalleryNotFound,
    ServiceError,
    SpaceMismatch,
    Unavailable,
    shown,
)
from service.state.registry import GalleryRecord, Registry, VersionRecord
from training.artifacts import Artifact
from training.encoders import Encoder

log = logging.getLogger(__name__)
EncoderLoader = Callable[[Artifact, str], Encoder]  # (artifact, space) -> encoder into space


@dataclass(frozen=True)
class OtherSide:
    """The other side of a migrating gallery: every write reaches it too, embedded by the
    active version into its space."""

    space: str
    collection: str
    embedder: Embedder


@dataclass(frozen=True)
class Serving:
    """What answers one gallery: its space, the collection that holds that space's vectors,
    the active version and that version's embedder (and, while a migration keeps two
    sides, the other one). Captured once per request, so a switch mid-request cannot mix
    spaces."""

    gallery: str
    space: str
    version: str
    embedder: Embedder | None
    error: ServiceError | None = None  # why there is no embedder (409 space, 503 load)
    stale: str | None = None  # why the registry's newer active version is not serving yet
    collection: str = ""  # "" only without an embedder
    others: tuple[OtherSide, ...] = ()
    migration: str | None = None  # the open migration's state, if any
    migration_job: str | None = None  # its job (a read-through fill records what it wrote)
    reranks: bool = False  # the migration's serving mode is rerank (searches by default)
    fuses: bool = False  # its serving mode is hybrid (both sides kept: searches by default)
    rerank_k: int | None = None  # its k (None: the server's rerank_k)

    def ready(self) -> Embedder:
        if self.embedder is None:
            error = self.error or Unavailable(f"gallery '{self.gallery}' has no loaded model")
            # A fresh instance per request: re-raising a shared one would grow its traceback.
            raise type(error)(error.message)
        return self.embedder


@dataclass(frozen=True)
class Snapshot:
    revision: int
    galleries: Mapping[str, Serving] = field(default_factory=dict)


class Runtime:
    def __init__(self, registry: Registry, load: EncoderLoader, lane: Executor,
                 batching: Batching, metrics: Metrics, keep_warm: int = 1) -> None:
        self.registry = registry
        self._load = load
        self.lane = lane
        self.batching = batching
        self.metrics = metrics
        self._snapshot = Snapshot(revision=-1)
        # (version, space) -> embedder, least recently used first.
        self._embedders: dict[tuple[str, str], Embedder] = {}
        self.keep_warm = keep_warm  # retired embedders kept loaded for a quick rollback
        self._lock = asyncio.Lock()
        self.loaded = False  # the first refresh finished

    @property
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def serving(self, gallery: str) -> Serving:
        """The gallery's current ``Serving``; keep it for the whole request."""
        found = self._snapshot.galleries.get(gallery)
        if found is None:
            raise GalleryNotFound(f"gallery '{shown(gallery)}' does not exist")
        return found

    async def refresh(self) -> bool:
        """Pick up registry changes; True when a new snapshot was swapped in."""
        async with self._lock:
            revision, versions, galleries = await asyncio.to_thread(self.registry.state)
            if revision == self._snapshot.revision:
                return False
            servings = {name: await self._serving(g, versions) for name, g in galleries.items()}
            self._swap(Snapshot(revision, servings))
            # Deleted galleries and retired versions leave the metrics too.
            self.metrics.forget(galleries.keys(), versions.keys())
            self.loaded = True
            return True

    async def embedder(self, version: str, space: str) -> Embedder:
        """The (cached) embedder of ``version`` into ``space``; loads it if needed."""
        async with self._lock:
            record = await asyncio.to_thread(self.registry.version, version)
            return await self._embedder(record, space)

    async def _embedder(self, record: VersionRecord, space: str) -> Embedder:
        if space not in record.routes:
            raise SpaceMismatch(f"version '{record.version_id}' (space '{record.space}') has no "
                                f"route into space '{space}'; its routes: {list(record.routes)}")
        key = (record.version_id, space)
        embedder = self._embedders.pop(key, None)
        if embedder is None:
            # in a thread that ends once it is loaded: only the lane keeps torch threads
            embedder = await in_own_thread(self._build, record, space)
        self._embedders[key] = embedder  # now the most recently used
        return embedder

    def _build(self, record: VersionRecord, space: str) -> Embedder:
        artifact = self.registry.artifact(record.version_id)  # checksums verified
        route = str(artifact.routes[space].get("kind", "native"))
        encoder = self._load(artifact, space)
        # the model just loaded, out of the collector's walks (its loading's garbage freed
        # first: a walk of what is not frozen yet), here off the event loop
        heap.settle(collect=True)
        return Embedder(encoder, record.version_id, space, route, self.lane, self.batching,
                        self._count_batch)

    async def _serving(self, gallery: GalleryRecord,
                       versions: Mapping[str, VersionRecord]) -> Serving:
        record = versions.get(gallery.active)
        if record is None:
            return Serving(gallery.name, gallery.space, gallery.active, None,
                           Unavailable(f"active version '{gallery.active}' is not registered"))
        if gallery.space not in record.routes:
            return Serving(gallery.name, gallery.space, gallery.active, None,
                           SpaceMismatch(_wrong_space(gallery, record)))
        try:
            embedder = await self._embedder(record, gallery.space)
            others = tuple([OtherSide(side.space, side.collection,
                                      await self._embedder(record, side.space))
                            for side in gallery.sides()[1:]])
        except Exception as exc:  # noqa: BLE001 - logged and counted; the old version serves on
            return self._keep_previous(gallery, exc)
        m = gallery.migration
        return Serving(gallery.name, gallery.space, gallery.active, embedder,
                       collection=gallery.serving_side.collection, others=others,
                       migration=m.state if m else None,
                       migration_job=m.job if m else None,
                       reranks=bool(m and m.serving == "rerank"),
                       fuses=bool(m and m.serving == "hybrid"),
                       rerank_k=m.rerank_k if m else None)

    def _keep_previous(self, gallery: GalleryRecord, exc: Exception) -> Serving:
        """A version that fails to load never replaces one that works."""
        log.exception("could not load version '%s' for gallery '%s'", gallery.active,
                      gallery.name, exc_info=exc)
        self.metrics.load_failed(gallery.active)
        problem = f"version '{gallery.active}' could not be loaded: {exc}"
        previous = self._snapshot.galleries.get(gallery.name)
        if previous is not None and previous.embedder is not None:
            return replace(previous, stale=problem)
        # Searches (public) get a fixed message; the cause is for keyed /readyz, the
        # admin gallery view and the log.
        public = Unavailable(f"version '{gallery.active}' could not be loaded; the cause is "
                             f"in /readyz (with a key) and the gateway log")
        return Serving(gallery.name, gallery.space, gallery.active, None, public, stale=problem)

    def _swap(self, new: Snapshot) -> None:
        old = self._snapshot
        self._snapshot = new  # the swap: one reference assignment
        self._retire(new)
        for name, serving in new.galleries.items():
            before = old.galleries.get(name)
            if before is not None and before.version != serving.version:
                self.metrics.swapped(name)
            self.metrics.set_active(name, serving.version, serving.space)

    def _retire(self, snapshot: Snapshot) -> None:
        """Drop embedders no gallery uses, except the ``keep_warm`` most recent ones; a
        dropped model is freed once its last in-flight request finishes."""
        in_use = {(s.embedder.version, s.space) for s in snapshot.galleries.values()
                  if s.embedder is not None}
        in_use |= {(o.embedder.version, o.space) for s in snapshot.galleries.values()
                   for o in s.others}
        idle = [k for k in self._embedders if k not in in_use]
        keep = set(idle[-self.keep_warm:]) if self.keep_warm > 0 else set()
        self._embedders = {k: v for k, v in self._embedders.items() if k in in_use | keep}

    def _count_batch(self, modality: str, size: int) -> None:
        self.metrics.batch_size.labels(modality).observe(size)

    def not_ready(self) -> list[str]:
        """Why the gateway cannot answer every gallery (empty when it can)."""
        if not self.loaded:
            return ["models are still loading"]
        problems = []
        for s in self._snapshot.galleries.values():
            if s.embedder is None and not isinstance(s.error, SpaceMismatch):
                # A gallery left in a wrong space answers 409 on purpose; that is not
                # a reason to take this replica out of rotation.
                problems.append(f"{s.gallery}: "
                                f"{s.stale or (s.error.message if s.error else 'no model')}")
            elif s.stale:
                problems.append(f"{s.gallery}: {s.stale}")
        return problems


def _wrong_space(gallery: GalleryRecord, version: VersionRecord) -> str:
    return (f"gallery '{gallery.name}' is in space '{gallery.space}', but its active version "
            f"'{version.version_id}' embeds into space '{version.space}' and has no route into "
            f"'{gallery.space}' (routes: {list(version.routes)}); promote or roll back to a "
            f"version with a route into '{gallery.space}'")
