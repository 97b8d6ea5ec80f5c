"""A trained candidate's way into the registry: the compatibility gate, then registration
(moved in atomically from the job's work directory), then promotion if asked and passed."""

from __future__ import annotations

from typing import Any

from service.state.registry import GalleryRecord, Registry
from service.state.registry.staging import write_manifest_field
from training.artifacts import Artifact
from worker.context import JobContext


def gate_report(ctx: JobContext, registry: Registry, gallery: GalleryRecord,
                candidate: Artifact, new_domain: str | None = None,
                new_language: str | None = None) -> dict[str, Any]:
    """The gate on the gallery's held-out validation set against its active version
    (``training.gate``); a gallery without one gets a failing report that says so. A
    phase's new domain or new language is checked for gain, the rest for retention."""
    from training.gate import GateCriterion, run_gate

    validation = ctx.job.params.get("validation") or gallery.validation
    if validation is None:
        return {"passed": False, "reason": f"gallery '{gallery.name}' has no validation set "
                f"(set one at creation or pass params.validation); promote with force to "
                f"override", "candidate": candidate.version_id, "incumbent": gallery.active}
    criterion = GateCriterion(
        margin=ctx.settings.gate_margin, new_domain=new_domain, new_language=new_language,
        retention_limit=ctx.settings.gate_retention_limit if new_domain or new_language
        else None,
        max_negative_flip=ctx.settings.gate_max_negative_flip)
    incumbent = registry.artifact(gallery.active)
    return run_gate(candidate, incumbent, ctx.open_dataset(validation, "validation"),
                    criterion)


def admit(ctx: JobContext, candidate: Artifact, new_domain: str | None = None,
          new_language: str | None = None) -> dict[str, Any]:
    """Gate, register and (with auto_promote, if it passed) promote a new candidate."""
    registry = Registry(ctx.settings.registry_dir)
    gallery = registry.gallery(ctx.job.gallery)
    ctx.heartbeat.progress = {**(ctx.heartbeat.progress or {}), "stage": "gate"}
    report = gate_report(ctx, registry, gallery, candidate, new_domain, new_language)
    ctx.heartbeat.check()  # the last point where a cancel still leaves nothing behind
    write_manifest_field(candidate.path, "gate", report)
    record = registry.register(candidate.path, by=f"job:{ctx.job.id}", move=True, gate=report)
    return {"version": record.version_id, "gate": report,
            "promoted": promote_if_passed(ctx, registry, record.version_id, report)}


def promote_if_passed(ctx: JobContext, registry: Registry, version: str,
                      report: dict[str, Any]) -> bool:
    if not (ctx.job.auto_promote and report.get("passed") is True):
        return False
    registry.promote(ctx.job.gallery, version, by=f"job:{ctx.job.id}",
                     reason="auto_promote: the compatibility gate passed")
    return True
