"""What a job kind is (``JobKind``), the table of registered kinds (``KINDS``) and the
checks every submission goes through (``check_job``).

A kind is one registration object: its parameter model (with the checks made at
submission, before anything is queued), its runner (the worker calls ``run``) and its
hooks on the gateway side (start, the spool it writes, its progress, its tick). The API
schema, the gateway and the worker all read their kinds from ``KINDS``; nothing else
branches on a kind's name.

Paths are as the workers see them (the registry/data volume every process shares), and
must lie under the allowed roots (``service.state.paths``): a dataset's manifest and every
image it names, a corpus, a checkpoint. A bad parameter (unknown method, missing dataset,
path outside the roots, unknown version, invalid config value) raises ``InvalidInput``
(422) at submission, so a job that is queued can only fail for reasons that show up while
it runs. The worker reads the parameters as they were stored (``params.model_validate``):
they were checked once, at submission.

This module imports only the state layer: the worker imports every kind, and the gateway
hands its own object in (``GatewayPort``), so no kind imports the runtime or a use case.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from service.state.config import Settings
from service.state.errors import InvalidInput, NotFound, Unavailable
from service.state.gallery.store import GalleryStore
from service.state.jobs.store import Job, JobStore
from service.state.paths import Roots
from service.state.registry import Registry

SYNTH = "synth:"


class Params(BaseModel):
    """A job kind's parameters; ``check`` looks at what exists (files, versions)."""

    model_config = ConfigDict(extra="forbid")

    def check(self, registry: Registry, roots: Roots) -> None:
        """InvalidInput naming the first parameter that points at nothing usable (or
        outside ``roots``)."""

    def snapshot(self, store: GalleryStore, gallery: str, work: Path) -> None:
        """Inputs the worker needs from the gallery store, written beside the job at
        submission by the process that owns the store (most kinds need none)."""


def checkpoint_every_field() -> Any:
    """``checkpoint_every`` of the training jobs: a job whose worker dies resumes."""
    return Field(100, ge=0, le=10_000_000, description="steps between saves of the whole "
                 "training state (rank 0, in the job's work directory; an XBT stage 2 that "
                 "selects saves at every selection point): a job whose worker dies after a "
                 "save is queued again and resumes from it, up to 3 starts; 0: no saves (a "
                 "killed job fails)")


def gpus_field() -> Any:
    return Field(1, ge=1, le=64, description="GPUs (ranks) of the worker host this job "
                 "trains on, data-parallel; on a host without CUDA, CPU processes (gloo)")


def check_dataset(roots: Roots, path: str | None, name: str) -> None:
    """A dataset under the roots (its manifest and every image the manifest names)."""
    if path is not None:
        roots.dataset(path, name)


def check_version(registry: Registry, version: str | None, name: str) -> None:
    if version is None:
        return
    try:
        registry.version(version)
    except NotFound as exc:
        raise InvalidInput(f"{name}: {exc.message}") from exc


class RunContext(Protocol):
    """What a runner works with (the worker's ``JobContext``): the job and its parameters
    as checked at submission, the process settings, the job store, the heartbeat
    (``progress``, ``report``, ``check``; ``advance`` for a shard), and for a sharded job
    which shard this task runs."""

    job: Job
    params: Any
    settings: Settings
    store: JobStore
    heartbeat: Any
    shard: int | None

    def open_dataset(self, path: str, name: str) -> Any: ...

    @property
    def out(self) -> Path: ...


class GatewayPort(Protocol):
    """What a kind's gateway hooks use of the gateway process (``service.runtime.Gateway``):
    typed here so that a kind module (which the worker imports) never imports the runtime."""

    settings: Settings
    registry: Registry
    store: GalleryStore
    jobs: JobStore
    queue: Any  # service.state.jobs.broker.JobQueue: send, send_shard
    runtime: Any  # service.runtime.serving.Runtime: refresh, embedder
    candidates: Any  # service.state.candidates.CandidateCounts: save, load


Runner = Callable[[RunContext], dict[str, Any]]
Shards = list[tuple[str, int]]  # (job id, shard) to queue


async def queue_job(gateway: GatewayPort, job: Job, params: Params) -> Job:
    """The default start: write what the worker needs from the gallery store beside the
    job, then queue it; if either fails, the job record is removed again."""
    jobs, settings = gateway.jobs, gateway.settings
    try:  # read here: this process owns the gallery store
        await asyncio.to_thread(params.snapshot, gateway.store, job.gallery, jobs.work_dir(job.id))
    except Exception:
        await asyncio.to_thread(jobs.delete, job.id)
        raise
    try:
        await asyncio.wait_for(asyncio.to_thread(gateway.queue.send, job.id),
                               timeout=settings.broker_timeout_s * 2)
    except (Unavailable, asyncio.TimeoutError) as exc:
        await asyncio.to_thread(jobs.delete, job.id)
        if isinstance(exc, Unavailable):
            raise
        raise Unavailable(f"the job queue did not answer within "
                          f"{settings.broker_timeout_s * 2:.0f}s; the job was not created") from exc
    return job


def _can_start(gateway: GatewayPort, gallery: str) -> None:
    """Any kind may start by default."""


def _no_progress(job: Job) -> dict[str, Any]:
    return {}


def _nothing_to_finish(gateway: GatewayPort, job: Job) -> None:
    """A kind that does not spool finishes in its worker."""


async def _no_tick(gateway: GatewayPort) -> Shards:
    return []


@dataclass(frozen=True)
class JobKind:
    """One kind of job: its name, parameters and runner, and its gateway hooks.

    - ``can_start(gateway, gallery)``: Conflicts before the job record is created.
    - ``start(gateway, job, params)``: after the record is created, queue it (default:
      ``queue_job``; a migration opens itself and queues its shards); on failure it
      leaves nothing behind.
    - ``spools``: its workers spool into the gallery; the gateway's applier writes the
      spool, then calls ``finish(gateway, job)``.
    - ``progress(job)``: what the job record shows on top of its heartbeat's progress.
    - ``tick(gateway)``: one step of the applier's loop (the shards to queue).
    """

    name: str
    params: type[Params]
    run: Runner
    can_start: Callable[[GatewayPort, str], None] = _can_start
    start: Callable[[GatewayPort, Job, Any], Awaitable[Job]] = queue_job
    spools: bool = False
    finish: Callable[[GatewayPort, Job], None] = _nothing_to_finish
    progress: Callable[[Job], dict[str, Any]] = _no_progress
    tick: Callable[[GatewayPort], Awaitable[Shards]] = _no_tick


KINDS: dict[str, JobKind] = {}


def register(kind: JobKind) -> JobKind:
    """Make ``kind`` submittable and runnable (``service.jobkinds`` registers the built-in
    ones, one line each); ValueError for a name already taken."""
    if kind.name in KINDS:
        raise ValueError(f"job kind {kind.name!r} is already registered")
    KINDS[kind.name] = kind
    return kind


def kind_of(name: str) -> JobKind:
    if name not in KINDS:
        raise InvalidInput(f"unknown job kind {name[:40]!r}; kinds: {', '.join(KINDS)}")
    return KINDS[name]


def parse_params(kind: str, params: dict[str, Any]) -> Params:
    model = kind_of(kind).params
    try:
        return model.model_validate(params)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "params"
        raise InvalidInput(f"{kind} job: params.{where}: {first.get('msg')}") from exc


def check_job(kind: str, gallery: str, params: Params | dict[str, Any], registry: Registry,
              roots: Roots) -> Params:
    """Parse (unless the API's schema already did) and check a submission; InvalidInput
    names the first problem."""
    model = kind_of(kind).params
    parsed = params if isinstance(params, model) else parse_params(kind, dict(params))
    try:
        registry.gallery(gallery)
    except NotFound as exc:
        raise InvalidInput(f"{kind} job: {exc.message}") from exc
    parsed.check(registry, roots)
    return parsed
