"""A trained candidate's way into the registry: the compatibility gate, then registration
(moved in atomically from the job's work directory), then promotion if asked and passed.
Every report is bound to the gallery, incumbent, validation set and criterion it was
measured with (``service.state.registry.gates``), so it counts only there."""

from __future__ import annotations

from typing import Any

from service.jobkinds.base import RunContext
from service.state.registry import GalleryRecord, Registry
from service.state.registry.gates import Binding, GatePolicy
from service.state.registry.staging import write_manifest_field
from training.artifacts import Artifact


def gate_report(ctx: RunContext, registry: Registry, gallery: GalleryRecord,
                candidate: Artifact, new_domain: str | None = None,
                new_language: str | None = None) -> dict[str, Any]:
    """The gate on the gallery's held-out validation set against its active version
    (``training.gate``), bound to both and to the criterion in force; a gallery without
    one gets a failing report that says so. A phase's new domain or new language is
    checked for gain, the rest for retention."""
    from training.gate import run_gate

    validation = ctx.job.params.get("validation") or gallery.validation
    policy = GatePolicy.of(ctx.settings)
    if validation is None:
        return Binding.now(gallery, policy).apply({
            "passed": False, "reason": f"gallery '{gallery.name}' has no validation set (set "
            f"one at creation or pass params.validation); promote with force to override",
            "candidate": candidate.version_id})
    dataset = ctx.open_dataset(validation, "validation")  # checks the roots; images load later
    binding = Binding.now(gallery, policy, validation)  # digested before the gate reads it
    incumbent = registry.artifact(gallery.active)
    return binding.apply(run_gate(candidate, incumbent, dataset,
                                  policy.criterion(new_domain, new_language)))


def admit(ctx: RunContext, candidate: Artifact, new_domain: str | None = None,
          new_language: str | None = None) -> dict[str, Any]:
    """Gate, register and (with auto_promote, if it passed) promote a new candidate."""
    registry = Registry.of(ctx.settings)
    gallery = registry.gallery(ctx.job.gallery)
    ctx.heartbeat.progress = {**(ctx.heartbeat.progress or {}), "stage": "gate"}
    report = gate_report(ctx, registry, gallery, candidate, new_domain, new_language)
    ctx.heartbeat.check()  # the last point where a cancel still leaves nothing behind
    write_manifest_field(candidate.path, "gate", report)
    record = registry.register(candidate.path, by=f"job:{ctx.job.id}", move=True, gate=report)
    return {"version": record.version_id, "gate": report,
            "promoted": promote_if_passed(ctx, registry, record.version_id, report)}


def promote_if_passed(ctx: RunContext, registry: Registry, version: str,
                      report: dict[str, Any]) -> bool:
    if not (ctx.job.auto_promote and report.get("passed") is True):
        return False
    registry.promote(ctx.job.gallery, version, by=f"job:{ctx.job.id}",
                     reason="auto_promote: the compatibility gate passed")
    return True
