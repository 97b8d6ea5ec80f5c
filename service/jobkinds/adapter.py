"""The ``adapter`` job: a route from a new model into the gallery's space, fitted on a sample
of the gallery (the OLD vectors it stores, read from the snapshot the gateway wrote at
submission) and the NEW model's embeddings of the same items' sources (images from the
payload's ``source`` path, texts from its ``caption``); gated and registered."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import Field

from service.jobkinds.admission import admit
from service.jobkinds.base import GatewayPort, JobKind, Params, RunContext, check_dataset, queue_job
from service.jobkinds.model_ref import ModelRef, new_model
from service.state.errors import InvalidInput
from service.state.gallery.sample import read_sample, take_sample, write_sample
from service.state.gallery.store import GalleryStore
from service.state.jobs.store import Job
from service.state.paths import Roots
from service.state.registry import Registry
from training.errors import NobackfillError


class AdapterParams(Params):
    """An adapter route fitted on a sample of the gallery (``training.adapters``)."""

    new: ModelRef
    sample: int = Field(10_000, ge=2, le=1_000_000,
                        description="gallery items to fit on (their stored OLD vectors, and "
                                    "their sources embedded by the new model)")
    seed: int = Field(0, description="which items the sample draws")
    config: dict[str, Any] = Field(default_factory=dict,
                                   description="AdapterFitConfig fields: method, slerp_t, ...")
    version_id: str | None = None
    validation: str | None = None

    def check(self, registry: Registry, roots: Roots) -> None:
        check_dataset(roots, self.validation, "validation")
        self.new.check(registry, roots, "adapter")
        try:
            self.fit_config()
        except NobackfillError as exc:
            raise InvalidInput(f"adapter job: config: {exc}") from exc

    def fit_config(self) -> Any:
        from training.upgrades.adapter import AdapterFitConfig

        return AdapterFitConfig.from_dict(self.config)

    def snapshot(self, store: GalleryStore, gallery: str, work: Path) -> None:
        """The sample, taken by the process that owns the gallery store, beside the job."""
        sample = take_sample(store, gallery, self.sample, self.seed)
        if len(sample["ids"]) < 2:
            raise InvalidInput(f"adapter job: gallery '{gallery}' holds {len(sample['ids'])} "
                               f"item(s); an adapter is fitted on at least 2")
        write_sample(sample, work)


def check_slerp(registry: Registry, gallery: str, slerp_t: float) -> None:
    """SLERP (``slerp_t`` > 0) mixes the route's query with the old model's own query in
    the gallery's space: the route carries the gallery's active version and runs it
    natively. A gallery served through a route (its active version native to another
    space) has no native old query to mix: InvalidInput, naming why."""
    if slerp_t <= 0:
        return
    record = registry.gallery(gallery)
    active = registry.version(record.active)
    if active.space != record.space:
        raise InvalidInput(
            f"adapter job: slerp_t={slerp_t:g} mixes the route's query with the old model's "
            f"own query in space '{record.space}', but gallery '{gallery}' is served by "
            f"'{active.version_id}' through a route (its native space is '{active.space}'): "
            f"there is no native old query to mix; set slerp_t=0")


async def start(gateway: GatewayPort, job: Job, params: AdapterParams) -> Job:
    """Refuse SLERP on a gallery served through a route (``check_slerp``: nothing is
    left behind), then take the sample and queue (``queue_job``)."""
    import asyncio

    try:
        await asyncio.to_thread(check_slerp, gateway.registry, job.gallery,
                                params.fit_config().slerp_t)
    except InvalidInput:
        await asyncio.to_thread(gateway.jobs.delete, job.id)
        raise
    return await queue_job(gateway, job, params)


def run(ctx: RunContext) -> dict[str, Any]:
    from training.upgrades.adapter.fit import fit_adapter

    p: AdapterParams = ctx.params
    registry = Registry(ctx.settings.registry_dir)
    gallery = registry.gallery(ctx.job.gallery)
    cfg = p.fit_config()
    check_slerp(registry, ctx.job.gallery, cfg.slerp_t)  # the gallery may have moved since
    ctx.heartbeat.progress = {"stage": "read sample"}
    roots = Roots.of(ctx.settings)
    sample, skipped = sources_of(read_sample(ctx.store.work_dir(ctx.job.id)),
                                 lambda path: roots.contains(os.path.realpath(path)),
                                 kept_originals(ctx.settings))
    ctx.heartbeat.check()
    candidate = fit_adapter(new_model(p.new, registry), sample, cfg, gallery.space, ctx.out,
                            old=registry.artifact(gallery.active), version_id=p.version_id,
                            device=ctx.settings.device, on_stage=_stage(ctx))
    outcome = admit(ctx, candidate)
    return {**outcome, "result": {"pairs": sample.counts(), "skipped": skipped}}


def _stage(ctx: RunContext) -> Any:
    def on_stage(stage: str) -> None:
        ctx.heartbeat.progress = {"stage": stage}
        ctx.heartbeat.check()
    return on_stage


def sources_of(snapshot: dict[str, Any], allowed: Callable[[str], bool],
               kept: Callable[[str], Any] | None = None,
               ) -> tuple[Any, dict[str, list[str]]]:
    """The fit's ``Sample`` from a gallery snapshot: an image pair where the item stores an
    image vector and its ``source`` opens under the allowed roots (without a ``source``:
    its kept original, through ``kept``, as a migration's backfill reads it); a text pair
    where it stores a text vector and has a ``caption`` (else its kept text). Items
    without a usable source are listed by id (the job record shows them), not fatal."""
    from PIL import Image

    from training.upgrades.adapter.fit import Sample

    ids, payloads = snapshot["ids"], snapshot["payloads"]
    origins = snapshot.get("origins") or [{} for _ in ids]
    sample, skipped = Sample(source=f"gallery sample of {len(ids)} items"), {"image": [],
                                                                              "text": []}
    image_rows, text_rows = [], []
    for row, n in enumerate(snapshot["image_rows"].tolist()):
        source = payloads[n].get("source")
        try:
            if source is None and origins[n].get("image") and kept is not None:
                sample.images.append(kept(str(origins[n]["image"])))
                image_rows.append(row)
                continue
            if not isinstance(source, str) or not allowed(source):
                raise ValueError(f"source {source!r} is not a path under the allowed roots")
            with Image.open(Path(source)) as im:
                sample.images.append(im.convert("RGB"))
            image_rows.append(row)
        except Exception:  # noqa: BLE001 - an unreadable source is reported by id
            skipped["image"].append(ids[n])
    for row, n in enumerate(snapshot["text_rows"].tolist()):
        caption = payloads[n].get("caption")
        if not (isinstance(caption, str) and caption.strip()):
            caption = origins[n].get("text")
        if isinstance(caption, str) and caption.strip():
            sample.texts.append(caption)
            text_rows.append(row)
        else:
            skipped["text"].append(ids[n])
    sample.image_old = snapshot["image"][image_rows] if image_rows else sample.image_old
    sample.text_old = snapshot["text"][text_rows] if text_rows else sample.text_old
    return sample, skipped


def kept_originals(settings: Any) -> Callable[[str], Any]:
    """Opens an item's kept original (or a path under the allowed roots) by its origin."""
    from service.state.paths import Roots
    from service.vectors.sources import SourceStore, open_origin_image

    sources, roots = SourceStore.of(settings), Roots.of(settings)
    return lambda uri: open_origin_image(uri, sources, roots)


KIND = JobKind("adapter", AdapterParams, run, start=start)
