"""Example bodies of the main routes (search, items, jobs, migrations, plans), shown in the
OpenAPI document and on the manual's HTTP reference page (``docs/hooks/reference_pages.py``
renders an "Example request" / "Example response" per operation).

A request or response model that one route owns carries its example in its own
``model_config`` (``json_schema_extra={"examples": [...]}``; the job submission's union,
an ``Examples`` annotation); ``JobOut`` and ``MigrationOut``, which several routes answer
with, get one example per route instead (``example_response``), so each operation shows
the job it starts or the state it reads. FastAPI drops every null from the document it
builds, examples included; ``restore_nulls`` puts them back (``service.api.app``), so an
example shows every field a real answer has. ``tests/test_reference_examples.py``
validates every example against its model and finds it on the rendered page, so an
example cannot drift from the schema. The values are those of the manual's tutorial (the
demo gallery, v1 and v2) and of its bench plan page, abridged where a field holds a whole
report.
"""

from __future__ import annotations

from typing import Any

# A 1x1 PNG: an image query or item that decodes.
PNG_1X1 = ("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAAB"
           "JRU5ErkJggg==")
NEW_V2 = {"version": "v2", "arch": None, "pretrained": None, "checkpoint": None,
          "model_config": None}

# ---------------------------------------------------------------- search
SEARCH_REQUEST = {"text": "a red circle", "top_k": 1}
SEARCH_RESPONSE = {
    "gallery": "demo", "version": "v1", "route": "native", "space": "v1", "kind": "image",
    "hits": [
        {"id": "pairs-000029", "score": 0.1092610632334098,
         "payload": {"caption": "a picture showing a blue disk over a purple six-sided shape "
                                "against a black background",
                     "domain": "pairs",
                     "source": "data/bootstrap/world/images/pairs-000029.png"},
         "version": "v1", "space": "v1"}],
    "reranked": None}

# ---------------------------------------------------------------- items
ITEMS_REQUEST = {"items": [
    {"id": "photo-0001", "text": "a red circle on a white background",
     "payload": {"album": "shapes"}},
    {"id": "photo-0002", "image_base64": PNG_1X1, "payload": {"album": "shapes"}}]}
INGEST_RESPONSE = {"gallery": "demo", "version": "v1", "space": "v1", "count": 2}

# ---------------------------------------------------------------- jobs
JOB_REQUEST = {"kind": "adapter", "gallery": "demo", "auto_promote": True,
               "params": {"new": {"version": "v2"}, "sample": 40,
                          "config": {"method": "procrustes", "slerp_t": 0.5, "seed": 0}}}


def adapter_params(sample: int) -> dict[str, Any]:
    """An ``adapter`` job's parameters as its record keeps them (defaults filled in)."""
    return {"new": NEW_V2, "sample": sample, "seed": 0,
            "config": {"method": "procrustes", "slerp_t": 0.5, "seed": 0},
            "version_id": None, "validation": None}


def job(id: str, kind: str, params: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """A ``JobOut`` as a queued job of ``kind`` shows it, with ``fields`` changed."""
    return {"id": id, "kind": kind, "gallery": "demo", "params": params, "status": "queued",
            "progress": {}, "created_by": "ops", "created_at": "2026-11-27T09:20:44.112873+00:00",
            "started_at": None, "ended_at": None, "heartbeat_at": None, "worker": None,
            "cancel_requested": False, "auto_promote": False, "version": None, "gate": None,
            "promoted": False, "result": {}, "error": None, "attempts": 0, "shards": [],
            **fields}


QUEUED_JOB = job("job-7217f355e227", "adapter", adapter_params(40), auto_promote=True)
FINISHED_JOB = job(
    "job-7217f355e227", "adapter", adapter_params(40), auto_promote=True, status="succeeded",
    progress={"stage": "gate"}, started_at="2026-11-27T09:20:45.027411+00:00",
    ended_at="2026-11-27T09:20:53.540219+00:00",
    heartbeat_at="2026-11-27T09:20:53.301855+00:00", worker="embedded@localhost:41207",
    version="v-20261127092052-14adfe", promoted=True, attempts=1,
    gate={"candidate": "v-20261127092052-14adfe", "gallery": "demo", "incumbent": "v1",
          "passed": True,
          "checks": [
              {"direction": "t2i", "subset": "all", "new_to_old": 0.044, "old_to_old": 0.044,
               "required": 0.044, "passed": True},
              {"direction": "i2t", "subset": "all", "new_to_old": 0.08, "old_to_old": 0.08,
               "required": 0.08, "passed": True}],
          "criterion": {"metric": "R@1", "margin": 0.0},
          "negative_flip": {"t2i": 0.0, "i2t": 0.0},
          "positive_flip": {"t2i": 0.0, "i2t": 0.0}},
    result={"pairs": {"image": 40, "text": 40}, "skipped": {"image": [], "text": []}})

# ---------------------------------------------------------------- migrations
# A 20,000-item gallery switched progressively at 65% of its backfill, now at 75%: the
# shares are those of the transform+random curve on the bench plan page.
MIGRATION_REQUEST = {"transform": True, "transform_config": {"method": "residual-mlp"},
                     "order": "random", "switch": "progressive"}
MIGRATE_PARAMS = {"shards": 2, "batch_size": 64, "rate_limit": None, "auto_switch": True,
                  "validation": None, "transform": True,
                  "transform_config": {"method": "residual-mlp"}, "sample": None,
                  "order": "random", "switch": "progressive", "seed": 0, "serving": "route",
                  "backfill": "run", "rerank_k": None}
MIGRATE_JOB = job("job-e8ae14a92656", "migrate", MIGRATE_PARAMS,
                  created_at="2026-11-27T09:21:02.480112+00:00")
MIGRATION_RESPONSE = {
    "gallery": "demo", "state": "switched", "phase": "serving",
    "phase_note": "switched progressively: the target side serves while the backfill "
                  "still runs",
    "options": ["rollback", "cancel", "pause"], "job_error": None, "serving": "route",
    "rerank_k": None, "serving_space": "v2", "version": "v-20261127092052-14adfe",
    "source": {"space": "v1", "collection": "demo-1c9e4f0a"},
    "target": {"space": "v2", "collection": "demo-e8ae14a9"},
    "job": "job-e8ae14a92656", "job_status": "running",
    "started_at": "2026-11-27T09:21:02.513390+00:00", "started_by": "ops",
    "progress": {"stage": "backfill", "done": 15000, "total": 20000, "items_per_s": 1650.0,
                 "eta_s": 3.0, "paused": False, "applied": 15000, "unreadable": 0,
                 "fraction": 0.75, "reembedded": 15000, "items": 20000, "listed": 20000,
                 "transformed": 5000, "filled_by_reads": 0, "filled_by_backfill": 15000,
                 "order": "random", "switch": "progressive", "switch_at": 0.65,
                 "switched_at_fraction": 0.65,
                 "switched_at": "2026-11-27T09:21:11.204512+00:00",
                 "switched_back_at_fraction": None,
                 "share_estimate": {"fraction": 0.75, "t2i": 0.584, "i2t": 0.969}},
    "gate": None, "result": {"applied": 15000, "checks": []}, "record": None}
SWITCH_REQUEST = {"drop": ["pairs-000031"]}

# ---------------------------------------------------------------- plans
# The numbers are those of the example plan on the bench plan page (20,000 items), under
# a compute budget of a tenth of a full backfill.
PLAN_REQUEST = {"new": {"version": "v2"}, "constraints": {"budget": 0.1}}
PLAN_PARAMS = {"new": NEW_V2, "sample": None, "seed": 0, "validation": None,
               "constraints": {"max_added_latency_ms": None, "max_negative_flip": None,
                               "budget": 0.1, "budget_gpu_hours": None},
               "objective": "lower", "stale_share": 0.1}
PLAN_JOB = job("job-5fa8857d4eae", "plan", PLAN_PARAMS,
               created_at="2026-11-27T09:20:11.904731+00:00")
PLAN_RESPONSE = {
    "id": "job-5fa8857d4eae", "gallery": "demo", "status": "succeeded",
    "progress": {"stage": "done"}, "error": None,
    "created_at": "2026-11-27T09:20:11.904731+00:00",
    "ended_at": "2026-11-27T09:20:22.245006+00:00", "params": PLAN_PARAMS,
    "plan": {
        "objective": "lower",
        "options": [
            {"name": "route:procrustes+slerp", "kind": "route", "measured": True,
             "applicable": True, "share": {"t2i": {"share": 0.178, "se": 0.046},
                                           "i2t": {"share": 0.649, "se": 0.126}},
             "score": 0.178, "compute": {"fraction": 0.0253},
             "recommended": True, "why_not": None},
            {"name": "route:affine+slerp", "kind": "route", "measured": True,
             "applicable": True, "share": {"t2i": {"share": 0.119, "se": 0.046},
                                           "i2t": {"share": 0.608, "se": 0.137}},
             "score": 0.119, "compute": {"fraction": 0.0254}, "recommended": False,
             "why_not": "not better than the cheaper route:procrustes+slerp beyond the "
                        "error: 0.119 against 0.178 (error 0.041)"},
            {"name": "migrate:transform+random", "kind": "migration", "measured": True,
             "applicable": True, "share": {"t2i": {"share": 1.0, "se": 0.0},
                                           "i2t": {"share": 1.0, "se": 0.0}},
             "score": 1.0, "switch_at": 0.65, "compute": {"fraction": 1.19},
             "recommended": False,
             "why_not": "compute 1.19 of a full backfill > budget 0.1"}],
        "recommendation": {"option": "route:procrustes+slerp",
                           "why": "route:procrustes+slerp: the largest gain that fits "
                                  "(0.178, compute 0.0253 of a full backfill)"}},
    "basis": {"items": 20000, "incumbent": "v1", "space": "v1", "migration": None,
              "validation": {"path": "data/bootstrap/validation",
                             "digest": ("sha256:1e5b479bcab61b2f24d223b781ee41417"
                                        "b7f7756be867a79b5f5bef1dcc4877a")}},
    "stale": [], "applied": []}
APPLY_REQUEST = {"option": "route:procrustes+slerp"}
APPLIED_RESPONSE = {"plan": "job-5fa8857d4eae", "option": "route:procrustes+slerp",
                    "job": job("job-7217f355e227", "adapter", adapter_params(500),
                               auto_promote=True),
                    "forced": False, "stale": []}


ALL = (SEARCH_REQUEST, SEARCH_RESPONSE, ITEMS_REQUEST, INGEST_RESPONSE, JOB_REQUEST,
       QUEUED_JOB, FINISHED_JOB, MIGRATION_REQUEST, MIGRATE_JOB, MIGRATION_RESPONSE,
       SWITCH_REQUEST, PLAN_REQUEST, PLAN_JOB, PLAN_RESPONSE, APPLY_REQUEST, APPLIED_RESPONSE)


def examples(*values: dict[str, Any]) -> dict[str, Any]:
    """``json_schema_extra`` (or its part) that lists ``values`` as the schema's examples."""
    return {"examples": list(values)}


def example_response(status: int, value: dict[str, Any]) -> dict[int | str, dict[str, Any]]:
    """A route's ``responses`` entry giving its ``status`` answer an example (merged with
    the answer's model by FastAPI)."""
    return {status: {"content": {"application/json": {"example": value}}}}


def without_nulls(value: Any) -> Any:
    """``value`` as FastAPI's document keeps it: no null in any object."""
    if isinstance(value, dict):
        return {k: without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_nulls(v) for v in value]
    return value


def restore_nulls(document: dict[str, Any]) -> None:
    """Put back the nulls of every example of ``ALL`` in an OpenAPI ``document`` (FastAPI
    encodes it with ``exclude_none``, so ``"error": null`` would vanish from an answer
    that always has it): each ``example`` and each item of an ``examples`` list that is
    one of them, nulls left out, becomes that example again."""
    stripped = [(without_nulls(value), value) for value in ALL]

    def original(value: Any) -> Any:
        return next((full for bare, full in stripped if bare == value), value)

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if "example" in node:
                node["example"] = original(node["example"])
            if isinstance(node.get("examples"), list):
                node["examples"] = [original(v) for v in node["examples"]]
            for child in node.values():
                walk(child)
        elif isinstance(node, list):
            for child in node:
                walk(child)
    walk(document)
