from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Json,
    Strict,
    StrictBool,
    StrictInt,
    StrictStr,
    StringConstraints,
)
from pydantic.json_schema import WithJsonSchema

from service.api.schemas import inline_schema
from service.api.schemas.examples import SEARCH_REQUEST, SEARCH_RESPONSE, examples
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
TOP_K_CAP = 10_000  # the largest top_k_max a server may be configured with
SEARCH_PATH = "/v1/galleries/{gallery}/search"
HYBRID = ("while the gallery migrates: score each item by both sides (the new model's query "
          "against the new side plus the routed query against the old side); 409 without "
          "a migration. An item one side does not hold yet (not re-embedded yet) is scored "
          "there by the least-squares line from the other side's score, fitted on this "
          "query's candidates both sides hold, so it ranks neither behind nor ahead of "
          "re-embedded items of equal merit. Two query embeddings and two searches: more "
          "latency")
RERANK = ("while the gallery migrates and its new side does not serve yet: the route's top "
          "rerank_k candidates ranked by the new model (their new vectors read from the new "
          "side, or embedded now from each item's kept source and written there); a "
          "candidate without one (unreadable source, or still embedding when "
          "rerank_budget_ms ran out, or past the search's embedding limit, "
          "rerank_embed_max_per_request) keeps its place in the route's order. Omitted: as the "
          "migration's serving mode says; false: the route's order; 409 without such a "
          "migration")
RERANK_K = ("candidates the new model ranks: at least top_k and at most the server's "
            "rerank_k_max (default 100), else 422. Omitted: the migration's, else the "
            "server's rerank_k (20), raised to top_k and cut to rerank_k_max (the rest of "
            "top_k then follows in the route's order)")
# Not blank: checked where the query is built (usecases/search.py), stated here as well.
Text = Annotated[str, StringConstraints(max_length=TEXT_MAX),
                 WithJsonSchema({"type": "string", "maxLength": TEXT_MAX, "pattern": r"\S"})]
TopK = Annotated[int, Field(ge=1, le=TOP_K_CAP, description="how many hits: at most the "
                            "server's top_k_max (default 100; this document states this "
                            "server's as the maximum)")]
# "Exactly one of text or image": a rule over two fields, which pydantic cannot derive.
# A null counts as absent (the server treats it so), hence the type in each branch.
ONE_QUERY: dict[str, Any] = {"oneOf": [
    {"properties": {"text": {"type": "string"}}, "required": ["text"]},
    {"properties": {"image_base64": {"type": "string"}}, "required": ["image_base64"]}]}


class SearchRequest(BaseModel):
    """A JSON search: exactly one of ``text`` or ``image_base64``."""

    model_config = ConfigDict(extra="forbid",
                              json_schema_extra={**ONE_QUERY, **examples(SEARCH_REQUEST)})

    text: Text | None = Field(None, description="text query")
    image_base64: str | None = Field(None, description="image query, base64 or a data: URL")
    # Strict: "10" and true (which lax parsing reads as 1) are refused, as the schema says.
    top_k: Annotated[TopK, Strict()] = 10
    kind: Kind = Field("image", description="which gallery items to return")
    filter: Where | None = None
    hybrid: StrictBool = Field(False, description=HYBRID)
    rerank: StrictBool | None = Field(None, description=RERANK)
    rerank_k: Annotated[int, Strict(), Field(ge=1, le=1000)] | None = Field(
        None, description=RERANK_K)


def digits(value: Any) -> Any:
    """A form field's text as an integer when it is plain ASCII digits, so that "5.0",
    " 5 ", "+5" or "5_0" stay text and the strict integer refuses them (a number of more
    than 12 digits is over any bound: it is not converted whole)."""
    if isinstance(value, str) and re.fullmatch(r"[0-9]+", value):
        return int(value) if len(value) <= 12 else 10**12
    return value


class SearchForm(BaseModel):
    """The non-file fields of a multipart search (the image is the ``image`` file part);
    every field arrives as text, so top_k is read from its digits, and only from digits:
    as strict as the JSON route."""

    model_config = ConfigDict(extra="forbid")

    text: Text | None = None
    top_k: Annotated[TopK, Strict(), BeforeValidator(digits)] = 10
    kind: Kind = "image"
    filter: Json[Where | None] | None = Field(None, description="payload filter, JSON text")
    hybrid: Literal["true", "false"] = Field("false", description=HYBRID)
    rerank: Literal["true", "false"] | None = Field(None, description=RERANK)
    rerank_k: Annotated[int, BeforeValidator(digits), Strict(), Field(ge=1, le=1000)] | None \
        = Field(None, description=RERANK_K)


class HitOut(BaseModel):
    id: str
    score: float
    payload: dict[str, Any]
    version: str = Field(description="the version that embedded this gallery item (with "
                                     "hybrid: on the serving side where that side found "
                                     "it, else on the side that did)")
    space: str = Field(description="the space of its stored vector (the answer's; with "
                                   "hybrid: the serving side's where that side found it, "
                                   "else the other side's)")


class SearchResponse(BaseModel):
    model_config = ConfigDict(json_schema_extra=examples(SEARCH_RESPONSE))

    gallery: str
    version: str = Field(description="the version that embedded the query")
    route: str = Field(description="how that version reached the gallery's space")
    space: str
    kind: Kind
    hits: list[HitOut]
    reranked: dict[str, Any] | None = Field(None, description=(
        "with route 'rerank': k, read (new vectors read from the new side), embedded "
        "(embedded now and written there), kept_route_place (ids that kept the route's "
        "place: no new vector), over_budget (of those, still embedding when the budget ran "
        "out), embeds_refused (of those, not embedded: past the search's embedding "
        "limit), budget_ms, stages_ms (where the search's time went: query, candidates, "
        "read, wait, and of the embeddings it waited on decode and forward)"))

    @classmethod
    def of(cls, answer: Answer) -> SearchResponse:
        hits = [HitOut(id=h.id, score=h.score, payload=h.payload, version=h.version, space=h.space)
                for h in answer.hits]
        return cls(gallery=answer.gallery, version=answer.version, route=answer.route,
                   space=answer.space, kind=answer.kind, hits=hits,  # type: ignore[arg-type]
                   reranked=answer.reranked)


def multipart_schema() -> dict[str, Any]:
    """OpenAPI schema of the multipart variant (FastAPI cannot derive it for this route),
    with the same one-of rule as the JSON variant: a text field or an image file."""
    schema = inline_schema(SearchForm)
    schema["properties"]["image"] = {"type": "string", "format": "binary"}
    schema["oneOf"] = [{"required": ["text"]}, {"required": ["image"]}]
    return schema


def state_top_k_max(document: dict[str, Any], top_k_max: int) -> None:
    """Write this server's ``top_k_max`` into the search body schemas of an OpenAPI
    document: the models are static, the bound is a setting."""
    operation = document.get("paths", {}).get(SEARCH_PATH, {}).get("post", {})
    for content in operation.get("requestBody", {}).get("content", {}).values():
        content["schema"]["properties"]["top_k"]["maximum"] = top_k_max
