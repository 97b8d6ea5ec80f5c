"""What a ``migrate`` job takes (also the body of POST /v1/galleries/{gallery}/migration)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from service.jobkinds.base import Params, check_dataset
from service.state.errors import InvalidInput
from service.state.paths import Roots
from service.state.registry import Registry

SAMPLE_SHARE = 0.02  # default sample: 2% of the gallery ...
SAMPLE_BOUNDS = (500, 10_000)  # ... at least 500 items (or all of them), at most 10,000


class MigrateParams(Params):
    """Re-embed every item of the gallery with its active version natively, into a new
    side (collection) in that version's space, then switch (``service.jobkinds.migrate``).
    With ``transform``, the new side is first filled by mapping every stored vector into
    the new space (a map fitted on a sample that the new version embeds), then the
    backfill replaces the transformed vectors in ``order``; with ``switch: progressive``
    the gallery switches as soon as the side as it stands beats the route on the
    validation set (simulated at the backfill's fraction), and the backfill goes on."""

    shards: int = Field(2, ge=1, le=256, description="ranges of the items that workers "
                                                     "backfill at once, each resumable")
    batch_size: int = Field(64, ge=1, le=4096, description="items per forward")
    rate_limit: float | None = Field(None, ge=0, description="items/s over all shards, so a "
                                     "backfill does not starve searches on a shared host; 0: "
                                     "none; default: the NOBACKFILL_MIGRATION_RATE_LIMIT setting")
    auto_switch: bool = Field(True, description="switch when every item has its new vector "
                                                "and the gate passes")
    validation: str | None = Field(None, description="gate data (default: the gallery's)")
    transform: bool = Field(False, description="first fill the new side with every stored "
                            "vector mapped into the new space (no encoder run over the "
                            "gallery; the map is fitted on `sample` items the new version "
                            "embeds), then backfill")
    transform_config: dict[str, Any] = Field(default_factory=dict, description="the "
                                             "transform's settings (method: procrustes, "
                                             "affine, residual-mlp; ensemble, steps, ...)")
    sample: int | None = Field(None, ge=8, le=1_000_000, description="items the new version "
                               "embeds to fit the transform (their vectors are the first "
                               "re-embedded); default 2% of the gallery, at least 500, at "
                               "most 10,000")
    order: Literal["id", "random", "learned", "candidates"] = Field(
        "id", description="backfill order: id; random; learned (most wrong transformed "
                          "vectors first, as predicted from what is stored; needs transform); "
                          "candidates (what users retrieve first: the sets of candidates "
                          "searches were served, the most served first, then the other "
                          "served candidates by count, then by id; dealt again as they stand "
                          "when a paused backfill resumes; without transform)")
    switch: Literal["end", "progressive"] = Field(
        "end", description="end: switch when every item has its new vector and the gate "
                           "passed; progressive (needs transform): as soon as the side as it "
                           "stands beats the route on the validation set, both directions, "
                           "then keep backfilling")
    seed: int = Field(0, ge=0, le=2**31 - 1, description="seed of the sample, the random "
                                                         "order and the transform's fit")
    serving: Literal["route", "rerank"] = Field(
        "route", description="how searches are answered while the new side fills: route "
                             "(the route's order), or rerank (the route's top rerank_k "
                             "candidates ranked by the new model, their missing vectors "
                             "embedded on read and written to the new side); a search's own "
                             "rerank field overrides it")
    backfill: Literal["run", "paused"] = Field(
        "run", description="run: the bulk backfill starts at once; paused: a lazy migration "
                           "(the backfill waits, while searches served by rerank fill the "
                           "new side with what they read, until POST .../migration/resume); "
                           "a running backfill can also be paused (POST .../migration/pause) "
                           "or rate-limited (rate_limit)")
    rerank_k: int | None = Field(None, ge=1, le=1000, description="candidates a reranked "
                                 "search has the new model rank (default: the server's "
                                 "rerank_k, 20)")

    def check(self, registry: Registry, roots: Roots) -> None:
        check_dataset(roots, self.validation, "validation")
        if self.transform and self.order == "candidates":
            raise InvalidInput("order 'candidates' is for a migration without transform (a "
                               "transform orders its own backfill: id, random or learned)")
        if not self.transform:
            for name, value, default in (("order", self.order, "learned"),
                                         ("switch", self.switch, "progressive")):
                if value == default:
                    raise InvalidInput(f"{name} '{value}' needs transform: true (it works on "
                                       f"the transformed side)")
            if self.transform_config or self.sample is not None:
                raise InvalidInput("transform_config and sample need transform: true")
            return
        self.transform_settings()

    def transform_settings(self) -> Any:
        """The ``TransformConfig`` (InvalidInput naming a bad key or value)."""
        from training.errors import ConfigError
        from training.upgrades.transform import TransformConfig

        try:
            return TransformConfig.from_dict({"seed": self.seed, **self.transform_config})
        except ConfigError as exc:
            raise InvalidInput(f"transform_config: {exc}") from exc

    def sample_size(self, items: int) -> int:
        if self.sample is not None:
            return min(self.sample, items)
        low, high = SAMPLE_BOUNDS
        return min(items, max(low, min(high, round(SAMPLE_SHARE * items))))
