"""Hybrid scoring while a gallery migrates (``service.usecases.search``): each item scored
by both sides, over the union of both sides' candidates (an item a side lacks scored there
by the line from the other side's score); through the API, only while a migration keeps
two sides, each hit as the serving side holds it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from conftest import ADMIN, bound
from qdrant_client import QdrantClient
from test_migration import add, up_version, world, world_items
from test_worker import gateway, job_settings

__all__ = ["up_version", "world"]  # fixtures

from service.state.gallery.store import GalleryStore, Item
from service.state.jobs.workers import write_beat
from service.state.registry import Registry
from service.usecases.search import Query, _fuse


def unit(v: list[float]) -> np.ndarray:
    a = np.asarray(v, np.float32)
    return a / np.linalg.norm(a)


def test_each_candidate_is_scored_on_both_sides_and_the_sum_ranks_them(embedded_store) -> None:
    store = embedded_store
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


def with_cosine(c: float) -> np.ndarray:
    """A unit vector whose cosine with [1, 0] is ``c``."""
    return np.asarray([c, np.sqrt(1 - c * c)], np.float32)


def test_an_item_one_side_lacks_is_scored_there_by_the_line_from_the_other_side(
        embedded_store) -> None:
    """The new side's scores run at half the old side's plus 0.3 on the items both hold;
    'x', not re-embedded yet, gets 0.3 + 0.5 * its old score there, not the new side's
    lowest (which put it last although the old side ranks it first)."""
    store = embedded_store
    old, new = store.create_side("g", 2), store.create_side("g", 2)
    olds = {"a": 0.2, "b": 0.4, "c": 0.6, "d": 0.8, "x": 0.95}
    store.upsert(old, [Item(i, {"image": with_cosine(c)}) for i, c in olds.items()], "v", "s")
    store.upsert(new, [Item(i, {"image": with_cosine(0.3 + 0.5 * c)})
                       for i, c in olds.items() if i != "x"], "v", "s")
    q = unit([1, 0])
    found = [store.search(c, q, "image", 5) for c in (old, new)]
    hits = _fuse(SimpleNamespace(store=store), (old, new), [q, q], found,
                 Query(text="x", top_k=5))
    assert [h.id for h in hits] == ["x", "d", "c", "b", "a"]
    expected = {i: c + 0.3 + 0.5 * c for i, c in olds.items()}
    assert {h.id: round(h.score, 4) for h in hits} == {
        i: round(v, 4) for i, v in expected.items()}


def test_two_sides_that_score_alike_rank_as_one_whatever_share_is_backfilled() -> None:
    """A migration to a model that scores like the old one, a share of the items
    re-embedded (the rest lacking on the new side): the hybrid ranking is the old side's
    own, at every share: being re-embedded neither lifts an item nor sinks one."""
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(30, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    ids = [f"i{n}" for n in range(30)]
    query = unit(list(rng.normal(size=8)))
    expected = [ids[n] for n in np.argsort(-(vectors @ query))[:10]]
    for share in (0.2, 0.5, 0.8):
        store = GalleryStore(QdrantClient(":memory:"), serialise=True)
        old, new = store.create_side("g", 8), store.create_side("g", 8)
        store.upsert(old, [Item(i, {"image": v}) for i, v in zip(ids, vectors)], "v", "s")
        done = rng.permutation(30)[:round(30 * share)]
        store.upsert(new, [Item(ids[n], {"image": vectors[n]}) for n in done], "w", "t")
        found = [store.search(c, query, "image", 20) for c in (old, new)]
        hits = _fuse(SimpleNamespace(store=store), (old, new), [query, query], found,
                     Query(text="x", top_k=10))
        assert [h.id for h in hits] == expected, share


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
