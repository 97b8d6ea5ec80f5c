"""Is a live response what the OpenAPI document declares? (shared by the spec and fuzz tests)

Schemathesis's checks, on responses of any client: for the request's operation the status
is declared, the media type is one declared for that status, and the body validates
against the declared schema.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
import schemathesis
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

CHECKS = [status_code_conformance, content_type_conformance, response_schema_conformance]


def load(spec: dict[str, Any]) -> Any:
    """The document as schemathesis reads it (parse once, check many responses)."""
    return schemathesis.openapi.from_dict(spec)


def operation_of(schema: Any, response: httpx.Response) -> Any:
    """The operation that answered, or None (an unknown path or method)."""
    request = response.request
    return schema.find_operation_by_path(request.method, request.url.path)


def problems(schema: Any, response: httpx.Response) -> list[str]:
    """Why ``response`` is not what the document declares (empty when it is)."""
    where = f"{response.request.method} {response.request.url.path} -> {response.status_code}"
    operation = operation_of(schema, response)
    if operation is None:  # no operation: an unknown path (404) or method (405), shaped
        return [] if response.status_code in (404, 405) and _is_error(response) else \
            [f"{where}: no operation, and not a shaped 404/405"]
    response.request.read()  # a multipart body is a stream; schemathesis reads it
    try:
        case = operation.Case(path_parameters=_parameters(operation.path, response))
        case.validate_response(response, checks=CHECKS)
    except FailureGroup as exc:
        return [f"{where}: {failure.title}" for failure in exc.exceptions]
    return []


def _parameters(template: str, response: httpx.Response) -> dict[str, str]:
    """The path parameters of the request (schemathesis names them in its reports)."""
    pattern = re.sub(r"\\\{(\w+)\\\}", r"(?P<\1>[^/]+)", re.escape(template))
    found = re.fullmatch(pattern, response.request.url.path)
    return found.groupdict() if found else {}


def _is_error(response: httpx.Response) -> bool:
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        return False
    return isinstance(error, dict) and {"code", "message"} <= set(error)
