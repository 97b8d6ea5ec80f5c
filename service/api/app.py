"""The FastAPI app: every route under /v1, health and the web page (``python -m service``,
or ``uvicorn service.api.app:app``; settings from ``NOBACKFILL_*``).

Models load in the lifespan, never at import. Run one worker process: the embedded
Qdrant allows a single process per path.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI

import training
from service.api import errors
from service.api.deps import key_checks, require_admin, require_reader
from service.api.errors import routes_of
from service.api.middleware import GuardBodies, ObserveRequests
from service.api.routes import (
    galleries,
    health,
    items,
    jobs,
    migrations,
    models,
    plans,
    search,
    web,
)
from service.api.schemas.errors import ANY, API, BODY, error_responses
from service.api.schemas.examples import restore_nulls
from service.api.schemas.search import state_top_k_max
from service.runtime import heap
from service.runtime.gateway import open_gateway
from service.runtime.metrics import Metrics
from service.runtime.serving import EncoderLoader, Runtime
from service.runtime.threads import limit_blas_threads
from service.runtime.watcher import watch_registry
from service.state.config import Settings
from service.usecases.applier import run_applier

log = logging.getLogger(__name__)
KEY_DESCRIPTION = ("X-API-Key: an admin key (NOBACKFILL_ADMIN_API_KEYS) for admin operations; "
                   "the read key (NOBACKFILL_READ_API_KEY) or an admin key for search and "
                   "thumbnails when a read key is set. Optional on /readyz and /metrics, "
                   "where a read or admin key adds the gallery-level details.")
# The error statuses each router's operations may answer, declared in the OpenAPI document
# with the error body; routes add their own (415 where a body may be JSON or multipart).
# Search reads a body too: 400 when a multipart one cannot be parsed (no boundary, a field
# over the form parser's 1 MiB).
ROUTERS = ((search, (*API, 400, 409)), (galleries, (*API, *BODY)), (items, (*API, *BODY)),
           (models, (*API, *BODY)), (jobs, (*API, *BODY)),
           (migrations, (*API, *BODY)), (plans, (*API, *BODY)), (health, ANY), (web, ()))


def create_app(settings: Settings | None = None, load: EncoderLoader | None = None) -> FastAPI:
    """A gateway app; ``load`` replaces how versions become encoders (tests)."""
    settings = settings or Settings()
    # A process setting, made on the creating (main) thread: with OpenBLAS, a limit set
    # from another thread (e.g. the lifespan's under TestClient) may not reach the rest.
    limit_blas_threads(settings.blas_threads)
    metrics = Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        gateway = open_gateway(settings, metrics, load)
        app.state.gateway = gateway
        await _first_refresh(gateway.runtime)
        heap.settle(collect=True)  # what startup loaded: out of the collector's walks
        loops = []
        if settings.registry_poll_interval_s > 0:
            loops.append(asyncio.create_task(watch_registry(gateway.runtime,
                                                            settings.registry_poll_interval_s)))
        if settings.apply_interval_s > 0:  # writes what workers spooled; drives migrations
            loops.append(asyncio.create_task(run_applier(gateway, settings.apply_interval_s)))
        try:
            yield
        finally:
            for task in loops:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            gateway.close()
            heap.release()

    app = FastAPI(title="nobackfill gateway", version=training.__version__, lifespan=lifespan,
                  description="Search galleries across model upgrades without re-embedding.")
    # Added first, so inside ObserveRequests: its 413s and 401s are counted too.
    app.add_middleware(GuardBodies, max_request_bytes=settings.max_request_bytes,
                       max_json_bytes=settings.max_json_bytes)
    app.add_middleware(ObserveRequests, metrics=metrics)
    errors.install(app)
    for routes, statuses in ROUTERS:
        app.include_router(routes.router, responses=error_responses(*statuses))
    document_settings(app, settings)
    return app


def document_settings(app: FastAPI, settings: Settings) -> None:
    """The OpenAPI document states this server's limits that are settings (top_k_max) and
    which operations need a key (search only when a read key is set): the request models
    are static classes, the document is built once, lazily."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        fresh = app.openapi_schema is None
        document = build()
        if fresh:
            state_top_k_max(document, settings.top_k_max)
            state_security(document, app, settings)
            restore_nulls(document)  # FastAPI drops them, examples' included
        return document

    app.openapi = openapi  # type: ignore[method-assign]


def state_security(document: dict[str, Any], app: FastAPI, settings: Settings) -> None:
    """FastAPI marks every operation that reads the key header as needing the key. Only
    admin operations do, and search and thumbnails when a read key is set; the others
    (/readyz, /metrics, open search) take a key optionally, for details: their
    requirements list ``{}`` (anonymous) first."""
    schemes = document.get("components", {}).get("securitySchemes", {})
    for scheme in schemes.values():
        scheme["description"] = KEY_DESCRIPTION
    for route in routes_of(app.routes):
        path, checks = getattr(route, "path_format", None), key_checks(route)
        for method in getattr(route, "methods", None) or ():
            operation = document["paths"].get(path, {}).get(method.lower())
            if operation is None or not operation.get("security"):
                continue
            needed = require_admin in checks or (require_reader in checks
                                                 and settings.read_api_key is not None)
            if not needed:
                operation["security"] = [{}, *operation["security"]]


async def _first_refresh(runtime: Runtime) -> None:
    """Load the active versions before serving; on failure start anyway (readyz says
    not ready) and let the watcher retry."""
    try:
        await runtime.refresh()
    except Exception:  # logged; /readyz reports it and the watcher retries
        log.exception("initial registry load failed")


app = create_app()
