"""Where a training job's ranks run: in the task's own process for one GPU (as always),
else on ``gpus`` ranks spawned from it (``training.distributed``). The task stays the
unit of work: it supervises the ranks, publishes rank 0's progress through the job's
heartbeat, and on cancel or failure stops every rank before the job ends (the lifecycle
then removes the work directory, and with it any partial artifact)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.jobkinds.base import RunContext


def train_candidate(ctx: RunContext, gpus: int, fn: Callable[..., Any],
                    **kwargs: Any) -> Any:
    """``fn(**kwargs)`` on ``gpus`` GPUs of this worker's host (CPU processes over gloo
    where it has no CUDA): the artifact it wrote at ``kwargs["out"]``. ConfigError (the
    job fails with its message) for a ``gpus`` the host cannot give."""
    from training.distributed import train_artifact

    return train_artifact(gpus, fn, kwargs, device=ctx.settings.device,
                          on_progress=ctx.heartbeat.report, check=ctx.heartbeat.check)


def checkpoint_dir(ctx: RunContext, every: int) -> str | None:
    """Where the job saves its training state (``every`` steps; None when it does not): a
    job queued again after its worker died finds what its last run saved there and resumes
    (``JobStore.reap``)."""
    return str(ctx.store.checkpoint_dir(ctx.job.id)) if every else None
