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
    curve,
    done_mask,
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


def test_the_progressive_switch_point_is_where_the_side_beats_the_route_for_good() -> None:
    """A built case each way: the side beats the route from 75% on; a side that never
    beats it (the route is as good as NEW) gives no switch point."""
    items, queries = built_world()
    grid = (0.0, 0.25, 0.5, 0.75, 1.0)
    hits = curve(items, queries, {"fwd": [0, 1, 2, 3]}, grid, hybrid=False)
    # At 3/4 the side answers [T, T, T, F], as the route does: a tie does not switch.
    assert switch_fraction(hits, "fwd", grid) == 1.0
    weaker = Queries(queries.new, {"text": np.stack([np.eye(4, dtype=np.float32)[i]
                                                     for i in (0, 1, 0, 0)])},
                     queries.old, queries.relevant)  # the route answers items 0-1
    hits = curve(items, weaker, {"fwd": [0, 1, 2, 3]}, grid, hybrid=False)
    assert switch_fraction(hits, "fwd", grid) == 0.75
    perfect = Queries(queries.new, {"text": np.eye(4, dtype=np.float32)}, queries.old,
                      queries.relevant)
    hits = curve(items, perfect, {"fwd": [0, 1, 2, 3]}, grid, hybrid=False)
    assert switch_fraction(hits, "fwd", grid) is None
    # A dip after the first winning point moves the switch past the dip.
    dip = {"routed": {"t2i": np.array([True, False])},
           **{f"side o {f:g}": {"t2i": np.array(v)} for f, v in
              ((0.0, [True, True]), (0.5, [False, False]), (1.0, [True, True]))}}
    assert switch_fraction(dip, "o", (0.0, 0.5, 1.0)) == 1.0
    # The flip bound: beating on R@1 while losing a query the route answered is refused.
    flip = {"routed": {"t2i": np.array([True, False, False])},
            "side o 0": {"t2i": np.array([False, True, True])}}
    assert switch_fraction(flip, "o", (0.0,)) == 0.0
    assert switch_fraction(flip, "o", (0.0,), max_negative_flip=0.1) is None
