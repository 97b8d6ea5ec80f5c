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
    at_one = what_serves(cache, old, new, dataset, 1, "rerank")
    k_all = len(dataset) * 10
    everything = what_serves(cache, old, new, dataset, k_all, "rerank")
    for d in ("t2i", "i2t"):
        assert at_one["R@1"][d]["rerank@1"] == round(routed[d]["R@1"], 4)
        assert everything["R@1"][d][f"rerank@{k_all}"] == round(native[d]["R@1"], 4)
        assert at_one["R@1"][d]["native"] == round(native[d]["R@1"], 4)
        assert at_one["R@1"][d]["hybrid"] == everything["R@1"][d]["hybrid"]  # k-free
    assert everything["native_below"] is False  # the same hits: never below
    assert at_one["mode"] == "rerank@1" and "against rerank@1" in at_one["why"]
    # served by the route, the gate itself compares: never "below what serves"
    routed_view = what_serves(cache, old, new, dataset, 1, "route")
    assert routed_view["mode"] == "route" and routed_view["native_below"] is False
    assert routed_view["native_below_fused"] == at_one["native_below_fused"]


def test_hybrid_hits_sum_both_sides_scores() -> None:
    """``hybrid_top1_hits`` against a plain loop over queries."""
    import numpy as np

    from training.compatibility import hybrid_top1_hits

    rng = np.random.default_rng(1)

    def unit(n: int) -> np.ndarray:
        v = rng.normal(size=(n, 5))
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    images, texts = 12, 24
    route, old, new = ((unit(images), unit(texts)) for _ in range(3))
    relevance = np.zeros((texts, images), bool)
    relevance[np.arange(texts), np.arange(texts) % images] = True
    got = hybrid_top1_hits(route, old, new, relevance)
    for m in range(texts):
        best = max(range(images), key=lambda c: float(route[1][m] @ old[0][c]
                                                      + new[1][m] @ new[0][c]))
        assert got["t2i"][m] == relevance[m, best]
    for n in range(images):
        best = max(range(texts), key=lambda c: float(route[0][n] @ old[1][c]
                                                     + new[0][n] @ new[1][c]))
        assert got["i2t"][n] == relevance.T[n, best]
