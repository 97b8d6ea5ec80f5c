"""The ``plan`` job: every way to a candidate model measured on the gallery's own data, and
the one to take under the operator's constraints (``training.upgrades.plan``).

At submission the gateway takes the sample (K stored items: their OLD vectors and
payloads) and records the plan's basis: the gallery's size, how it is served (active
version, space, migration), its validation set (path and content digest) and the
candidate's content (``candidate_digest``). A worker embeds the sample's sources with the
candidate (NEW), fits every adapter route and the gallery-side transform, measures each
option on the validation set and writes the plan into the job's result. Applying an option
(``service.usecases.plans``) starts the job that makes it happen, through the usual gate;
a plan whose basis moved (``staleness``) is applied only when forced with a reason.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.jobkinds.adapter import kept_originals, sources_of
from service.jobkinds.base import GatewayPort, JobKind, Params, RunContext, check_dataset, queue_job
from service.jobkinds.migrate.params import SAMPLE_BOUNDS, SAMPLE_SHARE
from service.jobkinds.model_ref import ModelRef, new_model
from service.state.errors import InvalidInput, NotFound, RegistryError
from service.state.gallery.sample import read_sample, take_sample, write_sample
from service.state.gallery.store import GalleryStore
from service.state.jobs.store import Job
from service.state.paths import Roots
from service.state.registry import Registry
from service.state.registry.gates import validation_digest


class PlanConstraints(BaseModel):
    """What the recommendation must respect (unset: no limit)."""

    model_config = ConfigDict(extra="forbid")

    max_added_latency_ms: float | None = Field(None, ge=0, description="per query, over the "
                                               "old model's own query (text and image)")
    max_negative_flip: float | None = Field(None, ge=0, le=1, description="per direction: "
                                            "queries the old system answered right that the "
                                            "option gets wrong, over all queries")
    budget: float | None = Field(None, ge=0, description="compute, as a fraction of a full "
                                 "backfill of the gallery by the new model on this host")
    budget_gpu_hours: float | None = Field(None, ge=0, description="compute in hours of the "
                                           "worker's device")


class PlanParams(Params):
    """Measure every upgrade option for ``new`` on the gallery; recommend one."""

    new: ModelRef
    sample: int | None = Field(None, ge=8, le=1_000_000, description="gallery items the new "
                               "model embeds to fit the adapters and the transform; default "
                               "2% of the gallery, at least 500, at most 10,000")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="the sample's draw and every fit")
    validation: str | None = Field(None, description="default: the gallery's validation set")
    constraints: PlanConstraints = Field(default_factory=PlanConstraints)
    objective: Literal["lower", "mean", "t2i", "i2t"] = Field(
        "lower", description="the gain an option is ranked by: the lower of the two "
                             "directions' shares (default), their mean, or one direction")
    stale_share: float = Field(0.1, gt=0, le=1, description="the plan goes stale when the "
                               "gallery's size moves by more than this share (or its active "
                               "version, serving space, migration, validation set or the "
                               "candidate's content changes)")

    def check(self, registry: Registry, roots: Roots) -> None:
        check_dataset(roots, self.validation, "validation")
        self.new.check(registry, roots, "plan")

    def sample_size(self, items: int) -> int:
        if self.sample is not None:
            return min(self.sample, items)
        low, high = SAMPLE_BOUNDS
        return min(items, max(low, min(high, round(SAMPLE_SHARE * items))))

    def snapshot(self, store: GalleryStore, gallery: str, work: Path) -> None:
        items = store.count(gallery)
        sample = take_sample(store, gallery, self.sample_size(items), self.seed)
        if len(sample["ids"]) < 8:
            raise InvalidInput(f"plan job: gallery '{gallery}' holds {len(sample['ids'])} "
                               f"item(s); a plan fits its maps on at least 8")
        write_sample(sample, work)


def basis_now(registry: Registry, store: GalleryStore, gallery: str,
              validation: str | None, new: ModelRef | None = None) -> dict[str, Any]:
    """What a plan was measured against: the gallery's size, how it is served (active
    version, space, an open migration's job, state and target space), its validation set
    and, given ``new``, the candidate's content (``candidate_digest``)."""
    record = registry.gallery(gallery)
    path = validation or record.validation
    m = record.migration
    basis = {"items": store.count(gallery), "incumbent": record.active, "space": record.space,
             "migration": {"job": m.job, "state": m.state, "target": m.target.space}
             if m else None,
             "validation": {"path": path, "digest": validation_digest(path)}}
    if new is not None:
        basis["candidate"] = candidate_digest(registry, new)
    return basis


def candidate_digest(registry: Registry, new: ModelRef) -> str | None:
    """A SHA-256 of what the candidate is made of now: a registered version's file
    checksums (its manifest's), or the size and modification time of each file it is
    given by (model_config, checkpoint: a checkpoint may be gigabytes, read on every view
    of the plan); None for an open_clip name alone (its weights are fixed by the name).
    A file or version that is gone hashes as gone."""
    parts: list[Any] = []
    if new.version:
        try:
            parts.append(["version", new.version, registry.manifest(new.version).get("files")])
        except (NotFound, RegistryError):
            parts.append(["version", new.version, None])
    for path in (new.model_config_file, new.checkpoint):
        if path:
            try:
                stat = os.stat(path)
                parts.append(["file", path, stat.st_size, stat.st_mtime_ns])
            except OSError:
                parts.append(["file", path, None])
    if not parts:
        return None
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


async def start(gateway: GatewayPort, job: Job, params: PlanParams) -> Job:
    """Refuse a gallery with no validation set (nothing to measure on), record the basis in
    the job's result, then take the sample and queue (``queue_job``)."""
    import asyncio

    record = await asyncio.to_thread(gateway.registry.gallery, job.gallery)
    if (params.validation or record.validation) is None:
        await asyncio.to_thread(gateway.jobs.delete, job.id)
        raise InvalidInput(f"plan job: gallery '{job.gallery}' has no validation set: give "
                           f"params.validation (the plan measures every option on it)")
    basis = await asyncio.to_thread(basis_now, gateway.registry, gateway.store, job.gallery,
                                    params.validation, params.new)
    job = await asyncio.to_thread(gateway.jobs.update, job.id,
                                  lambda j: j.merged(result={"basis": basis}))
    return await queue_job(gateway, job, params)


def xbt_versions(registry: Registry, describe: str, space: str) -> list[Any]:
    """Registered upgrade versions (kind ``xbt``) of the candidate's base model with a route
    into ``space``: XBT measured, not only costed. Manifests are read as stored; only the
    matches are loaded (their checksums verified)."""
    matches = []
    for v in registry.versions():
        m = registry.manifest(v.version_id)
        if (m.get("kind") == "xbt" and m.get("base_model") == describe
                and space in (m.get("routes") or {})):
            matches.append(registry.artifact(v.version_id))
    return matches


def run(ctx: RunContext) -> dict[str, Any]:
    from training.upgrades.inputs import new_model_of
    from training.upgrades.plan.decide import Constraints
    from training.upgrades.plan.run import run_plan

    p: PlanParams = ctx.params
    registry = Registry(ctx.settings.registry_dir)
    gallery = registry.gallery(ctx.job.gallery)
    work = ctx.store.work_dir(ctx.job.id)
    basis = ctx.job.result["basis"]  # recorded by ``start``
    roots = Roots.of(ctx.settings)
    ctx.heartbeat.progress = {"stage": "read sample"}
    sample, skipped = sources_of(read_sample(work),
                                 lambda path: roots.contains(os.path.realpath(path)),
                                 kept_originals(ctx.settings))
    validation = ctx.open_dataset(p.validation or gallery.validation, "validation")
    new = new_model(p.new, registry)
    spec = new_model_of(new)[0]
    old = registry.artifact(basis["incumbent"])

    def on_stage(stage: str) -> None:
        ctx.heartbeat.progress = {"stage": stage}
        ctx.heartbeat.check()

    plan = run_plan(new, old, gallery.space, sample, validation, basis["items"],
                    Constraints(**p.constraints.model_dump()), p.objective, p.seed,
                    xbt_versions(registry, spec.describe(), gallery.space),
                    ctx.settings.gate_max_negative_flip, ctx.settings.device, on_stage,
                    stored=stored_version(registry, gallery))
    with_workload(plan, ctx.settings.registry_dir, ctx.job.gallery, basis["items"])
    return {"result": {"plan": plan, "skipped": skipped}}


def with_workload(plan: dict[str, Any], registry_dir: Path, gallery: str, items: int) -> None:
    """What the gallery's users retrieve, in the plan: on its recorded searches
    (``service.state.candidates``), how soon rerank on read is warm with the read-through
    fill alone and with the backfill order ``candidates`` beside it, learned from the sets
    served before the searches measured (``training.upgrades.rerank.workload_curves``,
    at each rerank option's k). A rerank
    option whose candidate order is warm no later at every pace applies with it."""
    from service.state.candidates import FOLDER, read_counted
    from training.upgrades.rerank import workload_curves

    counted = read_counted(registry_dir / FOLDER / f"{gallery}.json")
    plan["workload"] = {"searches": len(counted.searches), "sets": len(counted.sets)}
    for option in plan.get("options", []):
        params = (option.get("apply") or {}).get("params") or {}
        if params.get("serving") != "rerank":
            continue
        warm = workload_curves(counted.searches, items, k=params.get("rerank_k"),
                               sets=counted.sets)
        option["warm"] = warm
        if warm is not None and warm["candidates_no_later"]:
            params["order"] = "candidates"


def stored_version(registry: Registry, gallery: Any) -> Any:
    """The version that embedded the gallery's stored vectors: the latest of its history
    native to the gallery's space (a route serving it, e.g. an applied adapter option,
    is not), else the newest registered version native to that space."""
    from service.jobkinds.migrate.backfill import _gallery_version

    return registry.artifact(_gallery_version(registry, {}, gallery.history, gallery.space))


def staleness(job: Job, now: dict[str, Any], own_versions: set[str]) -> list[str]:
    """Why the plan no longer describes the gallery, whose basis is ``now`` (``basis_now``
    with the plan's validation set and candidate); empty: it still does. A version that
    one of the plan's own applies promoted, or a migration that one of them opened and
    that still backfills, does not make it stale. A basis recorded before a field was
    (an older plan's) is not compared on that field."""
    p = PlanParams.model_validate(job.params)
    basis = job.result.get("basis") or {}
    out = []
    if now["incumbent"] != basis.get("incumbent") and now["incumbent"] not in own_versions:
        out.append(f"the gallery's active version is now '{now['incumbent']}' (the plan "
                   f"measured against '{basis.get('incumbent')}')")
    moved = _serving_moved(job, now, basis)
    if moved:
        out.append(moved)
    if now["validation"] != basis.get("validation"):
        out.append("the validation set changed since the plan measured on it")
    if "candidate" in basis and now.get("candidate") != basis["candidate"]:
        out.append(f"the candidate ({_candidate_named(p.new)}) changed since the plan "
                   f"measured it")
    items = basis.get("items") or 0
    if items and abs(now["items"] - items) / items > p.stale_share:
        out.append(f"the gallery holds {now['items']} items, {items} when planned (more than "
                   f"{p.stale_share:.0%} apart)")
    return out


def _serving_moved(job: Job, now: dict[str, Any], basis: dict[str, Any]) -> str | None:
    """Why the gallery is served otherwise than planned: its space changed (a migration
    switched or rolled back), or else its migration did (opened, switched and rolled
    back, ended); None when neither did."""
    if "space" in basis and now["space"] != basis["space"]:
        return (f"the gallery is now served in space '{now['space']}' (the plan measured "
                f"it in '{basis['space']}')")
    if "migration" not in basis or now["migration"] == basis["migration"]:
        return None
    moved, was = now["migration"], basis["migration"]
    own = {entry.get("job") for entry in job.result.get("applied", [])}
    if was is None and moved["job"] in own and moved["state"] == "backfilling":
        return None
    if moved is None:
        return (f"the gallery's migration (job {was['job']}) has ended ({was['state']} when "
                f"planned)")
    if was is None:
        then = "none was open when planned"
    elif was["job"] == moved["job"]:
        then = f"{was['state']} when planned"
    else:
        then = f"job {was['job']} was {was['state']} when planned"
    return f"the gallery's migration (job {moved['job']}) is {moved['state']} now ({then})"


def _candidate_named(new: ModelRef) -> str:
    if new.version:
        return f"version '{new.version}'"
    return ", ".join(path for path in (new.model_config_file, new.checkpoint) if path)


KIND = JobKind("plan", PlanParams, run, start=start)
