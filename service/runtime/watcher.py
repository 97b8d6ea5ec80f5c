"""Notice promotions and rollbacks made by any process (worker, another gateway, an
operator) by polling the registry index's revision."""

from __future__ import annotations

import asyncio
import logging

from service.runtime.serving import Runtime

log = logging.getLogger(__name__)


async def watch_registry(runtime: Runtime, interval_s: float) -> None:
    """Refresh forever; a failed refresh is logged and the current snapshot keeps serving."""
    while True:
        await asyncio.sleep(interval_s)
        try:
            if await runtime.refresh():
                log.info("swapped to registry revision %d", runtime.snapshot.revision)
        except asyncio.CancelledError:
            raise
        except Exception:  # logged; the watcher must outlive a bad index write
            log.exception("registry refresh failed; still serving revision %d",
                          runtime.snapshot.revision)
