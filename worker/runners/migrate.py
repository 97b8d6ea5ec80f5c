"""A ``migrate`` job's shards (``service.usecases.migration`` plans them).

``backfill``: re-embed a range of the gallery's items from their origins with the target
version natively, into the job's spool (the gateway writes them into the target side).
The shard's cursor is saved after each batch, so a shard whose worker was killed resumes
at the first batch it had not spooled (a batch spooled twice is the same upsert).
A source that cannot be read is reported by item id, not fatal.

``gate``: on the gallery's validation set, the target version natively (new->new) against
its route into the source space (new->old, what serves during the backfill).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from PIL import Image

from service.state.gallery.sources import SourceStore, open_origin_image
from service.state.gallery.spool import Batch, write_batch
from service.state.jobs.shards import read_cursor, read_items, write_cursor
from service.state.jobs.specs import MigrateParams
from service.state.paths import Roots
from service.state.registry import Registry
from worker.context import JobContext, ShardHeartbeat

if TYPE_CHECKING:
    import torch

DIRECTIONS = ("t2i", "i2t")


def run_migrate(ctx: JobContext) -> dict[str, Any]:
    assert ctx.shard is not None, "a migrate job runs as shards"
    task = ctx.job.shards[ctx.shard].get("task", "backfill")
    if task == "gate":
        return {"gate": run_gate(ctx)}
    return run_backfill(ctx)


class RateLimit:
    """At most ``rate`` items/s on average (0: no limit)."""

    def __init__(self, rate: float) -> None:
        self.rate, self.start, self.count = rate, time.monotonic(), 0

    def wait(self, items: int) -> None:
        self.count += items
        if self.rate > 0:
            ahead = self.count / self.rate - (time.monotonic() - self.start)
            if ahead > 0:
                time.sleep(ahead)


def run_backfill(ctx: JobContext) -> dict[str, Any]:
    from training.versions import load_encoder

    assert ctx.shard is not None and isinstance(ctx.heartbeat, ShardHeartbeat)
    p = MigrateParams.model_validate(ctx.job.params)
    work = ctx.store.work_dir(ctx.job.id)
    items = read_items(work, ctx.shard)
    cursor = read_cursor(work, ctx.shard)
    registry = Registry(ctx.settings.registry_dir)
    migration = registry.gallery(ctx.job.gallery).migration
    if migration is None or migration.job != ctx.job.id:
        raise RuntimeError(f"gallery '{ctx.job.gallery}' has no migration of job {ctx.job.id}")
    space, version = migration.target.space, migration.version
    encoder = load_encoder(registry.artifact(version), space, ctx.settings.device)
    rate = p.rate_limit if p.rate_limit is not None else ctx.settings.migration_rate_limit
    running = sum(1 for s in ctx.job.shards if s.get("task", "backfill") == "backfill")
    limit = RateLimit(rate / max(running, 1))
    reader = _Reader(SourceStore.of(ctx.settings), Roots.of(ctx.settings), encoder.image_tensors)
    start, done = time.monotonic(), 0
    ctx.heartbeat.advance(cursor, {"stage": "backfill"})
    for first, loaded in reader.batches(items, cursor, p.batch_size, read_ahead(
            ctx.settings.migration_read_ahead, encoder.device)):
        vectors = _embed(encoder, loaded)
        chunk = items[first:first + p.batch_size]
        write_batch(work, f"{ctx.shard:04d}-{first:09d}", Batch(
            "backfill", version, [{"id": i["id"], "etag": i.get("etag")} for i in chunk],
            {space: vectors}, [u for u in loaded["unreadable"]]))
        write_cursor(work, ctx.shard, first + len(chunk))
        done += len(chunk)
        elapsed = time.monotonic() - start
        ctx.heartbeat.advance(first + len(chunk), {
            "stage": "backfill", "items_per_s": round(done / max(elapsed, 1e-9), 2)})
        limit.wait(len(chunk))
    return {}


def read_ahead(setting: int | None, device: Any) -> int:
    """Batches to read ahead of the forward: the setting, else 1 on CUDA (the forward leaves
    the CPU to the reader) and 0 on the CPU, where a reader thread takes the cores the
    forward's threads spin on: measured on 2 cores, in line 1,499 items/s at 1.13 CPU-ms
    an item, one batch ahead 1,349 items/s at 1.39 CPU-ms (README, bench migrate)."""
    if setting is not None:
        return setting
    return 1 if str(device).startswith("cuda") else 0


class _Reader:
    """Reads, decodes and preprocesses a batch's origins: ``ahead`` batches ahead of the
    forward in a thread (decoding and the forward release the GIL), or in line (0)."""

    def __init__(self, sources: SourceStore, roots: Roots,
                 to_pixels: Callable[[list[Image.Image]], torch.Tensor]) -> None:
        self.sources, self.roots, self.to_pixels = sources, roots, to_pixels

    def batches(self, items: list[dict[str, Any]], cursor: int, size: int, ahead: int = 0,
                ) -> Iterator[tuple[int, dict[str, Any]]]:
        starts = iter(range(cursor, len(items), size))
        if ahead <= 0:
            for first in starts:
                yield first, self.load(items[first:first + size])
            return
        pool = ThreadPoolExecutor(1, thread_name_prefix="backfill-read")
        try:
            reading = deque((first, pool.submit(self.load, items[first:first + size]))
                            for first in itertools.islice(starts, ahead))
            while reading:
                first, loaded = reading.popleft()
                nxt = next(starts, None)
                if nxt is not None:
                    reading.append((nxt, pool.submit(self.load, items[nxt:nxt + size])))
                yield first, loaded.result()
        finally:  # stopped (cancelled, failed): what was not started is dropped
            pool.shutdown(wait=True, cancel_futures=True)

    def load(self, chunk: list[dict[str, Any]]) -> dict[str, Any]:
        """Per item, its text and preprocessed image where it has them; unreadable ids."""
        texts: dict[int, str] = {}
        images: dict[int, Image.Image] = {}
        unreadable: list[dict[str, str]] = []
        for n, item in enumerate(chunk):
            origin = item.get("origin") or {}
            missing = [k for k in item.get("kinds") or () if not origin.get(k)]
            if missing:
                unreadable.append({"id": item["id"], "reason": f"no {'/'.join(missing)} "
                                   f"source was kept for this item"})
                continue
            try:
                if origin.get("image"):
                    images[n] = open_origin_image(str(origin["image"]), self.sources, self.roots)
            except Exception as exc:  # noqa: BLE001 - reported per item, the shard goes on
                unreadable.append({"id": item["id"], "reason": f"image source "
                                   f"{str(origin['image'])[:200]!r}: {type(exc).__name__}: "
                                   f"{str(exc)[:200]}"})
                continue
            if origin.get("text"):
                texts[n] = str(origin["text"])
        rows = sorted(images)
        pixels = self.to_pixels([images[r] for r in rows]) if rows else None  # [k, 3, H, W]
        return {"n": len(chunk), "texts": texts, "image_rows": rows, "pixels": pixels,
                "unreadable": unreadable}


def _embed(encoder: Any, loaded: dict[str, Any]) -> list[dict[str, Any]]:
    vectors: list[dict[str, Any]] = [{} for _ in range(loaded["n"])]
    texts = loaded["texts"]
    if texts:
        rows = sorted(texts)
        for row, vector in zip(rows, encoder.encode_texts([texts[r] for r in rows]),
                               strict=True):
            vectors[row]["text"] = vector
    if loaded["image_rows"]:
        for row, vector in zip(loaded["image_rows"],
                               encoder.encode_image_tensors(loaded["pixels"]), strict=True):
            vectors[row]["image"] = vector
    return vectors


def run_gate(ctx: JobContext) -> dict[str, Any]:
    """new->new against new->old (the route that serves now) on the validation set: passed
    when the migrated side is at least as good at R@1 in both directions."""
    from training.compatibility import compatibility_of_artifacts

    p = MigrateParams.model_validate(ctx.job.params)
    registry = Registry(ctx.settings.registry_dir)
    gallery = registry.gallery(ctx.job.gallery)
    m = gallery.migration
    if m is None or m.job != ctx.job.id:
        raise RuntimeError(f"gallery '{ctx.job.gallery}' has no migration of job {ctx.job.id}")
    validation = p.validation or gallery.validation
    if validation is None:
        return {"passed": False, "reason": f"gallery '{gallery.name}' has no validation set; "
                "switch with force=true and a reason to override"}
    ctx.heartbeat.progress = {"stage": "gate"}
    target = registry.artifact(m.version)
    old = registry.artifact(_gallery_version(registry, ctx.job.result.get("embedded_by") or {},
                                             gallery.history, m.source.space))
    dataset = ctx.open_dataset(validation, "validation")
    cells = compatibility_of_artifacts([old, target], dataset)["cells"]
    routed, migrated = cells[target.version_id][old.version_id], cells[target.version_id][
        target.version_id]
    checks = [{"direction": d, "migrated": migrated[d]["R@1"], "routed": routed[d]["R@1"],
               "passed": migrated[d]["R@1"] >= routed[d]["R@1"] - 1e-12} for d in DIRECTIONS]
    return {"passed": all(c["passed"] for c in checks), "checks": checks, "metric": "R@1",
            "version": m.version, "old_gallery_version": old.version_id,
            "validation": validation, "validation_items": len(dataset)}


def _gallery_version(registry: Registry, embedded_by: dict[str, int], history: Any,
                     space: str) -> str:
    """The version that embedded most of the source side's items (counted when the items
    were listed) if it is still registered and native to that space; else the latest of
    the gallery's history native to it (else the newest registered one native to it)."""
    versions = {v.version_id: v for v in registry.versions()}  # retired ones are absent
    for version in embedded_by:  # most items first
        found = versions.get(version)
        if found is not None and found.space == space:
            return version
    for event in reversed(history):
        found = versions.get(event.version)
        if found is not None and found.space == space:
            return found.version_id
    return registry.default_version(space).version_id
