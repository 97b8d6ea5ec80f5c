"""Images are decoded at the size the model needs, under a decoded-pixel budget shared by
concurrent requests (issue 30, item 2): large uploads cannot add up to gigabytes of
decoded pixels, and the reduced image embeds like the original."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from conftest import ADMIN
from PIL import Image, ImageDraw, ImageFile

from training.data import generate_items, render

SIDE = 32  # the micro model's input side (conftest.MICRO_CONFIG)
pytestmark = pytest.mark.filterwarnings("ignore:Palette images with Transparency")


def encoded(image: Image.Image, fmt: str = "PNG", **params: object) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **params)
    return buf.getvalue()


def stripes(width: int, height: int, mode: str = "RGB") -> Image.Image:
    """A compressible picture with structure at every scale (not a flat colour)."""
    image = Image.new("RGB", (width, height), (200, 120, 40))
    draw = ImageDraw.Draw(image)
    for x in range(0, width, max(1, width // 23)):
        draw.rectangle((x, 0, x + width // 50, height), fill=(x % 255, 50, 200))
    for y in range(0, height, max(1, height // 17)):
        draw.ellipse((width // 10, y, width // 2, y + height // 30), fill=(10, 240, 10))
    return image.convert(mode)


def big_photo(width: int = 2400, height: int = 1800) -> Image.Image:
    """A synthetic scene scaled up: what a camera-sized upload of a small scene looks like."""
    item = generate_items(1, seed=3, languages=("en",))[0]
    return render(item, 64).resize((width, height), Image.Resampling.BICUBIC)


# ---------------------------------------------------------------- through the gateway
def sizes_reaching_the_model(monkeypatch) -> list[tuple[int, int]]:
    """The size of every image the embedder's preprocess is handed, in order."""
    from service.runtime.embedder import Embedder

    seen: list[tuple[int, int]] = []
    pixels = Embedder.pixels

    def spy(self, image):
        seen.append(image.size)
        return pixels(self, image)

    monkeypatch.setattr(Embedder, "pixels", spy)
    return seen


def test_search_decodes_a_large_image_at_the_size_the_model_needs(gateway_factory,
                                                                   monkeypatch) -> None:
    """The image reaching the model's preprocess is a few times the model's input side,
    not the 4.3-megapixel upload."""
    seen = sizes_reaching_the_model(monkeypatch)
    with gateway_factory() as client:
        r = client.post("/v1/galleries/shapes/search", data={"top_k": "1"},
                        files={"image": ("big.png", encoded(stripes(2400, 1800)), "image/png")})
        assert r.status_code == 200, r.text
    assert len(seen) == 1
    assert seen[0] == (171, 128), seen  # SIDE_MARGIN (4) times the model's side, 4:3


def test_concurrent_large_images_decode_within_the_pixel_budget(gateway_factory,
                                                                monkeypatch) -> None:
    """Four concurrent searches, each a 2.4 MP image, with a budget of one such image:
    the full-size decodes run one at a time (without the budget, all four at once)."""
    in_flight, most = 0, 0
    lock = threading.Lock()
    load = ImageFile.ImageFile.load

    def slow_load(self):
        nonlocal in_flight, most
        big = self.size[0] * self.size[1] >= 1_000_000
        if big:
            with lock:
                in_flight += 1
                most = max(most, in_flight)
            time.sleep(0.3)  # long enough for the others to start, were they allowed
        try:
            return load(self)
        finally:
            if big:
                with lock:
                    in_flight -= 1

    monkeypatch.setattr(ImageFile.ImageFile, "load", slow_load)
    data = encoded(stripes(1800, 1350))
    with gateway_factory(decode_pixel_budget=1800 * 1350 + 100_000) as client:
        def one(_: int) -> int:
            return client.post("/v1/galleries/shapes/search", data={"top_k": "1"},
                               files={"image": ("big.png", data, "image/png")}).status_code

        with ThreadPoolExecutor(4) as pool:
            statuses = list(pool.map(one, range(4)))
    assert statuses == [200] * 4
    assert most == 1


def test_search_waits_for_room_then_answers_503(gateway_factory) -> None:
    """While the budget is full longer than decode_wait_s, an image search gets 503
    (retry later); a text search is not held up; once there is room, images work."""
    from service.usecases.media import DecodeBudget

    data = encoded(stripes(300, 200))
    with gateway_factory(decode_pixel_budget=100_000, decode_wait_s=0.2) as client:
        settings = client.app.state.gateway.settings
        budget = DecodeBudget.of(settings)
        with budget.hold(100_000):
            began = time.monotonic()
            r = client.post("/v1/galleries/shapes/search",
                            files={"image": ("a.png", data, "image/png")})
            assert time.monotonic() - began >= 0.2
            assert r.status_code == 503, r.text
            assert r.json()["error"]["code"] == "unavailable"
            assert "busy decoding" in r.json()["error"]["message"]
            r = client.post("/v1/galleries/shapes/search", json={"text": "a red circle"})
            assert r.status_code == 200, r.text
        assert budget.used == 0 and budget.waiting == 0
        r = client.post("/v1/galleries/shapes/search",
                        files={"image": ("a.png", data, "image/png")})
        assert r.status_code == 200, r.text


def test_ingest_keeps_the_original_and_a_thumbnail_from_the_reduced_decode(
        gateway_factory, monkeypatch) -> None:
    """Ingest embeds the reduced image too; the kept source is the upload itself, and the
    thumbnail still has its full 96 px."""
    import base64

    from service.vectors.sources import SourceStore

    seen = sizes_reaching_the_model(monkeypatch)
    data = encoded(stripes(3000, 2000))
    with gateway_factory() as client:
        r = client.post("/v1/galleries/shapes/items", headers=ADMIN, json={"items": [
            {"id": "big", "image_base64": base64.b64encode(data).decode()}]})
        assert r.status_code == 200, r.text
        assert seen == [(192, 128)], seen  # 4 x 32 on the short side, 3:2
        thumb = client.get("/v1/galleries/shapes/items/big/thumbnail")
        assert thumb.status_code == 200
        assert max(Image.open(io.BytesIO(thumb.content)).size) == 96
        r = client.post("/v1/galleries/shapes/search", data={"top_k": "1"},
                        files={"image": ("big.png", data, "image/png")})
        assert r.json()["hits"][0]["id"] == "big"
        assert r.json()["hits"][0]["score"] == pytest.approx(1.0, abs=1e-4)
        store = SourceStore.of(client.app.state.gateway.settings)
        kept = [p for p in store.root.rglob("*") if p.is_file()]
        assert any(p.read_bytes() == data for p in kept)


# ---------------------------------------------------------------- decoding
@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "P", "1", "I;16", "CMYK"])
def test_reduced_decode_equals_converting_then_box_resizing_the_whole_image(mode) -> None:
    """Strip by strip, the result is ``convert("RGB").resize(size, BOX)`` of the whole
    image, for every mode (the strips never hold the full converted image): equal but for
    the float rounding of box edges that fall exactly between two source rows, which may
    put such a row in the other box (at most a row of output per strip boundary)."""
    from service.usecases import media
    from service.usecases.media import decode_image, plan_decode

    rng = np.random.default_rng(0)
    noise = Image.fromarray(rng.integers(0, 255, (1013, 1301, 3), dtype=np.uint8))
    source = (noise.convert("L").convert(mode) if mode in ("1", "I;16")
              else noise.convert("RGBA").convert(mode) if mode in ("RGBA", "LA", "P")
              else noise.convert(mode))
    data = encoded(source, "TIFF" if mode == "CMYK" else "PNG")
    old_strip = media.STRIP_PIXELS
    media.STRIP_PIXELS = 50_000  # many strips, with remainders
    try:
        for side in (10, 24, 60):
            size = plan_decode(data, 10**8, 10**8, side).output_size
            assert size is not None and min(size) == 4 * side
            got = decode_image(data, 10**8, 10**8, side)
            want = source.convert("RGB").resize(size, Image.Resampling.BOX, reducing_gap=None)
            assert got.mode == "RGB" and got.size == size
            diff = np.abs(np.asarray(got, dtype=int) - np.asarray(want, dtype=int))
            rows = np.count_nonzero(diff.max(axis=(1, 2)))
            strips = -(-source.size[1] // max(1, media.STRIP_PIXELS // source.size[0]))
            assert rows <= max(1, strips // 4) and diff.mean() < 0.1, (mode, side, rows)
    finally:
        media.STRIP_PIXELS = old_strip


def test_small_images_are_decoded_as_they_are() -> None:
    from service.usecases.media import decode_image

    image = stripes(200, 150, "RGBA")  # under twice 4 x 32 on the short side
    got = decode_image(encoded(image), 10**6, 10**6, 32)
    assert got.size == (200, 150) and got.mode == "RGB"
    assert np.array_equal(np.asarray(got), np.asarray(image.convert("RGB")))


def test_jpeg_is_scaled_in_the_decoder() -> None:
    """A JPEG is decoded at 1/2, 1/4 or 1/8 scale (draft) before any pixel exists: its plan
    holds the scaled pixels, not the header's."""
    from service.usecases.media import decode_image, plan_decode

    data = encoded(stripes(4000, 3000), "JPEG", quality=90)
    plan = plan_decode(data, 10**8, 10**8, 32)
    assert plan.image.size == (500, 375)  # 1/8: still >= 4 x 32 on the short side
    assert plan.cost < 4000 * 3000 // 32
    assert decode_image(data, 10**8, 10**8, 32).size == (171, 128)


def test_extreme_aspect_ratios_are_bounded_too() -> None:
    """A 40,000 x 100 strip cannot keep 128 px on its short side and shrink: the output is
    bounded by pixels instead."""
    from service.usecases.media import MAX_OUTPUT_PIXELS, decode_image, reduced_size

    width, height = reduced_size((40_000, 100), 32, 128, max_output=250_000)
    assert width * height <= 250_000 and width / height == pytest.approx(400, rel=0.01)
    image = decode_image(encoded(stripes(80_000, 100)), 10**7, 10**8, 32)
    assert image.size[0] * image.size[1] <= MAX_OUTPUT_PIXELS


@pytest.mark.parametrize("side", [32, 64, 224])
def test_the_model_resizes_a_reduced_image_to_the_same_size_as_the_original(side) -> None:
    """The reduced image's longer side is rounded so that the model's resize (shorter side
    to ``side``, the longer one truncated) gives exactly the original's size: otherwise
    its centre crop moves by half a pixel."""
    from service.usecases.media import MAX_OUTPUT_PIXELS, reduced_size

    rng = np.random.default_rng(side)
    for width, height in [(3000, 2000), (1999, 2701), (6030, 6633), (4001, 2999),
                          *rng.integers(1000, 9000, size=(300, 2)).tolist()]:
        size = reduced_size((width, height), side, 4 * side)
        if size is None:
            continue
        short, long = min(width, height), max(width, height)
        new_short, new_long = min(size), max(size)
        assert new_short == 4 * side or new_short * new_long <= MAX_OUTPUT_PIXELS
        assert new_short == new_long or (size[0] > size[1]) == (width > height)
        assert side * new_long // new_short == side * long // short, ((width, height), size)
        assert new_long / new_short == pytest.approx(long / short, abs=1 / new_short)


def test_the_limits_and_corrupt_data_still_fail_before_or_while_decoding() -> None:
    from service.state.errors import BadImage, TooLarge
    from service.usecases.media import DecodeBudget, decode_image

    data = encoded(stripes(1000, 1000))
    with pytest.raises(TooLarge):
        decode_image(data, 999_999, 10**8, 128)
    with pytest.raises(TooLarge):
        decode_image(data, 10**8, len(data) - 1, 128)
    budget = DecodeBudget(10**6, 1.0)
    with pytest.raises(BadImage):
        decode_image(data[: len(data) // 2], 10**8, 10**8, 128, budget)
    with pytest.raises(BadImage):
        decode_image(b"not an image", 10**8, 10**8, 128, budget)
    assert budget.used == 0  # a failed decode gives its pixels back


def test_the_reduced_image_embeds_like_the_original(micro_versions) -> None:
    """Box-reducing to 4x the model's side, then the model's own resize, gives (nearly)
    the embedding of the full-size image."""
    from service.usecases.media import decode_image
    from training.artifacts import load_artifact
    from training.versions import load_encoder

    artifact = load_artifact(micro_versions["v1"])
    encoder = load_encoder(artifact, artifact.space, "cpu")
    originals = [big_photo(2400, 1800), big_photo(1999, 2701), stripes(3000, 2000)]
    reduced = [decode_image(encoded(im), 10**8, 10**8, SIDE) for im in originals]
    assert all(max(r.size) < max(o.size) / 4 for r, o in zip(reduced, originals, strict=True))
    full = encoder.encode_images(originals)
    small = encoder.encode_images(reduced)
    assert np.min(np.sum(full * small, axis=1)) > 0.999


# ---------------------------------------------------------------- the budget
class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def busy(self) -> None:
        self.calls.append("busy")

    def idle(self) -> None:
        self.calls.append("idle")

    def trim(self) -> None:
        self.calls.append("trim")


def test_budget_is_first_come_first_served_and_an_oversized_decode_runs_alone() -> None:
    from service.usecases.media import DecodeBudget

    budget = DecodeBudget(100, 5.0, Recorder())
    order: list[str] = []
    budget.acquire(60)

    def take(name: str, pixels: int) -> None:
        with budget.hold(pixels):
            order.append(name)
            time.sleep(0.05)

    big = threading.Thread(target=take, args=("big", 500))  # over the whole budget
    big.start()
    while budget.waiting < 1:
        time.sleep(0.001)
    small = threading.Thread(target=take, args=("small", 10))  # would fit, but queues
    small.start()
    while budget.waiting < 2:
        time.sleep(0.001)
    assert order == []
    budget.release(60)
    big.join()
    small.join()
    assert order == ["big", "small"]
    assert budget.peak == 500 and budget.used == 0


def test_budget_times_out_with_503_and_leaves_the_queue() -> None:
    from service.state.errors import Unavailable
    from service.usecases.media import DecodeBudget

    budget = DecodeBudget(100, 0.1, Recorder())
    budget.acquire(100)
    began = time.monotonic()
    with pytest.raises(Unavailable, match="busy decoding"):
        budget.acquire(1)
    assert time.monotonic() - began >= 0.1
    assert budget.waiting == 0
    budget.release(100)
    with budget.hold(100):
        assert budget.used == 100


def test_async_waiters_hold_no_thread_and_cancelling_gives_back() -> None:
    from service.state.errors import Unavailable
    from service.usecases.media import DecodeBudget

    async def scenario() -> None:
        budget = DecodeBudget(100, 5.0, Recorder())
        await budget.acquire_async(80)
        waiters = [asyncio.create_task(budget.acquire_async(60)) for _ in range(3)]
        await asyncio.sleep(0.05)
        assert budget.waiting == 3 and not any(w.done() for w in waiters)
        waiters[1].cancel()  # a client that went away leaves the queue
        await asyncio.wait([waiters[1]])
        assert budget.waiting == 2
        budget.release(80)
        await waiters[0]
        assert budget.used == 60 and budget.waiting == 1  # 60 + 60 > 100: the third waits
        budget.release(60)
        await waiters[2]
        budget.release(60)
        assert budget.used == 0
        quick = DecodeBudget(10, 0.05, Recorder())
        await quick.acquire_async(10)
        with pytest.raises(Unavailable):
            await quick.acquire_async(1)
        assert quick.waiting == 0

    asyncio.run(scenario())


def test_a_cancelled_search_still_releases_its_decode(monkeypatch) -> None:
    """The decode thread gives the pixels back itself: a request cancelled mid-decode
    (the client went away) cannot leak budget."""
    from service.state.config import Settings
    from service.usecases import media

    settings = Settings(decode_pixel_budget=1_000_000, decode_wait_s=5.0)
    budget = media.DecodeBudget.of(settings)
    started = threading.Event()
    run = media.DecodePlan.run

    def slow_run(self):
        started.set()
        time.sleep(0.2)
        return run(self)

    monkeypatch.setattr(media.DecodePlan, "run", slow_run)

    async def scenario() -> None:
        task = asyncio.create_task(media.decode_image_async(
            encoded(stripes(800, 600)), settings, 128))
        while not started.is_set():
            await asyncio.sleep(0.01)
        assert budget.used > 0
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):
            if budget.used == 0:
                break
            await asyncio.sleep(0.01)
        assert budget.used == 0

    asyncio.run(scenario())


def test_memory_is_given_back_when_a_burst_of_large_decodes_ends() -> None:
    """The heap is told when a burst begins and ends; it is trimmed only after large
    decodes (not after every small one)."""
    from service.usecases.media import TRIM_AFTER_PIXELS, DecodeBudget

    heap = Recorder()
    budget = DecodeBudget(TRIM_AFTER_PIXELS * 4, 5.0, heap)
    with budget.hold(1000), budget.hold(1000):
        pass
    assert heap.calls == ["busy", "idle"]
    heap.calls.clear()
    with budget.hold(TRIM_AFTER_PIXELS):
        pass
    assert heap.calls == ["busy", "idle", "trim"]


def test_pillow_heap_caches_blocks_only_while_busy() -> None:
    from service.usecases.media import PillowHeap

    before = Image.core.get_blocks_max()
    heap = PillowHeap(40_000_000)
    heap.busy()
    assert Image.core.get_blocks_max() >= 10  # 160 MB of 16 MB blocks
    heap.idle()
    assert Image.core.get_blocks_max() == before
    heap.trim()  # glibc: malloc_trim; elsewhere nothing, and no error either way


# ---------------------------------------------------------------- the probe
@pytest.mark.slow
def test_bench_images_reads_the_gateway_rss_around_a_burst(tmp_path) -> None:
    """``nobackfill bench images`` on a small burst: a real gateway process answers every
    search, and its RSS is read idle, at the peak and after."""
    import argparse

    from service.bench.images import add_arguments, render, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    result = run(parser.parse_args(["--out", str(tmp_path), "--clients", "4", "--settle", "1",
                                    "--size", "3000x2000"]))
    assert result["requests"]["ok"] == 4, result["requests"]
    rss = result["rss_mb"]
    assert 0 < rss["idle"] <= rss["peak"] and rss["after"] > 0
    assert rss["peak_over_idle"] == pytest.approx(rss["peak"] - rss["idle"], abs=0.2)
    assert [t for t, _ in result["settle_mb"]][-1] >= 1.0
    text = render(result)
    assert "| idle |" in text and "target peak - idle <= 300 MB" in text
    assert (tmp_path / "bench-images.json").exists()
