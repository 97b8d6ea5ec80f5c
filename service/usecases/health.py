"""Is this gateway ready (models loaded for every gallery, Qdrant reachable), and its
Prometheus metrics.

What a caller learns depends on its key: anyone learns ready or not (a load balancer needs
no key), only a read or admin key learns which galleries and versions serve and why a
replica is not ready (gallery names, version ids and error texts describe the deployment).
The same holds for metrics: the gallery-level series need a read or admin key.
"""

from __future__ import annotations

import asyncio
from typing import Any

from service.runtime.gateway import Gateway
from service.state.errors import Unavailable
from service.state.jobs.workers import live_workers

NOT_READY = "not ready; a read or admin key shows why"


async def readiness(gateway: Gateway, detailed: bool) -> dict[str, Any]:
    """``{"status": "ready"}`` (with ``revision`` and ``galleries`` when ``detailed``), or
    Unavailable (503), naming every problem only when ``detailed``."""
    problems = gateway.runtime.not_ready()
    if problems:
        raise Unavailable("not ready: " + "; ".join(problems) if detailed else NOT_READY)
    try:
        await asyncio.to_thread(gateway.store.ping)  # 503 when Qdrant is unreachable
    except Unavailable as exc:
        if detailed:
            raise
        raise Unavailable(NOT_READY) from exc
    if not detailed:
        return {"status": "ready"}
    snapshot = gateway.runtime.snapshot
    return {"status": "ready", "revision": snapshot.revision,
            "galleries": {name: s.version for name, s in snapshot.galleries.items()},
            "workers": len(await asyncio.to_thread(live_workers, gateway.settings))}


def metrics_text(gateway: Gateway, detailed: bool) -> bytes:
    """The Prometheus exposition of this process's metrics: the process-level series
    (bounded labels, no gallery or version named) to anyone, the gallery-level ones
    (active version, swaps, load errors) only when ``detailed`` (a read or admin key)."""
    return gateway.metrics.exposition(galleries=detailed)
