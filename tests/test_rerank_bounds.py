# ruff: noqa: F811  (the module-scoped fixtures of test_migration are imported by name)
"""The bounds of rerank on read (service/usecases/rerank.py, usecases/search.py), through
the real gateway on the embedded store, with test_rerank's migrating gallery (the trained
micro model 'up' as the new version, its new side filled only by reads):

- a search that names no ``rerank_k`` is never refused for it: NEW ranks
  min(max(top_k, rerank_k), rerank_k_max) of the route's candidates and the rest of its
  ``top_k`` follow in the route's order;
- a ``rerank_k`` over ``rerank_k_max`` is a 422 that names the limit;
- one search starts at most ``rerank_embed_max_per_request`` embeddings: the candidates
  past it keep their route place, are not queued, and are counted by a public metric."""

from __future__ import annotations

import time

from test_migration import ITEMS, migrate, migrating_stack, migration, world  # noqa: F401
from test_migration_transform import up_trained  # noqa: F401
from test_rerank import QUERY, _migrating, _new_ranking, _search

from service.state.jobs.workers import write_beat
from service.state.registry.index import utc_now

REFUSED = "nobackfill_rerank_embeds_refused_total"


def _ids(answer: dict) -> list[str]:
    return [h["id"] for h in answer["hits"]]


def test_a_plain_search_past_the_migrations_rerank_k_reranks_what_it_may_and_is_answered(
        micro_versions, world, up_trained, tmp_path) -> None:
    """A migration served by rerank with rerank_k 20, rerank_k_max 30: a plain search with
    top_k 40 gets 40 hits, the route's top 30 in NEW's order, then the route's 31st to
    40th in the route's order; top_k 50 (over the gallery's 48 items) gets every item."""
    with migrating_stack(tmp_path, micro_versions, world, up_trained, rerank_k_max=30,
                         batch_max_wait_ms=0.0) as (client, _):
        gw = client.app.state.gateway  # type: ignore[attr-defined]
        write_beat(gw.settings, "busy@elsewhere", utc_now())  # the backfill never runs
        migrate(client, shards=1, batch_size=8, serving="rerank", rerank_k=20)
        assert migration(client)["rerank_k"] == 20
        route = _ids(_search(client, top_k=40, rerank=False))
        assert len(route) == 40
        answer = _search(client, top_k=40)  # plain: as the migration serves
        assert answer["route"] == "rerank" and answer["reranked"]["k"] == 30
        assert answer["reranked"]["embedded"] == 30 and answer["reranked"]["embeds_refused"] == 0
        assert answer["reranked"]["kept_route_place"] == []
        ids = _ids(answer)
        assert len(ids) == 40
        assert ids[:30] == _new_ranking(up_trained, world, route[:30])
        assert ids[30:] == route[30:]
        assert all(h["space"] == "v3" for h in answer["hits"][:30])
        assert all(h["space"] == "v1" for h in answer["hits"][30:])  # the route's hits
        # a top_k within the migration's rerank_k still reranks the migration's k
        assert _search(client, top_k=5)["reranked"]["k"] == 20
        # over the gallery's size: every item, the route's top 30 by NEW, then the route
        route = _ids(_search(client, top_k=50, rerank=False))
        answer = _search(client, top_k=50)
        assert answer["route"] == "rerank" and answer["reranked"]["k"] == 30
        ids = _ids(answer)
        assert len(ids) == ITEMS and sorted(ids) == sorted(route)
        assert ids[:30] == _new_ranking(up_trained, world, route[:30])
        assert ids[30:] == route[30:]
        # rerank: true without a rerank_k follows the same rule; a rerank_k given is bounded
        assert len(_ids(_search(client, top_k=40, rerank=True))) == 40
        r = client.post("/v1/galleries/shapes/search",
                        json={"text": QUERY, "top_k": 10, "rerank_k": 31})
        assert r.status_code == 422 and "rerank_k_max (30)" in r.text, r.text


def test_a_rerank_k_over_rerank_k_max_is_422_naming_the_limit(gateway_factory,
                                                              tmp_path) -> None:
    with gateway_factory() as client:  # default rerank_k_max: 100
        r = client.post("/v1/galleries/shapes/search",
                        json={"text": QUERY, "top_k": 10, "rerank_k": 101})
        assert r.status_code == 422 and "rerank_k_max (100)" in r.text, r.text
        assert r.json()["error"]["code"] == "invalid_input"
        r = client.post("/v1/galleries/shapes/search",
                        data={"text": QUERY, "top_k": "10", "rerank_k": "1000"})
        assert r.status_code == 422 and "rerank_k_max (100)" in r.text, r.text
        r = client.post("/v1/galleries/shapes/search",  # at the limit: no migration, no
                        json={"text": QUERY, "top_k": 10, "rerank_k": 100})  # rerank
        assert r.status_code == 200 and r.json()["route"] != "rerank", r.text
    with gateway_factory(rerank_k_max=8, data_dir=tmp_path / "other") as client:
        r = client.post("/v1/galleries/shapes/search",
                        json={"text": QUERY, "top_k": 5, "rerank": True, "rerank_k": 9})
        assert r.status_code == 422 and "rerank_k_max (8)" in r.text, r.text


def test_one_search_starts_at_most_its_embedding_limit_and_counts_the_rest(
        micro_versions, world, up_trained, tmp_path) -> None:
    """rerank_embed_max_per_request 4, a cold new side, rerank_k 12: the route's best 4
    are embedded (NEW's order among themselves), the 8 others keep their route places,
    are never embedded nor written, and the metric counts them; the next search reads
    the 4 and embeds the next 4."""
    from test_worker import wait_for

    with migrating_stack(tmp_path, micro_versions, world, up_trained,
                         rerank_embed_max_per_request=4) as (client, _):
        view = _migrating(client)
        gw = client.app.state.gateway  # type: ignore[attr-defined]
        target = view["target"]["collection"]

        def refused() -> float:
            return gw.metrics.registry.get_sample_value(REFUSED) or 0.0

        assert refused() == 0.0
        route = _ids(_search(client, top_k=12, rerank=False))
        answer = _search(client, top_k=12, rerank=True, rerank_k=12)
        report = answer["reranked"]
        assert (report["read"], report["embedded"]) == (0, 4)
        assert report["embeds_refused"] == 8
        assert report["kept_route_place"] == route[4:]
        ids = _ids(answer)
        assert ids[4:] == route[4:]  # kept their places
        assert ids[:4] == _new_ranking(up_trained, world, route[:4])
        assert refused() == 8.0
        text = client.get("/metrics").text  # public
        assert f"{REFUSED} 8.0" in text
        # only the 4 are written (marked as filled by a read), and nothing else follows
        held = wait_for(lambda: len(h := gw.store.stored(target)) >= 4 and h, 30, "the fills")
        time.sleep(1.0)
        held = gw.store.stored(target)
        assert sorted(held) == sorted(route[:4])
        assert all((s.made or {}).get("via") == "read" for s in held.values())
        assert migration(client)["progress"]["filled_by_reads"] == 4
        again = _search(client, top_k=12, rerank=True, rerank_k=12)["reranked"]
        assert (again["read"], again["embedded"], again["embeds_refused"]) == (4, 4, 4)
        assert again["kept_route_place"] == route[8:]
        assert refused() == 12.0
        wait_for(lambda: len(gw.store.stored(target)) >= 8, 30, "the second fills")
        time.sleep(0.5)
        assert sorted(gw.store.stored(target)) == sorted(route[:8])
