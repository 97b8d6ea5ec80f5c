"""Request and response bodies of /v1/jobs (the stored record is service.state.jobs.Job)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from service.state.jobs import JOB_KINDS, Job
from service.usecases.migration import progress

JobKind = Literal[tuple(JOB_KINDS)]  # type: ignore[valid-type]  # the one table of kinds


class JobIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kind: JobKind  # type: ignore[valid-type]
    gallery: str = Field(min_length=1, max_length=63,
                         description="the gallery the job serves: its active version is the "
                                     "parent / old model, its validation set feeds the gate")
    params: dict[str, Any] = Field(
        default_factory=dict,
        description="continual: method, data, domain|language, steps, batch_size, config; "
                    "xbt: new {version|arch(+pretrained|checkpoint)|model_config}, corpus, "
                    "pairs, config; evaluate: version; ingest: manifest, kinds")
    auto_promote: bool = Field(False, description="promote the result if its gate passes")


class JobOut(BaseModel):
    id: str
    kind: str
    gallery: str
    params: dict[str, Any]
    status: Literal["queued", "running", "applying", "succeeded", "failed", "cancelled"] = Field(
        description="applying: the workers are done and the gateway is writing their "
                    "results into the gallery (ingest, migrate)")
    progress: dict[str, Any]
    created_by: str
    created_at: str
    started_at: str | None
    ended_at: str | None
    heartbeat_at: str | None
    worker: str | None
    cancel_requested: bool
    auto_promote: bool
    version: str | None
    gate: dict[str, Any] | None
    promoted: bool
    result: dict[str, Any]
    error: str | None
    attempts: int = Field(0, description="starts so far: a job whose worker died after "
                                         "saving a checkpoint is queued again and resumes "
                                         "(result.requeued says when and why)")
    shards: list[dict[str, Any]] = Field(
        default_factory=list, description="a sharded job's shards (migrate): range, state, "
                                          "done/total, worker, attempts")

    @classmethod
    def of(cls, job: Job) -> JobOut:
        data = job.to_json()
        if job.kind == "migrate" and job.shards:  # done/total, items/s, ETA over the shards
            data["progress"] = {**job.progress, **progress(job)}
        return cls(**data)
