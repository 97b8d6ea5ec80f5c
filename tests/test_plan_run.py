# ruff: noqa: F811  (module-scoped fixtures imported by name)
"""``run_plan`` on real micro models (issue 38, findings 4, 5 and 8): a trained XBT version
can be the route that serves during the plan's migrations; the baseline is the gallery's
stored vectors (by the version that embedded them) queried through the serving route; a
migration's gain is weighed over time from its start, its own fits included."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_migration import ITEMS, world  # noqa: F401
from test_migration_transform import up_trained  # noqa: F401

from training.artifacts import load_artifact
from training.data import open_dataset
from training.upgrades.plan.build import time_averaged
from training.upgrades.plan.decide import Constraints
from training.upgrades.plan.measure import DIRECTIONS, Option, Scorer, top1_hits


def _relabelled(src: Path, out: Path, version: str, space: str) -> Path:
    shutil.copytree(src, out)
    manifest = json.loads((out / "manifest.json").read_text())
    native = (manifest.get("routes") or {}).get(manifest["space"], {"kind": "native"})
    manifest = {k: v for k, v in manifest.items() if k != "gate"}
    (out / "manifest.json").write_text(json.dumps({**manifest, "space": space,
                                                   "version_id": version,
                                                   "routes": {space: native}}))
    return out


@pytest.fixture(scope="module")
def plan_of_routes(micro_versions, world, up_trained, tmp_path_factory) -> dict:
    """The gallery's vectors by 't1' (a trained micro model, native to space v1); it is
    served through 'r3' (a random model with a Procrustes route into v1, fitted on t1's
    vectors); the candidate is v3 (random); 'xbt-t1' (t1's weights as a version native to
    v1) is a trained upgrade that routes exactly onto the stored vectors: the best route."""
    from training.upgrades.adapter import AdapterFitConfig
    from training.upgrades.adapter.fit import fit_adapter, sample_from_dataset
    from training.upgrades.plan.run import run_plan

    root = tmp_path_factory.mktemp("plan-run")
    trained = Path(up_trained).parent / "trained"
    t1 = load_artifact(_relabelled(trained, root / "t1", "t1", "v1"))
    xbt = load_artifact(_relabelled(trained, root / "xbt", "xbt-t1", "v1"))
    data = open_dataset(world)
    sample = sample_from_dataset(t1, data, k=ITEMS)
    r3 = fit_adapter(load_artifact(micro_versions["v3"]), sample, AdapterFitConfig(), "v1",
                     root / "r3", version_id="r3")
    plan = run_plan(load_artifact(micro_versions["v3"]), r3, "v1", sample, data, ITEMS,
                    Constraints(), xbt=[xbt], stored=t1)
    return {"plan": plan, "t1": t1, "r3": r3, "data": data}


def test_a_trained_xbt_version_can_be_the_route_that_serves(plan_of_routes) -> None:
    plan = plan_of_routes["plan"]
    rows = {r["name"]: r for r in plan["options"]}
    assert "xbt:xbt-t1" in rows and rows["xbt:xbt-t1"]["measured"]
    migrations = [r for r in plan["options"] if r["kind"] == "migration"]
    assert migrations and all(r["apply"]["route"] == "xbt:xbt-t1" for r in migrations)


def test_the_baseline_is_the_stored_vectors_seen_through_the_serving_route(
        plan_of_routes) -> None:
    from training.versions import load_encoder

    data = plan_of_routes["data"]
    stored = load_encoder(plan_of_routes["t1"], "v1", None)
    serving = load_encoder(plan_of_routes["r3"], "v1", None)
    texts, _ = data.captions("en")
    images = [data.load_image(n) for n in range(len(data))]
    rel = data.relevance("en")
    items = {"image": stored.encode_images(images), "text": stored.encode_texts(texts)}
    queries = {"text": serving.encode_texts(texts), "image": serving.encode_images(images)}
    relevant = {"t2i": rel, "i2t": rel.T}
    expected = {d: round(float(top1_hits(queries[q] @ items[i].T, relevant[d]).mean()), 4)
                for d, (q, i) in DIRECTIONS.items()}
    assert plan_of_routes["plan"]["baseline"]["old->old"] == expected
    # the route's own vectors would be another baseline: this one is not that
    own = {"image": serving.encode_images(images), "text": serving.encode_texts(texts)}
    naive = {d: round(float(top1_hits(queries[q] @ own[i].T, relevant[d]).mean()), 4)
             for d, (q, i) in DIRECTIONS.items()}
    assert naive != expected


def test_no_slerp_route_is_offered_when_the_gallery_is_served_through_a_route(
        plan_of_routes) -> None:
    """SLERP mixes NEW's routed query with OLD's own query in the gallery's space; served
    through 'r3' (a route from space v3), the gallery has no native OLD query to mix: the
    "+slerp" routes are listed, not measured, not applicable, the reason in their note;
    the plain routes are measured and applicable."""
    rows = {r["name"]: r for r in plan_of_routes["plan"]["options"]}
    for method in ("procrustes", "affine", "residual-mlp"):
        plain, mixed = rows[f"route:{method}"], rows[f"route:{method}+slerp"]
        assert plain["measured"] and plain["applicable"]
        assert plain["apply"]["config"]["slerp_t"] == 0.0
        assert not mixed["measured"] and not mixed["applicable"] and mixed["apply"] is None
        assert mixed.get("R@1") is None and not mixed["recommended"]
        assert "'r3' through a route" in mixed["note"]
        assert "no native old query" in mixed["note"]
    assert all(r["apply"]["route"] != "route:procrustes+slerp" for r in rows.values()
               if r["kind"] == "migration")


def test_slerp_routes_are_measured_where_the_gallery_is_served_natively(
        micro_versions, plan_of_routes) -> None:
    """The same gallery served by 't1' itself (native to v1): its "+slerp" routes mix
    with t1's own query, are measured and applicable, and run both models per query."""
    from training.upgrades.adapter.fit import sample_from_dataset
    from training.upgrades.plan.run import run_plan

    t1, data = plan_of_routes["t1"], plan_of_routes["data"]
    plan = run_plan(load_artifact(micro_versions["v3"]), t1, "v1",
                    sample_from_dataset(t1, data, k=ITEMS), data, ITEMS, Constraints())
    rows = {r["name"]: r for r in plan["options"]}
    for method in ("procrustes", "affine", "residual-mlp"):
        plain, mixed = rows[f"route:{method}"], rows[f"route:{method}+slerp"]
        assert mixed["measured"] and mixed["applicable"]
        assert mixed["apply"] == {"kind": "adapter", "config": {
            "method": method, "slerp_t": 0.5, "seed": 0}}
        assert mixed["storage"]["model_bytes"] > plain["storage"]["model_bytes"]


def test_a_migration_is_weighed_over_time_its_fits_included() -> None:
    """Two migrations with the same curve over their backfill: the one that first spends
    1.4 backfills on fits (the route serving meanwhile) delivers less over time."""
    rng = np.random.default_rng(0)
    n = 400
    old = {d: rng.random(n) < 0.3 for d in ("t2i", "i2t")}
    new = {d: old[d] | (rng.random(n) < 0.5) for d in old}
    scorer = Scorer(old, new, "lower", seed=0)
    served = {f: {d: np.where(np.arange(n) < f * n, new[d], old[d]) for d in old}
              for f in (0.0, 0.25, 0.5, 0.75, 1.0)}

    def migration(overhead: float) -> Option:
        return Option("m", "migration", "", compute_seconds=1.0, compute_fraction=1 + overhead,
                      hits=new, served=served, overhead_fraction=overhead, before=old)

    plain, fitted = migration(0.0), migration(1.4)
    by_fraction = scorer.area(served)[0]
    plain_t, _ = time_averaged(scorer, plain, 2.4)
    fitted_t, _ = time_averaged(scorer, fitted, 2.4)
    assert fitted_t < plain_t  # over the fraction of the backfill alone they are equal
    assert time_averaged(scorer, plain, 1.0)[0] == pytest.approx(by_fraction)


def test_during_a_migrations_fits_the_route_serves_not_its_side_at_fraction_0() -> None:
    """A transform migration whose side at fraction 0 (every item transformed) already
    beats the route by far, switching there: over its overhead (half the horizon: its
    fits, before the side exists) the route serves, so the time average holds the
    route's score there and the side's only after, and the worst negative flip is the
    route's where it is worse than the side's."""
    from training.upgrades.plan.build import Costs, make_plan

    rng = np.random.default_rng(1)
    n = 600
    old = {d: rng.random(n) < 0.3 for d in ("t2i", "i2t")}
    new = {d: old[d] | (rng.random(n) < 0.6) for d in old}
    pick = rng.random(n)
    route = {d: np.where(pick < 0.1, new[d], old[d] & (pick > 0.2)) for d in old}
    side = {d: np.where(pick < 0.9, new[d], old[d]) for d in old}
    scorer = Scorer(old, new, "lower", seed=0)
    route_s, route_draws = scorer.score(route)
    side_s, side_draws = scorer.score(side)
    assert side_s > route_s + 0.5  # the side at 0.0 scores much higher than the route
    served = {f: side for f in (0.0, 0.5, 1.0)}  # switched at 0: the side throughout
    option = Option("migrate:transform+learned", "migration", "", compute_seconds=2.0,
                    compute_fraction=2.0, hits=new, served=served, switch_at=0.0,
                    overhead_fraction=1.0, before=route)
    value, draws = time_averaged(scorer, option, 2.0)
    # the route over [0, 1] (the fits), the side over [1, 2] (its backfill)
    assert value == pytest.approx((route_s + side_s) / 2)
    assert np.allclose(draws, (route_draws + side_draws) / 2, equal_nan=True)
    assert value < side_s - 0.25  # not the side's score over the whole run
    with pytest.raises(ValueError, match="before"):  # an overhead needs what serves then
        time_averaged(scorer, Option("m", "migration", "", 2.0, 2.0, hits=new, served=served,
                                     overhead_fraction=1.0), 2.0)

    plan = make_plan([option], scorer, Costs(n, n, 1.0), Constraints(), old, new)
    row = plan["options"][0]
    assert row["mean_share_during"] == pytest.approx(value, abs=1e-4)
    from training.upgrades.transform.simulate import negative_flip
    flips = {d: negative_flip({"old->old": old, "x": h}, "x", "old->old", d)
             for h, d in ((route, "t2i"), (route, "i2t"))}
    assert row["negative_flip"] == pytest.approx(flips, abs=1e-4)


def test_the_plan_offers_rerank_on_read_for_each_k(plan_of_routes) -> None:
    """rerank@k (issue 39) in a real plan: a migration whose searches are the serving
    route's top k ranked by the new model; it costs what the backfill costs, adds NEW
    embedding k candidates to a cold query, and applying it starts a migration served by
    rerank with that k."""
    from training.upgrades.rerank import KS

    plan = plan_of_routes["plan"]
    rows = {r["name"]: r for r in plan["options"]}
    migrate = rows["migrate"]
    for k in KS:
        row = rows[f"rerank@{k}"]
        assert row["kind"] == "migration" and row["measured"]
        assert row["apply"] == {"kind": "migrate", "route": migrate["apply"]["route"],
                                "params": {"transform": False, "serving": "rerank",
                                           "rerank_k": k}}
        assert row["compute"]["fraction"] == 1.0
        for q in ("text", "image"):
            assert row["added_latency_ms"][q] > migrate["added_latency_ms"][q]
        assert f"up to {k} candidates" in row["note"]
        if "share" in row:  # scored (the new model gains on the validation set)
            end = row["end"]  # the native side alone against both sides kept, at its end
            assert set(end["native"]) == set(end["kept"]) == {"t2i", "i2t"}
            assert isinstance(end["native_below_kept"], bool)
            assert end["kept_storage"]["gallery_bytes"] == 2 * row["storage"]["gallery_bytes"]


def test_rerank_at_k_serves_news_best_of_the_routes_top_k_from_the_first_query(
        micro_versions, world) -> None:
    """On a synthetic validation set where NEW is perfect and the route finds the relevant
    item in its top 5 for some queries only: rerank@5 hits exactly where the route's top 5
    holds it, rerank@50 (every item a candidate) is NEW's own ranking; both serve so from
    the first point of the backfill to the switch, where NEW serves natively."""
    from training.upgrades.plan.build import Costs
    from training.upgrades.plan.measure import Embedded
    from training.upgrades.plan.run import rerank_options
    from training.versions import load_encoder

    rng = np.random.default_rng(0)
    n, dim = 30, 8

    def unit(x: np.ndarray) -> np.ndarray:
        return x / np.linalg.norm(x, axis=1, keepdims=True)
    new = {"image": unit(rng.normal(size=(n, dim))), "text": unit(rng.normal(size=(n, dim)))}
    old = {"image": unit(rng.normal(size=(n, dim))), "text": unit(rng.normal(size=(n, dim)))}
    routed = {"text": unit(old["image"] + rng.normal(size=(n, dim))),
              "image": unit(old["text"] + rng.normal(size=(n, dim)))}
    eye = np.eye(n, dtype=bool)
    emb = Embedded(item_old=old, item_new=new, query_old=routed,
                   query_new={"text": new["image"], "image": new["text"]},
                   relevant={"t2i": eye, "i2t": eye})
    old_hits = emb.hits(routed, old)
    new_hits = emb.hits(emb.query_new, new)
    assert all(h.all() for h in new_hits.values())
    scorer = Scorer(old_hits, new_hits)
    data = open_dataset(world)
    enc = load_encoder(load_artifact(micro_versions["v3"]), "v3", None)
    texts, _ = data.captions("en")
    images = [data.load_image(i) for i in range(4)]
    options = {o.name: o for o in rerank_options(
        emb, routed, scorer, Costs(n, n, 1.0), enc, texts, images,
        {"text": 1.0, "image": 2.0}, "route:test", 0)}
    top5 = {d: np.argsort(-(routed[q] @ old[i].T), axis=1)[:, :5]
            for d, (q, i) in DIRECTIONS.items()}
    in_top5 = {d: (top5[d] == np.arange(n)[:, None]).any(1) for d in top5}
    assert 0 < in_top5["t2i"].sum() < n  # the route misses some: rerank@5 cannot recover them
    for name, expected in (("rerank@5", in_top5), ("rerank@50", new_hits)):
        o = options[name]
        assert o.served is not None and o.served[1.0] is scorer.new
        for f, hits in o.served.items():
            if f < 1:
                assert all(np.array_equal(hits[d], expected[d]) for d in expected), (name, f)
        assert o.added_latency_ms["text"] > 1.0 and o.added_latency_ms["image"] > 2.0
        # its end: both sides kept serve its ranking; NEW is perfect here, so the native
        # side alone is never below it (the switch does not ask)
        assert all(np.array_equal(o.kept[d], expected[d]) for d in expected)
        assert o.native_below_kept is False
    # NEW's own ranking made poor, the route's top 5 ranked by a NEW that is right on its
    # candidates only: the native side alone is below both sides kept, beyond the error
    poor = {d: np.zeros(n, bool) for d in new_hits}
    below = {o.name: o for o in rerank_options(
        emb, routed, Scorer(old_hits, poor), Costs(n, n, 1.0), enc, texts, images,
        {"text": 1.0, "image": 2.0}, "route:test", 0)}["rerank@5"]
    assert below.native_below_kept is True
    # the plan's row shows the end: shares of the native side and of both sides kept
    from training.upgrades.plan.build import make_plan

    plan = make_plan([options["rerank@5"]], scorer, Costs(n, n, 1.0), Constraints(),
                     old_hits, new_hits)
    end = plan["options"][0]["end"]
    assert end["native_below_kept"] is False and "it switches" in end["note"]
    assert end["native"]["t2i"]["share"] == 1.0  # NEW's whole gain
    assert end["kept"]["t2i"]["share"] < 1.0  # the route's top 5 miss some


def test_rerank_options_are_held_to_the_latency_constraint(plan_of_routes) -> None:
    from training.upgrades.plan.build import make_plan  # noqa: F401 (the same rule)
    from training.upgrades.plan.decide import Scored, recommend

    plan = plan_of_routes["plan"]
    rows = [r for r in plan["options"] if r["name"].startswith("rerank@")]
    cheapest = min(max(r["added_latency_ms"].values()) for r in rows)
    scored = [Scored(r["name"], 1.0, 0.0, max(r["added_latency_ms"].values()), 0.0, True,
                     score=0.5, draws=np.full(10, 0.5)) for r in rows]
    decision = recommend(scored, Constraints(max_added_latency_ms=cheapest / 2))
    assert decision["option"] is None
    assert all("ms per query" in why for why in decision["rejected"].values())
