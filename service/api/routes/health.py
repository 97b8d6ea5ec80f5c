"""Liveness, readiness and metrics: open to anyone (probes carry no key); /readyz and
/metrics name galleries and versions only to a read or admin key (``usecases/health.py``)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from service.api.deps import GatewayDep, KeyedDep
from service.api.schemas.errors import error_responses
from service.api.schemas.health import HealthOut, ReadyOut
from service.runtime.metrics import CONTENT_TYPE
from service.usecases import health

router = APIRouter(tags=["health"])
TEXT: dict[int | str, dict[str, Any]] = {200: {"description": "Prometheus text exposition format",
              "content": {"text/plain": {"schema": {"type": "string"}}}}}


@router.get("/healthz", response_model=HealthOut)
async def healthz() -> HealthOut:
    """The process is up (says nothing about models or Qdrant)."""
    return HealthOut(status="ok")


@router.get("/readyz", response_model=ReadyOut, response_model_exclude_none=True,
            responses=error_responses(503))
async def readyz(gateway: GatewayDep, keyed: KeyedDep) -> ReadyOut:
    """Models loaded for every gallery and Qdrant reachable; 503 otherwise. With a read or
    admin key, also which version serves each gallery, or why it is not ready."""
    return ReadyOut(**await health.readiness(gateway, detailed=keyed))


@router.get("/metrics", response_class=Response, responses=TEXT)
async def metrics(gateway: GatewayDep, keyed: KeyedDep) -> Response:
    """Prometheus exposition format. To anyone: the process-level series, whose labels are
    bounded and name no gallery or version (``nobackfill_requests``,
    ``nobackfill_request_seconds``, ``nobackfill_batch_size``). With the read key or an
    admin key (X-API-Key; give it to the scraper) also the gallery-level ones:
    ``nobackfill_active_version{gallery,version,space}``, ``nobackfill_swaps{gallery}`` and
    ``nobackfill_load_errors{version}``; a deleted gallery's and a retired version's series
    are dropped."""
    return Response(health.metrics_text(gateway, detailed=keyed), media_type=CONTENT_TYPE)
