"""The new model of an upgrade job (``xbt``, ``adapter``): a registered version, or an
open_clip model spec."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, model_validator

from service.jobkinds.base import Params, check_version
from service.state.paths import Roots
from service.state.registry import Registry

SOURCES = ("version", "arch", "model_config")  # as the request names them
# "Exactly one of version, arch or model_config": a rule over three fields, stated in the
# schema as well as checked by ``_one_source``. Null or "" counts as absent (the check
# reads them so), hence a non-empty string in each branch.
ONE_SOURCE: dict[str, Any] = {"oneOf": [
    {"properties": {name: {"type": "string", "minLength": 1}}, "required": [name]}
    for name in SOURCES]}


class ModelRef(Params):
    """The new model of an upgrade: a registered version, or an open_clip model spec."""

    model_config = ConfigDict(json_schema_extra=ONE_SOURCE)

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
        check_version(registry, self.version, "new.version")
        for name in ("model_config_file", "checkpoint"):
            path = getattr(self, name)
            if path is not None:
                roots.file(path, f"{kind} job: new.{name.removesuffix('_file')}")


def new_model(new: ModelRef, registry: Registry) -> Any:
    """The upgrade's NEW model: a registered version's artifact, or an open_clip spec."""
    from training.encoders import ModelSpec

    if new.version:
        return registry.artifact(new.version)
    if new.model_config_file:
        return ModelSpec.from_json(new.model_config_file, checkpoint=new.checkpoint)
    return ModelSpec(arch=new.arch, pretrained=new.pretrained, checkpoint=new.checkpoint)
