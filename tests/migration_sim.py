"""A simulation of the migration control plane: the real control code
(``service.jobkinds.migrate``), the real applier, job store, registry and embedded engine
(Qdrant Edge), driven through random sequences of operations and faults, each step
checked against a reference model of the items and of the lifecycle table.

Stand-ins, and only these (``tests/test_migration_simulation.py`` runs a few sequences
through the real gateway and a real worker process to check them against the real
thing): the broker (``Queue`` records what was sent), the serving runtime (``Runtime``:
no model to refresh), and the worker's encoder: ``Worker`` runs a shard's steps the way
``service.jobkinds.migrate.backfill`` and ``transform`` do (the same shard files,
cursors, spool batches and records), with vectors made by ``vector`` from an item's id
and revision, so that the check can tell a stale or foreign vector from the right one.

A sequence is a list of ``Step``s (an operation and a random number that picks its
arguments when it runs), so a failing one replays exactly and shrinks (``shrink``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import shutil
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from service.jobkinds.migrate import actions, submit
from service.jobkinds.migrate import record as records
from service.jobkinds.migrate.drive import tick as drive_tick  # noqa: F401  (the applier calls it)
from service.jobkinds.migrate.lifecycle import TRANSITIONS, allowed, phase_of
from service.jobkinds.migrate.params import MigrateParams
from service.jobkinds.migrate.transform import LISTING, VALIDATION, Simulation, write_order
from service.jobkinds.migrate.view import view
from service.runtime.gateway import candidate_counts
from service.state.candidates import CandidateCounts
from service.state.config import Settings
from service.state.errors import Conflict, GateFailed, InvalidInput
from service.state.gallery.client import open_qdrant
from service.state.gallery.store import GalleryStore
from service.state.jobs.shards import (
    PAUSED,
    FilledByReads,
    read_cursor,
    read_items,
    write_cursor,
)
from service.state.jobs.store import JobStore
from service.state.registry import Registry
from service.state.registry.index import utc_now
from service.state.registry.records import VersionRecord
from service.state.thumbnails import ThumbnailStore
from service.usecases import applier
from service.usecases.rerank import _write_fills
from service.vectors.spool import SpooledWriter
from service.vectors.writer import Batch, DirectWriter

D = 8  # the sides' width
GALLERY = "sim"
OLD, NEW = "v1", "v3"  # the gallery's space, the new version's native space
VERSION = "up"  # native to v3, with a route into v1: it serves the gallery
# Operations and their weights in a random sequence (the driver and the workers often,
# the operator and the faults now and then).
OPS = {"start": 2, "tick": 8, "work": 10, "fill": 2, "upsert": 2, "delete": 1, "pause": 1,
       "resume": 2, "cancel": 0.7, "switch": 1, "force": 1, "rollback": 1, "retire": 1.5,
       "worker_death": 1, "fail_job": 0.3, "restart": 1, "keep": 2, "settle": 1}
APPLIER_ACTIONS = ("progressive", "switch_back", "finish", "gate_failed", "fail", "cancel")


class Violation(AssertionError):
    """An invariant did not hold after a step."""


@dataclass(frozen=True)
class Step:
    op: str
    r: int  # picks the step's arguments when it runs

    def __repr__(self) -> str:
        return f"Step({self.op!r}, {self.r})"


def vector(item: str, rev: int, space: str, how: str) -> np.ndarray:
    """The vector ``how`` ("embed" or "transform") made of item ``item`` at revision
    ``rev`` in ``space``: deterministic, so the check knows which one a point must hold."""
    seed = int.from_bytes(hashlib.sha256(f"{item}/{rev}/{space}/{how}".encode()).digest()[:8],
                          "little")
    v = np.random.default_rng(seed).normal(size=D).astype(np.float32)
    return v / np.linalg.norm(v)


class Queue:
    """The broker's stand-in: what the control code sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int]] = []

    def send_shard(self, job_id: str, shard: int) -> None:
        self.sent.append((job_id, shard))

    def send(self, job_id: str) -> None:
        self.sent.append((job_id, -1))


class Runtime:
    """The serving runtime's stand-in: nothing loaded to refresh; the new version's
    embedder is only asked its width."""

    async def refresh(self) -> None:
        return None

    async def embedder(self, version: str, space: str) -> Any:
        return SimpleNamespace(dim=D, version=version, space=space)


@dataclass
class Port:
    """The gateway as the control code sees it (``GatewayPort``), opened from disk."""

    settings: Settings
    registry: Registry
    store: GalleryStore
    jobs: JobStore
    queue: Queue
    runtime: Runtime
    candidates: CandidateCounts

    @classmethod
    def open(cls, settings: Settings, queue: Queue) -> Port:
        return cls(settings, Registry.of(settings), GalleryStore(open_qdrant(settings), False),
                   JobStore(settings.registry_dir), queue, Runtime(),
                   candidate_counts(settings))

    def close(self) -> None:
        self.store.close()


@dataclass
class Model:
    """The reference: every live item (id -> (revision, kinds)), ids ever deleted, and the
    lifecycle phase as the table's transitions lead to it."""

    items: dict[str, tuple[int, tuple[str, ...]]] = field(default_factory=dict)
    phase: str = "ended"
    cancel_asked: bool = False
    cancelled_in: str = ""
    next_id: int = 0
    log: list[str] = field(default_factory=list)


class World:
    """One sequence's world: a fresh data directory, the gallery with its items, the
    port (reopened on ``restart``) and the reference model."""

    def __init__(self, root: Path, items: int, seed: int) -> None:
        self.root = root
        self.settings = Settings(data_dir=root / "data", datasets_dir=root,
                                 job_stale_after_s=3600.0, qdrant_durability="process")
        self.queue = Queue()
        self.loop = asyncio.new_event_loop()
        self.rng = np.random.default_rng(seed)
        self.model = Model()
        self._register()
        self.port = Port.open(self.settings, self.queue)
        self.port.store.create(GALLERY, D)
        self.port.registry.create_gallery(GALLERY, OLD, by="sim", version=VERSION)
        self.upsert([f"i{n}" for n in range(items)])

    def _register(self) -> None:
        registry = Registry(self.settings.registry_dir)

        def change(index: dict[str, Any]) -> None:
            for vid, space, routes in (("v1", OLD, (OLD,)), (VERSION, NEW, (NEW, OLD))):
                index["versions"][vid] = VersionRecord(vid, space, routes, f"versions/{vid}",
                                                       utc_now(), "sim").to_json()
        registry.index.update(change)

    def close(self) -> None:
        self.port.close()
        self.loop.close()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    # -------------------------------------------------------------- writes (the items API's)
    def upsert(self, ids: list[str]) -> None:
        """Write ``ids`` (new ones, or a new revision of live ones) to every side, as the
        items API does: one batch with the vectors of each side's space."""
        record = self.port.registry.gallery(GALLERY)
        for i in ids:
            rev, kinds = self.model.items.get(i, (-1, ()))
            if not kinds:
                kinds = (("image", "text"), ("image",), ("text",))[int(self.rng.integers(3))]
            self.model.items[i] = (rev + 1, kinds)
        spaces = [s.space for s in record.sides()]
        batch = Batch("upsert", VERSION, [{"id": i, "payload": {}, "origin": {
            "text": f"caption of {i}"}} for i in ids], {space: [
                {k: vector(i, self.model.items[i][0], space, "embed")
                 for k in self.model.items[i][1]} for i in ids] for space in spaces})
        DirectWriter.registered(self.port.store, self.settings, self.port.registry,
                                GALLERY).write(batch)

    def delete(self, ids: list[str]) -> None:
        from service.state.gallery.locks import gallery_lock

        with gallery_lock(self.settings, GALLERY):
            for side in self.port.registry.gallery(GALLERY).sides():
                self.port.store.delete(side.collection, ids)
        for i in ids:
            self.model.items.pop(i, None)


def _next(phase: str, moves: tuple[str, ...]) -> set[str]:
    """Where the table's ``moves`` lead from ``phase``."""
    return {t for a in moves for t in TRANSITIONS[phase].get(a, "").split("|") if t}


def pick(r: int, options: list[Any]) -> Any:
    return options[r % len(options)] if options else None


class Worker:
    """A worker's stand-in: runs one step of a shard of the migration's job the way the
    real shards do (``backfill``: a batch from its cursor, items reads filled skipped;
    ``transform``: the sample embedded, every other item mapped, the order, the outcome
    and the validation inputs written; ``gate``: a report bound to the gallery and side,
    or a crash)."""

    BATCH = 3

    def __init__(self, world: World) -> None:
        self.world = world

    def step(self, r: int) -> str:
        w = self.world
        port = w.port
        m = port.registry.gallery(GALLERY).migration
        if m is None:
            return "no migration"
        job = port.jobs.get(m.job)
        open_ = [n for n, s in enumerate(job.shards) if s["state"] in ("queued", "running")]
        n = pick(r, open_)
        if n is None:
            return "no shard"
        shard = job.shards[n]
        if shard["state"] == "queued":
            started = port.jobs.start_shard(job.id, n, "sim@host")
            if started is None:
                return f"shard {n} not started"
            job = started
        if job.cancel_requested:
            port.jobs.finish_shard(job.id, n, "cancelled")
            return f"shard {n} cancelled"
        task = shard.get("task", "backfill")
        work = port.jobs.work_dir(job.id)
        try:
            if task == "gate":
                return self._gate(job, n, m, r)
            if task == "transform":
                return self._transform(job, n, m, r)
            return self._backfill(job, n, m, work)
        except FileNotFoundError as exc:  # its job ended under it (its work dir is gone)
            return f"shard {n}: {exc}"

    def _backfill(self, job: Any, n: int, m: Any, work: Path) -> str:
        port, model = self.world.port, self.world.model
        if job.result.get(PAUSED):
            port.jobs.finish_shard(job.id, n, "paused")
            return f"shard {n} paused"
        items = read_items(work, n)
        cursor = read_cursor(work, n)
        filled = FilledByReads(records.folder(port.jobs, job.id))()
        chunk = items[cursor:cursor + self.BATCH]
        todo = [i for i in chunk if i["id"] not in filled]
        writer = SpooledWriter(work, ThumbnailStore.of(self.world.settings), GALLERY,
                               f"{n:04d}-", cursor)
        if todo:
            writer.write(Batch("backfill", m.version, [{"id": i["id"], "etag": i["etag"]}
                                                        for i in todo],
                               {m.target.space: [self._new(i["id"], model) for i in todo]}))
        write_cursor(work, n, cursor + len(chunk))
        port.jobs.beat_shard(job.id, n, cursor + len(chunk))
        if cursor + len(chunk) >= len(items):
            port.jobs.finish_shard(job.id, n, "done")
            return f"shard {n} done"
        return f"shard {n} at {cursor + len(chunk)}"

    @staticmethod
    def _new(item: str, model: Model) -> dict[str, np.ndarray]:
        """NEW's vectors of ``item`` as its source reads now (a deleted item's last
        revision is gone: the writer skips it by its etag anyway)."""
        rev, kinds = model.items.get(item, (10_000, ("image",)))
        return {k: vector(item, rev, NEW, "embed") for k in kinds}

    def _transform(self, job: Any, n: int, m: Any, r: int) -> str:
        port, model = self.world.port, self.world.model
        work = port.jobs.work_dir(job.id)
        folder = records.folder(port.jobs, job.id)
        sample = read_items(work, n)
        listed = json.loads((folder / LISTING).read_text())
        writer = SpooledWriter(work, ThumbnailStore.of(self.world.settings), GALLERY,
                               f"{n:04d}-", 0)
        if sample:
            writer.write(Batch("backfill", m.version, [{"id": i["id"], "etag": i["etag"]}
                                                        for i in sample],
                               {m.target.space: [self._new(i["id"], model) for i in sample]}))
        chosen = {i["id"] for i in sample}
        rest = [i for i in listed if i["id"] not in chosen]
        if rest:
            made = {"by": "transform", "version": m.version, "from_space": m.source.space,
                    "map": f"sim fitted by job {job.id}"}
            writer.write(Batch("transform", m.version, [{"id": i["id"], "etag": i["etag"]}
                                                         for i in rest],
                               {m.target.space: [{k: vector(i["id"], model.items.get(
                                   i["id"], (10_000,))[0], NEW, "transform")
                                   for k in i["kinds"]} for i in rest]}, made=made))
        write_order(folder, "random", [i["id"] for i in rest])
        switch_at = pick(r, [None, 0.0, 0.1, 0.3, 0.6])
        records.write_json(folder / records.TRANSFORMED, {
            "transform": {"method": "sim", "sample": len(sample)},
            "curve": [{"fraction": f, "t2i": {"side": 0.5, "share": {"share": f, "se": 0.01}}}
                      for f in (0.0, 0.5, 1.0)],
            "curve_directions": ["t2i"], "routed": {"t2i": {"R@1": 0.5}},
            "switch_at": switch_at})
        _validation(folder / VALIDATION, good=(r // 7) % 3 != 0, seed=r)
        port.jobs.finish_shard(job.id, n, "done")
        return f"transform done (switch_at {switch_at})"

    def _gate(self, job: Any, n: int, m: Any, r: int) -> str:
        port = self.world.port
        outcome = pick(r, ["pass", "pass", "fail", "crash"])
        if outcome == "crash":
            port.jobs.finish_shard(job.id, n, "failed", "the gate's worker crashed")
            return "gate crashed"
        passed = outcome == "pass"
        gate: dict[str, Any] = {
            "passed": passed, "gallery": GALLERY, "target": m.target.collection,
            "checks": [{"direction": "t2i", "migrated": 0.6 if passed else 0.4,
                        "routed": 0.5, "passed": passed}]}
        below = bool((r // 4) % 2)  # the end states, measured beside the route
        fused = 0.7 if below else 0.6
        gate["serving"] = {  # as ``backfill.what_serves`` reports them
            "mode": "rerank@20" if m.serving == "rerank" else m.serving, "rerank_k": 20,
            "R@1": {"t2i": {"native": 0.6, "rerank@20": fused, "hybrid": fused}},
            "native_below_fused": {"rerank@20": below, "hybrid": below},
            "native_below": below and m.serving == "rerank",
            "why": f"t2i: the native side 0.6 against rerank@20 {fused}"}
        port.jobs.finish_shard(job.id, n, "done", gate=gate)
        return f"gate {outcome}{' (native below what serves)' if gate.get('serving', {}).get('native_below') else ''}"


def _validation(path: Path, good: bool, seed: int) -> None:
    """The curve's inputs for the checks after a switch: ``good``: NEW's side finds what
    the route finds (never below it); else NEW's queries are unrelated (far below)."""
    from training.upgrades.transform.simulate import Items, Queries

    rng = np.random.default_rng(seed)
    n = 60

    def unit(rows: int) -> np.ndarray:
        v = rng.normal(size=(rows, D)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    old = {"image": unit(n), "text": unit(n)}
    new = {"image": old["image"].copy(), "text": old["text"].copy()} if good else {
        "image": unit(n), "text": unit(n)}
    items = Items(old, new, {k: v.copy() for k, v in new.items()})
    eye = np.eye(n, dtype=bool)
    routed = {"text": old["image"].copy(), "image": old["text"].copy()}
    queries = Queries(new={"text": new["image"].copy(), "image": new["text"].copy()} if good
                      else {"text": unit(n), "image": unit(n)},
                      routed=routed, old=routed, relevant={"t2i": eye, "i2t": eye})
    Simulation(items, queries, {"image": list(range(n)), "text": list(range(n))},
               {"t2i": np.arange(n), "i2t": np.arange(n)}, n).save(path, "random", ["t2i"])


# ------------------------------------------------------------------ one sequence
class Sequence:
    """Runs steps on a ``World`` and checks every invariant after each."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.worker = Worker(world)

    @property
    def port(self) -> Port:
        return self.world.port

    def now(self) -> actions.Current:
        return actions.current(self.port, GALLERY)

    def phase(self) -> str:
        now = self.now()
        return phase_of(now.migration, now.job, now.state)

    def run(self, step: Step) -> None:
        before = self.phase()
        model = self.world.model
        self.expected: set[str] | None = None  # an operator's action that went through
        getattr(self, f"_{step.op}")(step.r, before)
        after = self.phase()
        model.log.append(f"{step} {before} -> {after}")
        self.check(step, before, after)
        model.phase = after

    def settle(self, rng: np.random.Generator, limit: int = 400) -> None:
        """After the sequence, no more faults: the driver and the workers (and a resume
        of a paused backfill) must bring the migration to rest (its job ended) within
        ``limit`` steps, each checked like the others."""
        from service.jobkinds.migrate.lifecycle import paused

        for _ in range(limit):
            now = self.now()
            if now.job is None or now.job.finished:
                return
            op = "resume" if paused(now.job) else ("tick", "work")[int(rng.integers(2))]
            self.run(Step(op, int(rng.integers(1 << 16))))
        now = self.now()
        raise Violation(f"the migration did not come to rest in {limit} steps: phase "
                        f"{self.phase()}, shards {[s['state'] for s in now.job.shards]}"
                        if now.job else "the migration did not come to rest")

    def searched(self, ids: list[str] | None = None) -> None:
        """Searches served these candidates (default: a few live items at random), as the
        search path counts them (``service.state.candidates``): what the candidate
        order plans by, at a start and when a paused backfill resumes."""
        live = sorted(self.world.model.items)
        if ids is None and live:
            ids = [live[int(k)] for k in self.world.rng.integers(len(live), size=3)]
        self.port.candidates.record(GALLERY, ids or [])

    # -------------------------------------------------------------- operations
    def _settle(self, r: int, phase: str) -> None:
        """Time passes without faults: the driver and the workers run until the
        migration is at rest (each of their steps checked like any other), so that the
        operator's actions after a backfill's end (switch, keep, cancel, retire) are
        drawn as often as those during it."""
        self.settle(np.random.default_rng(r))
        self.expected = {self.phase()}  # each inner step was checked on its own

    def _start(self, r: int, phase: str) -> None:
        transform = bool(r & 1)
        params = MigrateParams(shards=1 + (r >> 1) % 2, batch_size=4, transform=transform,
                               switch="progressive" if transform and r & 4 else "end",
                               serving="rerank" if r & 8 else "route",
                               backfill="paused" if r & 16 else "run",
                               auto_switch=not bool(r & 32), sample=8 if transform else None,
                               order="candidates" if not transform and r & 64 else "random")
        port = self.port
        self.searched()
        try:
            submit.check_can_start(port, GALLERY)
        except Conflict as exc:
            if phase == "ended" and not self._native():
                raise Violation(f"no migration is open, yet one cannot start: {exc.message}")
            return  # one is open, or the gallery is in its version's space already
        if phase != "ended":
            raise Violation(f"a second migration could start in phase {phase}")
        job = port.jobs.create("migrate", GALLERY, params.model_dump(), by="sim")
        try:
            self.world.run(submit.start(port, job, params))
        except Conflict as exc:
            raise Violation(f"a migration could not start: {exc.message}") from exc
        self.expected = {"backfilling"}
        self.world.model.cancel_asked = False

    def _native(self) -> bool:
        record = self.port.registry.gallery(GALLERY)
        return self.port.registry.version(record.active).space == record.space

    def _tick(self, r: int, phase: str) -> None:
        self.world.run(applier._tick(self.port))

    def _work(self, r: int, phase: str) -> None:
        self.world.model.log.append(self.worker.step(r))

    def _fill(self, r: int, phase: str) -> None:
        """A reranked search's read-through fill of a few candidates (the real writer
        path: ``rerank._write_fills``), with the vectors NEW makes of them."""
        now = self.now()
        m = now.migration
        if m is None:
            return
        stored = self.port.store.stored(m.source.collection)
        ids = sorted(stored)
        chosen = [ids[(r + 3 * k) % len(ids)] for k in range(min(3, len(ids)))]
        if not chosen:
            return
        record = now.record
        serving = SimpleNamespace(gallery=GALLERY, migration_job=m.job)
        if record.space == m.target.space:
            return  # the new side serves: no rerank fills it
        other = SimpleNamespace(embedder=SimpleNamespace(version=m.version),
                                space=m.target.space, collection=m.target.collection)
        self.searched(chosen)
        batch = [(stored[i], Worker._new(i, self.world.model), None)
                 for i in dict.fromkeys(chosen)]
        _write_fills(self.port, serving, other, batch)  # type: ignore[arg-type]

    def _upsert(self, r: int, phase: str) -> None:
        model = self.world.model
        live = sorted(model.items)
        if r % 2 and live:
            self.world.upsert([live[r % len(live)]])  # a new revision
        else:
            model.next_id += 1
            self.world.upsert([f"n{model.next_id}"])

    def _delete(self, r: int, phase: str) -> None:
        live = sorted(self.world.model.items)
        if live:
            self.world.delete([live[r % len(live)]])

    def _operator(self, action: str, phase: str, call: Callable[[], Any],
                  expected: tuple[type[Exception], ...] = ()) -> bool:
        """Run an operator's action; it must be refused (a Conflict naming it) exactly
        when the table does not allow it; True when it went through."""
        now = self.now()
        ok = allowed(phase, action, now.job, now.state) and now.migration is not None
        try:
            self.world.run(call())
        except (Conflict, GateFailed, InvalidInput) as exc:
            refused_by_table = f"cannot {action}" in exc.message or "no migration" in exc.message
            if ok and refused_by_table:
                raise Violation(f"{action} allowed in {phase} was refused: {exc.message}") from exc
            if not ok and not refused_by_table:
                raise Violation(f"{action} not allowed in {phase} was refused for another "
                                f"reason: {exc.message}") from exc
            return False
        if not ok:
            raise Violation(f"{action} went through in phase {phase}, which does not allow it")
        self.expected = set(TRANSITIONS[phase][action].split("|"))
        if action == "cancel":  # a running backfill is asked to stop: the applier ends it
            self.expected |= {phase, "undoing"}
        return True

    def _pause(self, r: int, phase: str) -> None:
        self._operator("pause", phase, lambda: actions.pause(self.port, GALLERY))

    def _resume(self, r: int, phase: str) -> None:
        self._operator("resume", phase, lambda: actions.resume(self.port, GALLERY))

    def _cancel(self, r: int, phase: str) -> None:
        if self._operator("cancel", phase, lambda: actions.cancel(self.port, GALLERY)):
            self.world.model.cancel_asked = True

    def _switch(self, r: int, phase: str) -> None:
        self._operator("switch", phase, lambda: actions.switch(self.port, GALLERY, by="sim"))

    def _force(self, r: int, phase: str) -> None:
        self._operator("switch", phase, lambda: actions.switch(
            self.port, GALLERY, by="sim", force=True, reason="the operator checked it"))

    def _keep(self, r: int, phase: str) -> None:
        """The operator keeps both sides as the served mode (rerank or hybrid): allowed
        exactly where the table says, and then only when every item has its own new
        vector (else a Conflict that names them)."""
        from service.jobkinds.migrate import keep

        mode = ("rerank", "hybrid")[r % 2]
        m = self.now().migration
        lacking = []
        if m is not None:
            own = {i for i, t in self.port.store.stored(m.target.collection).items()
                   if (t.made or {}).get("by") != "transform"}
            lacking = sorted(set(self.world.model.items) - own)
        went = self._operator("keep", phase, lambda: keep.keep(
            self.port, GALLERY, mode, by="sim", reason="both sides serve better"))
        if went and lacking:
            raise Violation(f"kept both sides while {len(lacking)} item(s) lacked a new vector")
        if went and self.port.registry.gallery(GALLERY).migration.serving != mode:
            raise Violation(f"kept with {mode}, the registry serves "
                            f"{self.port.registry.gallery(GALLERY).migration.serving}")

    def _rollback(self, r: int, phase: str) -> None:
        self._operator("rollback", phase, lambda: actions.rollback(self.port, GALLERY, by="sim"))

    def _retire(self, r: int, phase: str) -> None:
        now = self.now()
        serving = now.record.serving_side.collection
        transformed = self.port.store.count_made(serving, "transform") if now.migration else 0
        if self._operator("retire", phase,
                          lambda: actions.retire(self.port, GALLERY)) and transformed:
            raise Violation(f"retired while the serving side held {transformed} "
                            f"transformed vector(s)")

    def _worker_death(self, r: int, phase: str) -> None:
        """A worker is killed mid-shard: its shard's heartbeat stops (the applier's reap
        queues it again)."""
        now = self.now()
        if now.job is None:
            return
        running = [n for n, s in enumerate(now.job.shards) if s["state"] == "running"]
        n = pick(r, running)
        if n is None:
            return
        old = "2000-01-01T00:00:00+00:00"
        self.port.jobs.update(now.job.id, lambda j: j.merged(shards=[
            {**s, "heartbeat_at": old} if k == n else s for k, s in enumerate(j.shards)]))

    def _fail_job(self, r: int, phase: str) -> None:
        """The job fails outside a shard (a spooled batch the applier cannot write)."""
        now = self.now()
        if now.job is not None and not now.job.finished:
            self.port.jobs.finish(now.job.id, "failed", error="sim: a batch could not be written")

    def _restart(self, r: int, phase: str) -> None:
        """The gateway stops and starts: everything is read again from disk."""
        self.world.port.close()
        self.world.port = Port.open(self.world.settings, self.world.queue)

    # -------------------------------------------------------------- the invariants
    def check(self, step: Step, before: str, after: str) -> None:
        port, model = self.port, self.world.model
        now = self.now()
        record, m = now.record, now.migration
        # 5. The phase moved only along the table: an operator's action to where the
        # table leads it; the applier's tick by at most two of its transitions (a switch
        # and the end, in one step); a worker's step or a failed job by "fail"; nothing
        # else moves it.
        if self.expected is not None and after not in self.expected:
            raise Violation(f"{step}: the table leads {before} to {sorted(self.expected)}, "
                            f"the migration is {after}")
        if self.expected is None and after != before:
            if step.op == "tick":
                once = _next(before, APPLIER_ACTIONS)
                reachable = once | {t for p in once for t in _next(p, APPLIER_ACTIONS)}
            elif step.op in ("work", "fail_job"):
                reachable = _next(before, ("fail",))
            else:
                reachable = set()
            if after not in reachable:
                raise Violation(f"{step}: {before} -> {after} is no transition of the table")
        if step.op == "cancel" and self.expected is not None:
            model.cancel_asked = before in ("backfilling", "serving", "rolled_back")
            model.cancelled_in = before
        elif model.cancel_asked and step.op != "tick" and (now.job is None or now.job.finished):
            model.cancel_asked = False  # its job ended another way first (failed): moot
        elif model.cancel_asked and step.op == "tick":
            want = {"backfilling": "ended", "serving": "stopped", "rolled_back": "rolled_back"}
            if after != want.get(before, after):
                raise Violation(f"a cancel asked in {model.cancelled_in} was carried out "
                                f"in {before} as {after}")
            model.cancel_asked = False
        # 1. One side serves, it exists, and it answers.
        serving = record.collection or port.store.collection_of(GALLERY) or "?"
        if port.store.collection_of(GALLERY) != serving:
            raise Violation(f"the alias points at {port.store.collection_of(GALLERY)}, the "
                            f"registry serves {serving}")
        if m is not None and record.space not in (m.source.space, m.target.space):
            raise Violation(f"the gallery serves space {record.space}, not a side's")
        port.store.search(GALLERY, vector("q", 0, record.space, "embed"), "image", 5)
        # 2. Items: exactly the live ones, with the right vectors.
        self._items(serving, record.space, whole=True)
        if m is not None:
            other = m.target if serving == m.source.collection else m.source
            self._items(other.collection, other.space,
                        whole=other.collection == m.source.collection)
            folder = records.folder(port.jobs, m.job)
            if not folder.is_dir():
                raise Violation("an open migration has no folder")
        collections = {c.name for c in port.store.client.get_collections().collections}
        sides = {serving} | ({m.source.collection, m.target.collection} if m else set())
        if collections != sides:
            raise Violation(f"collections {sorted(collections)} are not the sides "
                            f"{sorted(sides)}")
        if m is None:
            leftover = list((port.jobs.root.parent / records.MIGRATIONS).glob("*"))
            if leftover:
                raise Violation(f"an ended migration left its folder: {leftover}")
            return
        # 3. Served progressively only while its check holds; a finish's switch was gated.
        state = now.state
        if after == "serving":
            if state is None or state.switched_back_at_fraction is not None:
                raise Violation("serving after a switch back")
            if state.switch_at is None or (state.switched_at_fraction or 0) + 1e-9 < state.switch_at:
                raise Violation(f"switched progressively at {state.switched_at_fraction}, "
                                f"before the curve's point {state.switch_at}")
            if any(c.get("below") for c in state.checks):
                raise Violation("serving although a check found the side below the route")
        if after == "switched" and before in ("backfilling", "serving") and step.op == "tick":
            gate = actions.bound_gate(now.job, m, GALLERY) if now.job else None
            if not gate or gate.get("passed") is not True:
                raise Violation(f"switched at the end without a passed gate of this side: {gate}")
            if (gate.get("serving") or {}).get("native_below"):
                raise Violation("switched on its own to a native side below what served")
        if after == "kept":  # both sides serve: the new one whole, NEW's own vectors
            self._items(m.target.collection, m.target.space, whole=True)
            if port.store.count_made(m.target.collection, "transform"):
                raise Violation("kept both sides while the new one holds transformed vectors")
            if m.serving not in ("rerank", "hybrid") or state is None or state.kept != m.serving:
                raise Violation(f"kept, served by {m.serving}, recorded {state and state.kept}")
        if after == "serving" and before == "backfilling" and m.serving == "rerank":
            raise Violation("a migration served by rerank switched progressively (the curve "
                            "compares the side with the route, not with what serves)")
        if state is not None and state.outcome and now.job is not None and now.job.finished \
                and actions.bound_gate(now.job, m, GALLERY) is None:
            raise Violation(f"the backfill ended ({state.outcome}) without a gate report "
                            f"for this side: {now.job.gate}")
        if after in ("serving", "stopped") and state is not None and state.transform \
                and not (records.folder(port.jobs, m.job) / VALIDATION).exists():
            raise Violation("a switched migration lost its validation set: no check can run")
        # 6. The view's counts are the store's.
        shown = self.world.run(view(port, GALLERY))
        if now.job is not None:
            p = shown.progress
            target = port.store.stored(m.target.collection)
            own = sum(1 for s in target.values() if (s.made or {}).get("by") != "transform")
            reads = sum(1 for s in target.values() if (s.made or {}).get("via") == "read")
            transformed = len(target) - own
            got = (p["reembedded"], p["transformed"], p["filled_by_reads"],
                   p["filled_by_backfill"])
            if got != (own, transformed, reads, own - reads):
                raise Violation(f"the view counts {got}, the store holds "
                                f"{(own, transformed, reads, own - reads)}")
        from service.api.schemas.migrations import MigrationOut

        out = MigrationOut.of(shown)  # the API's answer validates (a 200)
        if out.phase != after:
            raise Violation(f"the view says {out.phase}, the records {after}")

    def _items(self, collection: str, space: str, whole: bool) -> None:
        model = self.world.model
        stored = self.port.store.stored(collection)
        vectors = self.port.store.vectors(collection, sorted(stored)) if stored else {}
        live = set(model.items)
        if whole and set(stored) != live:
            raise Violation(f"{collection} holds {sorted(set(stored) - live)} beyond the live "
                            f"items and lacks {sorted(live - set(stored))}")
        if not set(stored) <= live:
            raise Violation(f"{collection} holds deleted items {sorted(set(stored) - live)}")
        for i, s in stored.items():
            rev, kinds = model.items[i]
            how = "transform" if (s.made or {}).get("by") == "transform" else "embed"
            if how == "transform" and space != NEW:
                raise Violation(f"a transformed vector of {i} on the {space} side")
            if how == "embed" and space == NEW and (s.made or {}).get("version") != VERSION:
                raise Violation(f"{i} on the new side was embedded by {s.made}")
            for k in kinds:
                got = vectors.get(i, {}).get(k)
                if got is None or not np.allclose(got, vector(i, rev, space, how), atol=1e-5):
                    raise Violation(f"{i}'s {k} vector on {collection} ({how}) is not the one "
                                    f"of its revision {rev}")


# ------------------------------------------------------------------ sequences
def random_steps(rng: np.random.Generator, length: int) -> list[Step]:
    names = list(OPS)
    weights = np.asarray([OPS[n] for n in names], np.float64)
    chosen = rng.choice(len(names), size=length - 1, p=weights / weights.sum())
    return [Step("start", int(rng.integers(1 << 16))),
            *(Step(names[k], int(rng.integers(1 << 16))) for k in chosen)]


def replay(root: Path, steps: list[Step], seed: int = 0, items: int = 20) -> list[str]:
    """Run ``steps`` in a fresh world under ``root``; the log (a Violation names the step)."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    world = World(root, items, seed)
    try:
        sequence = Sequence(world)
        for n, step in enumerate(steps):
            try:
                sequence.run(step)
            except Violation as exc:
                raise Violation(f"step {n} {step}: {exc}\n  " + "\n  ".join(
                    world.model.log[-12:])) from None
        try:
            sequence.settle(np.random.default_rng(seed))
        except Violation as exc:
            raise Violation(f"settling: {exc}\n  " + "\n  ".join(world.model.log[-12:])) from None
        return world.model.log
    finally:
        world.close()
        shutil.rmtree(root, ignore_errors=True)


def shrink(root: Path, steps: list[Step], seed: int = 0) -> list[Step]:
    """The shortest sub-sequence (removing one step at a time, greedily) that still
    fails."""
    def fails(candidate: list[Step]) -> bool:
        try:
            replay(root, candidate, seed)
        except Exception:  # noqa: BLE001 - any failure counts while shrinking
            return True
        return False

    current = list(steps)
    changed = True
    while changed:
        changed = False
        for n in range(len(current) - 1, -1, -1):
            candidate = current[:n] + current[n + 1:]
            if candidate and fails(candidate):
                current, changed = candidate, True
    return current


def run_many(root: Path, count: int, seed: int, length: int = 40,
             on_failure: Callable[[list[Step], BaseException], None] | None = None,
             ) -> dict[str, Any]:
    """``count`` random sequences of up to ``length`` steps; how many ran, steps, time.
    The first failure is shrunk and raised with its minimal reproduction."""
    rng = np.random.default_rng(seed)
    start, steps_run = time.monotonic(), 0
    moves: Counter[str] = Counter()
    for n in range(count):
        steps = random_steps(rng, int(rng.integers(length // 2, length + 1)))
        try:
            log = replay(root / "run", steps, seed=n)
            moves.update(line.split(") ", 1)[1] for line in log
                         if line.startswith("Step(") and "->" in line)
        except Exception as exc:
            small = shrink(root / "shrink", steps, seed=n)
            if on_failure is not None:
                on_failure(small, exc)
            raise AssertionError(f"sequence {n} (seed {seed}) failed: {exc}\nminimal "
                                 f"reproduction (replay with seed={n}): {small!r}") from exc
        steps_run += len(steps)
    return {"sequences": count, "steps": steps_run, "seconds": round(time.monotonic() - start, 1),
            "moves": dict(sorted(moves.items()))}
