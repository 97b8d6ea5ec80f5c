from __future__ import annotations

import asyncio

from fastapi import APIRouter, Response

from service.api.deps import GatewayDep
from service.core.errors import Unavailable
from service.core.metrics import CONTENT_TYPE

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up (says nothing about models or Qdrant)."""
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(gateway: GatewayDep) -> dict:
    """Models loaded for every gallery and Qdrant reachable; 503 otherwise."""
    problems = gateway.runtime.not_ready()
    if problems:
        raise Unavailable("not ready: " + "; ".join(problems))
    await asyncio.to_thread(gateway.store.ping)  # 503 when Qdrant is unreachable
    snapshot = gateway.runtime.snapshot
    return {"status": "ready", "revision": snapshot.revision,
            "galleries": {name: s.version for name, s in snapshot.galleries.items()}}


@router.get("/metrics")
async def metrics(gateway: GatewayDep) -> Response:
    """Prometheus exposition format."""
    return Response(gateway.metrics.exposition(), media_type=CONTENT_TYPE)
