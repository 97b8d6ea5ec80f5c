"""The gallery-side transform (``training.upgrades.transform``): its fit, its file, the
backfill orders, and the simulation that draws a migration's curve and decides where a
progressive migration switches."""

from __future__ import annotations

import numpy as np
import pytest

from training.errors import ArtifactError, ConfigError
from training.upgrades.transform import GalleryTransform, TransformConfig, fit_transform
from training.upgrades.transform.order import order_items, spearman
from training.upgrades.transform.simulate import (
    Items,
    Queries,
    beats,
    curve,
    done_mask,
    falls_below,
    join,
    joined_order,
    pad_relevance,
    share,
    switch_fraction,
)


def unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def paired(n: int, seed: int = 0, noise: float = 0.0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """OLD vectors [n, 16], NEW = OLD rotated into 24 dims (+ noise per item), the rotation."""
    rng = np.random.default_rng(seed)
    old = unit(rng.normal(size=(n, 16)))
    q, _ = np.linalg.qr(rng.normal(size=(24, 24)))
    rot = q[:16].astype(np.float32)  # [16, 24], orthonormal rows
    new = unit(old @ rot + noise * rng.normal(size=(n, 24)))
    return old, new, rot


@pytest.mark.parametrize("method", ["procrustes", "affine", "residual-mlp"])
def test_a_transform_learns_the_map_from_old_to_new_and_generalises(method: str) -> None:
    old, new, _ = paired(600)
    cfg = TransformConfig(method=method, steps=100)
    t = fit_transform({"image": old[:400], "text": old[:400]},
                      {"image": new[:400], "text": new[:400]}, cfg)
    mapped = t.apply("image", old[400:])  # items it never saw
    assert mapped.shape == (200, 24) and mapped.dtype == np.float32
    assert np.allclose(np.linalg.norm(mapped, axis=1), 1, atol=1e-5)
    cos = (mapped * new[400:]).sum(1)
    assert cos.mean() > 0.97, cos.mean()
    assert t.metrics["pairs"] == {"image": 400, "text": 400}
    assert 0.9 < t.metrics["holdout_cosine"]["image"] <= 1.0


def test_a_transform_round_trips_through_its_directory(tmp_path) -> None:
    old, new, _ = paired(300, noise=0.3)
    t = fit_transform({"image": old}, {"image": new},
                      TransformConfig(method="residual-mlp", ensemble=2, steps=30))
    t.save(tmp_path / "t")
    back = GalleryTransform.load(tmp_path / "t")
    assert back.kinds == ("image",) and len(back.maps["image"]) == 2
    assert np.allclose(back.apply("image", old[:20]), t.apply("image", old[:20]), atol=1e-6)
    assert np.allclose(back.predicted_error("image", old[:20]),
                       t.predicted_error("image", old[:20]))
    assert back.config == t.config
    with pytest.raises(ConfigError, match="no text map"):
        back.apply("text", old[:2])
    with pytest.raises(ArtifactError, match="no readable transform"):
        GalleryTransform.load(tmp_path / "missing")


def test_bad_inputs_are_refused_by_name() -> None:
    old, new, _ = paired(20)
    with pytest.raises(ConfigError, match="fewer than 8 pairs"):
        fit_transform({"image": old[:5]}, {"image": new[:5]}, TransformConfig())
    with pytest.raises(ConfigError, match="20 old vectors but 19"):
        fit_transform({"image": old}, {"image": new[:19]}, TransformConfig())
    for bad, message in (({"method": "pca"}, "method must be one of"),
                         ({"holdout": 1.0}, "holdout must be in"),
                         ({"ensemble": 0}, "ensemble must be >= 1"),
                         ({"steps": -1}, "residual-mlp needs")):
        with pytest.raises(ConfigError, match=message):
            TransformConfig.from_dict(bad)
    with pytest.raises(ConfigError, match="did you mean: stepz -> steps"):
        TransformConfig.from_dict({"stepz": 3})


def test_the_learned_order_puts_the_most_wrong_transforms_first() -> None:
    """Items whose NEW vector strays from the linear map (a known subset) are predicted
    to be wrong and ranked first."""
    rng = np.random.default_rng(1)
    old, new, _ = paired(3000, seed=1)
    strays = old[:, 0] > 0.2  # a region of OLD's space (a fifth) that NEW sees differently
    new = unit(np.where(strays[:, None], new + 0.8 * rng.normal(size=new.shape), new))
    t = fit_transform({"image": old[:2000]}, {"image": new[:2000]},
                      TransformConfig(method="procrustes"))
    rest_old, rest_new = old[2000:], new[2000:]
    scores = t.predicted_error("image", rest_old)
    truth = 1 - (t.apply("image", rest_old) * rest_new).sum(1)
    assert spearman(scores, truth) > 0.2  # most items are exact: their order is noise
    ids = [f"i{n:04d}" for n in range(1000)]
    order = order_items("learned", ids, scores)
    first = np.asarray(order[:int(strays[2000:].sum())])
    assert strays[2000:][first].mean() > 0.7  # the strays come first (a fifth at random)
    assert sorted(order) == list(range(1000))


def test_orders_by_id_and_random_are_what_they_say() -> None:
    ids = ["b", "c", "a", "e", "d"]
    assert [ids[i] for i in order_items("id", ids)] == ["a", "b", "c", "d", "e"]
    r1, r2 = order_items("random", ids, seed=3), order_items("random", ids, seed=3)
    assert r1 == r2 and sorted(r1) == list(range(5)) and r1 != order_items("random", ids, seed=4)
    assert order_items("learned", ids, np.array([0.1, 0.5, 0.5, 0.0, 0.9])) == [4, 2, 1, 0, 3]
    with pytest.raises(ConfigError, match="order must be one of"):
        order_items("fastest", ids)
    with pytest.raises(ConfigError, match="one predicted error per item"):
        order_items("learned", ids, np.zeros(2))


def built_world() -> tuple[Items, Queries]:
    """Four items, one text query each (relevant: its own item). OLD's side answers items
    0-1 right; the routed query answers items 0-2; NEW's own vectors all four; the
    transformed side none until re-embedded (its vectors point elsewhere)."""
    eye4 = np.eye(4, dtype=np.float32)
    wrong = -eye4  # each item's transform points away from its own query
    old_q = np.stack([eye4[0], eye4[1], eye4[3], eye4[2]])
    routed_q = np.stack([eye4[0], eye4[1], eye4[2], eye4[0]])
    items = Items(old={"image": eye4}, new={"image": eye4}, transformed={"image": wrong})
    queries = Queries(new={"text": eye4}, routed={"text": routed_q}, old={"text": old_q},
                      relevant={"t2i": np.eye(4, dtype=bool)})
    return items, queries


def test_the_curve_follows_the_order_and_fraction() -> None:
    items, queries = built_world()
    hits = curve(items, queries, {"fwd": [0, 1, 2, 3], "back": [3, 2, 1, 0]},
                 (0.0, 0.5, 1.0), hybrid=False)
    assert hits["old->old"]["t2i"].tolist() == [True, True, False, False]
    assert hits["routed"]["t2i"].tolist() == [True, True, True, False]
    assert hits["new->new"]["t2i"].tolist() == [True] * 4
    assert hits["side fwd 0"]["t2i"].tolist() == [False] * 4
    assert hits["side fwd 0.5"]["t2i"].tolist() == [True, True, False, False]
    assert hits["side back 0.5"]["t2i"].tolist() == [False, False, True, True]
    assert hits["side back 1"]["t2i"].tolist() == [True] * 4
    assert done_mask([2, 0, 1], 3, 1 / 3).tolist() == [False, False, True]


def test_a_share_of_the_gain_carries_its_bootstrap_error() -> None:
    hits = {"old->old": {"t2i": np.array([True] * 50 + [False] * 150)},
            "new->new": {"t2i": np.array([True] * 150 + [False] * 50)},
            "half": {"t2i": np.array([True] * 100 + [False] * 100)}}
    got = share(hits, "half", "t2i")
    assert got["share"] == pytest.approx(0.5)
    assert 0.01 < got["se"] < 0.1
    hits["new->new"]["t2i"] = hits["old->old"]["t2i"]  # no gain: no share
    assert share(hits, "half", "t2i") == {"share": None, "se": None}


def tiled(queries: Queries, copies: int) -> Queries:
    """Every query ``copies`` times (each copy its own unit): the same outcomes, measured
    on enough queries to tell a one-query-in-four lead from noise."""
    def rep(per: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: np.tile(v, (copies, 1)) for k, v in per.items()}
    return Queries(rep(queries.new), rep(queries.routed), rep(queries.old),
                   rep(queries.relevant))


def test_the_progressive_switch_point_is_where_the_side_beats_the_route_for_good() -> None:
    """A built case each way, every query 100 times: the side beats the route from 75% on;
    a side that never beats it (the route is as good as NEW) gives no switch point."""
    items, queries = built_world()
    grid = (0.0, 0.25, 0.5, 0.75, 1.0)
    hits = curve(items, tiled(queries, 100), {"fwd": [0, 1, 2, 3]}, grid, hybrid=False)
    # At 3/4 the side answers [T, T, T, F], as the route does: a tie does not switch.
    assert switch_fraction(hits, "fwd", grid) == 1.0
    weaker = Queries(queries.new, {"text": np.stack([np.eye(4, dtype=np.float32)[i]
                                                     for i in (0, 1, 0, 0)])},
                     queries.old, queries.relevant)  # the route answers items 0-1
    hits = curve(items, tiled(weaker, 100), {"fwd": [0, 1, 2, 3]}, grid, hybrid=False)
    assert switch_fraction(hits, "fwd", grid) == 0.75
    perfect = Queries(queries.new, {"text": np.eye(4, dtype=np.float32)}, queries.old,
                      queries.relevant)
    hits = curve(items, tiled(perfect, 100), {"fwd": [0, 1, 2, 3]}, grid, hybrid=False)
    assert switch_fraction(hits, "fwd", grid) is None
    # A dip after the first winning point moves the switch past the dip.
    dip = {"routed": {"t2i": np.repeat([True, False], 100)},
           **{f"side o {f:g}": {"t2i": np.repeat(v, 100)} for f, v in
              ((0.0, [True, True]), (0.5, [False, False]), (1.0, [True, True]))}}
    assert switch_fraction(dip, "o", (0.0, 0.5, 1.0)) == 1.0
    # The flip bound: beating on R@1 while losing a query the route answered is refused.
    flip = {"routed": {"t2i": np.repeat([True, False, False], 100)},
            "side o 0": {"t2i": np.repeat([False, True, True], 100)}}
    assert switch_fraction(flip, "o", (0.0,)) == 0.0
    assert switch_fraction(flip, "o", (0.0,), max_negative_flip=0.1) is None


def test_a_side_that_leads_the_route_within_the_error_does_not_switch() -> None:
    """The same built world on its four queries: at 3/4 the side answers one query more
    than the route (0.75 against 0.5), a lead a bootstrap of four queries cannot tell
    from noise (the strict ``>`` of point estimates switched there); at the end it
    answers two more (1.0 against 0.5), beyond the error."""
    items, queries = built_world()
    grid = (0.0, 0.25, 0.5, 0.75, 1.0)
    weaker = Queries(queries.new, {"text": np.stack([np.eye(4, dtype=np.float32)[i]
                                                     for i in (0, 1, 0, 0)])},
                     queries.old, queries.relevant)
    hits = curve(items, weaker, {"fwd": [0, 1, 2, 3]}, grid, hybrid=False)
    assert hits["side fwd 0.75"]["t2i"].mean() > hits["routed"]["t2i"].mean()
    assert switch_fraction(hits, "fwd", grid) == 1.0
    assert switch_fraction(hits, "fwd", grid, alpha=0.45) == 0.75  # a lax test takes it


def lead_hits(gained: int, lost: int, items: int = 100, captions: int = 5,
              ) -> dict[str, dict[str, np.ndarray]]:
    """``routed`` and ``side o 0`` over ``items`` items with ``captions`` identical caption
    queries each: the side wins ``gained`` items the route misses and loses ``lost`` it
    hits (the rest: both hit the even items)."""
    route = np.arange(items) % 2 == 0
    side = route.copy()
    misses, hits_ = np.flatnonzero(~route), np.flatnonzero(route)
    side[misses[:gained]] = True
    side[hits_[:lost]] = False
    return {"routed": {"t2i": np.repeat(route, captions)},
            "side o 0": {"t2i": np.repeat(side, captions)}}


def test_the_switch_tests_the_lead_over_items_not_caption_rows() -> None:
    """A lead of 5 items in 100 (9 won, 4 lost), each item's five captions answered
    alike: beyond the error over 500 caption rows, within it over the 100 items."""
    hits = lead_hits(9, 4)
    owners = {"t2i": np.repeat(np.arange(100), 5)}
    assert switch_fraction(hits, "o", (0.0,)) == 0.0
    assert switch_fraction(hits, "o", (0.0,), units=owners) is None
    assert switch_fraction(lead_hits(30, 0), "o", (0.0,), units=owners) == 0.0


def test_the_switch_needs_every_direction_asked_for() -> None:
    """The side beats the route in t2i and ties it in i2t: no switch over both directions;
    a gallery that serves only text->image switches."""
    t2i = lead_hits(30, 0)
    tie = np.arange(500) % 2 == 0
    hits = {"routed": {"t2i": t2i["routed"]["t2i"], "i2t": tie},
            "side o 0": {"t2i": t2i["side o 0"]["t2i"], "i2t": tie}}
    assert switch_fraction(hits, "o", (0.0,)) is None
    assert switch_fraction(hits, "o", (0.0,), directions=("t2i",)) == 0.0
    with pytest.raises(ConfigError, match="no hits for"):
        switch_fraction(hits, "o", (0.0,), directions=("x2y",))


def test_a_side_falls_below_the_route_only_beyond_the_error() -> None:
    owners = {"t2i": np.repeat(np.arange(100), 5)}
    below = lead_hits(0, 30)
    assert falls_below(below, "side o 0", "routed", units=owners)
    assert not falls_below(lead_hits(4, 9), "side o 0", "routed", units=owners)  # noise
    assert falls_below(lead_hits(4, 9), "side o 0", "routed")  # over rows it would be
    assert not falls_below(lead_hits(30, 0), "side o 0", "routed", units=owners)
    assert beats(lead_hits(30, 0), "side o 0", "routed", "t2i", owners)


def test_distractors_join_the_items_and_are_re_embedded_in_step() -> None:
    """Validation items plus distractors: rows after the items, relevant to no query, and
    the same share of each re-embedded at every fraction, each in its own order."""
    items, queries = built_world()
    extra = np.eye(4, dtype=np.float32)[[3, 2, 1, 0]] * 0.5
    dist = Items({"image": extra}, {"image": extra}, {"image": extra})
    joined = join(items, dist)
    assert joined.old["image"].shape == (8, 4) and len(joined) == 8
    assert np.array_equal(joined.transformed["image"][4:], extra)
    rel = pad_relevance(queries.relevant, 4)["t2i"]
    assert rel.shape == (4, 8) and not rel[:, 4:].any() and rel[:, :4].all() == np.eye(4).all()
    order = joined_order([2, 0, 1, 3], [1, 0, 3, 2])
    assert sorted(order) == list(range(8))
    for f in (0.25, 0.5, 0.75, 1.0):
        done = done_mask(order, 8, f)
        assert done[:4].sum() == round(f * 4) and done[4:].sum() == round(f * 4)
    assert [r for r in order if r < 4] == [2, 0, 1, 3]
    assert [r - 4 for r in order if r >= 4] == [1, 0, 3, 2]
    uneven = joined_order(list(range(10)), list(range(3)))
    for f in np.arange(0, 1.01, 0.05):
        done = done_mask(uneven, 13, f)
        assert abs(done[:10].sum() - f * 10) <= 1 and abs(done[10:].sum() - f * 3) <= 1
    with pytest.raises(ConfigError, match="every one"):
        joined_order([0, 0], [0])
    with pytest.raises(ConfigError, match="kinds"):
        join(items, Items({"text": extra}, {"text": extra}, {"text": extra}))
    hits = curve(joined, Queries(queries.new, queries.routed, queries.old,
                                 pad_relevance(queries.relevant, 4)),
                 {"o": order}, (0.0, 1.0), hybrid=False)
    assert hits["new->new"]["t2i"].all()  # the distractors (half as close) never win
