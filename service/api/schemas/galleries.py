from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Json, StringConstraints
from pydantic.json_schema import WithJsonSchema

from service.api.schemas import inline_schema
from service.api.schemas.examples import INGEST_RESPONSE, ITEMS_REQUEST, examples
from service.runtime.serving import Serving
from service.state.registry import Event, GalleryRecord

GalleryName = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")]
Name = Annotated[str, StringConstraints(min_length=1, max_length=128)]
ItemId = Annotated[str, StringConstraints(min_length=1, max_length=256)]


class GalleryCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: GalleryName
    space: Name = Field(description="the embedding space the gallery's vectors live in")
    version: Name | None = Field(
        None, description="version that serves it; default: the newest native to the space")
    validation: str | None = Field(
        None, max_length=4096, description="held-out dataset (directory with manifest.jsonl, "
        "or a .jsonl/.csv manifest, as the workers see it, under an allowed root) that the "
        "compatibility gate evaluates candidates on")


class GalleryDeletedOut(BaseModel):
    name: str
    space: str
    active: str = Field(description="the version that served it last")
    deleted_by: str


class EventOut(BaseModel):
    action: str
    version: str
    previous: str | None
    by: str
    at: str
    reason: str | None
    forced: bool
    overrides: list[str]
    space: str | None = Field(None, description="migration events: the space it moved into")

    @classmethod
    def of(cls, event: Event) -> EventOut:
        return cls(**event.to_json())


class ServingOut(BaseModel):
    """What this gateway replica actually serves the gallery with right now."""

    version: str | None
    route: str | None
    problem: str | None


class GalleryOut(BaseModel):
    name: str
    space: str
    active: str
    created_at: str
    history: list[EventOut]
    serving: ServingOut | None = None
    items: int | None = Field(None, description="points stored (single-gallery reads only)")
    validation: str | None = None
    collection: str | None = Field(None, description="the Qdrant collection that serves "
                                                     "(null: the one behind the alias)")
    migration: dict[str, Any] | None = Field(None, description="an open migration: state, "
                                             "job, source and target spaces")

    @classmethod
    def of(cls, record: GalleryRecord, serving: Serving | None = None,
           items: int | None = None) -> GalleryOut:
        return cls(name=record.name, space=record.space, active=record.active,
                   created_at=record.created_at,
                   history=[EventOut.of(e) for e in record.history],
                   serving=_serving(serving) if serving else None, items=items,
                   validation=record.validation, collection=record.collection,
                   migration=_migration(record))


def _migration(record: GalleryRecord) -> dict[str, Any] | None:
    m = record.migration
    if m is None:
        return None
    return {"state": m.state, "job": m.job, "version": m.version,
            "source_space": m.source.space, "target_space": m.target.space}


def _serving(serving: Serving) -> ServingOut:
    embedder = serving.embedder
    problem = serving.stale or (serving.error.message if serving.error else None)
    return ServingOut(version=embedder.version if embedder else None,
                      route=embedder.route if embedder else None, problem=problem)


# Not blank: checked with the batch (usecases/items.py), stated here as well.
ItemText = Annotated[str, StringConstraints(max_length=10_000),
                     WithJsonSchema({"type": "string", "maxLength": 10_000, "pattern": r"\S"})]
# An item needs a text or an image (or both); a null counts as absent, as in search.
TEXT_OR_IMAGE: dict[str, Any] = {"anyOf": [
    {"properties": {"text": {"type": "string"}}, "required": ["text"]},
    {"properties": {"image_base64": {"type": "string"}}, "required": ["image_base64"]}]}


class ItemIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=TEXT_OR_IMAGE)

    id: ItemId
    text: ItemText | None = None
    image_base64: str | None = None
    payload: dict[str, Any] | None = Field(None, description="stored and returned with hits")


class ItemsIn(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=examples(ITEMS_REQUEST))

    items: list[ItemIn] = Field(min_length=1)


class IngestOut(BaseModel):
    model_config = ConfigDict(json_schema_extra=examples(INGEST_RESPONSE))

    gallery: str
    version: str
    space: str
    count: int


class DeleteIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ids: list[ItemId] = Field(
        min_length=1, max_length=10_000)


class DeleteOut(BaseModel):
    gallery: str
    deleted: int = Field(description="ids asked to delete (absent ids are not an error)")


class ItemsForm(BaseModel):
    """The non-file fields of a multipart ingest (the files are the ``images`` parts)."""

    model_config = ConfigDict(extra="forbid")

    ids: list[ItemId] | None = Field(None, description="one per image, in order; default: "
                                                       "the file names")
    payloads: Json[list[dict[str, Any] | None]] | None = Field(
        None, description="JSON array with one payload object (or null) per image")


def items_multipart_schema() -> dict[str, Any]:
    schema = inline_schema(ItemsForm)
    schema["properties"]["images"] = {"type": "array",
                                      "items": {"type": "string", "format": "binary"}}
    schema["required"] = ["images"]
    return schema
