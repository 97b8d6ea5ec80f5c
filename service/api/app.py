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
from service.api.middleware import GuardBodies, ObserveRequests
from service.api.routes import galleries, health, items, jobs, migrations, models, search, web
from service.api.schemas.errors import ANY, API, BODY, error_responses
from service.api.schemas.search import state_top_k_max
from service.runtime.gateway import open_gateway
from service.runtime.metrics import Metrics
from service.runtime.serving import EncoderLoader, Runtime
from service.runtime.threads import limit_blas_threads
from service.runtime.watcher import watch_registry
from service.state.config import Settings
from service.usecases.applier import run_applier

log = logging.getLogger(__name__)
# The error statuses each router's operations may answer, declared in the OpenAPI document
# with the error body; routes add their own (415 where a body may be JSON or multipart).
ROUTERS = ((search, (*API, 409)), (galleries, (*API, *BODY)), (items, (*API, *BODY)),
           (models, (*API, *BODY)), (jobs, (*API, *BODY)),
           (migrations, (*API, *BODY)), (health, ANY), (web, ()))


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
    """The OpenAPI document states this server's limits that are settings (top_k_max):
    the request models are static classes, the document is built once, lazily."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        fresh = app.openapi_schema is None
        document = build()
        if fresh:
            state_top_k_max(document, settings.top_k_max)
        return document

    app.openapi = openapi  # type: ignore[method-assign]


async def _first_refresh(runtime: Runtime) -> None:
    """Load the active versions before serving; on failure start anyway (readyz says
    not ready) and let the watcher retry."""
    try:
        await runtime.refresh()
    except Exception:  # logged; /readyz reports it and the watcher retries
        log.exception("initial registry load failed")


app = create_app()
