"""Request counts and latency per route template, and the request-size guard.

A plain ASGI middleware: it sees the final status even when a handler raised, and
labels by route template (``/v1/galleries/{gallery}/search``) so label sets stay small.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import error_response
from service.runtime.metrics import Metrics


class ObserveRequests:
    def __init__(self, app: ASGIApp, metrics: Metrics, max_request_bytes: int) -> None:
        self.app = app
        self.metrics = metrics
        self.max_request_bytes = max_request_bytes

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
            if self._too_large(scope):
                await error_response(413, "too_large", f"request body is over "
                                     f"{self.max_request_bytes} bytes")(scope, receive, observe)
            else:
                await self.app(scope, receive, observe)
        finally:
            self._record(scope, status, time.perf_counter() - start)

    def _too_large(self, scope: Scope) -> bool:
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    return int(value) > self.max_request_bytes
                except ValueError:
                    return False
        return False

    def _record(self, scope: Scope, status: int, seconds: float) -> None:
        route = scope.get("route")
        path = getattr(route, "path", None) or "unmatched"
        method = scope.get("method", "")
        self.metrics.requests.labels(method, path, str(status)).inc()
        self.metrics.latency.labels(method, path).observe(seconds)
