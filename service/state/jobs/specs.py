"""The one table of job kinds (``JOB_KINDS``): what each kind takes, and the checks made
at submission, before anything is queued. The API schema, the job store and the
worker's runners all read their list of kinds from here.

Paths are as the workers see them (the registry/data volume every process shares).
A bad parameter (unknown method, missing dataset, unknown version, invalid config
value) raises ``InvalidInput`` (422) here, so a job that is queued can only fail for
reasons that show up while it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, model_validator

from service.state.errors import InvalidInput, NotFound
from service.state.registry import Registry
from training.errors import NobackfillError

SYNTH = "synth:"


class Params(BaseModel):
    """A job kind's parameters; ``check`` looks at what exists (files, versions)."""

    model_config = ConfigDict(extra="forbid")

    def check(self, registry: Registry) -> None:
        """InvalidInput naming the first parameter that points at nothing usable."""


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
    config: dict[str, Any] = Field(default_factory=dict, description="strategy config fields")
    version_id: str | None = Field(None, description="default: generated")
    validation: str | None = Field(None, description="gate data (default: the gallery's)")

    def check(self, registry: Registry) -> None:
        from training.continual import get_strategy

        _dataset(self.data, "data")
        _dataset(self.validation, "validation")
        _version(registry, self.parent, "parent")
        try:
            get_strategy(self.method).Config.from_dict(self.config)
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


class XbtParams(Params):
    new: ModelRef
    corpus: str = Field(description="stage 1 captions: a text file or synth:N")
    pairs: str = Field(description="paired image-caption set: dataset directory or manifest")
    config: dict[str, Any] = Field(default_factory=dict, description="XbtConfig fields")
    version_id: str | None = None
    validation: str | None = None

    def check(self, registry: Registry) -> None:
        from training.xbt.config import XbtConfig

        _dataset(self.pairs, "pairs")
        _dataset(self.validation, "validation")
        if not self.corpus.startswith(SYNTH) and not Path(self.corpus).is_file():
            raise InvalidInput(f"xbt job: corpus {self.corpus!r} is neither a file nor synth:N")
        _version(registry, self.new.version, "new.version")
        for name in ("model_config_file", "checkpoint"):
            path = getattr(self.new, name)
            if path is not None and not Path(path).is_file():
                raise InvalidInput(f"xbt job: new.{name.removesuffix('_file')} file not "
                                   f"found: {path}")
        try:
            XbtConfig.from_dict(self.config)  # strict: an unknown field is named
        except NobackfillError as exc:
            raise InvalidInput(f"xbt job: config: {exc}") from exc


class EvaluateParams(Params):
    version: str = Field(description="the candidate version to gate against the gallery")
    validation: str | None = None

    def check(self, registry: Registry) -> None:
        _version(registry, self.version, "version")
        _dataset(self.validation, "validation")


class IngestParams(Params):
    manifest: str = Field(description="dataset directory or manifest of items to add")
    kinds: list[Literal["image", "text"]] = Field(default_factory=lambda: ["image"])
    language: str = "en"
    batch_size: int = Field(64, ge=1, le=4096)

    def check(self, registry: Registry) -> None:
        _dataset(self.manifest, "manifest")


# The one table of job kinds: name -> parameters (with their checks). The worker maps the
# same names to runners and refuses to start if the two tables differ.
JOB_KINDS: dict[str, type[Params]] = {"continual": ContinualParams, "xbt": XbtParams,
                                      "evaluate": EvaluateParams, "ingest": IngestParams}


def parse_params(kind: str, params: dict[str, Any]) -> Params:
    if kind not in JOB_KINDS:
        raise InvalidInput(f"unknown job kind {kind[:40]!r}; kinds: {', '.join(JOB_KINDS)}")
    try:
        return JOB_KINDS[kind].model_validate(params)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "params"
        raise InvalidInput(f"{kind} job: params.{where}: {first.get('msg')}") from exc


def check_job(kind: str, gallery: str, params: dict[str, Any], registry: Registry) -> Params:
    """Parse and check a submission; InvalidInput names the first problem."""
    parsed = parse_params(kind, params)
    try:
        registry.gallery(gallery)
    except NotFound as exc:
        raise InvalidInput(f"{kind} job: {exc.message}") from exc
    parsed.check(registry)
    return parsed


def _dataset(path: str | None, name: str) -> None:
    """A dataset directory holding manifest.jsonl, or a manifest file (JSONL/CSV)."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        target = target / "manifest.jsonl"
    if not target.is_file():
        raise InvalidInput(f"{name}: no dataset at {path} (a directory with manifest.jsonl, "
                           f"or a JSONL/CSV manifest)")


def _version(registry: Registry, version: str | None, name: str) -> None:
    if version is None:
        return
    try:
        registry.version(version)
    except NotFound as exc:
        raise InvalidInput(f"{name}: {exc.message}") from exc
