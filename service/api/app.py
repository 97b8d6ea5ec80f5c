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

from fastapi import FastAPI

import training
from service.api import errors
from service.api.middleware import ObserveRequests
from service.api.routes import galleries, health, items, jobs, models, search, web
from service.runtime.gateway import open_gateway
from service.runtime.metrics import Metrics
from service.runtime.serving import EncoderLoader, Runtime
from service.runtime.threads import limit_blas_threads
from service.runtime.watcher import watch_registry
from service.state.config import Settings

log = logging.getLogger(__name__)


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
        watcher = (asyncio.create_task(watch_registry(gateway.runtime,
                                                      settings.registry_poll_interval_s))
                   if settings.registry_poll_interval_s > 0 else None)
        try:
            yield
        finally:
            if watcher is not None:
                watcher.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await watcher
            gateway.close()

    app = FastAPI(title="nobackfill gateway", version=training.__version__, lifespan=lifespan,
                  description="Search galleries across model upgrades without re-embedding.")
    app.add_middleware(ObserveRequests, metrics=metrics,
                       max_request_bytes=settings.max_request_bytes)
    errors.install(app)
    for routes in (search, galleries, items, models, jobs, health, web):
        app.include_router(routes.router)
    return app


async def _first_refresh(runtime: Runtime) -> None:
    """Load the active versions before serving; on failure start anyway (readyz says
    not ready) and let the watcher retry."""
    try:
        await runtime.refresh()
    except Exception:  # logged; /readyz reports it and the watcher retries
        log.exception("initial registry load failed")


app = create_app()
