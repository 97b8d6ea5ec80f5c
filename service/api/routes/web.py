"""The web page (``/`` and its assets under ``/web/``) and item thumbnails.

The page is a client of the public JSON API like any other; these routes only hand it
its files. Thumbnails live on disk beside the gallery (``service/thumbnails.py``) and
follow search's read-key rule, since they show what the gallery holds.
"""

from __future__ import annotations

from fastapi import APIRouter, Response

from service import web
from service.api import API_V1
from service.api.deps import GatewayDep, ReaderDep
from service.api.schemas.errors import error_responses
from service.state.errors import NotFound, shown
from service.usecases.items import read_thumbnail

router = APIRouter()
# Assets change with the gateway version: revalidate rather than cache blindly.
NO_CACHE = {"Cache-Control": "no-cache"}


@router.get("/", include_in_schema=False)
async def page() -> Response:
    """The single page; the tabs (search, models, jobs) are client-side."""
    return _static(web.PAGE, "text/html; charset=utf-8")


@router.get("/web/{name}", include_in_schema=False)
async def asset(name: str) -> Response:
    media_type = web.ASSETS.get(name)
    if media_type is None:
        raise NotFound(f"no web asset named '{shown(name)}'")
    return _static(name, media_type)


@router.get(API_V1 + "/galleries/{gallery}/items/{item_id:path}/thumbnail", tags=["items"],
            response_class=Response,
            responses={200: {"content": {"image/png": {}}, "description": "PNG thumbnail"},
                       **error_responses(401, 404, 413, 422, 500)})
async def thumbnail(gallery: str, item_id: str, gateway: GatewayDep, _: ReaderDep) -> Response:
    """A small PNG of an image item (made at ingest); 404 when the item has none."""
    png = await read_thumbnail(gateway, gallery, item_id)
    # Short: re-ingesting an item under the same id replaces its picture.
    return Response(png, media_type="image/png",
                    headers={"Cache-Control": "private, max-age=60"})


def _static(name: str, media_type: str) -> Response:
    body = web.read(name)
    if body is None:
        raise NotFound(f"no web file named {name!r}")
    return Response(body, media_type=media_type,
                    headers={**NO_CACHE, "Content-Security-Policy": web.CSP,
                             "X-Content-Type-Options": "nosniff"})
