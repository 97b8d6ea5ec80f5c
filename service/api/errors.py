"""Errors become one JSON shape, ``{"error": {"code", "message"}}``, mapped here once.

Whatever a message repeats of the request (a field name, a dict key, a library's text)
goes through ``shown``: bounded and printable, never a whole 5,000-character input."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.routing import BaseRoute, Match

from service.state import errors as e
from service.state.errors import ServiceError, shown
from training.errors import NobackfillError

log = logging.getLogger(__name__)

STATUS: dict[type[ServiceError], int] = {
    e.NotFound: 404, e.Conflict: 409, e.InvalidInput: 422, e.TooLarge: 413,
    e.UnsupportedMedia: 415, e.Unauthorized: 401, e.Unavailable: 503, e.RegistryError: 500,
}
HTTP_CODES = {400: "bad_request", 401: "unauthorized", 404: "not_found",
              405: "method_not_allowed", 413: "too_large", 415: "unsupported_media_type",
              422: "invalid_request"}
MESSAGE_CHARS = 200  # pydantic's messages quote patterns and choices, never the input
LIBRARY_CHARS = 300  # the ML library names the artifact path it could not read
MAX_DETAILS = 20  # a 10,000-item body can fail 10,000 times; the first few say enough


def error_response(status: int, code: str, message: str,
                   details: list[dict] | None = None) -> JSONResponse:
    body: dict = {"code": code, "message": message}
    if details is not None:
        body["details"] = details
    return JSONResponse({"error": body}, status_code=status)


def status_of(exc: ServiceError) -> int:
    for cls in type(exc).__mro__:
        if cls in STATUS:
            return STATUS[cls]
    return 500


async def on_service_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceError)
    return error_response(status_of(exc), exc.code, exc.message)


async def on_library_error(request: Request, exc: Exception) -> JSONResponse:
    """The ML library rejected an artifact or model spec we were asked to use."""
    return error_response(422, "invalid_artifact", shown(exc, LIBRARY_CHARS))


async def on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, (RequestValidationError, ValidationError))
    details = [{"loc": [shown(p) for p in err.get("loc", ())],
                "msg": shown(err.get("msg", ""), MESSAGE_CHARS),
                "type": shown(err.get("type", ""))} for err in exc.errors()[:MAX_DETAILS]]
    first = details[0] if details else {"loc": [], "msg": "invalid request"}
    where = ".".join(first["loc"]) or "body"
    return error_response(422, "invalid_request", f"{where}: {first['msg']}", details)


async def on_http_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    code = HTTP_CODES.get(exc.status_code, "http_error")
    response = error_response(exc.status_code, code, str(exc.detail))
    response.headers.update(exc.headers or {})
    if exc.status_code == 405:
        response.headers["Allow"] = allowed_methods(request)
    return response


def allowed_methods(request: Request) -> str:
    """Every method some route answers at the request's path. Starlette's 405 names only
    the methods of the first route whose path matched (``Allow: POST`` where another
    route of the same path answers GET)."""
    scope = {"type": "http", "method": request.method, "path": request.scope["path"],
             "root_path": request.scope.get("root_path", "")}  # a bare copy: no side effects
    methods: set[str] = set()
    for route in routes_of(request.app.router.routes):
        answers = getattr(route, "methods", None)
        if answers and route.matches(dict(scope))[0] is not Match.NONE:
            methods |= set(answers)
    return ", ".join(sorted(methods))


def routes_of(routes: Iterable[BaseRoute]) -> Iterator[BaseRoute]:
    """Every route, those of included routers too (FastAPI keeps an included router as one
    entry; the app includes its routers without a prefix, so their own routes match)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from routes_of(inner.routes)
        else:
            yield route


async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal", "internal error; see the gateway log")


def install(app: FastAPI) -> None:
    app.add_exception_handler(ServiceError, on_service_error)
    app.add_exception_handler(NobackfillError, on_library_error)
    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(ValidationError, on_validation_error)
    app.add_exception_handler(HTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
