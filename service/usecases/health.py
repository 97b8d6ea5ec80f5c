"""Is this gateway ready (models loaded for every gallery, Qdrant reachable), and its
Prometheus metrics."""

from __future__ import annotations

import asyncio
from typing import Any

from service.runtime.gateway import Gateway
from service.state.errors import Unavailable


async def readiness(gateway: Gateway) -> dict[str, Any]:
    """What serves each gallery; Unavailable (503) naming every problem otherwise."""
    problems = gateway.runtime.not_ready()
    if problems:
        raise Unavailable("not ready: " + "; ".join(problems))
    await asyncio.to_thread(gateway.store.ping)  # 503 when Qdrant is unreachable
    snapshot = gateway.runtime.snapshot
    return {"status": "ready", "revision": snapshot.revision,
            "galleries": {name: s.version for name, s in snapshot.galleries.items()}}


def metrics_text(gateway: Gateway) -> bytes:
    """The Prometheus exposition of this process's metrics."""
    return gateway.metrics.exposition()
