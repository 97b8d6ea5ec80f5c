"""The applier's step for migrations (``tick``, every ``apply_interval_s``, after it
wrote every spool): each migration whose backfill runs moves one step (``drive``); one
whose job failed or was cancelled before any switch is undone.

A step: carry out a cancel (undo before a switch, stop after one); queue paused shards
again once resumed; plan the backfill once a transform is written; with ``switch:
progressive``, switch as soon as the share of items re-embedded (``view.Counts``: the
target side counted, whoever wrote them) reaches the point where the validation curve
says the side beats the route, and after the switch check the side again at every 5%
(``check.live_check``: switched back, for good, if it falls below the route beyond the
error at the level the check spends); at the end: catch up what the listing missed,
run the gate for this side if it has not run, and ``finish``.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from typing import Any

from service.jobkinds.base import GatewayPort
from service.jobkinds.migrate import record as records
from service.jobkinds.migrate.actions import (
    abort,
    bound_gate,
    current,
    gate_summary,
    locked_reconcile,
    stop,
    switch,
    switch_back,
)
from service.jobkinds.migrate.check import CHECK_EVERY, live_check
from service.jobkinds.migrate.keep import below_what_serves
from service.jobkinds.migrate.lifecycle import phase_of
from service.jobkinds.migrate.params import MigrateParams
from service.jobkinds.migrate.planning import plan_after_transform, ranges, write_shards
from service.jobkinds.migrate.record import MigrationState
from service.jobkinds.migrate.view import counts
from service.state.errors import Conflict
from service.state.jobs.shards import PAUSED
from service.state.jobs.store import Job
from service.state.registry import GalleryRecord
from service.vectors.spool import pending

log = logging.getLogger(__name__)
CATCH_UP_ROUNDS = 3  # backfills of items the listing missed, before the switch gives up


async def tick(gateway: GatewayPort) -> list[tuple[str, int]]:
    """Each open migration one step; the shards to queue."""
    queue: list[tuple[str, int]] = []
    for record in await asyncio.to_thread(gateway.registry.galleries):
        if record.migration is None:
            continue
        now = await asyncio.to_thread(current, gateway, record.name)
        if now.migration is None:
            continue
        phase = phase_of(now.migration, now.job, now.state)
        if phase == "undoing":
            await abort(gateway, record.name, now.migration.job, "fail")
        elif now.job is not None and not now.job.finished and now.state is not None:
            queue += await drive(gateway, now.record, now.job, now.state, phase)
    return queue


async def drive(gateway: GatewayPort, record: GalleryRecord, job: Job, state: MigrationState,
                phase: str) -> list[tuple[str, int]]:
    """One step of a running backfill (``phase``: backfilling, serving, or rolled_back
    with its job still running); the shards to queue."""
    if job.cancel_requested:
        if phase == "backfilling":
            await abort(gateway, record.name, job.id, "cancel")
        else:
            await stop(gateway, record, job)
        return []
    if state.planning:
        return []  # its submission is still listing the items and planning the shards
    if not job.result.get(PAUSED) and any(s["state"] == "paused" for s in job.shards):
        again = await asyncio.to_thread(gateway.jobs.requeue_shards, job.id, "paused")
        return [(job.id, n) for n in again]  # resumed: each from its cursor
    params = MigrateParams.model_validate(job.params)
    work = gateway.jobs.work_dir(job.id)
    if params.transform and not state.backfill_planned:
        transform = [s for s in job.shards if s.get("task") == "transform"]
        if not transform or transform[-1]["state"] != "done" or pending(work):
            return []  # the transform runs, or its spool is still being written
        added = await asyncio.to_thread(plan_after_transform, gateway, job)
        return [(job.id, n) for n in added]
    if params.switch == "progressive":
        if phase == "backfilling" and state.switched_back_at_fraction is None:
            await _maybe_switch_progressively(gateway, record, job, state)
        elif phase == "serving" and state.switched_back_at_fraction is not None:
            # A switch back was decided and recorded, then the gateway stopped before the
            # registry changed: finish it.
            await switch_back(gateway, record.name, by=f"job:{job.id}",
                              reason=state.switched_back or "switched back")
        elif phase == "serving":
            await _check_after_switch(gateway, record, job, state)
        now = await asyncio.to_thread(current, gateway, record.name)
        if now.job is None or now.state is None:
            return []
        record, job, state = now.record, now.job, now.state
    if any(s["state"] not in ("done", "cancelled") for s in job.shards) or pending(work):
        return []  # still running, or applied at the next tick first
    m = record.migration
    assert m is not None
    missing = await asyncio.to_thread(locked_reconcile, gateway, record.name, m, job)
    listed_all = int(job.result.get("unreadable_count", 0)) <= len(
        job.result.get("unreadable", []))  # else some missing ones are unreadable: final
    if missing and listed_all and _rounds(job, state) < CATCH_UP_ROUNDS:
        log.info("migration of %s: %d item(s) missed by the listing; backfilling them",
                 record.name, len(missing))
        added = await asyncio.to_thread(write_shards, gateway, job, ranges(missing, 1))
        return [(job.id, n) for n in added]
    if bound_gate(job, m, record.name) is None:
        gates = [s for s in job.shards if s.get("task") == "gate"]
        if gates and gates[-1]["state"] not in ("done", "cancelled"):
            return []  # it runs
        added = await asyncio.to_thread(write_shards, gateway, job, [[]], "gate")
        return [(job.id, n) for n in added]  # none ran for this side (or it was stopped)
    await finish(gateway, record, job, params, missing)
    return []


async def finish(gateway: GatewayPort, record: GalleryRecord, job: Job,
                 params: MigrateParams, missing: list[dict[str, Any]]) -> None:
    """The backfill and its gate (bound to this side) are done: end the job by the
    migration's phase. backfilling: switch if auto_switch is on and the gate passed
    (else the operator decides: the job succeeds with why it did not switch). serving
    (switched progressively): a passed gate ends it switched; a failed one switches back
    to the route and fails the job, naming the operator's options. rolled_back: ends as
    is."""
    m = record.migration
    assert m is not None
    state = records.load(gateway.jobs, job.id)
    phase = phase_of(m, job, state)
    gate = bound_gate(job, m, record.name) or {}
    passed = gate.get("passed") is True
    outcome: dict[str, Any] = {"missing": [i["id"] for i in missing][:1000],
                               "missing_count": len(missing), "switched": phase == "serving",
                               "gate_passed": passed}
    switched: dict[str, Any] = {}
    if phase == "serving" and not passed:
        await _gate_failed_after_switch(gateway, record, job, outcome, gate)
        return
    if phase == "rolled_back":
        outcome["switch_refused"] = "rolled back by the operator after the progressive switch"
    elif phase == "backfilling" and params.auto_switch and below_what_serves(gate):
        outcome["switch_refused"] = below_what_serves(gate)
    elif phase == "backfilling" and params.auto_switch:
        try:  # the switch comes first, so a finished job says whether it switched
            await switch(gateway, record.name, by=f"job:{job.id}", backfilled=True,
                         reason="auto_switch: every item has its new vector and the gate passed")
            outcome["switched"] = True
            switched = {"switched_at_fraction": 1.0,
                        "switched_at": datetime.now(timezone.utc).isoformat()}
        except Conflict as exc:  # the gate failed or items are missing: the operator decides
            log.warning("migration of %s not switched: %s", record.name, exc.message)
            outcome["switch_refused"] = exc.message
    elif phase == "backfilling":
        outcome["switch_refused"] = "auto_switch is off: switch with POST .../migration/switch"
    await asyncio.to_thread(records.merge, gateway.jobs, job.id, outcome=outcome,
                            gate_failed=not passed, **switched)
    await asyncio.to_thread(gateway.jobs.finish, job.id, "succeeded")


async def _gate_failed_after_switch(gateway: GatewayPort, record: GalleryRecord, job: Job,
                                    outcome: dict[str, Any], gate: dict[str, Any]) -> None:
    """A progressively switched gallery whose end-of-backfill gate failed: the route serves
    again (the gate says the new side is worse than it), the job fails and says what the
    operator can do."""
    summary = gate_summary(gate)
    reason = f"the end-of-backfill gate failed ({summary}): the route serves again"
    options = ("switch with force=true and a reason to serve the new side anyway, or cancel "
               "the migration to drop it")
    outcome.update({"switched": False, "switched_back": "gate", "switch_refused":
                    f"the migration gate did not pass ({summary})", "options": options})
    # Recorded first: a restart before the registry changes finishes the switch back.
    await asyncio.to_thread(records.merge, gateway.jobs, job.id, outcome=outcome,
                            gate_failed=True, switched_back=reason,
                            switched_back_at_fraction=1.0)
    await switch_back(gateway, record.name, by=f"job:{job.id}", action="gate_failed",
                      reason=reason)
    await asyncio.to_thread(
        gateway.jobs.finish, job.id, "failed",
        error=f"the end-of-backfill gate failed after the progressive switch ({summary}); "
              f"gallery '{record.name}' was switched back to the route: {options}")


async def _maybe_switch_progressively(gateway: GatewayPort, record: GalleryRecord, job: Job,
                                      state: MigrationState) -> None:
    """Switch when the share of items re-embedded (the target side counted) has reached
    ``switch_at`` (the validation curve's point from which the side beats the route
    beyond the error, there and later) and every item has a vector on the target side
    (transformed or re-embedded). Not for a migration served by rerank on read: the curve
    compares the side with the route, and rerank serves more than the route (its switch
    is decided at the end, against what serves)."""
    at = state.switch_at
    if at is None or record.migration is None or record.migration.serving == "rerank":
        return  # no point, or served by rerank: the curve measures the route, not it
    fraction = (await asyncio.to_thread(counts, gateway.store, record.migration)).fraction
    if fraction + 1e-9 < float(at):
        return
    served = ", ".join(state.curve_directions or ("t2i", "i2t"))
    reason = (f"progressive: {fraction:.1%} of the items re-embedded, the rest transformed; "
              f"on the validation set with the gallery's distractors the side beats the "
              f"route beyond the error ({served}) from {float(at):.0%} of the backfill")
    try:
        await switch(gateway, record.name, by=f"job:{job.id}", reason=reason, progressive=True)
    except Conflict as exc:
        log.warning("migration of %s: progressive switch deferred: %s", record.name, exc.message)
        return
    now = datetime.now(timezone.utc).isoformat()
    await asyncio.to_thread(records.merge, gateway.jobs, job.id,
                            switched_at_fraction=round(fraction, 4), switched_at=now)
    log.info("migration of %s switched progressively at %.1f%%", record.name, 100 * fraction)


async def _check_after_switch(gateway: GatewayPort, record: GalleryRecord, job: Job,
                              state: MigrationState) -> None:
    """After a progressive switch, at each 5% the side gains: the side measured again
    with the gallery's own vectors as they stand (``check.live_check``); below the route
    beyond the error -> the switch back is recorded first, then made (a restart between
    the two finishes it, and never switches progressively again)."""
    assert record.migration is not None
    fraction = (await asyncio.to_thread(counts, gateway.store, record.migration)).fraction
    last = state.checks[-1]["fraction"] if state.checks else (state.switched_at_fraction or 0)
    if fraction < float(last) + CHECK_EVERY - 1e-9:
        return
    check = await asyncio.to_thread(
        lambda: live_check(gateway.store, record, records.folder(gateway.jobs, job.id),
                           fraction, seed=int(job.params.get("seed", 0)),
                           switched_at=state.switched_at_fraction or 0.0, checks=state.checks))
    if check is None:
        return
    reason = (f"switched back at {fraction:.1%} of the backfill: the side fell below "
              f"the route beyond the error ({check['why']})")
    await asyncio.to_thread(records.update, gateway.jobs, job.id, lambda s: s.model_copy(
        update={"checks": [*s.checks, check], **({
            "switched_back_at_fraction": round(fraction, 4), "switched_back": reason}
            if check["below"] else {})}))
    if check["below"]:
        await switch_back(gateway, record.name, by=f"job:{job.id}", reason=reason)


def _rounds(job: Job, state: MigrationState) -> int:
    """Catch-up rounds so far: backfill shards added after the last plan."""
    return sum(1 for s in job.shards[state.planned_shards:]
               if s.get("task", "backfill") == "backfill")
