"""The one table of job kinds (``JOB_KINDS``): what each kind takes, and the checks made
at submission, before anything is queued. The API schema, the job store and the
worker's runners all read their list of kinds from here.

Paths are as the workers see them (the registry/data volume every process shares), and
must lie under the allowed roots (``service.state.paths``): a dataset's manifest and every
image it names, a corpus, a checkpoint. A bad parameter (unknown method, missing dataset,
path outside the roots, unknown version, invalid config value) raises ``InvalidInput``
(422) here, so a job that is queued can only fail for reasons that show up while it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, model_validator

from service.state.errors import InvalidInput, NotFound
from service.state.gallery.sample import take_sample, write_sample
from service.state.gallery.store import GalleryStore
from service.state.paths import Roots
from service.state.registry import Registry
from training.errors import NobackfillError

SYNTH = "synth:"


class Params(BaseModel):
    """A job kind's parameters; ``check`` looks at what exists (files, versions)."""

    model_config = ConfigDict(extra="forbid")

    def check(self, registry: Registry, roots: Roots) -> None:
        """InvalidInput naming the first parameter that points at nothing usable (or
        outside ``roots``)."""

    def snapshot(self, store: GalleryStore, gallery: str, work: Path) -> None:
        """Inputs the worker needs from the gallery store, written beside the job at
        submission by the process that owns the store (most kinds need none)."""


def checkpoint_every_field() -> Any:
    """``checkpoint_every`` of the training jobs: a job whose worker dies resumes."""
    return Field(100, ge=0, le=10_000_000, description="steps between saves of the whole "
                 "training state (rank 0, in the job's work directory; an XBT stage 2 that "
                 "selects saves at every selection point): a job whose worker dies after a "
                 "save is queued again and resumes from it, up to 3 starts; 0: no saves (a "
                 "killed job fails)")


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
    gpus: int = Field(1, ge=1, le=64, description="GPUs (ranks) of the worker host this job "
                      "trains on, data-parallel; on a host without CUDA, CPU processes (gloo)")
    config: dict[str, Any] = Field(default_factory=dict, description="strategy config fields")
    version_id: str | None = Field(None, description="default: generated")
    validation: str | None = Field(None, description="gate data (default: the gallery's)")
    checkpoint_every: int = checkpoint_every_field()

    def check(self, registry: Registry, roots: Roots) -> None:
        from training.continual import get_strategy
        from training.distributed import check_batches

        _dataset(roots, self.data, "data")
        _dataset(roots, self.validation, "validation")
        _version(registry, self.parent, "parent")
        try:
            get_strategy(self.method).Config.from_dict(self.config)
            check_batches(self.gpus, batch_size=self.batch_size)
        except NobackfillError as exc:
            raise InvalidInput(f"continual job: {exc}") from exc


class ModelRef(Params):
    """The new model of an upgrade: a registered version, or an open_clip model spec."""

    version: str | None = None
    arch: str | None = None
    pretrained: str | None = None
    checkpoint: str | None = None
    model_config_file: str | None = Field(None, alias="model_config")

    @model_validator(mode="after")
    def _one_source(self) -> ModelRef:
        given = [n for n in ("version", "arch", "model_config_file") if getattr(self, n)]
        if len(given) != 1:
            raise ValueError("give the new model as exactly one of version, arch or "
                             "model_config")
        return self

    def check(self, registry: Registry, roots: Roots, kind: str = "") -> None:  # type: ignore[override]
        _version(registry, self.version, "new.version")
        for name in ("model_config_file", "checkpoint"):
            path = getattr(self, name)
            if path is not None:
                roots.file(path, f"{kind} job: new.{name.removesuffix('_file')}")


class XbtParams(Params):
    new: ModelRef
    corpus: str = Field(description="stage 1 captions: a text file or synth:N")
    pairs: str = Field(description="paired image-caption set: dataset directory or manifest")
    config: dict[str, Any] = Field(default_factory=dict, description="XbtConfig fields")
    gpus: int = Field(1, ge=1, le=64, description="GPUs (ranks) of the worker host this job "
                      "trains on, data-parallel; on a host without CUDA, CPU processes (gloo)")
    version_id: str | None = None
    validation: str | None = None
    checkpoint_every: int = checkpoint_every_field()

    def check(self, registry: Registry, roots: Roots) -> None:
        from training.distributed import check_batches
        from training.xbt.config import XbtConfig

        _dataset(roots, self.pairs, "pairs")
        _dataset(roots, self.validation, "validation")
        if not self.corpus.startswith(SYNTH):
            roots.file(self.corpus, "xbt job: corpus (a text file or synth:N)")
        self.new.check(registry, roots, "xbt")
        try:
            cfg = XbtConfig.from_dict(self.config)  # strict: an unknown field is named
            check_batches(self.gpus, batch_size=cfg.batch_size,
                          pretrain_batch_size=cfg.pretrain_batch_size)
        except NobackfillError as exc:
            raise InvalidInput(f"xbt job: config: {exc}") from exc


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
        from training.adapters import AdapterFitConfig

        _dataset(roots, self.validation, "validation")
        self.new.check(registry, roots, "adapter")
        try:
            AdapterFitConfig.from_dict(self.config)
        except NobackfillError as exc:
            raise InvalidInput(f"adapter job: config: {exc}") from exc

    def snapshot(self, store: GalleryStore, gallery: str, work: Path) -> None:
        """The sample, taken by the process that owns the gallery store, beside the job."""
        sample = take_sample(store, gallery, self.sample, self.seed)
        if len(sample["ids"]) < 2:
            raise InvalidInput(f"adapter job: gallery '{gallery}' holds {len(sample['ids'])} "
                               f"item(s); an adapter is fitted on at least 2")
        write_sample(sample, work)


class EvaluateParams(Params):
    version: str = Field(description="the candidate version to gate against the gallery")
    validation: str | None = None

    def check(self, registry: Registry, roots: Roots) -> None:
        _version(registry, self.version, "version")
        _dataset(roots, self.validation, "validation")


class IngestParams(Params):
    manifest: str = Field(description="dataset directory or manifest of items to add")
    kinds: list[Literal["image", "text"]] = Field(default_factory=lambda: ["image"])
    language: str = "en"
    batch_size: int = Field(64, ge=1, le=4096)

    def check(self, registry: Registry, roots: Roots) -> None:
        _dataset(roots, self.manifest, "manifest")


class MigrateParams(Params):
    """Re-embed every item of the gallery with its active version natively, into a new
    side (collection) in that version's space, then switch (``service.usecases.migration``)."""

    shards: int = Field(2, ge=1, le=256, description="ranges of the items that workers "
                                                     "backfill at once, each resumable")
    batch_size: int = Field(64, ge=1, le=4096, description="items per forward")
    rate_limit: float | None = Field(None, ge=0, description="items/s over all shards, so a "
                                     "backfill does not starve searches on a shared host; 0: "
                                     "none; default: the NOBACKFILL_MIGRATION_RATE_LIMIT setting")
    auto_switch: bool = Field(True, description="switch when every item has its new vector "
                                                "and the gate passes")
    validation: str | None = Field(None, description="gate data (default: the gallery's)")

    def check(self, registry: Registry, roots: Roots) -> None:
        _dataset(roots, self.validation, "validation")


# The one table of job kinds: name -> parameters (with their checks). The worker maps the
# same names to runners and refuses to start if the two tables differ.
JOB_KINDS: dict[str, type[Params]] = {"continual": ContinualParams, "xbt": XbtParams,
                                      "adapter": AdapterParams, "evaluate": EvaluateParams,
                                      "ingest": IngestParams, "migrate": MigrateParams}


def parse_params(kind: str, params: dict[str, Any]) -> Params:
    if kind not in JOB_KINDS:
        raise InvalidInput(f"unknown job kind {kind[:40]!r}; kinds: {', '.join(JOB_KINDS)}")
    try:
        return JOB_KINDS[kind].model_validate(params)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "params"
        raise InvalidInput(f"{kind} job: params.{where}: {first.get('msg')}") from exc


def check_job(kind: str, gallery: str, params: dict[str, Any], registry: Registry,
              roots: Roots) -> Params:
    """Parse and check a submission; InvalidInput names the first problem."""
    parsed = parse_params(kind, params)
    try:
        registry.gallery(gallery)
    except NotFound as exc:
        raise InvalidInput(f"{kind} job: {exc.message}") from exc
    parsed.check(registry, roots)
    return parsed


def _dataset(roots: Roots, path: str | None, name: str) -> None:
    """A dataset under the roots (its manifest and every image the manifest names)."""
    if path is not None:
        roots.dataset(path, name)


def _version(registry: Registry, version: str | None, name: str) -> None:
    if version is None:
        return
    try:
        registry.version(version)
    except NotFound as exc:
        raise InvalidInput(f"{name}: {exc.message}") from exc
