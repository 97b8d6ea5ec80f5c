"""The ``evaluate`` job: re-run the compatibility gate of a registered version against a
gallery."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from service.jobkinds.admission import gate_report, promote_if_passed
from service.jobkinds.base import JobKind, Params, RunContext, check_dataset, check_version
from service.state.paths import Roots
from service.state.registry import Registry


class EvaluateParams(Params):
    version: str = Field(description="the candidate version to gate against the gallery")
    validation: str | None = None

    def check(self, registry: Registry, roots: Roots) -> None:
        check_version(registry, self.version, "version")
        check_dataset(roots, self.validation, "validation")


def run(ctx: RunContext) -> dict[str, Any]:
    """Gate an already registered version against the gallery; keep the report with it
    (after its earlier ones: it counts for this gallery only, while it is current)."""
    p: EvaluateParams = ctx.params
    registry = Registry.of(ctx.settings)
    gallery = registry.gallery(ctx.job.gallery)
    report = gate_report(ctx, registry, gallery, registry.artifact(p.version))
    registry.add_gate(p.version, report)
    return {"version": p.version, "gate": report,
            "promoted": promote_if_passed(ctx, registry, p.version, report)}


KIND = JobKind("evaluate", EvaluateParams, run)
