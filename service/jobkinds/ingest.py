"""The ``ingest`` job: a manifest's items embedded with the gallery's active version into
every side of the gallery (its space; during a migration, the other side's too), through
the shared pipeline (``service.vectors.ingest``). The worker writes the thumbnails and
spools the vectors (``SpooledWriter``); the gateway, which owns the gallery store, writes them (upsert by item
id: a re-run changes nothing it already did) and then finishes the job."""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import Field

from service.jobkinds.base import GatewayPort, JobKind, Params, RunContext, check_dataset
from service.state.jobs.store import Job
from service.state.paths import Roots
from service.state.registry import Registry
from service.state.thumbnails import ThumbnailStore
from service.vectors.ingest import ingest_dataset
from service.vectors.spool import SpooledWriter, pending


class IngestParams(Params):
    manifest: str = Field(description="dataset directory or manifest of items to add")
    kinds: list[Literal["image", "text"]] = Field(default_factory=lambda: ["image"])
    language: str = "en"
    batch_size: int = Field(64, ge=1, le=4096)

    def check(self, registry: Registry, roots: Roots) -> None:
        check_dataset(roots, self.manifest, "manifest")


def run(ctx: RunContext) -> dict[str, Any]:
    from training.trainer import Progress
    from training.versions import load_encoder

    p: IngestParams = ctx.params
    dataset = ctx.open_dataset(p.manifest, "manifest")  # every image under an allowed root
    registry = Registry(ctx.settings.registry_dir)
    gallery = registry.gallery(ctx.job.gallery)
    artifact = registry.artifact(gallery.active)
    encoders = {side.space: load_encoder(artifact, side.space, ctx.settings.device)
                for side in gallery.sides()}
    work = ctx.store.work_dir(ctx.job.id)
    work.mkdir(parents=True, exist_ok=True)
    writer = SpooledWriter(work, ThumbnailStore.of(ctx.settings), gallery.name,
                           durable=ctx.settings.qdrant_durability == "power")
    start = time.perf_counter()

    def on_batch(done: int, total: int) -> None:
        elapsed = time.perf_counter() - start
        ctx.heartbeat.report(Progress(done, total, 0.0, elapsed / done * (total - done),
                                      done / max(elapsed, 1e-9), "ingest"))

    total = ingest_dataset(encoders, gallery.active, writer, dataset, p.batch_size, p.kinds,
                           p.language, on_batch)
    return {"result": {"items": total}, "hand_off": True}


def finish(gateway: GatewayPort, job: Job) -> None:
    """After the applier wrote its spool: a job whose worker is done and whose spool is all
    written succeeds (one cancelled meanwhile ends cancelled: what was written stays, a
    re-run is idempotent)."""
    job = gateway.jobs.get(job.id)
    if job.status != "applying" or pending(gateway.jobs.work_dir(job.id)):
        return
    if job.cancel_requested:
        gateway.jobs.finish(job.id, "cancelled", error="cancelled while its items were "
                            f"written; {job.result.get('applied', 0)} were written")
        return
    gateway.jobs.finish(job.id, "succeeded")


KIND = JobKind("ingest", IngestParams, run, spools=True, finish=finish)
