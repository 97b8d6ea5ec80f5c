"""Upgrade plans (``service.jobkinds.plan``): read one with whether it still describes the
gallery, and apply one of its options in one call.

Applying starts the job that makes the option happen, through the usual gate:

- a route (``route:*``): an ``adapter`` job with the option's config on the plan's sample
  size and seed, ``auto_promote``: registered, gated against the gallery, promoted if the
  gate passes;
- a trained XBT version (``xbt:*``): an ``evaluate`` job on it, ``auto_promote``;
- a migration (``migrate*``, ``rerank@k``): a ``migrate`` job with the option's transform,
  order and switch rule (a ``rerank@k``: serving ``rerank`` with that k). A migration re-embeds with the version that serves the gallery, so the
  candidate must serve it first: applying a route option of the same plan does that (the
  version it promotes does not make the plan stale).

A plan whose basis moved (the gallery's size by more than its ``stale_share``, its active
version, the space it is served in, its migration, its validation set, or the candidate's
content: a registered version's checksums, the size and time of the files it is given by)
is refused (409) unless forced with a reason; every apply is recorded in the plan
(``result.applied``).
"""

from __future__ import annotations

import asyncio
import functools
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from service.jobkinds.plan import PlanParams, basis_now, candidate_digest, staleness
from service.runtime.gateway import Gateway
from service.state.errors import Conflict, InvalidInput, NotFound
from service.state.jobs.store import Job
from service.usecases.jobs import get_job, list_jobs, submit_job


@dataclass(frozen=True)
class PlanView:
    job: Job
    stale: list[str]  # why it no longer describes the gallery (empty: current)


@dataclass(frozen=True)
class Applied:
    plan: Job
    option: str
    job: Job
    stale: list[str]
    forced: bool


async def get_plan(gateway: Gateway, gallery: str, plan_id: str) -> PlanView:
    try:
        job = await get_job(gateway, plan_id)
    except NotFound:
        job = None
    if job is None or job.kind != "plan" or job.gallery != gallery:
        raise NotFound(f"gallery '{gallery}' has no plan '{plan_id[:64]}'")
    return (await _views(gateway, gallery, [job]))[0]


async def list_plans(gateway: Gateway, gallery: str) -> list[PlanView]:
    jobs = [j for j in await list_jobs(gateway) if j.kind == "plan" and j.gallery == gallery]
    return await _views(gateway, gallery, jobs)


async def _views(gateway: Gateway, gallery: str, jobs: list[Job]) -> list[PlanView]:
    """Each plan with why it is stale; the gallery's basis now is read once per
    validation set (its digest hashes every image of the set), the candidate's per plan."""
    def views() -> list[PlanView]:
        now = functools.cache(lambda validation: basis_now(
            gateway.registry, gateway.store, gallery, validation))
        return [PlanView(j, staleness(j, _now(gateway, j, now(j.params.get("validation"))),
                                      _own_versions(gateway, j))
                         if j.status == "succeeded" else []) for j in jobs]
    return await asyncio.to_thread(views)


def _now(gateway: Gateway, job: Job, gallery_now: dict[str, Any]) -> dict[str, Any]:
    """The basis of ``job`` now: the gallery's, and its candidate's content."""
    new = PlanParams.model_validate(job.params).new
    return {**gallery_now, "candidate": candidate_digest(gateway.registry, new)}


def _own_versions(gateway: Gateway, job: Job) -> set[str]:
    """Versions that the plan's own applies produced (a promotion by them is expected)."""
    out = set()
    for entry in job.result.get("applied", []):
        try:
            done = gateway.jobs.get(entry["job"])
        except NotFound:
            continue
        if done.version:
            out.add(done.version)
    return out


def _option(job: Job, name: str) -> dict[str, Any]:
    plan = job.result.get("plan") or {}
    options = plan.get("options", [])
    for row in options:
        if row["name"] == name:
            return row
    raise InvalidInput(f"plan '{job.id}' has no option '{name[:80]}'; its options: "
                       f"{', '.join(r['name'] for r in options)}")


async def apply_plan(gateway: Gateway, gallery: str, plan_id: str, option: str, force: bool,
                     reason: str | None, by: str) -> Applied:
    view = await get_plan(gateway, gallery, plan_id)
    job = view.job
    if job.status != "succeeded":
        raise Conflict(f"plan '{plan_id}' is {job.status}: only a finished plan can be applied")
    row = _option(job, option)
    how = row.get("apply")
    if not how:
        raise Conflict(f"option '{option}' cannot be applied: {row.get('note') or 'no job makes it'}")
    if view.stale and not force:
        raise Conflict(f"plan '{plan_id}' is stale: {'; '.join(view.stale)}. Run a new plan, "
                       f"or apply with force and a reason")
    if force and not (reason or "").strip():
        raise InvalidInput("reason: a forced apply needs a reason (it is recorded)")
    params = PlanParams.model_validate(job.params)
    started = await _start(gateway, gallery, job, params, row, how, by)
    entry = {"option": option, "job": started.id, "kind": started.kind, "by": by,
             "at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "forced": bool(force),
             "reason": reason, "stale": view.stale}

    def record(current: Job) -> Job:
        return current.merged(result={"applied": [*current.result.get("applied", []), entry]})
    plan = await asyncio.to_thread(gateway.jobs.update, job.id, record)
    return Applied(plan, option, started, view.stale, bool(force))


async def _start(gateway: Gateway, gallery: str, job: Job, params: PlanParams,
                 row: dict[str, Any], how: dict[str, Any], by: str) -> Job:
    plan = job.result["plan"]
    kind = how["kind"]
    if kind == "adapter":
        body = {"new": params.new.model_dump(by_alias=True, exclude_none=True),
                "sample": plan["sample"]["items"], "seed": params.seed,
                "config": how["config"], "validation": params.validation}
        return await submit_job(gateway, "adapter", gallery, body, True, by)
    if kind == "evaluate":
        return await submit_job(gateway, "evaluate", gallery,
                                {"version": how["version"], "validation": params.validation},
                                True, by)
    if kind == "migrate":
        await asyncio.to_thread(_candidate_serves, gateway, gallery, job, params, how)
        return await submit_job(gateway, "migrate", gallery,
                                {**how["params"], "validation": params.validation}, False, by)
    raise Conflict(f"option '{row['name']}' has an apply of unknown kind '{kind}'")


def _candidate_serves(gateway: Gateway, gallery: str, job: Job, params: PlanParams,
                      how: dict[str, Any]) -> None:
    """A migration re-embeds with the active version: it must be the candidate (the plan's
    ``new.version``, or a version one of the plan's route applies produced)."""
    active = gateway.registry.gallery(gallery).active
    if active == params.new.version or active in _own_versions(gateway, job):
        return
    raise Conflict(f"a migration re-embeds with the version that serves gallery '{gallery}' "
                   f"('{active}' now, not the plan's candidate): apply the route option "
                   f"'{how.get('route')}' of this plan first (its gate promotes the candidate "
                   f"with that route), then this option")
