"""What a ``migrate`` job takes (also the body of POST /v1/galleries/{gallery}/migration)."""

from __future__ import annotations

from pydantic import Field

from service.jobkinds.base import Params, check_dataset
from service.state.paths import Roots
from service.state.registry import Registry


class MigrateParams(Params):
    """Re-embed every item of the gallery with its active version natively, into a new
    side (collection) in that version's space, then switch (``service.jobkinds.migrate``)."""

    shards: int = Field(2, ge=1, le=256, description="ranges of the items that workers "
                                                     "backfill at once, each resumable")
    batch_size: int = Field(64, ge=1, le=4096, description="items per forward")
    rate_limit: float | None = Field(None, ge=0, description="items/s over all shards, so a "
                                     "backfill does not starve searches on a shared host; 0: "
                                     "none; default: the NOBACKFILL_MIGRATION_RATE_LIMIT setting")
    auto_switch: bool = Field(True, description="switch when every item has its new vector "
                                                "and the gate passes")
    validation: str | None = Field(None, description="gate data (default: the gallery's)")

    def check(self, registry: Registry, roots: Roots) -> None:
        check_dataset(roots, self.validation, "validation")
