"""Hybrid scoring while a gallery migrates (``service.usecases.search``): each item scored
by both sides, over the union of both sides' candidates; through the API, only while a
migration keeps two sides."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from conftest import ADMIN, bound
from qdrant_client import QdrantClient
from test_migration import add, up_version, world, world_items
from test_worker import gateway, job_settings

__all__ = ["up_version", "world"]  # fixtures

from service.state.jobs.workers import write_beat
from service.state.registry import Registry

from service.state.gallery.store import GalleryStore, Hit, Item
from service.usecases.search import Query, _fuse


def unit(v: list[float]) -> np.ndarray:
    a = np.asarray(v, np.float32)
    return a / np.linalg.norm(a)


def test_each_candidate_is_scored_on_both_sides_and_the_sum_ranks_them() -> None:
    store = GalleryStore(QdrantClient(":memory:"), serialise=True)
    old, new = store.create_side("g", 2), store.create_side("g", 2)
    # On the old side 'a' is nearest the routed query; on the new side 'b' the new query;
    # 'c' is second on both, so the sum puts it first.
    old_vecs = {"a": unit([1, 0]), "b": unit([0, 1]), "c": unit([0.8, 0.6])}
    new_vecs = {"a": unit([0, 1]), "b": unit([1, 0]), "c": unit([0.8, 0.6])}
    for collection, vecs in ((old, old_vecs), (new, new_vecs)):
        store.upsert(collection, [Item(i, {"image": v}) for i, v in vecs.items()], "v", "s")
    q_old, q_new = unit([1, 0]), unit([1, 0])
    found = [store.search(c, q, "image", 1) for c, q in ((old, q_old), (new, q_new))]
    assert [h.id for h in found[0]] == ["a"] and [h.id for h in found[1]] == ["b"]
    gateway = SimpleNamespace(store=store)
    hits = _fuse(gateway, (old, new), [q_old, q_new], found, Query(text="x", top_k=2))
    # 'a': 1 + 0, 'b': 0 + 1: both read the side they were not found on.
    assert [h.id for h in hits] == ["a", "b"] or [h.id for h in hits] == ["b", "a"]
    assert all(abs(h.score - 1.0) < 1e-5 for h in hits)
    found = [store.search(c, q, "image", 3) for c, q in ((old, q_old), (new, q_new))]
    hits = _fuse(gateway, (old, new), [q_old, q_new], found, Query(text="x", top_k=3))
    assert hits[0].id == "c" and abs(hits[0].score - 1.6) < 1e-5
    assert [round(h.score, 4) for h in hits] == sorted((round(h.score, 4) for h in hits),
                                                       reverse=True)


def test_an_item_one_side_lacks_gets_that_sides_lowest_pooled_score() -> None:
    store = GalleryStore(QdrantClient(":memory:"), serialise=True)
    old, new = store.create_side("g", 2), store.create_side("g", 2)
    store.upsert(old, [Item("a", {"image": unit([1, 0])}), Item("b", {"image": unit([0.6, 0.8])})],
                 "v", "s")
    store.upsert(new, [Item("b", {"image": unit([1, 0])})], "v", "s")  # 'a' not there yet
    found = [[Hit("a", 1.0, {}, "v", "s"), Hit("b", 0.6, {}, "v", "s")],
             [Hit("b", 1.0, {}, "v", "s")]]
    hits = _fuse(SimpleNamespace(store=store), (old, new), [unit([1, 0]), unit([1, 0])],
                 found, Query(text="x", top_k=2))
    assert [(h.id, round(h.score, 4)) for h in hits] == [("a", 2.0), ("b", 1.6)]


def test_hybrid_search_needs_an_open_migration(gateway_factory) -> None:
    with gateway_factory() as client:
        r = client.post("/v1/galleries/shapes/search", json={"text": "a red circle",
                                                              "hybrid": True})
        assert r.status_code == 409 and "hybrid" in r.json()["error"]["message"], r.text
        r = client.post("/v1/galleries/shapes/search", json={"text": "a red circle",
                                                              "hybrid": "yes"})
        assert r.status_code == 422, r.text
        r = client.post("/v1/galleries/shapes/search", headers=ADMIN,
                        data={"text": "a red circle", "hybrid": "maybe"})
        assert r.status_code == 422, r.text


def test_an_item_both_sides_found_reports_the_serving_sides_version_and_space(
        micro_versions, world, up_version, tmp_path) -> None:
    """Through the gateway, a migration open (its job queued; a worker's liveness record
    with no worker behind it, so nothing runs the job and the gallery stays backfilling, the
    source side in space v1 serving) and items written since it opened (so on both sides):
    each hit says the serving side's space, not the other side's."""
    values = job_settings(tmp_path / "data", world, broker=False, queue="training")
    with gateway(values, micro_versions, world) as client:
        settings = client.app.state.gateway.settings  # type: ignore[attr-defined]
        write_beat(settings, "idle@test", "2020-01-01T00:00:00+00:00")
        registry = Registry(settings.registry_dir)
        registry.register(up_version, by="test", gate=bound({"passed": True},
                                                            validation=str(world)))
        r = client.post("/v1/models/up/promote", headers=ADMIN, json={"gallery": "shapes"})
        assert r.status_code == 200, r.text
        r = client.post("/v1/galleries/shapes/migration", headers=ADMIN, json={"shards": 1})
        assert r.status_code == 202, r.text
        add(client, world_items(world, range(6)))  # written to both sides
        r = client.post("/v1/galleries/shapes/search", json={
            "text": "a red circle", "top_k": 6, "hybrid": True})
        assert r.status_code == 200, r.text
        answer = r.json()
        assert (answer["space"], answer["route"]) == ("v1", "hybrid")
        assert {h["id"] for h in answer["hits"]} == {f"w{i}" for i in range(6)}
        assert [(h["id"], h["space"], h["version"]) for h in answer["hits"]] == [
            (h["id"], "v1", "up") for h in answer["hits"]]
