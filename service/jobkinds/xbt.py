"""The ``xbt`` job: an upgrade of a new model into the gallery's space by any registered
upgrade method (``training.upgrades``: XBT, the Direct baseline, ...; ``config.method``,
default ``xbt``), gated and registered as a candidate.

Stage 2 selects its checkpoint (``select_every``) on ``select_holdout`` of the job's paired
set, held out of training: never on the gallery's validation set, which the gate then
scores the chosen route on, so the gate stays a check on data the selection never saw.
The validation curve and the chosen step are in the job's ``result.selection`` (and in
the artifact's ``metrics.selection``). Each stage saves its state every
``checkpoint_every`` steps, so a job whose worker dies resumes where it saved."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from service.jobkinds.admission import admit
from service.jobkinds.base import (
    SYNTH,
    JobKind,
    Params,
    RunContext,
    check_dataset,
    checkpoint_every_field,
    gpus_field,
)
from service.jobkinds.model_ref import ModelRef, new_model
from service.jobkinds.ranks import checkpoint_dir, train_candidate
from service.state.errors import InvalidInput
from service.state.paths import Roots
from service.state.registry import Registry
from training.errors import NobackfillError

DEFAULT_METHOD = "xbt"


class XbtParams(Params):
    new: ModelRef
    corpus: str = Field(description="stage 1 captions: a text file or synth:N")
    pairs: str = Field(description="paired image-caption set: dataset directory or manifest")
    config: dict[str, Any] = Field(default_factory=dict, description="the upgrade method's "
                                   "config fields (XbtConfig's for xbt and direct); 'method' "
                                   "names a registered upgrade method (default: xbt)")
    gpus: int = gpus_field()
    version_id: str | None = None
    validation: str | None = None
    checkpoint_every: int = checkpoint_every_field()

    def check(self, registry: Registry, roots: Roots) -> None:
        from training.distributed import check_batches

        check_dataset(roots, self.pairs, "pairs")
        check_dataset(roots, self.validation, "validation")
        if not self.corpus.startswith(SYNTH):
            roots.file(self.corpus, "xbt job: corpus (a text file or synth:N)")
        self.new.check(registry, roots, "xbt")
        try:
            cfg = self.method_config()
            batches = {name: getattr(cfg, name) for name in ("batch_size", "pretrain_batch_size")
                       if isinstance(getattr(cfg, name, None), int)}
            check_batches(self.gpus, **batches)
        except NobackfillError as exc:
            raise InvalidInput(f"xbt job: config: {exc}") from exc

    def method_config(self) -> Any:
        """The config of the upgrade method ``config.method`` names, resolved through the
        upgrade registry (strict: an unknown field, or an unknown method, is named)."""
        from training.upgrades import UPGRADES, get_upgrade

        name = self.config.get("method", DEFAULT_METHOD)
        known = isinstance(name, str) and name in UPGRADES
        # an unknown method is refused by the default method's config, which lists them
        return get_upgrade(name if known else DEFAULT_METHOD).Config.from_dict(self.config)


def run(ctx: RunContext) -> dict[str, Any]:
    from training.upgrades.run import upgrade

    p: XbtParams = ctx.params
    registry = Registry(ctx.settings.registry_dir)
    gallery = registry.gallery(ctx.job.gallery)
    candidate = train_candidate(ctx, p.gpus, upgrade, old=registry.artifact(gallery.active),
                                new=new_model(p.new, registry), corpus=p.corpus,
                                pairs=ctx.open_dataset(p.pairs, "pairs"), out=ctx.out,
                                cfg=p.method_config(), version_id=p.version_id,
                                target_space=gallery.space, show_progress=False,
                                checkpoint_dir=checkpoint_dir(ctx, p.checkpoint_every),
                                checkpoint_every=p.checkpoint_every)
    outcome = admit(ctx, candidate)
    selection = candidate.manifest.get("metrics", {}).get("selection")
    return {**outcome, "result": {"selection": selection}} if selection else outcome


KIND = JobKind("xbt", XbtParams, run)
