"""One runner per job kind. Each parses the job's parameters, calls one ``training`` entry
point with the job's progress callback, and hands the result on; none knows Celery."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.jobs.specs import ContinualParams, EvaluateParams, IngestParams, XbtParams
from service.registry import Registry
from worker.candidate import admit, gate_report, promote_if_passed
from worker.run import JobContext


def run_continual(ctx: JobContext) -> dict[str, Any]:
    from training.continual import get_strategy
    from training.continual.phase import run_phase
    from training.continual.strategy import PhaseOptions
    from training.data import open_dataset

    p = ContinualParams.model_validate(ctx.job.params)
    registry = Registry(ctx.settings.registry_dir)
    parent = registry.artifact(p.base or registry.gallery(ctx.job.gallery).active)
    options = PhaseOptions(steps=p.steps, batch_size=p.batch_size, seed=p.seed, domain=p.domain,
                           language=p.language, version_id=p.version_id,
                           device=ctx.settings.device, show_progress=False)
    candidate = run_phase(parent, p.method, open_dataset(p.data), ctx.out,
                          get_strategy(p.method).Config.from_dict(p.config), options,
                          on_progress=ctx.heartbeat.report)
    return admit(ctx, candidate, new_domain=p.domain, new_language=p.language)


def run_xbt(ctx: JobContext) -> dict[str, Any]:
    from training.data import open_dataset
    from training.xbt.config import XbtConfig
    from training.xbt.upgrade import upgrade

    p = XbtParams.model_validate(ctx.job.params)
    registry = Registry(ctx.settings.registry_dir)
    gallery = registry.gallery(ctx.job.gallery)
    candidate = upgrade(registry.artifact(gallery.active), _new_model(p, registry), p.corpus,
                        open_dataset(p.pairs), ctx.out, XbtConfig(**p.config),
                        version_id=p.version_id, target_space=gallery.space,
                        device=ctx.settings.device, show_progress=False,
                        on_progress=ctx.heartbeat.report)
    return admit(ctx, candidate)


def _new_model(p: XbtParams, registry: Registry) -> Any:
    from training.encoders import ModelSpec

    new = p.new
    if new.version:
        return registry.artifact(new.version)
    if new.model_config_file:
        return ModelSpec.from_json(new.model_config_file, checkpoint=new.checkpoint)
    return ModelSpec(arch=new.arch, pretrained=new.pretrained, checkpoint=new.checkpoint)


def run_evaluate(ctx: JobContext) -> dict[str, Any]:
    """Gate an already registered version against the gallery; store the report with it."""
    p = EvaluateParams.model_validate(ctx.job.params)
    registry = Registry(ctx.settings.registry_dir)
    gallery = registry.gallery(ctx.job.gallery)
    report = gate_report(ctx, registry, gallery, registry.artifact(p.version))
    registry.set_gate(p.version, report)
    return {"version": p.version, "gate": report,
            "promoted": promote_if_passed(ctx, registry, p.version, report)}


def run_ingest(ctx: JobContext) -> dict[str, Any]:
    """Embed a manifest's items with the gallery's active route and upsert them by id."""
    from service.gallery import GalleryStore, open_qdrant
    from training.data import open_dataset
    from worker.ingest import ingest_dataset

    p = IngestParams.model_validate(ctx.job.params)
    registry = Registry(ctx.settings.registry_dir)
    store = GalleryStore(open_qdrant(ctx.settings), serialise=ctx.settings.qdrant_url is None)
    try:
        count = ingest_dataset(ctx, registry, store, open_dataset(p.manifest), p)
    finally:
        store.close()
    return {"result": {"items": count}}


RUNNERS: dict[str, Callable[[JobContext], dict[str, Any]]] = {
    "continual": run_continual, "xbt": run_xbt, "evaluate": run_evaluate, "ingest": run_ingest}
