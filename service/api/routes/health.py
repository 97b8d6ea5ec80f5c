from __future__ import annotations

from fastapi import APIRouter, Response

from service.api.deps import GatewayDep
from service.runtime.metrics import CONTENT_TYPE
from service.usecases import health

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up (says nothing about models or Qdrant)."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(gateway: GatewayDep) -> dict:
    """Models loaded for every gallery and Qdrant reachable; 503 otherwise."""
    return await health.readiness(gateway)


@router.get("/metrics")
async def metrics(gateway: GatewayDep) -> Response:
    """Prometheus exposition format."""
    return Response(health.metrics_text(gateway), media_type=CONTENT_TYPE)
