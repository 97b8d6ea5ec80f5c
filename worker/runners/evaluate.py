"""Re-run the compatibility gate of a registered version against a gallery."""

from __future__ import annotations

from typing import Any

from service.state.jobs.specs import EvaluateParams
from service.state.registry import Registry
from worker.admission import gate_report, promote_if_passed
from worker.context import JobContext


def run_evaluate(ctx: JobContext) -> dict[str, Any]:
    """Gate an already registered version against the gallery; store the report with it."""
    p = EvaluateParams.model_validate(ctx.job.params)
    registry = Registry(ctx.settings.registry_dir)
    gallery = registry.gallery(ctx.job.gallery)
    report = gate_report(ctx, registry, gallery, registry.artifact(p.version))
    registry.set_gate(p.version, report)
    return {"version": p.version, "gate": report,
            "promoted": promote_if_passed(ctx, registry, p.version, report)}
