from __future__ import annotations

from fastapi import APIRouter, Request

from service.api import API_V1, bodies
from service.api.deps import GatewayDep, ReaderDep
from service.api.schemas import inline_schema
from service.api.schemas.errors import error_responses
from service.api.schemas.search import (
    SEARCH_PATH,
    SearchForm,
    SearchRequest,
    SearchResponse,
    multipart_schema,
)
from service.state.config import Settings
from service.state.errors import InvalidInput
from service.usecases.media import from_base64
from service.usecases.search import Query, search

router = APIRouter(prefix=API_V1, tags=["search"])
BODY = {"requestBody": {"required": True, "content": {
    bodies.JSON: {"schema": inline_schema(SearchRequest)},
    bodies.MULTIPART: {"schema": multipart_schema()}}}}


@router.post(SEARCH_PATH.removeprefix(API_V1), response_model=SearchResponse,
             openapi_extra=BODY, responses=error_responses(415))
async def search_gallery(gallery: str, request: Request, gateway: GatewayDep,
                         _: ReaderDep) -> SearchResponse:
    """Search a gallery with a text or an image (base64 JSON, or multipart ``image`` file)."""
    if bodies.is_form(request):
        query = await _from_form(request, gateway.settings)
    else:
        query = _from_json(SearchRequest.model_validate_json(await request.body()),
                           gateway.settings)
    answer = await search(gateway, gallery, query)
    return SearchResponse.of(answer)


def _from_json(body: SearchRequest, settings: Settings) -> Query:
    image = (from_base64(body.image_base64, settings.max_image_bytes)
             if body.image_base64 is not None else None)
    return Query(body.text, image, body.kind, body.top_k, body.filter, body.hybrid,
                 body.rerank, body.rerank_k)


async def _from_form(request: Request, settings: Settings) -> Query:
    async with bodies.form(request) as form:
        fields = SearchForm.model_validate(bodies.text_fields(form))
        uploads = bodies.files(form, "image")
        if len(uploads) > 1:
            raise InvalidInput("send one image per search")
        image = await bodies.file_bytes(uploads[0], settings.max_image_bytes) if uploads else None
    return Query(fields.text, image, fields.kind, fields.top_k, fields.filter,
                 fields.hybrid == "true",
                 None if fields.rerank is None else fields.rerank == "true", fields.rerank_k)
