"""Request and response bodies of /v1/jobs (the stored record is service.state.jobs.Job)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StrictBool,
    create_model,
)
from pydantic.json_schema import Examples
from pydantic_core import PydanticCustomError

from service.api.schemas.examples import JOB_REQUEST
from service.jobkinds import KINDS, JobKind, Params
from service.state.jobs import Job


class JobBase(BaseModel):
    """What every job submission has; each kind's model (``job_in``) narrows ``kind`` to
    its tag and ``params`` to its parameters."""

    model_config = ConfigDict(extra="forbid")

    kind: str
    gallery: str = Field(min_length=1, max_length=63,
                         description="the gallery the job serves: its active version is the "
                                     "parent / old model, its validation set feeds the gate")
    params: Params
    auto_promote: StrictBool = Field(False, description="promote the result if its gate passes")


def job_in(kind: str, params: type[Params]) -> type[JobBase]:
    """The submission of one kind: ``kind`` is the tag, ``params`` that kind's parameters
    (optional where every parameter has a default)."""
    required = any(field.is_required() for field in params.model_fields.values())
    about = f"the parameters of a job of kind '{kind}'"
    default: Any = Field(..., description=about) if required \
        else Field(default_factory=params, description=about)
    name = "".join(part.capitalize() for part in kind.split("_")) + "JobIn"
    return create_model(name, __base__=JobBase, __doc__=f"A job of kind '{kind}'.",
                        kind=(Literal[kind], ...),  # type: ignore[arg-type]
                        params=(params, default))


def known_kind(value: Any) -> Any:
    """An unknown or missing kind is refused naming the kinds, not echoing what was sent
    (the union's own error quotes the whole tag)."""
    if isinstance(value, dict):
        kind = value.get("kind")
        if not (isinstance(kind, str) and kind in KINDS):
            raise PydanticCustomError("invalid_kind", "kind must be one of: {kinds}",
                                      {"kinds": ", ".join(KINDS)})
    return value


def job_union(kinds: dict[str, JobKind]) -> Any:
    """The submission of any of ``kinds``: a union on ``kind``, so the document states each
    kind's parameters and a bad one is a 422 naming it (``body.<kind>.params.<name>``),
    before the use case checks what they point at (files, versions)."""
    members = tuple(job_in(name, kind.params) for name, kind in kinds.items())
    return Annotated[Union[members],  # noqa: UP007
                     Discriminator("kind"), BeforeValidator(known_kind)]


# The registered kinds (``service.jobkinds.KINDS``), with an example for the document.
if TYPE_CHECKING:  # what a type checker can follow: every member is a JobBase
    JobIn = JobBase
else:
    JobIn = Annotated[job_union(KINDS), Examples([JOB_REQUEST])]


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
        kind = KINDS.get(job.kind)
        shown = kind.progress(job) if kind is not None else {}  # e.g. a migration's shards
        if shown:
            data["progress"] = {**job.progress, **shown}
        return cls(**data)
