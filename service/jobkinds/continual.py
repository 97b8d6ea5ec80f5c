"""The ``continual`` job: a continual phase (any registered strategy) from the gallery's
active version (or ``parent``), gated and registered as a candidate. It saves its training
state every ``checkpoint_every`` steps, so a job whose worker dies resumes where it saved."""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, Field

from service.jobkinds.admission import admit
from service.jobkinds.base import (
    JobKind,
    Params,
    RunContext,
    check_dataset,
    check_version,
    checkpoint_every_field,
    gpus_field,
)
from service.jobkinds.ranks import checkpoint_dir, train_candidate
from service.state.errors import InvalidInput
from service.state.paths import Roots
from service.state.registry import Registry
from training.errors import NobackfillError


class ContinualParams(Params):
    method: str = Field(description="a registered strategy: seqft, modx, ctp, dns, teir, ...")
    data: str = Field(description="dataset directory (manifest.jsonl) or manifest file")
    domain: str | None = Field(None, description="domain methods: train on this domain")
    language: str | None = Field(None, description="language methods: the language to add")
    parent: str | None = Field(None, validation_alias=AliasChoices("parent", "base"),
                               description="parent version (default: the gallery's active); "
                                           "'base' is accepted as its older name")
    steps: int = Field(200, ge=1, le=10_000_000)
    batch_size: int = Field(128, ge=2, le=65_536)
    seed: int = 0
    gpus: int = gpus_field()
    config: dict[str, Any] = Field(default_factory=dict, description="strategy config fields")
    version_id: str | None = Field(None, description="default: generated")
    validation: str | None = Field(None, description="gate data (default: the gallery's)")
    checkpoint_every: int = checkpoint_every_field()

    def check(self, registry: Registry, roots: Roots) -> None:
        from training.distributed import check_batches

        check_dataset(roots, self.data, "data")
        check_dataset(roots, self.validation, "validation")
        check_version(registry, self.parent, "parent")
        try:
            self.strategy_config()
            check_batches(self.gpus, batch_size=self.batch_size)
        except NobackfillError as exc:
            raise InvalidInput(f"continual job: {exc}") from exc

    def strategy_config(self) -> Any:
        """The strategy's config from ``config`` (strict: an unknown field is named)."""
        from training.continual import get_strategy

        return get_strategy(self.method).Config.from_dict(self.config)


def run(ctx: RunContext) -> dict[str, Any]:
    from training.continual.phase import run_phase
    from training.continual.strategy import PhaseOptions

    p: ContinualParams = ctx.params
    registry = Registry(ctx.settings.registry_dir)
    parent = registry.artifact(p.parent or registry.gallery(ctx.job.gallery).active)
    options = PhaseOptions(steps=p.steps, batch_size=p.batch_size, seed=p.seed, domain=p.domain,
                           language=p.language, version_id=p.version_id, show_progress=False,
                           checkpoint_dir=checkpoint_dir(ctx, p.checkpoint_every),
                           checkpoint_every=p.checkpoint_every)
    candidate = train_candidate(ctx, p.gpus, run_phase, parent=parent, method=p.method,
                                data=ctx.open_dataset(p.data, "data"), out=ctx.out,
                                config=p.strategy_config(), options=options)
    return admit(ctx, candidate, new_domain=p.domain, new_language=p.language)


KIND = JobKind("continual", ContinualParams, run)
