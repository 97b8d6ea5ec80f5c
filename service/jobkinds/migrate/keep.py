"""The end of a migration: the native side alone, or both sides kept with a fused ranking.

At the end of the backfill the gate compares the native side with the route (pass or
fail) and measures, on the same validation set, what the two sides give together
(``backfill.what_serves``): rerank@k (the route's top k ranked by the new model's stored
vectors) and hybrid (both sides' scores summed). A migration served by rerank on read
serves more than the native side alone on many galleries; switching would then lower
quality. So when the native side is below what serves beyond the error, the automatic
switch is refused (``below_what_serves``) and the operator chooses the end state:

- ``switch``: the native side alone serves; retire then drops the source side;
- ``keep``: both sides stay, as the served mode (phase ``kept``): searches are ranked by
  ``rerank`` or ``hybrid``, every write is embedded into both sides. It costs the second
  side's storage and a second embedding per write, stated here (``kept_cost``, from the
  store) and measured by ``bench rerank`` (disk and ingest, two sides against one).

``end_report`` is what the view, the web page and the CLI show of this choice.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from typing import Any

from service.jobkinds.base import GatewayPort
from service.jobkinds.migrate import record as records
from service.jobkinds.migrate.actions import bound_gate, current, reconcile
from service.state.errors import Conflict, InvalidInput, shown
from service.state.gallery.locks import gallery_lock
from service.state.gallery.store import KINDS, GalleryStore
from service.state.jobs.store import Job
from service.state.registry.records import Migration

log = logging.getLogger(__name__)
MODES = ("rerank", "hybrid")
FLOAT_BYTES = 4


def below_what_serves(gate: dict[str, Any]) -> str | None:
    """Why the switch waits for the operator although the gate passed: the migration is
    served by rerank on read and the native side alone is below what serves beyond the
    error (the gate measured both: ``backfill.what_serves``); None otherwise."""
    serving = gate.get("serving") or {}
    if not serving.get("native_below"):
        return None
    return (f"the native side alone is below what serves now ({serving.get('why')}): "
            f"switching would lower quality; switch (POST .../migration/switch) to serve "
            f"the native side alone, keep both sides as the served mode (POST "
            f".../migration/keep), or cancel")


def kept_cost(store: GalleryStore, m: Migration) -> dict[str, Any]:
    """What keeping both sides costs, from the store: each side's points and the bytes of
    their vectors (points x kinds x width x 4; the engine's index and payloads come on
    top), the second side's share of the total, and the second embedding per write."""
    sides = {}
    for name, side in (("source", m.source), ("target", m.target)):
        points, width = store.count(side.collection), store.width(side.collection)
        sides[name] = {"space": side.space, "points": points, "width": width,
                       "vector_bytes": points * len(KINDS) * width * FLOAT_BYTES}
    one = sides["target"]["vector_bytes"]
    both = one + sides["source"]["vector_bytes"]
    return {"sides": sides, "vector_bytes_one_side": one, "vector_bytes_both": both,
            "storage_ratio": round(both / one, 3) if one else None,
            "embeddings_per_write": 2,
            "note": ("both sides are stored and every write is embedded by the version "
                     "into both spaces (its route into the source space, natively into "
                     "the target); bench rerank measures the disk and ingest cost")}


def end_report(gallery: str, m: Migration, job: Job | None, phase: str,
               cost: dict[str, Any] | None) -> dict[str, Any] | None:
    """The end states the gate measured (R@1 per direction: the native side, rerank@k,
    hybrid), whether the native side is below each fused one and below what serves now,
    and the operator's choices with their cost; None before the gate has measured them."""
    gate = bound_gate(job, m, gallery) if job is not None else None
    report = (gate or {}).get("serving")
    if not report or "native_below_fused" not in report:
        return None
    fused = f"rerank@{report['rerank_k']}"
    choices = [{"end": "native", "action": "switch", "R@1": _of(report, "native"),
                "note": "the native side alone; retire then drops the source side"}]
    for mode, name in (("rerank", fused), ("hybrid", "hybrid")):
        choices.append({"end": f"kept:{mode}", "action": "keep", "mode": mode,
                        "R@1": _of(report, name),
                        "native_below": report["native_below_fused"][name],
                        "note": "both sides kept and written; the cost below"})
    return {"measured_by": "the gate, on the validation set", "now": report["mode"],
            "native_below_what_serves": report["native_below"], "why": report["why"],
            "choices": choices, "cost_of_keeping": cost, "phase": phase}


def _of(report: dict[str, Any], name: str) -> dict[str, float]:
    return {d: v[name] for d, v in report["R@1"].items()}


async def keep(gateway: GatewayPort, gallery: str, mode: str, *, by: str,
               rerank_k: int | None = None, reason: str | None = None) -> None:
    """Keep both sides as the served mode (phase ``kept``), or change its mode: searches
    are ranked by ``mode`` (rerank: the route's top ``rerank_k`` by the new model; hybrid:
    both sides' scores), writes keep reaching both sides. Refused (409) outside awaiting
    and kept, and while any item lacks its own new vector (a fused ranking reads it)."""
    if mode not in MODES:
        raise InvalidInput(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    settings = gateway.settings
    if rerank_k is not None and (mode != "rerank" or not 1 <= rerank_k <= settings.rerank_k_max):
        raise InvalidInput(f"rerank_k goes with mode rerank, between 1 and rerank_k_max "
                           f"({settings.rerank_k_max}); got {rerank_k} with mode {mode}")

    def locked() -> None:
        with gallery_lock(settings, gallery):
            now = current(gateway, gallery)
            now.require("keep")
            m, job = now.migration, now.job
            assert m is not None
            if job is None:
                raise Conflict(f"the migration of gallery '{gallery}' has lost its job record: "
                               f"switch or cancel it")
            lacking = reconcile(gateway, m, job, skip_unreadable=False,
                                transformed_missing=True)
            if lacking:
                named = ", ".join(shown(i["id"]) for i in lacking[:20])
                raise Conflict(f"{len(lacking)} item(s) of gallery '{gallery}' have no new "
                               f"vector of their own ({named}): a fused ranking reads it; "
                               f"delete them or fix their sources and migrate again, or "
                               f"switch with drop=[their ids]")
            k = (rerank_k or m.rerank_k or settings.rerank_k) if mode == "rerank" else None
            gateway.registry.serve_migration(gallery, serving=mode, rerank_k=k, by=by,
                                             reason=reason)
            cost = kept_cost(gateway.store, m)
            records.merge(gateway.jobs, job.id, kept=mode, kept_by=by,
                          kept_at=datetime.now(timezone.utc).isoformat(),
                          kept_reason=(reason or "").strip() or None, kept_cost=cost)
    await asyncio.to_thread(locked)
    await gateway.runtime.refresh()
    log.info("migration of %s: both sides kept, served by %s", gallery, mode)
