"""Rerank on read simulated on embeddings (training/upgrades/rerank.py): the candidates are
the route's top k, the answer NEW's best of them, and the fill curve counts each item once
and a search as warm only when it embeds nothing."""

from __future__ import annotations

import numpy as np
import pytest

from training.upgrades.rerank import (
    candidates,
    fill_curve,
    filled_share,
    recall_at,
    reranked_hits,
    zipf_stream,
)


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_candidates_are_the_routes_top_k_best_first() -> None:
    rng = np.random.default_rng(0)
    q, items = _unit(rng.normal(size=(37, 8))), _unit(rng.normal(size=(200, 8)))
    got = candidates(q, items, 7, chunk=5)
    expected = np.argsort(-(q @ items.T), axis=1, kind="stable")[:, :7]
    assert np.array_equal(got, expected)


def test_the_reranked_answer_is_news_best_candidate() -> None:
    rng = np.random.default_rng(1)
    routed, old = _unit(rng.normal(size=(50, 6))), _unit(rng.normal(size=(80, 6)))
    new_q, new = _unit(rng.normal(size=(50, 6))), _unit(rng.normal(size=(80, 6)))
    relevant = rng.random((50, 80)) < 0.1
    cands = candidates(routed, old, 5)
    hits = reranked_hits(cands, new_q, new, relevant, chunk=7)
    for q in range(50):
        best = max(cands[q], key=lambda i: new_q[q] @ new[i])
        assert hits[q] == relevant[q, best]
    # k = every item: NEW's own top-1; k = 1: the route's own top-1
    everything = reranked_hits(candidates(routed, old, 80), new_q, new, relevant)
    assert np.array_equal(everything, relevant[np.arange(50), (new_q @ new.T).argmax(1)])
    first = reranked_hits(candidates(routed, old, 1), new_q, new, relevant)
    assert np.array_equal(first, relevant[np.arange(50), (routed @ old.T).argmax(1)])
    fused = reranked_hits(cands, new_q, new, relevant, routed, old)
    for q in range(50):
        best = max(cands[q], key=lambda i: new_q[q] @ new[i] + routed[q] @ old[i])
        assert fused[q] == relevant[q, best]
    assert np.array_equal(recall_at(cands, relevant),
                          np.array([relevant[q, cands[q]].any() for q in range(50)]))


def test_the_fill_counts_each_item_once_and_warm_means_nothing_embedded() -> None:
    stream = np.array([[0, 1], [1, 2], [0, 1], [2, 0], [3, 4], [3, 4]])
    out = fill_curve(stream, 10, window=2, points=(0.2, 0.3, 0.5, 0.9))
    # embedded after each search: 2, 3, 3, 3, 5, 5 of 10; warm: F F T T F T
    assert out["final_filled"] == 0.5 and out["warm_overall"] == pytest.approx(3 / 6)
    by = {p["filled"]: p for p in out["curve"]}
    assert by[0.2]["search"] == 0 and by[0.2]["warm"] is None  # no whole window yet
    assert by[0.3]["search"] == 1 and by[0.3]["warm"] == 0.0
    assert by[0.5]["search"] == 4 and by[0.5]["warm"] == 0.5
    assert by[0.9]["search"] is None
    assert out["warm_80_at_search"] == 3 and out["warm_80_at_filled"] == 0.3
    assert filled_share([stream[:2], stream[4:]], 10) == 0.5


def test_the_candidate_order_and_a_backfill_beside_the_reads() -> None:
    from training.upgrades.rerank import candidate_order

    # {2, 5} searched twice (worth 2 / 2) first, then {5, 7} and {5, 9} (1 / 1 each, once
    # 5 is held), then the items no search named, in the default order
    learned = np.array([[5, 2], [5, 7], [2, 5], [9, 5]])
    order = candidate_order(learned, 10)
    assert order.tolist() == [2, 5, 7, 9, 0, 1, 3, 4, 6, 8]
    assert candidate_order(np.array([[1, 1, 3]]), 4).tolist() == [1, 3, 0, 2]
    # a search seen often beats a larger one seen once; a nearly held one comes early
    rows = np.array([[0, 1, 2, 3]] + [[4, 5, 4, 5]] * 3)  # rows padded with repeats
    assert candidate_order(rows, 6).tolist() == [4, 5, 0, 1, 2, 3]
    stream = np.array([[5, 2], [5, 2], [0, 1], [5, 7]])
    # one backfill item before each search (what is held already is skipped, not paid):
    # 2 (search 0 lacks 5: it fills it), 7 (search 1 warm), 9 (search 2 fills 0 and 1),
    # 3 after skipping 0 and 1 (search 3 warm: 5 and 7 held)
    out = fill_curve(stream, 10, window=1, points=(0.2, 0.6), backfill=order, per_search=1.0)
    assert out["warm_overall"] == pytest.approx(2 / 4)
    assert out["final_filled"] == pytest.approx(0.7)
    assert out["warm_80_at_search"] == 1 and out["warm_80_at_filled"] == 0.3  # 5, 2, 7
    # half an item per search: search 0 fills 2 and 5, then 7 (search 1 warm), search 2
    # fills 0 and 1, then 9 (search 3 warm)
    half = fill_curve(stream, 10, window=1, points=(0.5,), backfill=order, per_search=0.5)
    assert half["final_filled"] == pytest.approx(0.6)
    assert half["warm_overall"] == pytest.approx(2 / 4)
    assert fill_curve(stream, 10, window=1)["warm_overall"] == pytest.approx(1 / 4)


def test_a_zipf_workload_is_skewed_to_the_popular_items() -> None:
    items, k = 200, 3
    owners = {"t2i": np.repeat(np.arange(items), 2), "i2t": np.arange(items)}
    cands = {"t2i": np.arange(2 * items * k).reshape(-1, k) % 500,
             "i2t": np.arange(items * k).reshape(-1, k) % 500}
    rows, picked = zipf_stream(cands, owners, items, 5000, 1.1, seed=3)
    counts = np.bincount(picked, minlength=items)
    top = np.sort(counts)[::-1]
    assert top[:20].sum() > 0.5 * len(picked)  # the 10% most popular: most searches
    for row, item in zip(rows[:50], picked[:50], strict=True):  # each row is one of its
        ok = [cands["t2i"][q] for q in np.flatnonzero(owners["t2i"] == item)]  # item's
        ok.append(cands["i2t"][item])                                        # queries
        assert any(np.array_equal(row, c) for c in ok)


def test_the_query_shares_are_the_streams_own_and_the_greedy_fill_takes_the_best_first(
        ) -> None:
    from training.upgrades.rerank import best_fill_curve, zipf_query_shares

    items, k = 200, 3
    owners = {"t2i": np.repeat(np.arange(items), 2)[:-2], "i2t": np.arange(items)}
    cands = {"t2i": np.arange(2 * items * k).reshape(-1, k)[:-2] % 500,
             "i2t": np.arange(items * k).reshape(-1, k) % 500}
    shares = zipf_query_shares(owners, items, 1.1, seed=3)
    assert sum(x.sum() for x in shares.values()) == pytest.approx(1.0)
    _, picked = zipf_stream(cands, owners, items, 40_000, 1.1, seed=3)
    per_item = np.bincount(np.concatenate([owners[d] for d in shares]),
                           np.concatenate([shares[d] for d in shares]), minlength=items)
    seen = np.bincount(picked, minlength=items) / len(picked)
    top = np.argsort(-per_item)[:5]
    assert np.argmax(seen) == top[0]  # the same ranking as the stream's
    se = np.sqrt(per_item[top] * (1 - per_item[top]) / len(picked))
    assert np.all(np.abs(seen[top] - per_item[top]) < 4 * se)
    # the last item has no t2i query: its i2t query gets all of its popularity
    assert shares["i2t"][items - 1] == pytest.approx(per_item[items - 1])

    # three queries over ten items: the best share per missing item first
    toy = {"t2i": np.array([[0, 1], [1, 2]]), "i2t": np.array([[5, 6, 7, 8]])}
    toy_shares = {"t2i": np.array([0.35, 0.3]), "i2t": np.array([0.35])}
    got = best_fill_curve(toy, toy_shares, 10, (0.2, 0.3, 0.5, 0.7, 0.9))
    # [1, 2] once [0, 1] is held (0.3 for one item) before [5, 6, 7, 8] (0.35 for four)
    assert [p["warm"] for p in got["curve"]] == [0.35, 0.65, 0.65, 1.0, None]
    assert got["warm_80_at_filled"] == 0.7


def test_every_k_at_once_agrees_with_each_k_alone() -> None:
    from training.upgrades.rerank import every_k

    rng = np.random.default_rng(2)
    routed, old = _unit(rng.normal(size=(40, 6))), _unit(rng.normal(size=(90, 6)))
    new_q, new = _unit(rng.normal(size=(40, 6))), _unit(rng.normal(size=(90, 6)))
    relevant = rng.random((40, 90)) < 0.08
    cands = candidates(routed, old, 20)
    got = every_k(cands, new_q, new, relevant, (3, 10, 20), routed, old, 10, chunk=9)
    for k in (3, 10, 20):
        assert np.array_equal(got[f"rerank@{k}"],
                              reranked_hits(cands[:, :k], new_q, new, relevant))
        assert np.array_equal(got[f"recall@{k}"], recall_at(cands[:, :k], relevant))
    assert np.array_equal(got["fused@10"], reranked_hits(cands[:, :10], new_q, new, relevant,
                                                         routed, old))


def test_the_exact_warm_share_is_the_workloads_share_of_searches_held_whole() -> None:
    stream = np.array([[0, 1], [2, 3], [0, 1]])
    queries, shares = np.array([[0, 1], [2, 3]]), np.array([0.75, 0.25])
    out = fill_curve(stream, 8, window=1, points=(0.25, 0.5, 0.75), exact=(queries, shares))
    # after search 0 (0, 1 held: the 0.75 query warm), after search 1 (all of both)
    assert out["exact"]["curve"] == [{"filled": 0.25, "warm": 0.75},
                                     {"filled": 0.5, "warm": 1.0},
                                     {"filled": 0.75, "warm": None}]
    assert out["exact"]["warm_80_at_filled"] == 0.5
    assert "exact" not in fill_curve(stream, 8, window=1)
    # a backfill that takes the popular query's items first warms 0.75 of the searches
    # before any read
    order = np.array([0, 1, 2, 3])
    fast = fill_curve(stream, 8, window=1, points=(0.25,), backfill=order, per_search=2.0,
                      exact=(queries, shares))
    assert fast["exact"]["curve"][0]["warm"] == 0.75 and fast["warm_overall"] == 1.0


def test_the_zipf_curves_learn_before_the_migration_and_measure_during_it() -> None:
    from training.bench.frontier import ZIPF_LEARN, ZIPF_PER_SEARCH, ZIPF_SEARCHES, zipf_curves

    items, n, k = 100, 400, 4
    owners = {"t2i": np.repeat(np.arange(items), 2), "i2t": np.arange(items)}
    rng = np.random.default_rng(0)
    cands = {d: (o[:, None] * 3 + rng.integers(0, 6, (len(o), k))) % n
             for d, o in owners.items()}
    z = zipf_curves(cands, owners, items, n, 1.1, seed=0)
    assert z["learned_from"] == ZIPF_LEARN and z["searches"] == ZIPF_SEARCHES
    assert [c["per_search"] for c in z["candidates"]] == list(ZIPF_PER_SEARCH)
    alone = z["exact"]["warm_80_at_filled"]
    fastest = z["candidates"][0]["exact"]["warm_80_at_filled"]
    # the order the counted searches teach warms 80% of searches with less of the gallery
    # filled than the reads alone, at every rate
    at = [c["exact"]["warm_80_at_filled"] for c in z["candidates"]]
    assert alone is not None and fastest is not None and max(at) < alone, (at, alone)
    assert z["best_fill"]["warm_80_at_filled"] <= alone
