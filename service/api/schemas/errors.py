from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: list[dict[str, Any]] | None = None


class ErrorBody(BaseModel):
    """Every error response has this shape."""

    error: ErrorDetail


WHY: dict[int, str] = {
    400: "The body could not be read (e.g. not UTF-8, a multipart body without a boundary "
         "or with a form field over 1 MiB)",
    401: "A key is missing or wrong (X-API-Key header)",
    404: "No such gallery, version, job, item or path",
    409: "Conflicts with the current state (exists already, wrong space, gate failed, "
         "job finished)",
    413: "The body, an upload or an image is over its limit",
    415: "The body is neither JSON nor multipart/form-data",
    422: "The request is invalid (schema, image, parameters)",
    500: "Internal error (see the gateway log)",
    503: "Not ready, or a dependency (model, Qdrant, job queue) is unavailable",
}
ANY = (413, 500)  # any request: a body over the limit, an internal error
API = (*ANY, 401, 404, 422, 503)  # every /v1 route
BODY = (400, 409)  # /v1 routes that read or change state: a body FastAPI parses, conflicts


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` declaring ``statuses`` with the error body (``ErrorBody``): the
    document lists every status the service answers, not only 2xx and 422."""
    return {status: {"model": ErrorBody, "description": WHY[status]}
            for status in sorted(set(statuses))}
