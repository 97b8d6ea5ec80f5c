"""A ``migrate`` job's shards, by task: ``backfill`` and ``gate``
(``service.jobkinds.migrate.backfill``), ``transform`` (``service.jobkinds.migrate.transform``).
``control.prepare`` and ``control.drive`` plan them; the worker runs ``run``."""

from __future__ import annotations

from typing import Any

from service.jobkinds.base import RunContext
from service.jobkinds.migrate.backfill import run_backfill, run_gate
from service.jobkinds.migrate.transform import run_transform


def run(ctx: RunContext) -> dict[str, Any]:
    assert ctx.shard is not None, "a migrate job runs as shards"
    task = ctx.job.shards[ctx.shard].get("task", "backfill")
    if task == "gate":
        return {"gate": run_gate(ctx)}
    if task == "transform":
        return run_transform(ctx)
    return run_backfill(ctx)
