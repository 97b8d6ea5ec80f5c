"""A continual phase (any registered strategy) from the gallery's active version (or
``parent``), gated and registered as a candidate. It saves its training state every
``checkpoint_every`` steps, so a job whose worker dies resumes where it saved."""

from __future__ import annotations

from typing import Any

from service.state.jobs.specs import ContinualParams
from service.state.registry import Registry
from worker.admission import admit
from worker.context import JobContext
from worker.runners.ranks import checkpoint_dir, train_candidate


def run_continual(ctx: JobContext) -> dict[str, Any]:
    from training.continual import get_strategy
    from training.continual.phase import run_phase
    from training.continual.strategy import PhaseOptions
    from training.distributed import check_batches

    p = ContinualParams.model_validate(ctx.job.params)
    registry = Registry(ctx.settings.registry_dir)
    parent = registry.artifact(p.parent or registry.gallery(ctx.job.gallery).active)
    check_batches(p.gpus, batch_size=p.batch_size)
    options = PhaseOptions(steps=p.steps, batch_size=p.batch_size, seed=p.seed, domain=p.domain,
                           language=p.language, version_id=p.version_id, show_progress=False,
                           checkpoint_dir=checkpoint_dir(ctx, p.checkpoint_every),
                           checkpoint_every=p.checkpoint_every)
    candidate = train_candidate(ctx, p.gpus, run_phase, parent=parent, method=p.method,
                                data=ctx.open_dataset(p.data, "data"), out=ctx.out,
                                config=get_strategy(p.method).Config.from_dict(p.config),
                                options=options)
    return admit(ctx, candidate, new_domain=p.domain, new_language=p.language)
