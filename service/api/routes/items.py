from __future__ import annotations

from fastapi import APIRouter, Request

from service.api import API_V1, bodies
from service.api.deps import AdminDep, GatewayDep
from service.api.schemas import inline_schema
from service.api.schemas.errors import error_responses
from service.api.schemas.galleries import (
    DeleteIn,
    DeleteOut,
    IngestOut,
    ItemIn,
    ItemsForm,
    ItemsIn,
    items_multipart_schema,
)
from service.state.config import Settings
from service.state.errors import InvalidInput
from service.usecases import items as use
from service.usecases.items import NewItem
from service.usecases.media import from_base64

router = APIRouter(prefix=API_V1 + "/galleries/{gallery}/items", tags=["items"])
BODY = {"requestBody": {"required": True, "content": {
    bodies.JSON: {"schema": inline_schema(ItemsIn)},
    bodies.MULTIPART: {"schema": items_multipart_schema()}}}}


@router.post("", response_model=IngestOut, openapi_extra=BODY, responses=error_responses(415))
async def add_items(gallery: str, request: Request, gateway: GatewayDep,
                    _: AdminDep) -> IngestOut:
    """Add or replace items (by id): JSON with texts and/or base64 images, or a multipart
    upload of ``images`` files with optional ``ids`` and ``payloads``."""
    use.known_gallery(gateway, gallery)
    if bodies.is_form(request):
        items = await _from_form(request, gateway.settings)
    else:
        body = ItemsIn.model_validate_json(await request.body())
        items = [_from_json(item, gateway.settings) for item in body.items]
    done = await use.add_items(gateway, gallery, items)
    return IngestOut(gallery=done.gallery, version=done.version, space=done.space,
                     count=done.count)


@router.post("/delete", response_model=DeleteOut)
async def delete_items(gallery: str, body: DeleteIn, gateway: GatewayDep,
                       _: AdminDep) -> DeleteOut:
    deleted = await use.delete_items(gateway, gallery, body.ids)
    return DeleteOut(gallery=gallery, deleted=deleted)


@router.delete("/{item_id}", response_model=DeleteOut)
async def delete_item(gallery: str, item_id: str, gateway: GatewayDep,
                      _: AdminDep) -> DeleteOut:
    deleted = await use.delete_items(gateway, gallery, [item_id])
    return DeleteOut(gallery=gallery, deleted=deleted)


def _from_json(item: ItemIn, settings: Settings) -> NewItem:
    image = (from_base64(item.image_base64, settings.max_image_bytes)
             if item.image_base64 is not None else None)
    return NewItem(item.id, item.text, image, item.payload)


async def _from_form(request: Request, settings: Settings) -> list[NewItem]:
    async with bodies.form(request) as form:
        uploads = bodies.files(form, "images")
        if not uploads:
            raise InvalidInput("a multipart upload needs one or more 'images' file parts")
        fields = ItemsForm.model_validate(bodies.text_fields(form, multi=("ids",)))
        ids = fields.ids or [u.filename or "" for u in uploads]
        payloads = fields.payloads or [None] * len(uploads)
        if not len(ids) == len(payloads) == len(uploads):
            raise InvalidInput(f"{len(uploads)} images but {len(ids)} ids and "
                               f"{len(payloads)} payloads; send one of each per image")
        if any(not i or len(i) > 256 for i in ids):
            raise InvalidInput("every item needs an id of 1 to 256 characters (file names "
                               "are the default ids)")
        images = [await bodies.file_bytes(u, settings.max_image_bytes) for u in uploads]
    return [NewItem(i, None, image, p)
            for i, image, p in zip(ids, images, payloads, strict=True)]
