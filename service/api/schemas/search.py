from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Json,
    StrictBool,
    StrictInt,
    StrictStr,
    StringConstraints,
)

from service.api.schemas import inline_schema
from service.usecases.search import Answer

Kind = Literal["image", "text"]
FilterKey = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}$")]
Int64 = Annotated[StrictInt, Field(ge=-(2**63), le=2**63 - 1)]  # what Qdrant can match
Scalar = StrictStr | Int64 | StrictBool
# A list matches any of its values; Qdrant needs them all strings or all integers.
FilterValue = Scalar | Annotated[list[StrictStr], Field(min_length=1, max_length=100)] \
    | Annotated[list[Int64], Field(min_length=1, max_length=100)]
Where = Annotated[dict[FilterKey, FilterValue], Field(
    max_length=16, description="payload filter: every key must match; a list matches any")]
TEXT_MAX = 2000


class SearchRequest(BaseModel):
    """A JSON search: exactly one of ``text`` or ``image_base64``."""

    model_config = ConfigDict(extra="forbid")

    text: str | None = Field(None, max_length=TEXT_MAX, description="text query")
    image_base64: str | None = Field(None, description="image query, base64 or a data: URL")
    top_k: int = Field(10, ge=1, description="how many hits (at most the server's top_k_max)")
    kind: Kind = Field("image", description="which gallery items to return")
    filter: Where | None = None


class SearchForm(BaseModel):
    """The non-file fields of a multipart search (the image is the ``image`` file part)."""

    model_config = ConfigDict(extra="forbid")

    text: str | None = Field(None, max_length=TEXT_MAX)
    top_k: int = Field(10, ge=1)
    kind: Kind = "image"
    filter: Json[Where | None] | None = Field(None, description="payload filter, JSON text")


class HitOut(BaseModel):
    id: str
    score: float
    payload: dict[str, Any]
    version: str = Field(description="the version that embedded this gallery item")


class SearchResponse(BaseModel):
    gallery: str
    version: str = Field(description="the version that embedded the query")
    route: str = Field(description="how that version reached the gallery's space")
    space: str
    kind: Kind
    hits: list[HitOut]

    @classmethod
    def of(cls, answer: Answer) -> SearchResponse:
        hits = [HitOut(id=h.id, score=h.score, payload=h.payload, version=h.version)
                for h in answer.hits]
        return cls(gallery=answer.gallery, version=answer.version, route=answer.route,
                   space=answer.space, kind=answer.kind, hits=hits)  # type: ignore[arg-type]


def multipart_schema() -> dict[str, Any]:
    """OpenAPI schema of the multipart variant (FastAPI cannot derive it for this route)."""
    schema = inline_schema(SearchForm)
    schema["properties"]["image"] = {"type": "string", "format": "binary"}
    return schema
