"""Decode untrusted image bytes into an RGB image, or fail with a typed error.

Pixel counts are checked from the header before any pixel is decoded, so an image
bomb costs nothing; truncated or corrupt data fails while decoding. Messages are fixed
texts: PIL's exception texts carry object reprs and internals (``<_io.BytesIO object at
0x...>``), so they stay the error's cause (``from exc``) and never reach the caller.

Images are decoded at the size the model needs, not at the size they were sent: the
model's preprocess shrinks every image to its input side (32-224 px), so an upload much
larger than ``SIDE_MARGIN`` times that is shrunk as it is decoded (a JPEG by the
decoder's own 1/2-1/8 scaling, ``draft``, before any pixel exists; then a box filter, a
strip at a time right after the decoder, so no full-size converted copy is ever made),
keeping the geometry the model's resize would have seen. The pixels a decoder still
needs at full size (PNG, WebP, ... decode whole) are held under a ``DecodeBudget``: a
pixel count shared by every request of the process. A decode waits (first come, first
served) until its pixels fit, so concurrent uploads cannot add up to gigabytes; past
``decode_wait_s`` the request gets 503. While decodes run, Pillow reuses freed image
blocks across threads; when the budget falls idle they are freed and, after large
decodes, the heap's free pages go back to the system (glibc's ``malloc_trim``), so a
burst does not leave the process at its peak.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ctypes
import functools
import io
import math
import threading
import warnings
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from PIL import Image

from service.state.config import Settings
from service.state.errors import BadImage, TooLarge, Unavailable

SIDE_MARGIN = 4  # decode to this many times the model's input side: a box filter to there,
#                  then the model's own resize, is within a grey level of resizing the original
MAX_OUTPUT_PIXELS = 4_000_000  # a reduced image never holds more (extreme aspect ratios)
STRIP_PIXELS = 1_000_000  # source pixels converted and reduced at a time
TRIM_AFTER_PIXELS = 4_000_000  # decoded pixels released before an idle budget trims the heap


def png_base64(image: Image.Image) -> str:
    """An image as base64 PNG text (what the JSON API takes in ``image_base64``)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


def from_base64(text: str, max_bytes: int) -> bytes:
    """Bytes of a base64 (or ``data:...;base64,``) image string."""
    if text.startswith("data:") and "," in text:
        text = text.split(",", 1)[1]
    if len(text) * 3 // 4 > max_bytes:
        raise TooLarge(f"image is over the {max_bytes}-byte limit")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadImage("image_base64 is not base64 (nor a base64 data: URL)") from exc


def decode_image(data: bytes, max_pixels: int, max_bytes: int, side: int,
                 budget: DecodeBudget | None = None, at_least: int = 0) -> Image.Image:
    """An RGB image for a model whose input is ``side`` pixels: about ``SIDE_MARGIN``
    times that on its shorter side (and ``at_least``), or the original when it is not
    much larger; decoded under ``budget``, waiting in this thread for room."""
    return plan_decode(data, max_pixels, max_bytes, side, at_least).run_under(budget)


async def decode_image_async(data: bytes, settings: Settings, side: int) -> Image.Image:
    """``decode_image`` for the event loop, under the process's budget: the wait for room
    happens on the loop (no thread is held while waiting), the decode on a worker thread,
    which releases the budget itself when it is done, even if the request was cancelled."""
    plan = await asyncio.to_thread(plan_decode, data, settings.max_image_pixels,
                                   settings.max_image_bytes, side)
    budget = DecodeBudget.of(settings)
    await budget.acquire_async(plan.cost)
    try:
        future = asyncio.get_running_loop().run_in_executor(
            None, functools.partial(_run_then_release, plan, budget))
    except BaseException:
        budget.release(plan.cost)
        raise
    return await asyncio.shield(future)  # cancelled or not, the thread runs and releases


def _run_then_release(plan: DecodePlan, budget: DecodeBudget) -> Image.Image:
    try:
        return plan.run()
    finally:
        budget.release(plan.cost)


def plan_decode(data: bytes, max_pixels: int, max_bytes: int, side: int,
                at_least: int = 0) -> DecodePlan:
    """Check the limits and read the header (no pixel is decoded yet); a JPEG is set to
    decode at a reduced scale already."""
    if not data:
        raise BadImage("the image is empty")
    if len(data) > max_bytes:
        raise TooLarge(f"image of {len(data)} bytes is over the {max_bytes}-byte limit")
    image = _open(data)
    original = image.size
    width, height = original
    if width * height > max_pixels:
        raise TooLarge(f"image of {width}x{height} pixels is over the {max_pixels}-pixel limit")
    min_side = max(SIDE_MARGIN * side, at_least)
    if min(width, height) >= 2 * min_side:  # JPEG: scale by 1/2, 1/4 or 1/8 in the decoder
        scale = min_side / min(width, height)
        try:
            image.draft("RGB", (math.ceil(width * scale), math.ceil(height * scale)))
        except Exception as exc:  # draft reads JPEG markers: hostile input fails here too
            raise BadImage("the image is truncated or corrupt") from exc
    drafted = image.size != original
    return DecodePlan(image, reduced_size(original, side, min_side, force=drafted))


def reduced_size(size: tuple[int, int], side: int, min_side: int,
                 max_output: int = MAX_OUTPUT_PIXELS,
                 force: bool = False) -> tuple[int, int] | None:
    """The size to shrink an image of ``size`` to, or None to keep it: ``min_side`` on the
    shorter side (fewer when more than ``max_output`` pixels would be left: a 100 x 400,000
    strip cannot keep 100 px on its short side), and the longer side as the aspect ratio
    gives it, rounded so that the model's resize of the shorter side to ``side`` (which
    truncates the longer one: torchvision's ``Resize(side)``) gives the same size as for the
    original. Images less than twice ``min_side`` on the shorter side are kept, unless
    ``force`` (a JPEG that the decoder already scaled: its size is rounded there)."""
    width, height = size
    short, long = min(width, height), max(width, height)
    if not force and short < 2 * min_side and width * height <= max_output:
        return None
    new_short = min(short, min_side)
    if new_short * new_short * long > max_output * short:
        new_short = max(1, math.isqrt(max_output * short // long))
    new_long = max(1, round(long * new_short / short))
    resized = side * long // short  # the original's longer side after the model's resize
    lowest = -(-resized * new_short // side)  # so that side * new_long // new_short == resized
    highest = -(-(resized + 1) * new_short // side) - 1
    if lowest <= highest:
        new_long = min(max(new_long, lowest), highest)
    out = (new_long, new_short) if width >= height else (new_short, new_long)
    return None if out == size else out


@dataclass
class DecodePlan:
    image: Image.Image  # header read; draft set
    output_size: tuple[int, int] | None  # box-resample to this after decoding; None: keep

    @property
    def cost(self) -> int:
        """Pixels held at once while decoding: the decoder's image, plus the RGB output
        unless that is the decoded image itself."""
        width, height = self.image.size
        if self.output_size is None:
            return width * height * (1 if self.image.mode == "RGB" else 2)
        return width * height + self.output_size[0] * self.output_size[1]

    def run_under(self, budget: DecodeBudget | None) -> Image.Image:
        """``run`` holding ``cost`` pixels of ``budget`` (waiting in this thread for room;
        None: no budget)."""
        if budget is None:
            return self.run()
        with budget.hold(self.cost):
            return self.run()

    def run(self) -> Image.Image:
        """Decode, reduce and convert to RGB; the full-size image is freed before this
        returns."""
        image = self.image
        result = None
        try:
            image.load()
            if self.output_size is None:
                result = image if image.mode == "RGB" else image.convert("RGB")
            else:
                result = _reduced(image, self.output_size)
            return result
        except Exception as exc:  # PIL decoders raise many types on hostile input
            raise BadImage("the image is truncated or corrupt") from exc
        finally:
            if result is not image:
                image.close()  # drops the decoded pixels now, not when the plan is collected


def _reduced(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """``image.convert("RGB").resize(size, BOX)``, a strip at a time, so the only
    full-size buffer is the decoder's own. The box filter maps the whole image onto the
    whole output (no edge rows dropped or half-filled): the model's own resize then sees
    the original's geometry."""
    if image.mode in ("RGB", "L"):  # resampled in place, converted after: the same pixels
        return image.resize(size, Image.Resampling.BOX, reducing_gap=None).convert("RGB")
    width, height = image.size
    out_width, out_height = size
    out = Image.new("RGB", size)
    scale = height / out_height  # source rows per output row
    step = max(1, int(STRIP_PIXELS / (width * scale)))  # output rows per strip
    for first in range(0, out_height, step):
        last = min(out_height, first + step)
        top, bottom = first * scale, last * scale
        rows = (0, max(0, math.floor(top) - 1), width, min(height, math.ceil(bottom) + 1))
        strip = image.crop(rows).convert("RGB")
        out.paste(strip.resize((out_width, last - first), Image.Resampling.BOX,
                               box=(0, top - rows[1], width, bottom - rows[1]),
                               reducing_gap=None), (0, first))
    return out


def _open(data: bytes) -> Image.Image:
    """Read the header only (size, format)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            return Image.open(io.BytesIO(data))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise TooLarge("the image has too many pixels to decode") from exc
    except Exception as exc:  # PIL raises many types for non-image bytes
        raise BadImage("the data is not a readable image; send PNG, JPEG or another "
                       "common format") from exc


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():  # a waiter that timed out or was cancelled is done already
        future.set_result(None)


class _Waiter:
    __slots__ = ("granted", "pixels", "wake")

    def __init__(self, pixels: int, wake: Callable[[], None]) -> None:
        self.pixels, self.wake, self.granted = pixels, wake, False


class DecodeBudget:
    """Pixels that image decodes in flight may hold at once, shared by the threads and
    the event loop of one process. Waiters are served first come, first served (a large
    image is not starved by a stream of small ones); a decode larger than the whole
    budget runs when nothing else holds any. Past ``wait_s`` a waiter gets ``Unavailable``
    (503): the caller may retry, and nothing was decoded."""

    def __init__(self, capacity: int, wait_s: float, heap: Heap | None = None) -> None:
        self.capacity = capacity
        self.wait_s = wait_s
        self.heap = heap if heap is not None else PillowHeap(capacity)
        self.used = 0
        self.peak = 0  # most pixels held at once (tests and metrics)
        self._queue: deque[_Waiter] = deque()
        self._lock = threading.Lock()
        self._since_trim = 0

    @classmethod
    def of(cls, settings: Settings) -> DecodeBudget:
        """The process's budget for these settings (one per process, whatever number of
        gateways or requests share it)."""
        key = (settings.decode_budget_pixels, settings.decode_wait_s)
        with _BUDGETS_LOCK:
            if key not in _BUDGETS:
                _BUDGETS[key] = cls(*key)
            return _BUDGETS[key]

    @property
    def waiting(self) -> int:
        return len(self._queue)

    # ---------------------------------------------------------------- taking room
    @contextmanager
    def hold(self, pixels: int) -> Iterator[None]:
        """Hold ``pixels`` for the block, waiting in this thread for room."""
        self.acquire(pixels)
        try:
            yield
        finally:
            self.release(pixels)

    def acquire(self, pixels: int) -> None:
        event = threading.Event()
        waiter = self._take_or_queue(pixels, event.set)
        if waiter is not None and not event.wait(self.wait_s) and not self._give_up(waiter):
            raise self._busy(pixels)

    async def acquire_async(self, pixels: int) -> None:
        """``acquire`` on the event loop: waiting holds no thread."""
        loop = asyncio.get_running_loop()
        woken = loop.create_future()

        def wake() -> None:
            loop.call_soon_threadsafe(_settle, woken)

        waiter = self._take_or_queue(pixels, wake)
        if waiter is None:
            return
        try:
            await asyncio.wait_for(woken, self.wait_s)
        except asyncio.TimeoutError:  # TimeoutError from 3.11 on
            if not self._give_up(waiter):
                raise self._busy(pixels) from None
        except BaseException:  # cancelled while waiting: leave the queue, or hand back
            if self._give_up(waiter):
                self.release(pixels)
            raise

    def release(self, pixels: int) -> None:
        with self._lock:
            self.used -= pixels
            self._since_trim += pixels
            woken = self._grant()
            idle = self.used == 0
            trim = idle and self._since_trim >= TRIM_AFTER_PIXELS
            if idle:
                self.heap.idle()
            if trim:
                self._since_trim = 0
        for wake in woken:
            wake()
        if trim:  # a burst of large decodes is over: give their memory back to the system
            self.heap.trim()

    # ---------------------------------------------------------------- under the lock
    def _fits(self, pixels: int) -> bool:
        return self.used == 0 or self.used + pixels <= self.capacity

    def _take_or_queue(self, pixels: int, wake: Callable[[], None]) -> _Waiter | None:
        with self._lock:
            if not self._queue and self._fits(pixels):
                self._take(pixels)
                return None
            waiter = _Waiter(pixels, wake)
            self._queue.append(waiter)
            return waiter

    def _take(self, pixels: int) -> None:
        if self.used == 0:
            self.heap.busy()
        self.used += pixels
        self.peak = max(self.peak, self.used)

    def _grant(self) -> list[Callable[[], None]]:
        woken = []
        while self._queue and self._fits(self._queue[0].pixels):
            waiter = self._queue.popleft()
            self._take(waiter.pixels)
            waiter.granted = True
            woken.append(waiter.wake)
        return woken

    def _give_up(self, waiter: _Waiter) -> bool:
        """Leave the queue; True when the room was granted meanwhile (the caller holds
        it after all)."""
        with self._lock:
            if waiter.granted:
                return True
            self._queue.remove(waiter)
            woken = self._grant()  # the ones behind may fit now
        for wake in woken:
            wake()
        return False

    def _busy(self, pixels: int) -> Unavailable:
        return Unavailable(f"the gateway is busy decoding other images (an image of "
                           f"{pixels} pixels waited {self.wait_s:g}s for room in the "
                           f"{self.capacity}-pixel decode budget); send it again later")


class Heap:
    """Where a budget's decoded pixels live, told when decodes start and stop."""

    def busy(self) -> None:
        """The first decode of a burst is about to allocate."""

    def idle(self) -> None:
        """The last decode in flight released its pixels (called under the budget's lock:
        it must be quick)."""

    def trim(self) -> None:
        """After ``idle``, when large decodes ran: hand freed memory back to the system."""


class PillowHeap(Heap):
    """Pillow's image blocks over glibc's malloc. Each thread that decodes allocates from
    its own malloc arena, and an arena keeps what it freed: eight threads decoding a 40 MP
    image one after another held about 1 GB. So while decodes are in flight, Pillow keeps
    up to a budget's worth of freed blocks (``set_blocks_max``) and hands them to the next
    decode, whatever its thread; when the budget falls idle that cache is dropped, and
    after large decodes the heap's free pages are returned (``malloc_trim``)."""

    def __init__(self, capacity: int) -> None:
        block = max(1, Image.core.get_block_size())
        self.blocks = min(4096, math.ceil(4 * capacity / block) + 2)  # 4 bytes a pixel

    def busy(self) -> None:
        Image.core.set_blocks_max(max(self.blocks, _PIL_BLOCKS_MAX))

    def idle(self) -> None:
        Image.core.set_blocks_max(0)  # frees the cached blocks
        Image.core.set_blocks_max(_PIL_BLOCKS_MAX)

    def trim(self) -> None:
        malloc_trim()


_PIL_BLOCKS_MAX = Image.core.get_blocks_max()  # the process's own setting (PILLOW_BLOCKS_MAX)
_BUDGETS: dict[tuple[int, float], DecodeBudget] = {}
_BUDGETS_LOCK = threading.Lock()


def _libc_malloc_trim() -> Callable[[], int] | None:
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim  # glibc only (musl and others have none)
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return functools.partial(trim, 0)


_TRIM = _libc_malloc_trim()


def malloc_trim() -> None:
    """Return the heap's free pages to the system, on glibc (elsewhere: nothing)."""
    if _TRIM is not None:
        _TRIM()
