"""An XBT upgrade (or the Direct baseline) of a new model into the gallery's space, gated
and registered as a candidate.

Stage 2 selects its checkpoint (``select_every``) on ``select_holdout`` of the job's paired
set, held out of training: never on the gallery's validation set, which the gate then
scores the chosen route on, so the gate stays a check on data the selection never saw.
The validation curve and the chosen step are in the job's ``result.selection`` (and in
the artifact's ``metrics.selection``). Each stage saves its state every
``checkpoint_every`` steps, so a job whose worker dies resumes where it saved."""

from __future__ import annotations

from typing import Any

from service.state.jobs.specs import ModelRef, XbtParams
from service.state.registry import Registry
from worker.admission import admit
from worker.context import JobContext
from worker.runners.ranks import checkpoint_dir, train_candidate


def run_xbt(ctx: JobContext) -> dict[str, Any]:
    from training.distributed import check_batches
    from training.xbt.config import XbtConfig
    from training.xbt.upgrade import upgrade

    p = XbtParams.model_validate(ctx.job.params)
    cfg = XbtConfig.from_dict(p.config)
    check_batches(p.gpus, batch_size=cfg.batch_size, pretrain_batch_size=cfg.pretrain_batch_size)
    registry = Registry(ctx.settings.registry_dir)
    gallery = registry.gallery(ctx.job.gallery)
    candidate = train_candidate(ctx, p.gpus, upgrade, old=registry.artifact(gallery.active),
                                new=new_model(p.new, registry), corpus=p.corpus,
                                pairs=ctx.open_dataset(p.pairs, "pairs"), out=ctx.out,
                                cfg=cfg, version_id=p.version_id,
                                target_space=gallery.space, show_progress=False,
                                checkpoint_dir=checkpoint_dir(ctx, p.checkpoint_every),
                                checkpoint_every=p.checkpoint_every)
    outcome = admit(ctx, candidate)
    selection = candidate.manifest.get("metrics", {}).get("selection")
    return {**outcome, "result": {"selection": selection}} if selection else outcome


def new_model(new: ModelRef, registry: Registry) -> Any:
    """The upgrade's NEW model: a registered version's artifact, or an open_clip spec."""
    from training.encoders import ModelSpec

    if new.version:
        return registry.artifact(new.version)
    if new.model_config_file:
        return ModelSpec.from_json(new.model_config_file, checkpoint=new.checkpoint)
    return ModelSpec(arch=new.arch, pretrained=new.pretrained, checkpoint=new.checkpoint)
