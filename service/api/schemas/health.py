"""Bodies of the health routes (``/healthz``, ``/readyz``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class HealthOut(BaseModel):
    status: Literal["ok"]


class ReadyOut(BaseModel):
    """Without a key only ``status``: a load balancer learns that the replica is ready, not
    which galleries it holds or which versions serve them."""

    status: Literal["ready"]
    revision: int | None = Field(None, description="registry revision served (with a key)")
    galleries: dict[str, str] | None = Field(
        None, description="gallery -> the version serving it (with a read or admin key)")
    workers: int | None = Field(
        None, description="workers seen within worker_stale_after_s (with a key); 0 means "
                          "jobs are refused with 503, search is unaffected")
