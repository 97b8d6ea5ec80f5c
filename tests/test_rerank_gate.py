# ruff: noqa: F811  (the module-scoped fixtures of test_migration are imported by name)
"""What a rerank-served migration's gate measures beside its pass/fail against the route
(``service.jobkinds.migrate.backfill.what_serves``), on real tiny models: rerank@k is the
route's top k ranked by the new model, so at k = 1 it is the route itself and at k = the
whole gallery it is the native side; the native side is below it only beyond the error."""

from __future__ import annotations

from test_migration import up_version, world  # noqa: F401

from service.jobkinds.migrate.backfill import what_serves
from training.artifacts import load_artifact
from training.compatibility import compatibility_of_artifacts
from training.data import open_dataset


def test_rerank_at_the_ends_is_the_route_and_the_native_side(micro_versions, world,
                                                             up_version) -> None:
    old, new = load_artifact(micro_versions["v1"]), load_artifact(up_version)
    dataset = open_dataset(world)
    cache: dict = {}
    cells = compatibility_of_artifacts([old, new], dataset, cache=cache)["cells"]
    routed, native = cells[new.version_id][old.version_id], cells[new.version_id][
        new.version_id]
    at_one = what_serves(cache, old, new, dataset, 1)
    everything = what_serves(cache, old, new, dataset, len(dataset) * 10)
    for d in ("t2i", "i2t"):
        assert at_one["R@1"][d]["serving"] == round(routed[d]["R@1"], 4)
        assert everything["R@1"][d]["serving"] == round(native[d]["R@1"], 4)
        assert at_one["R@1"][d]["native"] == round(native[d]["R@1"], 4)
    assert everything["native_below"] is False  # the same hits: never below
    assert at_one["mode"] == "rerank@1" and "against rerank@1" in at_one["why"]
