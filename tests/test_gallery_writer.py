"""The gallery writer's contract, the same tests on both backends (qdrant-client's way):
``DirectWriter`` writes into the gallery's sides now; ``SpooledWriter`` writes a worker's
job spool, which the gateway's applier writes batch by batch with a ``DirectWriter``.
qdrant-client's local mode stands in for the server."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from service.state.gallery.client import open_embedded
from service.state.gallery.store import GalleryStore
from service.state.registry.records import Migration, Side
from service.state.thumbnails import ThumbnailStore
from service.vectors.embed import Pixels, embed
from service.vectors.ingest import Source, payload, upserts
from service.vectors.spool import SpooledWriter, pending, read_batch
from service.vectors.writer import Applied, Batch, DirectWriter, Sides

DIM = 8
BACKENDS = ["direct", "spooled"]


def unit(seed: int) -> np.ndarray:
    v = np.random.default_rng(seed).normal(size=DIM).astype(np.float32)
    return v / np.linalg.norm(v)


@dataclass
class Gallery:
    """A gallery ``g`` in local Qdrant: its serving side (space ``old``), and a writer of
    the chosen backend whose ``write`` returns what was written into Qdrant."""

    backend: str
    root: Path
    engine: str
    store: GalleryStore = field(init=False)
    thumbnails: ThumbnailStore = field(init=False)
    sides: Sides = field(init=False)

    def __post_init__(self) -> None:
        self.store = GalleryStore(open_embedded(self.engine), serialise=True)
        self.store.create("g", DIM)
        self.thumbnails = ThumbnailStore(self.root / "thumbnails")
        self.sides = Sides({"old": "g"})
        (self.root / "job").mkdir()

    def direct(self) -> DirectWriter:
        return DirectWriter(self.store, self.thumbnails, "g", lambda: self.sides)

    def write(self, batch: Batch) -> Applied:
        if self.backend == "direct":
            return self.direct().write(batch)
        spooled = SpooledWriter(self.root / "job", self.thumbnails, "g")
        assert spooled.write(batch) == Applied(spooled=len(batch.items))
        applied = []
        for path in pending(self.root / "job"):  # what the gateway's applier does
            applied.append(self.direct().write(read_batch(path)))
            path.unlink()
        assert len(applied) == 1
        return applied[0]

    def open_migration(self, state: str = "backfilling") -> str:
        target = self.store.create_side("g", DIM)
        migration = Migration("job1", "v2", Side("old", "g"), Side("new", target), state,
                              "2026-01-01T00:00:00Z", "test")
        self.sides = Sides({"old": "g", "new": target}, migration)
        return target


@pytest.fixture(params=BACKENDS)
def gallery(request: pytest.FixtureRequest, tmp_path: Path, engine: str):
    made = Gallery(request.param, tmp_path, engine)
    yield made
    made.store.close()


def image(colour: tuple[int, int, int]) -> Image.Image:
    return Image.new("RGB", (40, 30), colour)


def sources() -> list[Source]:
    return [Source("a", "a red square", image((200, 0, 0)), payload({"k": 1}, caption="red"),
                   "cas:" + "0" * 64),
            Source("b", "a blue circle", None, payload(domain="shapes"))]


def vectors(seed: int, spaces: tuple[str, ...] = ("old",)) -> dict[str, list[dict]]:
    return {space: [{"text": unit(seed + 10 * n), "image": unit(seed + 10 * n + 1)}
                    if n == 0 else {"text": unit(seed + 10 * n)} for n in range(2)]
            for space in spaces}


def test_new_items_are_stored_with_payload_origin_version_and_thumbnails(gallery) -> None:
    applied = gallery.write(upserts("v1", sources(), vectors(0)))
    assert applied == Applied(written=2)
    stored = gallery.store.stored("g", ["a", "b"])
    assert stored["a"].payload == {"k": 1, "caption": "red"}
    assert stored["a"].origin == {"text": "a red square", "image": "cas:" + "0" * 64}
    assert stored["b"].origin == {"text": "a blue circle"}
    assert stored["b"].payload == {"domain": "shapes"}
    assert {s.version for s in stored.values()} == {"v1"}
    assert sorted(stored["a"].kinds) == ["image", "text"] and stored["b"].kinds == ("text",)
    got = gallery.store.vectors("g", ["a", "b"])
    np.testing.assert_allclose(got["a"]["image"], unit(1), atol=1e-6)
    np.testing.assert_allclose(got["b"]["text"], unit(10), atol=1e-6)
    assert gallery.thumbnails.read("g", "a") is not None
    assert gallery.thumbnails.read("g", "b") is None


def test_an_item_is_replaced_by_id_with_a_new_etag_and_loses_a_thumbnail_it_no_longer_has(
        gallery) -> None:
    gallery.write(upserts("v1", sources(), vectors(0)))
    before = gallery.store.stored("g", ["a"])["a"]
    again = Source("a", "a red square, again", None, payload({"k": 2}))
    assert gallery.write(upserts("v1.1", [again], {"old": [{"text": unit(77)}]})).written == 1
    after = gallery.store.stored("g", ["a"])["a"]
    assert gallery.store.count("g") == 2
    assert after.etag != before.etag and after.version == "v1.1"
    assert after.payload == {"k": 2} and after.kinds == ("text",)
    np.testing.assert_allclose(gallery.store.vectors("g", ["a"])["a"]["text"], unit(77),
                               atol=1e-6)
    assert gallery.thumbnails.read("g", "a") is None


def test_writing_the_same_batch_twice_changes_no_vector(gallery) -> None:
    gallery.write(upserts("v1", sources(), vectors(0)))
    first = gallery.store.fingerprint("g")
    gallery.write(upserts("v1", sources(), vectors(0)))
    assert gallery.store.fingerprint("g") == first
    assert gallery.store.count("g") == 2


def test_during_a_migration_an_upsert_reaches_both_sides_with_one_etag(gallery) -> None:
    target = gallery.open_migration()
    batch = upserts("v1", sources(), vectors(0, ("old", "new", "retired")))
    assert gallery.write(batch).written == 2
    old, new = gallery.store.stored("g", ["a", "b"]), gallery.store.stored(target, ["a", "b"])
    assert {i: s.etag for i, s in old.items()} == {i: s.etag for i, s in new.items()}
    assert len({s.etag for s in old.values()}) == 2  # one etag per item
    assert gallery.store.stored(target, ["a"])["a"].payload == old["a"].payload


def test_a_backfill_writes_only_items_unchanged_since_they_were_read(gallery) -> None:
    gallery.write(upserts("v1", [*sources(), Source("c", "a green star")],
                          {"old": [*vectors(0)["old"], {"text": unit(5)}]}))
    target = gallery.open_migration()
    read = gallery.store.stored("g", ["a", "b", "c"])  # what the backfill's listing read
    gallery.direct().write(upserts("v1", [Source("b", "rewritten")],
                                   {"old": [{"text": unit(50)}]}))  # b rewritten meanwhile
    gallery.store.delete("g", ["c"])  # and c deleted
    batch = Batch("backfill", "v2", [{"id": i, "etag": read[i].etag} for i in "abc"],
                  {"new": [{"text": unit(100 + n)} for n in range(3)]},
                  [{"id": "d", "reason": "image source gone"}])
    applied = gallery.write(batch)
    assert applied == Applied(written=1, skipped=2,
                              unreadable=({"id": "d", "reason": "image source gone"},))
    copied = gallery.store.stored(target, ["a", "b", "c"])
    assert sorted(copied) == ["a"]
    assert copied["a"].etag == read["a"].etag and copied["a"].version == "v2"
    assert copied["a"].payload == read["a"].payload and copied["a"].origin == read["a"].origin
    np.testing.assert_allclose(gallery.store.vectors(target, ["a"])["a"]["text"], unit(100),
                               atol=1e-6)


def test_a_backfill_writes_while_the_migration_is_open_and_nothing_without_one(
        gallery) -> None:
    """After a progressive switch the backfill goes on: a switched (or rolled back)
    migration still takes its batches; with no migration there is nowhere to write."""
    gallery.write(upserts("v1", sources(), vectors(0)))
    read = gallery.store.stored("g", ["a", "b"])
    batch = Batch("backfill", "v2", [{"id": i, "etag": read[i].etag} for i in "ab"],
                  {"new": [{"text": unit(1)}, {"text": unit(2)}]})
    assert gallery.write(batch) == Applied(skipped=2)  # no migration
    target = gallery.open_migration("switched")
    assert gallery.write(batch) == Applied(written=2)
    assert gallery.store.count(target) == 2


def test_a_transform_fills_only_what_the_target_lacks_and_says_how_it_was_made(
        gallery) -> None:
    gallery.write(upserts("v1", sources(), vectors(0)))
    gallery.write(upserts("v1", [Source("c", "a green star", None, payload())],
                          {"old": [{"text": unit(5)}]}))
    target = gallery.open_migration()
    read = gallery.store.stored("g", ["a", "b", "c"])
    embedded = Batch("backfill", "v2", [{"id": "a", "etag": read["a"].etag}],
                     {"new": [{"text": unit(11)}]})
    assert gallery.write(embedded) == Applied(written=1)
    made = {"by": "transform", "version": "v2", "from_space": "old", "map": "procrustes"}
    mapped = Batch("transform", "v2", [{"id": i, "etag": read[i].etag} for i in "abc"],
                   {"new": [{"text": unit(20 + n)} for n in range(3)]}, made=made)
    mapped.items[2]["etag"] = "stale"  # 'c' was rewritten since it was read
    assert gallery.write(mapped) == Applied(written=1, skipped=2)
    stored = gallery.store.stored(target)
    assert sorted(stored) == ["a", "b"]
    assert stored["a"].made == {"by": "embed", "version": "v2"}  # a real vector stays
    assert stored["b"].made == made and stored["b"].etag == read["b"].etag
    assert stored["b"].payload == read["b"].payload and stored["b"].origin == read["b"].origin
    vec = gallery.store.vectors(target, ["a", "b"])
    assert np.allclose(vec["a"]["text"], unit(11)) and np.allclose(vec["b"]["text"], unit(21))
    # The backfill then replaces the transformed vector in place (one point per item).
    again = Batch("backfill", "v2", [{"id": "b", "etag": read["b"].etag}],
                  {"new": [{"text": unit(30)}]})
    assert gallery.write(again) == Applied(written=1)
    assert gallery.store.count(target) == 2
    assert gallery.store.stored(target, ["b"])["b"].made == {"by": "embed", "version": "v2"}
    assert np.allclose(gallery.store.vectors(target, ["b"])["b"]["text"], unit(30))


def test_an_unknown_mode_is_refused(gallery) -> None:
    with pytest.raises(ValueError, match="mode"):
        gallery.write(Batch("merge", "v1", [{"id": "a"}], {"old": [{"text": unit(0)}]}))


class Recorder:
    """An encoder that records its calls and embeds a text/row by a seeded vector."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def encode_texts(self, texts: list[str]) -> np.ndarray:
        self.calls.append(("texts", list(texts)))
        return np.stack([unit(len(t)) for t in texts])

    def encode_images(self, images: list[Image.Image]) -> np.ndarray:
        self.calls.append(("images", len(images)))
        return np.stack([unit(100 + im.width) for im in images])

    def encode_image_tensors(self, pixels: torch.Tensor) -> np.ndarray:
        self.calls.append(("tensors", tuple(pixels.shape)))
        return np.stack([unit(100 + int(p[0, 0, 0])) for p in pixels])


@dataclass(frozen=True)
class Row:
    text: str | None
    image: object


@pytest.mark.parametrize("view", ["images", "pixels"])
def test_one_embed_function_one_forward_per_kind_whatever_the_images_are(view: str) -> None:
    """The same vectors whether images are decoded images (ingest) or the rows of a batch
    preprocessed ahead of the forward (a backfill): one text and one image forward."""
    widths = {0: 7, 2: 9}
    texts = {0: "ab", 1: "abc"}
    encoder = Recorder()
    use: Callable[[int, int], object]
    if view == "images":
        viewed, use = encoder, lambda n, k: Image.new("RGB", (widths[n], 4))
    else:
        pixels = torch.stack([torch.full((3, 4, 4), float(widths[n])) for n in sorted(widths)])
        viewed, use = Pixels(encoder, pixels), lambda n, k: k
    rows, k = [], 0
    for n in range(3):
        rows.append(Row(texts.get(n), use(n, k) if n in widths else None))
        k += n in widths
    got = embed(viewed, rows)
    assert [sorted(v) for v in got] == [["image", "text"], ["text"], ["image"]]
    np.testing.assert_allclose(got[0]["image"], unit(107))
    np.testing.assert_allclose(got[2]["image"], unit(109))
    np.testing.assert_allclose(got[1]["text"], unit(3))
    assert [c[0] for c in encoder.calls] == ["texts", "images" if view == "images"
                                             else "tensors"]


def test_pixels_refuses_rows_out_of_order() -> None:
    with pytest.raises(ValueError, match="rows"):
        Pixels(Recorder(), torch.zeros(2, 3, 4, 4)).encode_images([1, 0])
