"""Request counts and latency per route template, and the request-body guard.

Plain ASGI middlewares. ``ObserveRequests`` sees the final status even when a handler
raised, and labels by route template (``/v1/galleries/{gallery}/search``) and a fixed set
of methods, so the number of series stays bounded whatever clients send. ``GuardBodies``
checks a body while it arrives, below FastAPI, which reads and parses a declared body
before any dependency runs.
"""

from __future__ import annotations

import time

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.bodies import MULTIPART
from service.api.deps import check_key_first
from service.runtime.metrics import Metrics
from service.state.errors import Unauthorized

# RFC 9110's methods and PATCH; anything else a client invents is counted as OTHER.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "CONNECT",
                     "TRACE"})
OTHER_METHOD = "OTHER"
UNMATCHED = "unmatched"


def labels(scope: Scope) -> tuple[str, str]:
    """The (method, route) labels of a request: a known method or OTHER, and the matched
    route's template or ``unmatched`` (a raw path would be one series per URL probed)."""
    method = scope.get("method", "")
    path = getattr(scope.get("route"), "path", None)
    return (method if method in METHODS else OTHER_METHOD,
            path if isinstance(path, str) and path else UNMATCHED)


class ObserveRequests:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what is recorded if the app raises before responding

        async def observe(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, observe)
        finally:
            self._record(scope, status, time.perf_counter() - start)

    def _record(self, scope: Scope, status: int, seconds: float) -> None:
        method, route = labels(scope)
        self.metrics.requests.labels(method, route, str(status)).inc()
        self.metrics.latency.labels(method, route).observe(seconds)


class GuardBodies:
    """Refuses a body before it is buffered or parsed: past its size limit (413), counted
    as the bytes arrive, so a chunked body or a false Content-Length cannot bypass it; and
    on a route that needs a key, without a valid one (401), checked before the first byte
    is handed over, so an unauthenticated malformed body gets 401, not 422.

    The key comes first: a declared ``Content-Length`` over the limit is refused (413,
    nothing read) only after the route's key check passed, so a bad key gets 401 whatever
    size it declares. Both need the matched route, known once routing has run: they are
    made when the app first asks for the body (FastAPI's body reading; a route without a
    body never asks, and answers as if no body had been sent).

    Multipart uploads (spooled to disk by the form parser) may be up to
    ``max_request_bytes``; every other body (JSON, read whole into memory) up to
    ``max_json_bytes``. The refusal is raised as an ``HTTPException`` from ``receive``:
    FastAPI re-raises those from its body reading (any other error there becomes 400)."""

    def __init__(self, app: ASGIApp, max_request_bytes: int, max_json_bytes: int) -> None:
        self.app = app
        self.max_request_bytes = max_request_bytes
        self.max_json_bytes = min(max_json_bytes, max_request_bytes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        multipart = header(scope, b"content-type").split(";")[0].strip().lower() == MULTIPART
        limit = self.max_request_bytes if multipart else self.max_json_bytes
        await self.app(scope, CheckedBody(scope, receive, limit, multipart), send)


class CheckedBody:
    """A ``receive`` that, before the first body message, checks the caller's key and then
    the declared Content-Length, and counts the body's bytes, refusing it past ``limit``."""

    def __init__(self, scope: Scope, receive: Receive, limit: int, multipart: bool) -> None:
        self.scope = scope
        self.receive = receive
        self.limit = limit
        self.multipart = multipart
        self.seen = 0
        self.key_checked = False

    async def __call__(self) -> Message:
        if not self.key_checked:
            self.key_checked = True
            try:
                check_key_first(self.scope)  # routing has run: scope["route"] is known
            except Unauthorized as exc:
                raise HTTPException(401, exc.message) from exc
            declared = header(self.scope, b"content-length")
            if declared.isdigit() and int(declared) > self.limit:  # refused before reading
                raise HTTPException(413, too_large(self.limit, self.multipart))
        message = await self.receive()
        if message["type"] != "http.request":
            return message
        self.seen += len(message.get("body", b""))
        if self.seen > self.limit:
            raise HTTPException(413, too_large(self.limit, self.multipart))
        return message


def header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", ()):
        if key == name:
            return value.decode("latin-1")
    return ""


def too_large(limit: int, multipart: bool) -> str:
    if multipart:
        return f"the request body is over the {limit}-byte limit of uploads"
    return (f"the request body is over the {limit}-byte limit of JSON bodies; send large "
            f"images as {MULTIPART}")
